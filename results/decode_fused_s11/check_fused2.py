"""GPU check: fused decode attention (qkv in, RoPE in kernel) vs a float64 loop."""
import numpy as np, jax, jax.numpy as jnp
from agentrl_jax.rollout.engine.fused_decode_attention import fused_decode_attention
print(jax.devices())
def rope(x, c, s):
    h = x.shape[-1] // 2
    return x * c + np.concatenate([-x[..., h:], x[..., :h]], -1) * s
def ref(q, kn, vn, ck, cv, pos):
    b, h, dh = q.shape; kh, s = ck.shape[1], ck.shape[2]; g = h // kh
    ck = ck.copy(); cv = cv.copy(); out = np.zeros((b, h, dh))
    for i in range(b):
        p = pos[i]
        if p >= s: continue
        ck[i, :, p] = kn[i]; cv[i, :, p] = vn[i]
        for hh in range(h):
            kk = ck[i, hh // g, :p + 1]; sc = kk @ q[i, hh] / np.sqrt(dh); w = np.exp(sc - sc.max()); w /= w.sum()
            out[i, hh] = w @ cv[i, hh // g, :p + 1]
    return out, ck, cv
rng = np.random.default_rng(0)
for dtype in (jnp.float32, jnp.bfloat16):
    for (b, h, kh, dh, s) in [(8, 9, 3, 64, 384), (8, 12, 2, 128, 384), (8, 12, 2, 128, 4096), (8, 28, 4, 128, 2048)]:
        qkv = rng.standard_normal((b, h + 2 * kh, dh))
        ck = rng.standard_normal((b, kh, s, dh)); cv = rng.standard_normal((b, kh, s, dh))
        pos = np.array([0, 1, 31, 32, 200, s - 2, s - 1, s])
        ang = pos[:, None] * 1e4 ** (-np.arange(0, dh, 2) / dh); ang = np.concatenate([ang, ang], -1)
        cos, sin = np.cos(ang), np.sin(ang)
        cast = lambda x: np.asarray(jnp.asarray(x, dtype).astype(jnp.float32), np.float64)
        f = jax.jit(fused_decode_attention, static_argnames=("num_heads",), donate_argnums=(1, 2))
        o, nk, nv = f(jnp.asarray(qkv, dtype), jnp.asarray(ck, dtype), jnp.asarray(cv, dtype), jnp.asarray(pos), num_heads=h,
                      rope=(jnp.asarray(cos, jnp.float32), jnp.asarray(sin, jnp.float32)))
        qc = cast(qkv)
        q = rope(qc[:, :h], cos[:, None], sin[:, None]); kn = rope(qc[:, h:h + kh], cos[:, None], sin[:, None]); vn = qc[:, h + kh:]
        ro, rk, rv = ref(q, cast(kn), vn, cast(ck), cast(cv), pos)
        err = np.abs(np.asarray(o.astype(jnp.float32)) - ro).max()
        kerr = np.abs(np.asarray(nk.astype(jnp.float32)) - rk).max()
        print(jnp.dtype(dtype).name, (b, h, kh, dh, s), "out max err %.2e" % err, "k cache max err %.2e" % kerr,
              "v exact", np.array_equal(np.asarray(nv.astype(jnp.float32)), rv), flush=True)
