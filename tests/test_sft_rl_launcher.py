"""``launch/sft_rl.py``: expert recording, SFT and RL from the SFT policy in one command, each
stage the project's own command in its own folder, resumable by running the same command."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, "launch", "sft_rl.py")
SFT = os.path.join(REPO, "experiments", "smoke.py:sft")
RL = os.path.join(REPO, "experiments", "smoke.py")


def _launch(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the stages run on the machine's real devices, as a user's do
    return subprocess.run([sys.executable, LAUNCHER, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_mistakes_are_all_reported_before_anything_starts(tmp_path):
    wd = tmp_path / "p"
    r = _launch("--sft_config", SFT, "--sft_config.sft.max_secs=1", "--sft_config.sft.data=x",
                "--config", RL, "--config.model.name=y", "--config.train.total_steps=two",
                "--workdir", str(wd), timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [line.strip() for line in r.stderr.splitlines()]
    assert "invalid config (4 problems):" in lines
    assert any(line.startswith("--sft_config.sft.max_secs: no such key (did you mean "
                               "--sft_config.sft.max_seconds?)") for line in lines), lines
    assert any(line.startswith("--sft_config.sft.data: set by launch/sft_rl.py itself")
               for line in lines)
    assert any(line.startswith("--config.model.name: set by launch/sft_rl.py itself")
               for line in lines)
    assert any(line.startswith("--config.train.total_steps: must be an int") for line in lines)
    assert not wd.exists()


def test_the_stages_get_their_own_overrides_and_the_pipeline_s_paths(tmp_path):
    wd = tmp_path / "p"
    r = _launch("--sft_config", SFT, "--sft_config.sft.steps=5", "--config", RL,
                "--config.train.total_steps=1", "--workdir", str(wd), "--expert_workers", "3",
                "--dry_run", timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("[sft_rl ")]
    assert [line.split(":")[0] for line in lines] == [
        "[sft_rl 1/3] record babyai experts", "[sft_rl 2/3] SFT",
        "[sft_rl 3/3] RL from the SFT policy"]
    record, sft, rl = (line.split(": ", 1)[1].split() for line in lines)
    assert record[1:] == [os.path.join(REPO, "launch", "record_experts.py"), "--env", "babyai",
                          "--out", str(wd / "experts"), "--config", SFT,
                          "--config.sft.steps=5", "--workers", "3"]
    assert sft[1:] == [os.path.join(REPO, "launch", "sft.py"), "--config", SFT,
                       "--config.sft.steps=5", f"--config.sft.data={wd / 'experts'}",
                       "--workdir", str(wd / "sft")]
    assert rl[1:] == [os.path.join(REPO, "launch", "run.py"), "--config", RL,
                      "--config.train.total_steps=1",
                      f"--config.model.name={wd / 'sft' / 'model'}", "--workdir", str(wd / "rl")]
    assert not wd.exists()  # a dry run starts nothing


def test_sigterm_reaches_the_running_stage_and_its_exit_code_is_returned(tmp_path):
    ready = tmp_path / "ready"
    child = (f"import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); "
             f"open({str(ready)!r}, 'w').close(); time.sleep(60); sys.exit(0)")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.join(REPO, 'launch')!r})
        import sft_rl
        sys.exit(sft_rl.run_stage([sys.executable, "-c", {child!r}]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists()
    proc.send_signal(signal.SIGTERM)  # to the launcher only, as a job's time limit sends it
    assert proc.wait(timeout=30) == 143


@pytest.mark.slow
def test_one_command_records_fine_tunes_and_trains_then_resumes_with_nothing_left(tmp_path):
    wd = tmp_path / "p"
    args = ("--sft_config", SFT, "--sft_config.sft.record_episodes=8", "--config", RL,
            "--config.train.total_steps=1", "--workdir", str(wd), "--expert_workers", "1")
    first = _launch(*args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    with open(wd / "experts" / "babyai.meta.json") as f:
        meta = json.load(f)
    assert meta["episodes"] == 8 and meta["expert"] == "babyai"
    with open(wd / "sft" / "summary.json") as f:
        assert json.load(f)["finished_step"] == 3  # smoke.py:sft: sft.steps = 3
    assert os.path.exists(wd / "sft" / "model" / "config.json")
    with open(wd / "rl" / "config.json") as f:
        assert json.load(f)["model"]["name"] == str(wd / "sft" / "model")
    with open(wd / "rl" / "summary.json") as f:
        assert json.load(f)["finished_step"] == 1
    recorded = os.path.getmtime(wd / "experts" / "babyai.jsonl")

    again = _launch(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[sft_rl 1/3] record babyai experts: done before" in again.stdout
    assert "SFT run already finished at step 3" in again.stdout
    assert "already finished" in again.stdout.split("[sft_rl 3/3]", 1)[1]
    assert os.path.getmtime(wd / "experts" / "babyai.jsonl") == recorded
