"""benchmarks/speed/rollout_profile.py on the CPU smoke config: the profile's independently measured
parts add up to the rollout's wall time (engine thread: device calls + host work + idle waits;
episodes: queueing + generation + environment + host work), within 5%."""

from __future__ import annotations

import pytest

from benchmarks.speed.rollout_profile import main


@pytest.mark.slow
def test_profile_parts_add_up_to_the_wall(tmp_path):
    # one warm-up rollout: the measured one then holds no compile, whose time the engine's
    # always-on clocks and the probe's split differently (a 0.08 s gap failed CI once)
    report = main(["--config", "experiments/smoke.py", "--warmup", "1", "--rollouts", "1",
                   "--variants", "noshare,share", "--json", str(tmp_path / "profile.json")])
    assert (tmp_path / "profile.json").exists()
    for name, variant in report["variants"].items():
        (run,) = variant["rollouts"]
        (engine,) = run["engines"]
        assert engine["wall_s"] == pytest.approx(run["wall_s"], rel=0.02, abs=0.01)
        assert engine["parts_s"] == pytest.approx(engine["wall_s"], rel=0.05)
        for key in ("prefill_device_s", "decode_device_s", "host_s", "idle_s"):
            assert engine[key] >= 0, (name, key)
        # the part of each call window blocked on the device lies within the window
        assert 0 < engine["prefill_wait_s"] <= engine["prefill_device_s"]
        assert 0 < engine["decode_wait_s"] <= engine["decode_device_s"]
        # the dispatch precedes the wait: the two parts do not overlap within a window
        for kind in ("prefill", "decode"):
            assert 0 < engine[f"{kind}_dispatch_s"]
            assert (engine[f"{kind}_dispatch_s"] + engine[f"{kind}_wait_s"]
                    <= engine[f"{kind}_device_s"] + 1e-9)
            # the thread's CPU before the wait fits in the window's stretch before the wait
            assert 0 < engine[f"{kind}_host_cpu_s"] <= (
                engine[f"{kind}_device_s"] - engine[f"{kind}_wait_s"]) * 1.05 + 0.01
        assert engine["requests"] == run["turns"] > 0  # one engine request per turn
        # every prompt token prefilled went into a row of a call (the last one of each
        # request is fed by its first decode step instead), padding around them
        assert engine["prefill_row_tokens"] == engine["prefill_tokens"] - engine["requests"]
        assert (0 < engine["prefill_row_tokens"] <= engine["prefill_used_positions"]
                <= engine["prefill_positions"])
        assert engine["prefill_rows_used"] <= engine["prefill_rows"]
        # the engine's always-on clocks agree with the probe's, less the step or wait for work
        # in progress at each snapshot (the engine's clocks count one once it ends; the
        # rollout's last environment calls leave the engine waiting at the second snapshot:
        # 0.27 s on a loaded CI box, where the comparison without it failed)
        assert engine["engine_step_s"] + engine["engine_idle_s"] == pytest.approx(
            engine["parts_s"] - engine["open_s"], rel=0.05, abs=0.05)
        # run_decode's wall split: the engine thread's CPU in it, its collections
        assert 0 < engine["run_decode_cpu_s"] <= engine["run_decode_s"] * 1.05 + 0.01
        assert 0 <= engine["engine_gc_s"] <= engine["wall_s"]
        episode = run["episode"]
        assert episode["accounted_s"] == pytest.approx(episode["wall_s"], rel=0.05)
        assert 0 < episode["wall_s"] <= run["wall_s"]
        assert 0 <= episode["engine_s"] <= episode["gen_s"]
        # the event loop's CPU by callback: within the loop thread's CPU, the episodes' own
        # coroutine among the charged names
        callbacks = run["event_loop_callbacks"]
        assert sum(c["cpu_s"] for c in callbacks) <= run["cpu"]["event_loop_s"] + 0.01
        assert "task:ActorPool.collect.<locals>.run" in [c["name"] for c in callbacks]
    assert report["variants"]["noshare"]["rollouts"][0]["engines"][0]["shared_prompts"] == 0


def test_set_overrides_reach_the_run_config_and_the_engine():
    """``--set`` (as speed_round2.sh's dtype parts pass it) sets the run config the profile
    builds its engine from: a float32 sampler (compute and weights) beside the recipe's
    bfloat16 one."""
    from agentrl_jax.training.config.rollout_section import engine_config_of_run
    from benchmarks.speed.rollout_profile import load_config

    base = load_config("experiments/babyai.py:grpo_gpu", [])
    f32 = load_config("experiments/babyai.py:grpo_gpu",
                      ["rollout.engine_dtype='float32'", "learner.dtype=float32"])
    assert base.rollout.engine_dtype == "bfloat16" and f32.rollout.engine_dtype == "float32"
    assert f32.learner.dtype == "float32" and base.learner.dtype == "bfloat16"
    assert (engine_config_of_run(base.rollout).dtype,
            engine_config_of_run(base.rollout).weights_dtype) == ("bfloat16", "bfloat16")
    engine = engine_config_of_run(f32.rollout)
    assert (engine.dtype, engine.weights_dtype) == ("float32", "float32")


def test_format_programs_sets_device_spans_beside_the_engine_counters():
    from benchmarks.speed.rollout_profile import format_programs
    engines = [{"prefill_calls": 3, "decode_calls": 2, "prefill_device_s": 0.03,
                "decode_device_s": 0.02},
               {"prefill_calls": 1, "decode_calls": 2, "prefill_device_s": 0.01,
                "decode_device_s": 0.02}]
    line = format_programs({"jit_prefill": {"calls": 4, "span_s": 0.02, "busy_s": 0.015},
                            "jit_decode": {"calls": 4, "span_s": 0.03, "busy_s": 0.025}},
                           engines, wall=0.1)
    assert line.index("jit_decode") < line.index("jit_prefill")  # longest span first
    assert "prefill 4 calls, 0.040 s dispatch to results" in line
    assert "decode 4 calls, 0.040 s dispatch to results" in line
    assert "no program running 0.150 s of 0.100 s x 2 device(s)" in line  # 0.2 - 0.05
    assert format_programs({}, engines, wall=0.1).endswith("none (no accelerator?)")
    layout = {"/device:GPU:0": {"Stream #14(Compute)": 120, "Steps": 3}}
    assert ("its device lines: /device:GPU:0: Stream #14(Compute) (120), Steps (3)"
            in format_programs({}, engines, wall=0.1, layout=layout))
    by_kernels = format_programs(
        {"jit_prefill": {"calls": None, "span_s": None, "busy_s": 0.012, "kernels": 40},
         "jit_decode": {"calls": None, "span_s": None, "busy_s": 0.02, "kernels": 9}},
        engines, wall=0.1)
    assert "jit_decode 9 kernels, busy 0.020 s; jit_prefill 40 kernels, busy 0.012 s" in by_kernels
    assert "no program running" not in by_kernels


@pytest.mark.slow
def test_trace_adds_one_rollout_kept_out_of_the_medians():
    """``--trace``: one more rollout under the profiler, marked, with its device time by
    program (none on the CPU backend), and the summary's medians from the others alone."""
    report = main(["--config", "experiments/smoke.py", "--warmup", "1", "--rollouts", "1",
                   "--trace"])
    runs = report["variants"]["base"]["rollouts"]
    assert [r["traced"] for r in runs] == [False, True]
    assert runs[1]["device_programs"] == {} and "device_programs" not in runs[0]
    assert report["variants"]["base"]["summary"]["wall_s"] == pytest.approx(runs[0]["wall_s"])
