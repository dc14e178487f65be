"""``model_to_hf_tensors`` casts and transposes on the device, a bounded group at a time: the
tensors are bit-identical to the host reference (fetch, ``astype`` and transpose in NumPy), in
the parameters' order, whole or sharded over a mesh, one tensor per group or all in one."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from agentrl_jax.models import weights
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.llama import init_model
from agentrl_jax.sharding.mesh import make_mesh

CFG = ModelConfig(vocab_size=160, hidden_size=48, intermediate_size=80, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=12, tie_word_embeddings=False,
                  attention_bias=True)


def host_reference(model, dtype: str) -> dict[str, np.ndarray]:
    np_dtype = jax.numpy.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    out = {}
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name, transpose = weights.hf_name(path)
        array = np.asarray(jax.device_get(variable.get_value()), np.float32).astype(np_dtype)
        out[name] = np.ascontiguousarray(array.T if transpose else array)
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("group_bytes", [1, 2**30], ids=["tensor_per_group", "one_group"])
@pytest.mark.parametrize("fsdp", [0, 4], ids=["whole", "fsdp4"])
def test_device_side_export_matches_the_host_reference(dtype, group_bytes, fsdp, monkeypatch):
    if fsdp and len(jax.devices()) < fsdp:
        pytest.skip(f"needs {fsdp} (virtual) devices")
    monkeypatch.setattr(weights, "EXPORT_GROUP_BYTES", group_bytes)
    mesh = make_mesh(fsdp=fsdp, devices=jax.devices()[:fsdp]) if fsdp else None
    model = init_model(CFG, seed=7, mesh=mesh)
    if fsdp:  # some parameters really are split over the devices
        assert any(not x.sharding.is_fully_replicated
                   for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    got = weights.model_to_hf_tensors(model, dtype)
    want = host_reference(model, dtype)
    assert list(got) == list(want)  # the parameters' order
    for name, array in want.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        assert got[name].flags["C_CONTIGUOUS"], name
        np.testing.assert_array_equal(got[name].view(np.uint8), array.view(np.uint8), name)
    assert got["model.layers.0.self_attn.q_proj.weight"].shape == (48, 48)
    assert got["lm_head.weight"].shape == (160, 48)  # [vocab, hidden] as HF stores it
