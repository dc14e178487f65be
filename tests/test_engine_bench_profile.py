"""``benchmarks/speed/engine.py --profile``: the traced round's device time by XLA program in
the report (as ``rollout_profile.py --trace``). A CPU trace has no device lines, so the trace
reader is replaced by a hand-built GPU trace whose program times are worked out by hand."""

from __future__ import annotations

import json

import pytest


def _gpu_trace() -> list[dict]:
    """Two decode calls of 40 and 30 us on the module line; kernels [0, 10) + [5, 25) in the
    first (busy 25 us) and [100, 110) in the second."""
    ev = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
          {"ph": "M", "pid": 1, "tid": 7, "name": "thread_name", "args": {"name": "Stream #7"}},
          {"ph": "M", "pid": 1, "tid": 11, "name": "thread_name",
           "args": {"name": "XLA Modules"}}]
    for ts, dur in ((0.0, 10.0), (5.0, 20.0), (100.0, 10.0)):
        ev.append({"ph": "X", "pid": 1, "tid": 7, "name": "fusion", "ts": ts, "dur": dur})
    for ts, dur in ((0.0, 40.0), (95.0, 30.0)):
        ev.append({"ph": "X", "pid": 1, "tid": 11, "name": "jit_decode(2)", "ts": ts,
                   "dur": dur})
    return ev


def test_profile_puts_the_device_time_by_program_in_the_report(tmp_path, monkeypatch, capsys):
    from benchmarks.speed import devtime, engine

    seen = []

    def fake_trace_events(log_dir: str) -> list[dict]:
        seen.append(log_dir)
        return _gpu_trace()

    monkeypatch.setattr(devtime, "trace_events", fake_trace_events)
    out = tmp_path / "engine.json"
    report = engine.main(["--small", "--skip", "naive,hf,reuse", "--bandwidth", "1e11",
                          "--profile", str(tmp_path / "trace"), "--json", str(out)])
    programs = report["engine"]["device_programs"]
    assert seen == [str(tmp_path / "trace" / "auto_auto_while")]  # the variant's own folder
    assert programs["jit_decode"]["calls"] == 2 and programs["jit_decode"]["kernels"] == 3
    assert programs["jit_decode"]["span_s"] == pytest.approx(70e-6)
    assert programs["jit_decode"]["busy_s"] == pytest.approx(35e-6)
    assert report["engine"]["device_layout"] == {
        "/device:GPU:0": {"Stream #7": 3, "XLA Modules": 2}}
    assert json.loads(out.read_text())["engine"]["device_programs"] == programs
    assert "jit_decode: 2 calls, device span 0.070 ms, kernels busy 0.035 ms" in \
        capsys.readouterr().out


def test_without_profile_the_report_has_no_device_programs():
    from benchmarks.speed import engine

    report = engine.main(["--small", "--skip", "naive,hf,reuse", "--bandwidth", "1e11"])
    assert "device_programs" not in report["engine"]
