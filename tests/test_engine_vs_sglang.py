"""``benchmarks/contenders/engine_vs_sglang.py``: our engine and SGLang's offline engine timed
alike (issue 49 item 3). The derived quantities against a hand-computed case, the warm-up and
round order with injected timings, and a CPU run of our side on the tiny shape with the SGLang
side skipped because ``import sglang`` fails in its process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.contenders.engine_vs_sglang import derive, measure, ratios

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "contenders", "engine_vs_sglang.py")


def test_derive_hand_computed():
    # batch 256, D = 256: T(1) medians 0.05 s, T(257) 0.80 s
    times = {"1": [0.06, 0.05, 0.04], "257": [0.85, 0.75, 0.80]}
    d = derive(times, batch=256, decode_tokens=256)
    assert d["t1_s"] == 0.05 and d["t_long_s"] == 0.80
    assert d["decode_s"] == pytest.approx(0.75)
    assert d["decode_step_ms"] == pytest.approx(0.75 / 256 * 1e3)  # 2.9296875 ms
    assert d["decode_step_ms"] == pytest.approx(2.9296875)
    assert d["decode_tokens_per_s"] == pytest.approx(65536 / 0.75)  # 87,381.33
    assert d["end_to_end_tokens_per_s"] == pytest.approx(256 * 257 / 0.80)  # 82,240
    assert d["end_to_end_tokens_per_s"] == pytest.approx(82240.0)


def test_derive_refuses_a_long_run_no_longer_than_the_short_one():
    with pytest.raises(ValueError, match="not longer"):
        derive({"1": [0.5], "9": [0.5]}, batch=8, decode_tokens=8)


def test_ratios_are_ours_against_sglang():
    ours = {"decode_step_ms": 1.5, "decode_tokens_per_s": 170_000.0,
            "end_to_end_tokens_per_s": 140_000.0}
    sgl = {"decode_step_ms": 3.0, "decode_tokens_per_s": 85_000.0,
           "end_to_end_tokens_per_s": 70_000.0}
    assert ratios(ours, sgl) == {"decode_step": 2.0, "decode_tokens_per_s": 2.0,
                                 "end_to_end_tokens_per_s": 2.0}


def test_measure_warms_up_once_then_alternates_rounds():
    calls: list[int] = []
    clock = iter([9.0, 0.1, 1.1, 0.2, 1.3, 0.3, 1.2])  # warm-up, then (T(1), T(5)) x 3

    def run_batch(n: int) -> tuple[float, int]:
        calls.append(n)
        return next(clock), 4 * n

    out = measure(run_batch, batch=4, decode_tokens=4, repeats=3)
    assert calls == [5, 1, 5, 1, 5, 1, 5]
    assert out == {"warmup_s": 9.0, "times_s": {"1": [0.1, 0.2, 0.3], "5": [1.1, 1.3, 1.2]}}
    d = derive(out["times_s"], batch=4, decode_tokens=4)
    assert d["decode_step_ms"] == pytest.approx((1.2 - 0.2) / 4 * 1e3)
    assert d["end_to_end_tokens_per_s"] == pytest.approx(4 * 5 / 1.2)


def test_measure_refuses_a_short_batch():
    with pytest.raises(RuntimeError, match="EOS was not ignored"):
        measure(lambda n: (0.1, 4 * n - 1), batch=4, decode_tokens=4, repeats=1)


def test_cpu_run_ours_with_sglang_skipped(tmp_path):
    # an "sglang" that cannot be imported, alone on the SGLang process's PYTHONPATH
    fake = tmp_path / "fake_site"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text('raise ImportError("planted: no SGLang")\n')
    out, work = tmp_path / "out.json", tmp_path / "work"
    cmd = [sys.executable, SCRIPT, "--shapes", "tiny", "--engines", "ours,sglang",
           "--batch", "8", "--prompt-len", "16", "--decode-tokens", "8", "--repeats", "2",
           "--workdir", str(work), "--json", str(out)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "SGLANG_PYTHONPATH": str(fake)}
    done = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "sglang skipped: import sglang failed" in done.stdout
    entry = json.loads(out.read_text())["shapes"]["tiny"]
    ours, sgl = entry["ours"], entry["sglang"]
    assert "planted: no SGLang" in sgl["skipped"]
    assert f"PYTHONPATH={str(fake)!r}" in sgl["skipped"]  # its own PYTHONPATH, nothing else
    assert "ours_vs_sglang" not in entry
    assert ours["pid"] != os.getpid()
    times = ours["times_s"]
    assert sorted(times) == ["1", "9"] and all(len(v) == 2 for v in times.values())
    assert {k: ours[k] for k in derive(times, 8, 8)} == derive(times, 8, 8)
    assert ours["decode_step_ms"] > 0 and ours["device"].startswith("cpu")
    # both workers were handed one prompts file; SGLang a dummy-weights config of the shape
    spec_ours = json.loads((work / "ours_tiny_spec.json").read_text())
    spec_sgl = json.loads((work / "sglang_tiny_spec.json").read_text())
    assert spec_ours["prompts_file"] == spec_sgl["prompts_file"]
    with open(spec_ours["prompts_file"]) as f:
        batch_prompts = json.load(f)
    assert len(batch_prompts) == 8 and {len(p) for p in batch_prompts} == {16}
    assert spec_sgl["sglang_load_format"] == "dummy"
    with open(os.path.join(spec_sgl["sglang_model_path"], "config.json")) as f:
        hf = json.load(f)
    assert hf["hidden_size"] == 128 and hf["num_hidden_layers"] == 2
