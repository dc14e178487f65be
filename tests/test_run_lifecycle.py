"""The main job as a user meets it: progress lines for every long phase, a finished run
started again, ``summary.json`` merged across sessions, evaluation sized by ``k x tasks`` and
Ctrl-C.

One finished smoke run (tiny random model, real BabyAI + TextCraft servers, 1 step) is shared by
the tests of this module; ``--config.progress_seconds=0`` makes the plain progress lines (what a
CI log shows) appear on every change, so short phases show them too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from urllib.parse import urlparse

import pytest

from agentrl_common.jsonl_files import read_records
from agentrl_jax.training.config.experiment import to_run_config
from agentrl_jax.training.outputs.code_version import source_digest
from agentrl_jax.training.runtime.services import engine_slots, max_episodes_per_round
from agentrl_jax.training.runtime.policy import checkpoint_steps
from agentrl_jax.training.outputs.summary import merge_summary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = ["--config", "experiments/smoke.py", "--config.progress_seconds=0"]


def _env(cache_env: dict[str, str]) -> dict[str, str]:
    """The subprocesses' environment: the session's JAX compilation cache (``cache_env``,
    tests/conftest.py), so the runs after the first load its programs instead of compiling."""
    env = dict(os.environ, **cache_env)
    env.pop("XLA_FLAGS", None)  # the job itself runs on the machine's real devices
    return env


def _launch(script: str, cache_env: dict[str, str], *args: str,
            timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script, *args], cwd=REPO, env=_env(cache_env),
                          capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _rows(path: str) -> list[dict]:
    """The rows of ``path``, or of its gzip log ``path.gz`` (the trainer's trajectories)."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    return read_records(path)


def _work(path: str, first: int | None = None) -> tuple[int, int]:
    """(assistant turns, generated tokens) of the (``first``) episodes logged in ``path``."""
    episodes = _rows(path)[:first]
    return sum(t["num_turns"] for t in episodes), sum(sum(t["loss_mask"]) for t in episodes)


def _last_count(out: str, prefix: str) -> tuple[int, int]:
    """(turns, tokens) of the last progress line starting with ``prefix``:
    ``"<prefix>, 8 turns, 192 tokens (1.2 s)"``."""
    line = [ln for ln in out.splitlines() if ln.startswith(prefix)][-1]
    words = line[len(prefix):].replace(",", " ").split()
    return int(words[words.index("turns") - 1]), int(words[words.index("tokens") - 1])


def _lines(path: str) -> int:
    return len(_rows(path))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, compile_cache_env) -> tuple[str, str]:
    """(workdir, stdout) of a finished one-step smoke run (checkpoint 1, final eval at step 1)."""
    workdir = str(tmp_path_factory.mktemp("lifecycle") / "run")
    out = _ok(_launch("launch/run.py", compile_cache_env, *SMOKE, "--workdir", workdir,
                      "--config.train.total_steps=1"))
    return workdir, out


# ----------------------------------------------------------------------------- progress
@pytest.mark.slow
def test_every_long_phase_reports_progress(finished_run):
    workdir, out = finished_run
    phases = ["starting environment servers ['babyai', 'textcraft']",
              "loading model random 2 layers x 64 hidden (tokenizer of smollm2)", "starting rollout backend embedded",
              "first update (compiles the train step)", "saving checkpoint step 1"]
    for phase in phases:
        start, end = out.find(f"{phase} ...\n"), out.find(f"{phase} ... done in ")
        assert 0 <= start < end, f"{phase!r} not announced and timed:\n{out}"
    # the compilation is announced before the first update and timed before its step line
    assert out.find("first update (compiles the train step) ... done in") < out.find("[step 1/1]")
    # per-episode progress of the rollout (2 tasks x 2 samples) and of the final evaluation
    # (smoke: 2 test tasks of each of 2 environments, k=1), then one summary line
    assert _last_count(out, "step 1/1 rollout (horizon 2): 4/4 episodes") == _work(
        os.path.join(workdir, "trajectories_train.jsonl"))
    assert _last_count(out, "eval at step 1: 4/4 episodes") == _work(
        os.path.join(workdir, "trajectories_eval.jsonl"), first=4)  # this run's episodes
    assert "[eval step 1] avg@1=" in out and "over 4 tasks x 1 (4 episodes, dropped 0) in" in out
    assert out.find("eval at step 1: 4/4 episodes") < out.find("[eval step 1]")


# ----------------------------------------------------------------------------- finished runs
@pytest.mark.slow
def test_finished_run_started_again_says_so_and_exits(finished_run, compile_cache_env):
    workdir, _ = finished_run
    files = ["trajectories_eval.jsonl", "trajectories_train.jsonl", "metrics.jsonl"]
    before = {f: _lines(os.path.join(workdir, f)) for f in files}
    summary = open(os.path.join(workdir, "summary.json")).read()
    t0 = time.monotonic()
    out = _ok(_launch("launch/run.py", compile_cache_env, *SMOKE, "--workdir", workdir,
                      "--config.train.total_steps=1", timeout=120))
    assert out == (f"run already finished at step 1 (workdir {workdir}); pass --eval_again to "
                   "evaluate it again, or a larger --config.train.total_steps / "
                   "--config.train.max_seconds to train on\n")
    assert time.monotonic() - t0 < 60  # no model load, no evaluation
    assert {f: _lines(os.path.join(workdir, f)) for f in files} == before
    assert open(os.path.join(workdir, "summary.json")).read() == summary


@pytest.mark.slow
def test_eval_again_evaluates_and_merges_the_summary(finished_run, compile_cache_env):
    workdir, _ = finished_run
    path = os.path.join(workdir, "summary.json")
    summary = json.load(open(path))
    assert summary["finished_step"] == 1 and list(summary["evals"]) == ["1"]
    summary["note"] = "written by hand"  # a field no session writes must survive
    json.dump(summary, open(path, "w"))
    evals_before = _lines(os.path.join(workdir, "trajectories_eval.jsonl"))

    out = _ok(_launch("launch/run.py", compile_cache_env, *SMOKE, "--workdir", workdir,
                      "--config.train.total_steps=1", "--eval_again"))
    assert "resumed at step 1" in out and "[eval step 1] avg@1=" in out
    assert "compiles the train step" not in out and "compiling the train step" not in out
    assert "[step " not in out  # no training
    assert _lines(os.path.join(workdir, "trajectories_eval.jsonl")) == evals_before + 4

    merged = json.load(open(path))
    assert merged["note"] == "written by hand"
    assert merged["start_step"] == 0 and merged["final_step"] == 1
    assert merged["first_reward"] == summary["first_reward"]
    assert merged["mean_step_seconds"] == summary["mean_step_seconds"]  # no new steps
    assert list(merged["evals"]) == ["1"] and merged["evals"]["1"]["num_tasks"] == 4
    assert [(s["start_step"], s["final_step"], s["steps"], s["stopped"], s["evals"])
            for s in merged["sessions"]] == [(0, 1, 1, "total_steps", [1]),
                                             (1, 1, 0, "evaluate_only", [1])]
    assert checkpoint_steps(os.path.join(workdir, "checkpoints")) == [1]


def _checkpoint_extras(workdir: str, step: int) -> dict:
    """The trainer's ``extra_state`` saved with checkpoint ``step`` (orbax's JSON item)."""
    with open(os.path.join(workdir, "checkpoints", str(step), "trainer_state", "metadata")) as f:
        return json.load(f)["extra"]


@pytest.mark.slow
def test_time_budget_counts_every_session(finished_run, tmp_path, compile_cache_env):
    """``train.max_seconds`` bounds the training loop over all sessions of a run: checkpoints
    carry the seconds trained, so a run killed after a checkpoint and started again spends only
    what is left, and a run whose budget is spent is finished (a larger budget trains on)."""
    workdir, _ = finished_run
    trained = _checkpoint_extras(workdir, 1)["train_seconds"]
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    # the loop's seconds, the final evaluation not counted (it ran after the checkpoint)
    assert 0 < trained <= summary["train_seconds"] < trained + 5
    budget = [f"--config.train.max_seconds={trained / 2:.3f}", "--config.train.total_steps=3"]

    # its summary says the budget is spent: finished, nothing runs
    out = _ok(_launch("launch/run.py", compile_cache_env, *SMOKE, "--workdir", workdir,
                      *budget, timeout=120))
    assert out.startswith("run already finished at step 1"), out

    # killed after checkpoint 1 (no summary yet): the checkpoint's seconds count, no step runs
    killed = str(tmp_path / "killed")
    shutil.copytree(workdir, killed)
    os.remove(os.path.join(killed, "summary.json"))
    out = _ok(_launch("launch/run.py", compile_cache_env, *SMOKE, "--workdir", killed, *budget))
    assert "resumed at step 1" in out and "already spent" in out, out
    assert "[step 2/3]" not in out and "compiles the train step" not in out
    assert "compiling the train step" not in out
    rows = [json.loads(line) for line in open(os.path.join(killed, "metrics.jsonl"))]
    assert [r["step"] for r in rows if "train/horizon" in r] == [1]  # the first run's step only
    after = json.load(open(os.path.join(killed, "summary.json")))
    assert after["finished_step"] == 1 and "1" in after["evals"]  # evaluated, then finished
    assert after["train_seconds"] == pytest.approx(trained, abs=1.0)


def test_merge_summary_keeps_old_fields_and_merges_evals():
    old = {"workdir": "w", "start_step": 0, "final_step": 2, "first_reward": 0.1,
           "last_reward": 0.2, "mean_step_seconds": 10.0, "custom": [1, 2],
           "evals": {"0": {"avg_at_k": 0.0}, "2": {"avg_at_k": 0.25}},
           "sessions": [{"start_step": 0, "final_step": 2, "steps": 2,
                         "mean_step_seconds": 10.0}]}
    new = {"workdir": "w", "start_step": 2, "final_step": 5, "first_reward": 0.3,
           "last_reward": 0.5, "mean_step_seconds": 20.0, "finished_step": 5,
           "evals": {2: {"avg_at_k": 0.5}, 5: {"avg_at_k": 0.75}},
           "sessions": [{"start_step": 2, "final_step": 5, "steps": 3,
                         "mean_step_seconds": 20.0}]}
    merged = merge_summary(old, new)
    assert merged["custom"] == [1, 2]  # only the old summary has it
    assert (merged["start_step"], merged["first_reward"]) == (0, 0.1)  # the first session's
    assert (merged["final_step"], merged["last_reward"], merged["finished_step"]) == (5, 0.5, 5)
    # evals by step, a step evaluated again takes the new result; keys as JSON writes them
    assert merged["evals"] == {"0": {"avg_at_k": 0.0}, "2": {"avg_at_k": 0.5},
                               "5": {"avg_at_k": 0.75}}
    assert [s["start_step"] for s in merged["sessions"]] == [0, 2]
    assert merged["mean_step_seconds"] == pytest.approx((2 * 10.0 + 3 * 20.0) / 5)  # 16 s
    assert merge_summary({}, new) == {**new, "evals": {"2": {"avg_at_k": 0.5},
                                                       "5": {"avg_at_k": 0.75}}}


# ----------------------------------------------------------------------------- launch/eval.py
def test_eval_episodes_size_the_engine():
    from agentrl_jax.models.config import ModelConfig

    from experiments.smoke import get_config
    tiny = ModelConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=16)
    c = to_run_config(get_config())
    # smoke's own rounds: 2 tasks x 2 samples (train), 2 tasks x 1 sample x 2 envs (eval)
    assert max_episodes_per_round(c) == 4
    assert engine_slots(c, tiny, backend="gpu") == 4
    assert engine_slots(c, tiny, backend="gpu", episodes=6) == 6  # eval --k 3 --tasks 1
    assert engine_slots(c, tiny, backend="gpu", episodes=100) == 16  # rollout.max_batch
    assert engine_slots(c, tiny, backend="gpu", episodes=1) == 1


@pytest.mark.slow
def test_eval_script_sized_by_k_and_tasks_with_progress(finished_run, tmp_path,
                                                        compile_cache_env):
    workdir, _ = finished_run
    output = str(tmp_path / "eval.json")
    out = _ok(_launch("launch/eval.py", compile_cache_env, *SMOKE, "--checkpoint",
                      os.path.join(workdir, "checkpoints"), "--k", "3", "--tasks", "1",
                      "--horizon", "2", "--output", output))
    # 1 test task of each of the 2 environments x k=3: 6 episodes, 6 slots (the config's
    # train.* values would give 4)
    assert "rollout engine: 6 decode slots for 6 episodes per round" in out
    for phase in ("loading model smollm2", "restoring checkpoint", "starting rollout backend"):
        assert f"{phase}" in out and out.find(f"{phase}") < out.find("eval (test, k=3)")
    assert "loading model smollm2 ... done in" in out
    assert _last_count(out, "eval (test, k=3): 6/6 episodes") == _work(
        output.replace(".json", "_trajectories.jsonl"))
    assert "evaluated 2 tasks x k=3 (6 episodes, horizon 2) in" in out
    result = json.load(open(output))
    assert (result["num_tasks"], result["k"], result["step"]) == (2, 3, 1)


# ----------------------------------------------------------------------------- Ctrl-C
def _port_open(url: str) -> bool:
    parsed = urlparse(url)
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((parsed.hostname, parsed.port)) == 0


def _signal_when(cache_env: dict[str, str], args: list[str], marker: str, sig: int,
                 stderr_path) -> tuple[int, str, list[str]]:
    """Start ``launch/run.py args``, send ``sig`` once a stdout line contains ``marker`` (the
    environment servers checked up at that moment); (exit code, the stdout after the signal,
    the servers' URLs). Stderr goes to ``stderr_path``."""
    with open(stderr_path, "w") as err:
        # the child starts with SIGINT's default action whatever the suite inherited (a suite
        # run in the background, e.g. `nohup ... &`, has SIGINT ignored, and Python then never
        # installs its Ctrl-C handler: the run would train on to its last step)
        proc = subprocess.Popen([sys.executable, "launch/run.py", *args], cwd=REPO,
                                env=_env(cache_env),
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                                stdout=subprocess.PIPE, stderr=err, text=True)
        urls, seen = [], False
        try:
            for line in proc.stdout:
                if line.startswith("environment servers: "):
                    urls = [w.rstrip(",") for w in line.split() if w.startswith("http://")]
                if marker in line:
                    seen = True
                    break
            assert seen and urls, f"the run ended before {marker!r}"
            assert all(_port_open(u) for u in urls)
            proc.send_signal(sig)
            out = proc.stdout.read()
            return proc.wait(timeout=180), out, urls
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.slow
def test_ctrl_c_stops_cleanly(tmp_path, compile_cache_env):
    """SIGINT while the first rollout is in flight: one line on stderr, no traceback, no
    unretrieved futures, the environment servers gone, exit code 130."""
    stderr_path = tmp_path / "stderr.txt"
    # 8-turn episodes of up to 100 tokens: the rollout lasts a few seconds
    args = [*SMOKE, "--workdir", str(tmp_path / "run"), "--config.train.total_steps=50",
            "--config.horizon.phases=(8,)", "--config.rollout.max_new_tokens=100"]
    code, _, urls = _signal_when(compile_cache_env, args, "rollout (horizon 8): 0/",
                                 signal.SIGINT, stderr_path)
    stderr = stderr_path.read_text()
    assert code == 130, stderr
    assert "Traceback" not in stderr and "never retrieved" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted (Ctrl-C) before the first "
                                                   "training step;"), stderr
    assert not any(_port_open(u) for u in urls)  # the servers were stopped


@pytest.mark.slow
def test_sigterm_checkpoints_the_last_step_and_the_run_resumes(tmp_path, compile_cache_env):
    """SIGTERM while step 3's rollout is in flight, with no checkpoint due before step 100: the
    rollout is cancelled, step 2 is checkpointed, the run ends without its final evaluation
    (one line, exit code 143, environment servers gone), and the same command resumes at step
    2 and trains step 3 only."""
    workdir = str(tmp_path / "run")
    args = [*SMOKE, "--workdir", workdir, "--config.train.save_every=100",
            "--config.horizon.phases=(8,)", "--config.rollout.max_new_tokens=100"]
    stderr_path = tmp_path / "stderr.txt"
    code, out, urls = _signal_when(compile_cache_env, [*args, "--config.train.total_steps=50"],
                                   "step 3/50 rollout (horizon 8): 0/", signal.SIGTERM,
                                   stderr_path)
    stderr = stderr_path.read_text()
    assert code == 143, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip() and "WARNING" not in ln]
    assert lines == [f"stopped by SIGTERM after step 2/50, without the final evaluation; the "
                     f"same command resumes from the checkpoint of step 2 (workdir {workdir})"]
    assert "SIGTERM: stopping at a safe point (2 steps done;" in out and "[step 3/50]" not in out
    assert "eval at step" not in out  # no final evaluation
    assert checkpoint_steps(os.path.join(workdir, "checkpoints")) == [2]
    assert not any(_port_open(u) for u in urls)
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert "finished_step" not in summary and summary["sessions"][-1]["stopped"] == "terminated"

    out = _ok(_launch("launch/run.py", compile_cache_env, *args, "--config.train.total_steps=3"))
    assert "resumed at step 2" in out and "[step 3/3]" in out and "[step 2/3]" not in out
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [r["step"] for r in rows if "train/horizon" in r] == [1, 2, 3]


@pytest.mark.slow
def test_sigterm_during_the_final_evaluation_says_one_line_and_the_run_evaluates_again(
        tmp_path, compile_cache_env):
    """SIGTERM while the final evaluation runs (it used to end the process at once, exit 143
    with no line): the evaluation is cancelled, one line, exit code 143, the servers gone, the
    run not marked finished; the same command evaluates the step-1 checkpoint again."""
    workdir = str(tmp_path / "run")
    args = [*SMOKE, "--workdir", workdir, "--config.train.total_steps=1",
            "--config.train.eval_horizon=8", "--config.train.eval_tasks=4",
            "--config.rollout.max_new_tokens=100"]
    stderr_path = tmp_path / "stderr.txt"
    code, out, urls = _signal_when(compile_cache_env, args, "eval at step 1: 0/",
                                   signal.SIGTERM, stderr_path)
    stderr = stderr_path.read_text()
    assert code == 143, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip() and "WARNING" not in ln]
    assert lines == [f"stopped by SIGTERM during the final evaluation at step 1/1; the same "
                     f"command evaluates the checkpoint of step 1 again (workdir {workdir})"]
    assert "SIGTERM: stopping at a safe point (1 steps done;" in out
    assert checkpoint_steps(os.path.join(workdir, "checkpoints")) == [1]
    assert not any(_port_open(u) for u in urls)
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert "finished_step" not in summary and summary["sessions"][-1]["stopped"] == "terminated"

    out = _ok(_launch("launch/run.py", compile_cache_env, *args))
    assert "resumed at step 1" in out and "[eval step 1]" in out and "[step " not in out
    assert json.load(open(os.path.join(workdir, "summary.json")))["finished_step"] == 1


@pytest.mark.slow
def test_a_learning_rate_that_blows_up_stops_the_run_in_one_line(tmp_path, compile_cache_env):
    """``learner.learning_rate=1e10`` (it used to log pg_loss=nan from step 3, finish, write
    checkpoints and exit 0): the step whose update goes non-finite stops the run with one
    line, exit code 3, no checkpoint of that step or later, the run not marked finished."""
    workdir = str(tmp_path / "run")
    proc = _launch("launch/run.py", compile_cache_env, *SMOKE, "--workdir", workdir,
                   "--config.learner.learning_rate=1e10", "--config.train.total_steps=4")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "WARNING" not in ln]
    assert len(lines) == 1 and lines[0].startswith("run failed: stopped at step "), lines
    assert "the update went non-finite (" in lines[0], lines
    step = int(lines[0].split("stopped at step ")[1].split(":")[0])
    assert f"[step {step}/4]" not in proc.stdout
    assert checkpoint_steps(os.path.join(workdir, "checkpoints")) == list(range(1, step))
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert "finished_step" not in summary and summary["sessions"][-1]["stopped"] == "run_failed"
    # a failed session records the code it ran, as a finished one does
    assert summary["sessions"][-1]["code"]["source_sha256"] == source_digest()
