"""One source for the engine's settings (issue 46, item 2).

``EngineConfig`` is the typed section; the run config's ``rollout`` keys are declared from its
fields, the rollout server's options are generated from them, the engine-servers backend
writes a server's command line from it, and ``resolve_engine_config`` is the one resolution of
``"auto"`` and platform values. The expected values below are written out by hand.
"""

from __future__ import annotations

import dataclasses

import pytest

from agentrl_common.typed_sections import SectionError
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.rollout.backends.engine_servers import server_flags
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.engine.resolution import resolve_engine_config
from agentrl_jax.rollout.servers.engine_flags import engine_config_from_args, engine_flags
from agentrl_jax.rollout.servers.server import parse_args
from agentrl_jax.training.config.rollout_section import ENGINE_KEYS, engine_config_of_run
from agentrl_jax.training.config.sections import RunConfig

TINY = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                   num_heads=2, num_kv_heads=1, head_dim=16)


def test_every_engine_setting_of_a_run_reaches_the_servers_engine_config():
    """A run config whose every engine key differs from its default: the engine servers'
    command line, parsed by the server, gives back an EngineConfig equal field by field to
    the run's (share_prompts included, which the hand-written command line dropped)."""
    run, problems = RunConfig.from_mapping({"seed": 11, "rollout": dict(
        max_batch=5, max_context=320, engine_dtype="bfloat16", decode_steps=3,
        decode_attention="ragged", prefill_attention="flash", decode_gemm="merged",
        prefill_kv_buckets="64,128", share_prompts=False, max_new_tokens=16,
        prefill_tokens=256, deliver_after_launch=True, decode_loop="fixed")})
    assert problems == []
    assert set(ENGINE_KEYS) | {"seed"} >= {"max_batch", "share_prompts", "prefill_kv_buckets"}
    sent = engine_config_of_run(run.rollout, run.seed)
    received = engine_config_from_args(parse_args(server_flags(sent)))
    expected = dict(max_batch=5, max_length=320, dtype="bfloat16", weights_dtype="bfloat16",
                    decode_steps=3, decode_attention="ragged", prefill_attention="flash",
                    decode_gemm="merged", prefill_kv_buckets=(64, 128), share_prompts=False,
                    prefill_tokens=256, deliver_after_launch=True, decode_loop="fixed",
                    seed=11)
    for name in EngineConfig.field_names():
        want = expected.get(name, getattr(EngineConfig(), name))
        assert getattr(sent, name) == want, name
        assert getattr(received, name) == want, name


def test_prefill_tokens_from_a_run_command_line_reach_the_engine_as_a_number():
    """``--config.rollout.prefill_tokens=16384`` (a string: the config file's default is
    "auto") resolves to the integer 16384 on any platform; a non-number is refused by name."""
    from agentrl_jax.training.config.experiment import base_config, to_run_config

    c = base_config()
    c.rollout.prefill_tokens = "16384"  # what config_flags makes of the command line
    engine = engine_config_of_run(to_run_config(c).rollout)
    for platform in ("cpu", "gpu"):
        resolved = resolve_engine_config(engine, platform, 1, TINY)
        assert resolved.prefill_tokens == 16384 and isinstance(resolved.prefill_tokens, int)
    c.rollout.prefill_tokens = "lots"
    with pytest.raises(Exception, match="prefill_tokens"):
        to_run_config(c)


def test_every_engine_field_round_trips_through_the_server_options():
    """Non-default values for every field (the settings no run key names too)."""
    config = EngineConfig(max_batch=3, max_length=200, dtype="float16", weights_dtype="bfloat16",
                          prefill_chunks=(16, 32), prefill_tokens=96, decode_steps=2,
                          max_stop_ids=4, max_queue=7, copy_rows=2, session_cache=False, seed=9,
                          kv_layout="bskd", prefill_calls_per_step=1, decode_attention="dense",
                          decode_gemm="xla", prefill_kv_buckets=(), share_prompts=False,
                          prefill_attention="dense", deliver_after_launch=True,
                          decode_loop="fixed")
    assert all(getattr(config, f.name) != f.default for f in dataclasses.fields(EngineConfig))
    assert engine_config_from_args(parse_args(engine_flags(config))) == config
    assert engine_config_from_args(parse_args(engine_flags(EngineConfig()))) == EngineConfig()


def test_server_options_are_generated_from_the_section():
    """Every field is an option whose default is the field's and whose help is the field's."""
    defaults = parse_args([])
    assert engine_config_from_args(defaults) == EngineConfig()
    assert (defaults.max_batch, defaults.max_length, defaults.prefill_kv_buckets) == (
        64, 4096, "auto")
    with pytest.raises(SystemExit):
        parse_args(["--decode-gemm", "cublas"])  # the field's choices
    with pytest.raises(SectionError, match="engine.max_batch"):
        engine_config_from_args(parse_args(["--max-batch", "0"]))  # the field's bound
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(out.getvalue().split())
    for f in dataclasses.fields(EngineConfig):
        assert "--" + f.name.replace("_", "-") in text
    assert "copies that prefill's KV row (default: True)" in text


def test_the_rollout_section_declares_the_engines_defaults():
    """Each rollout key of an engine setting has the field's default (one default)."""
    rollout, engine = RunConfig().rollout, EngineConfig()
    for key, fields in ENGINE_KEYS.items():
        for name in fields:
            assert (getattr(rollout, key) or None) == (getattr(engine, name) or None), key
    assert engine_config_of_run(rollout) == dataclasses.replace(engine, seed=0)


def test_cpu_resolution_by_hand():
    """The defaults on the CPU backend: no "auto" left; resolving again changes nothing."""
    cpu = resolve_engine_config(EngineConfig(), "cpu", 1, TINY)
    assert cpu.resolved and cpu == resolve_engine_config(cpu, "cpu", 1, TINY)
    assert (cpu.prefill_chunks, cpu.prefill_tokens, cpu.prefill_kv_buckets) == ((64, 256), 64, ())
    assert (cpu.decode_attention, cpu.prefill_attention, cpu.decode_gemm) == (
        "dense", "dense", "xla")
    assert (cpu.dtype, cpu.weights_dtype, cpu.max_batch) == ("float32", None, 64)
    # explicit values are kept on CPU (the trainer used to overwrite them)
    given = resolve_engine_config(EngineConfig(prefill_chunks=(32,), prefill_tokens=512,
                                               prefill_kv_buckets=(512, 1024)), "cpu")
    assert (given.prefill_chunks, given.prefill_tokens, given.prefill_kv_buckets) == (
        (32,), 512, (512, 1024))
    # the slots fit a sixth of the host's RAM: 1 layer x 1 head x 16 x 4096 x 2 x 4 bytes
    per_slot = 2 * 1 * 1 * 16 * 4096 * 4
    small = resolve_engine_config(EngineConfig(), "cpu", 1, TINY, host_ram_bytes=6 * 10 * per_slot)
    assert small.max_batch == 10
    with pytest.raises(ValueError, match="resolve"):
        EngineConfig().chunk_buckets


def test_accelerator_resolution_by_hand():
    gpu = resolve_engine_config(EngineConfig(max_length=4096), "gpu", 1, TINY)
    # the fused decode kernel needs a head dim divisible by 32 (TINY's is 16): ragged;
    # flash_in_cache reads rows in place: one KV length, rows of BLOCK_Q (64) tokens
    assert (gpu.decode_attention, gpu.prefill_attention, gpu.decode_gemm) == (
        "ragged", "flash_in_cache", "merged_cublas")
    wide = dataclasses.replace(TINY, head_dim=32)
    assert resolve_engine_config(EngineConfig(), "gpu", 1, wide).decode_attention == "ragged_fused"
    assert (gpu.prefill_chunks, gpu.prefill_tokens, gpu.prefill_kv_buckets) == ((64,), 4096, ())
    dense = resolve_engine_config(EngineConfig(max_length=4096, prefill_attention="dense"),
                                  "gpu", 2, TINY)
    assert (dense.prefill_chunks, dense.prefill_kv_buckets) == ((64, 256, 1024), (512, 1024, 2048))
    # tensor-parallel: no Pallas kernel, no merged GEMMs
    assert (dense.decode_attention, dense.decode_gemm) == ("dense", "xla")


def test_a_gpu_default_kernel_lost_to_the_length_is_said(caplog):
    """A max_length that is no multiple of 16 rules the decode kernels out: auto on a GPU falls
    back to dense with a warning naming a length that fits (the side-by-side benchmark once ran
    dense unawares at 385); on a CPU, where auto is dense anyway, and for a tensor-parallel
    group, where dense is the design, nothing is said."""
    wide = dataclasses.replace(TINY, head_dim=32)
    with caplog.at_level("WARNING", logger="agentrl_jax.rollout.engine.attention_choice"):
        gpu = resolve_engine_config(EngineConfig(max_length=385), "gpu", 1, wide)
    assert gpu.decode_attention == "dense"
    said = [r.getMessage() for r in caplog.records if "decode attention" in r.getMessage()]
    assert said == ["ragged_fused decode attention is not available with max_length=385 "
                    "(not a multiple of 16; e.g. 400 is); using dense"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="agentrl_jax.rollout.engine.attention_choice"):
        assert resolve_engine_config(EngineConfig(max_length=385), "cpu", 1, wide
                                     ).decode_attention == "dense"
        assert resolve_engine_config(EngineConfig(max_length=400), "gpu", 2, wide
                                     ).decode_attention == "dense"
        assert resolve_engine_config(EngineConfig(max_length=400), "gpu", 1, wide
                                     ).decode_attention == "ragged_fused"
    assert not [r for r in caplog.records if "decode attention" in r.getMessage()]
