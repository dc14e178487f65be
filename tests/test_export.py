"""``launch/export.py``: a run's checkpoint becomes a Hugging Face directory that transformers
loads with our logits (the reference: HF's own Llama forward on the exported files), that our
inference server serves (``/generate`` log-probs equal our model's on the same ids), and bad
input is refused in one line (exit 2) before anything is written.

The run is the smoke config's tiny random model (SmolLM2 tokenizer) whose checkpoint is
written through the real checkpoint code (``Learner.save``), with the parameters moved off
their initial values first, so that an export of the initial weights could not pass.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

#: float32 logits: ours (XLA on CPU) against transformers' (torch on CPU), same weights
LOGIT_ATOL = 1e-4
STEP = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(workdir, model): a run directory (config.json + the orbax checkpoint of step ``STEP``,
    params and optimiser state) and the policy it holds."""
    import jax
    from flax import nnx

    from agentrl_jax.learner import Learner
    from agentrl_jax.sharding.mesh import make_mesh
    from agentrl_jax.training.config.experiment import config_json, to_run_config
    from agentrl_jax.training.runtime.policy import load_policy
    from experiments.smoke import get_config

    workdir = str(tmp_path_factory.mktemp("run"))
    config = to_run_config(get_config())
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(config_json(config), f)
    model = load_policy(config)[0]
    learner = Learner(model, config.learner, mesh=make_mesh(devices=jax.devices()[:1]),
                      checkpoint_dir=os.path.join(workdir, "checkpoints"))
    keys = iter(jax.random.split(jax.random.key(1), 100))
    learner.params = jax.tree.map(  # "trained": every parameter moved by a noise of 0.05
        lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape, x.dtype), learner.params)
    learner.save({"step": STEP}, step=STEP)
    learner.close()
    trained = nnx.merge(nnx.graphdef(model), jax.tree.map(np.asarray, learner.params))
    return workdir, trained


def _our_logits(model, ids: list[int]) -> np.ndarray:
    import jax.numpy as jnp

    return np.asarray(model(jnp.asarray([ids], jnp.int32)).logits)[0]


def test_export_loads_in_transformers_with_our_logits(run, tmp_path):
    """f32 export: transformers' logits equal ours within ``LOGIT_ATOL``; the directory holds
    the tokenizer with its chat template and a generation config; bf16 export: the same
    tensors rounded to bfloat16."""
    import jax.numpy as jnp
    import safetensors.numpy

    from launch.export import main

    workdir, model = run
    out = str(tmp_path / "hf")
    assert main(["--workdir", workdir, "--out", out]) == 0
    files = set(os.listdir(out))
    assert {"config.json", "model.safetensors", "generation_config.json",
            "tokenizer.json"} <= files
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template
    text = tokenizer.apply_chat_template([{"role": "user", "content": "go to the red ball"}],
                                         tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].numpy()
    ours = _our_logits(model, ids)
    assert np.abs(ours).max() > 0.1  # not a flat model: the comparison has something to compare
    np.testing.assert_allclose(theirs, ours, atol=LOGIT_ATOL, rtol=0)

    bf16 = str(tmp_path / "hf_bf16")
    assert main(["--workdir", workdir, "--out", bf16, "--step", str(STEP),
                 "--dtype", "bfloat16"]) == 0
    with open(os.path.join(bf16, "config.json")) as f:
        assert json.load(f)["torch_dtype"] == "bfloat16"
    full = safetensors.numpy.load_file(os.path.join(out, "model.safetensors"))
    with open(os.path.join(bf16, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    half = transformers.AutoModelForCausalLM.from_pretrained(bf16, dtype=torch.float32)
    for name, tensor in half.state_dict().items():
        if name in full:
            expected = np.asarray(jnp.asarray(full[name]).astype(jnp.bfloat16).astype(jnp.float32))
            np.testing.assert_array_equal(tensor.numpy(), expected, err_msg=name)


async def test_our_inference_server_serves_the_export(run, tmp_path):
    """``/generate`` on the exported directory (loaded as ``--model DIR`` does): the log-prob
    of every sampled token equals our trained model's on the same ids."""
    import aiohttp

    from agentrl_jax.models.pretrained import load_pretrained
    from agentrl_jax.training.jobs.export import export_checkpoint
    from rollout_helpers import full_logprobs, make_engine, start_server

    workdir, model = run
    out, step = export_checkpoint(workdir, str(tmp_path / "served"))
    assert step == STEP
    pretrained = load_pretrained(out)
    engine = make_engine(pretrained.model, pretrained.tokenizer, warmup=False)
    thread = start_server(engine, model_path=out)
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 1000, size=9)]
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(thread.url + "/generate", json={
                    "input_ids": prompt, "return_logprob": True,
                    "sampling_params": {"max_new_tokens": 6, "temperature": 0,
                                        "ignore_eos": True}}) as r:
                assert r.status == 200, await r.text()
                body = await r.json()
    finally:
        thread.stop()
        engine.close()
    got = body["output_ids"]
    assert len(got) == 6
    reference = full_logprobs(model, prompt + got)
    expected = [reference[len(prompt) - 1 + i, t] for i, t in enumerate(got)]
    served = [t[0] for t in body["meta_info"]["output_token_logprobs"]]
    np.testing.assert_allclose(served, expected, atol=1e-4)


def test_bad_input_is_refused_in_one_line_before_anything_is_written(run, tmp_path, capsys):
    from launch.export import main

    workdir, _ = run
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("keep me")
    cases = [
        (["--workdir", str(tmp_path / "nope"), "--out", str(tmp_path / "a")], "no run directory"),
        (["--workdir", str(tmp_path), "--out", str(tmp_path / "a")], "has no config.json"),
        (["--workdir", workdir, "--out", str(tmp_path / "a"), "--step", "7"],
         f"no checkpoint of step 7 (it has {STEP})"),
        (["--workdir", workdir, "--out", str(taken)], "exists and is not empty"),
    ]
    empty_run = tmp_path / "empty_run"
    empty_run.mkdir()
    (empty_run / "config.json").write_text("{}")
    cases.append((["--workdir", str(empty_run), "--out", str(tmp_path / "a")],
                  "no finished checkpoint"))
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "a").exists()
    assert os.listdir(taken) == ["x"]


def test_a_restricted_policy_is_exported_with_its_token_ids(run, tmp_path):
    """A run with ``model.output_tokens`` exports the whole network plus its token ids in
    ``config.json`` (``agentrl_output_token_ids``); our loader restores the restriction, so the
    loaded policy's logits are -inf outside the ids and equal the trained model's inside them,
    and transformers still loads the directory (it ignores the key)."""
    import jax.numpy as jnp

    from agentrl_jax.models.pretrained import load_pretrained
    from agentrl_jax.models.tokenizer import load_tokenizer
    from agentrl_jax.training.jobs.export import export_checkpoint

    workdir, model = run
    restricted = str(tmp_path / "restricted_run")
    os.makedirs(restricted)
    with open(os.path.join(workdir, "config.json")) as f:
        config = json.load(f)
    config["model"]["output_tokens"] = "abc"
    with open(os.path.join(restricted, "config.json"), "w") as f:
        json.dump(config, f)
    os.symlink(os.path.join(workdir, "checkpoints"), os.path.join(restricted, "checkpoints"))
    out, _ = export_checkpoint(restricted, str(tmp_path / "export"))

    tokenizer = load_tokenizer(out)
    eos = {tokenizer.eos_token_id} | set(model.cfg.eos_token_ids)
    want = sorted({tokenizer.convert_tokens_to_ids(c) for c in "abc"} | eos)
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["agentrl_output_token_ids"] == want
    loaded = load_pretrained(out).model
    assert loaded.cfg.output_token_ids == tuple(want)
    ids = [5, 17, 99, 3, 250]
    got = np.asarray(loaded(jnp.asarray([ids], jnp.int32)).logits)[0]
    full = _our_logits(model, ids)
    outside = np.ones(full.shape[-1], bool)
    outside[want] = False
    assert np.all(np.isneginf(got[:, outside]))
    np.testing.assert_allclose(got[:, want], full[:, want], atol=1e-5)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert hf.config.vocab_size == model.cfg.vocab_size
