"""benchmarks/gpu/jobs.sh: lanes, GPU pinning, done markers, time caps, and two drivers that
share one --out on different GPUs running side by side (they once shared a lane lock and took
turns, which cost a GPU call its third seed)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DRIVER = ROOT / "benchmarks" / "gpu" / "jobs.sh"
pytestmark = pytest.mark.skipif(not os.path.exists("/bin/bash") or
                                subprocess.run(["which", "flock"], capture_output=True).returncode,
                                reason="needs bash and flock")


def _jobs(path: pathlib.Path, lines: list[str]) -> pathlib.Path:
    path.write_text("# NAME CAP LANE COMMAND\n\n" + "\n".join(lines) + "\n")
    return path


def _run(jobs: pathlib.Path, out: pathlib.Path, gpus: str, *extra: str
         ) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(DRIVER), "--jobs", str(jobs), "--out", str(out),
                           "--gpu-ids", gpus, *extra], capture_output=True, text=True,
                          timeout=120)


def _printer(name: str, sleep: float = 0.0) -> str:
    return (f'python3 -c "import os, time; time.sleep({sleep}); '
            f'print(\'{name}\', os.environ[\'CUDA_VISIBLE_DEVICES\'], time.time())"')


def test_lanes_pin_gpus_and_a_done_job_is_skipped(tmp_path):
    jobs = _jobs(tmp_path / "jobs.txt", [
        f"first 40 0 {_printer('first')}",
        f"second 40 1 {_printer('second')}",
        f"third 40 2 {_printer('third')}",
    ])
    out = tmp_path / "out"
    done = _run(jobs, out, "4,7")
    assert done.returncode == 0, done.stdout + done.stderr
    seen = {name: gpu for name, gpu, _ in
            (l.split() for f in ("first", "second", "third")
             for l in (out / "logs" / f"{f}.log").read_text().splitlines())}
    # lanes 0 and 2 -> the first listed GPU, lane 1 -> the second
    assert seen == {"first": "4", "second": "7", "third": "4"}
    timings = [json.loads(l) for l in (out / "results" / "timings.jsonl").read_text().splitlines()]
    assert sorted((t["job"], t["gpu"], t["status"]) for t in timings) == [
        ("first", "4", "ok"), ("second", "7", "ok"), ("third", "4", "ok")]
    again = _run(jobs, out, "4,7")
    assert again.returncode == 0
    assert again.stdout.count("(done before)") == 3


def test_a_cap_that_does_not_fit_the_budget_skips_and_a_failure_exits_1(tmp_path):
    jobs = _jobs(tmp_path / "jobs.txt", [
        "fails 40 0 python3 -c 'raise SystemExit(3)'",
        f"too_long 500 1 {_printer('too_long')}",
    ])
    out = tmp_path / "out"
    r = _run(jobs, out, "0,1", "--budget", "100")
    assert r.returncode == 1
    assert "SKIPPED too_long" in r.stdout
    assert not (out / "logs" / "too_long.log").exists()
    assert (out / ".done" / "fails.failed").exists() and not (out / ".done" / "fails").exists()


def test_a_call_clears_only_its_own_jobs_failed_markers(tmp_path):
    """A failed job of this list is tried again (its marker removed at the start); the failed
    markers of jobs this call does not run (another list on the same --out, or a job that
    --only leaves out) survive it."""
    out = tmp_path / "out"
    other = _jobs(tmp_path / "other.txt", ["other_fails 40 0 python3 -c 'raise SystemExit(3)'"])
    assert _run(other, out, "0").returncode == 1
    mine = _jobs(tmp_path / "mine.txt", [
        "mine_fails 40 0 python3 -c 'raise SystemExit(3)'",
        f"mine_left_out 40 0 {_printer('mine_left_out')}"])
    (out / ".done" / "mine_left_out.failed").touch()
    (out / ".done" / "mine_fails.failed").touch()
    r = _run(mine, out, "0", "--only", "^mine_fails$")
    assert r.returncode == 1
    assert (out / ".done" / "other_fails.failed").exists()
    assert (out / ".done" / "mine_left_out.failed").exists()
    assert (out / "logs" / "mine_fails.log").exists()  # run again, and failed again
    fixed = _jobs(tmp_path / "mine.txt", [f"mine_fails 40 0 {_printer('mine_fails')}"])
    assert _run(fixed, out, "0").returncode == 0
    assert not (out / ".done" / "mine_fails.failed").exists()
    assert (out / ".done" / "mine_fails").exists()


def test_two_drivers_on_different_gpus_share_an_out_without_waiting(tmp_path):
    """Each driver's single lane is lane 0; their locks are named by GPU, so the jobs overlap."""
    a = _jobs(tmp_path / "a.txt", [f"job_a 40 0 {_printer('job_a', 2.0)}"])
    b = _jobs(tmp_path / "b.txt", [f"job_b 40 0 {_printer('job_b', 2.0)}"])
    out = tmp_path / "out"
    t0 = time.time()
    pa = subprocess.Popen(["bash", str(DRIVER), "--jobs", str(a), "--out", str(out),
                           "--gpu-ids", "0"], stdout=subprocess.PIPE, text=True)
    pb = subprocess.Popen(["bash", str(DRIVER), "--jobs", str(b), "--out", str(out),
                           "--gpu-ids", "1"], stdout=subprocess.PIPE, text=True)
    assert pa.wait(60) == 0 and pb.wait(60) == 0
    # each driver's closing table lists its own job only, though both (usually) started in one
    # second and write one timings.jsonl (the table was once keyed by the start second alone)
    tables = {"job_a": pa.stdout.read(), "job_b": pb.stdout.read()}
    for name, other in (("job_a", "job_b"), ("job_b", "job_a")):
        table = tables[name].split("job timings of this call")[1]
        assert name in table and other not in table, tables[name]
    ends = {}
    for name in ("job_a", "job_b"):
        _, gpu, end = (out / "logs" / f"{name}.log").read_text().split()
        ends[name] = float(end) - t0
    # one after the other would end >= 4 s apart; side by side they end together
    assert abs(ends["job_a"] - ends["job_b"]) < 1.5, ends


def test_after_waits_for_a_job_of_another_lane_and_skips_when_it_failed(tmp_path):
    jobs = _jobs(tmp_path / "jobs.txt", [
        f"sft 40 0 {_printer('sft', 2.0)}",
        "broken 40 0 python3 -c 'raise SystemExit(3)'",
        f"rl 40 1 after=sft {_printer('rl')}",
        f"rl_of_broken 40 1 after=sft,broken {_printer('rl_of_broken')}",
    ])
    out = tmp_path / "out"
    r = _run(jobs, out, "0,1")
    assert r.returncode == 1, r.stdout + r.stderr
    _, _, sft_end = (out / "logs" / "sft.log").read_text().split()
    _, gpu, rl_time = (out / "logs" / "rl.log").read_text().split()
    # lane 1 would have run `rl` at once; it waited for `sft` (2 s) on lane 0
    assert gpu == "1" and float(rl_time) >= float(sft_end)
    assert "SKIPPED rl_of_broken" in r.stdout
    assert not (out / "logs" / "rl_of_broken.log").exists()
    assert (out / ".done" / "rl_of_broken.failed").exists()


def test_missing_jobs_file_is_a_usage_error(tmp_path):
    r = _run(tmp_path / "nope.txt", tmp_path / "out", "0")
    assert r.returncode == 2 and "--jobs FILE is required" in r.stderr


def _attempts(folder: pathlib.Path, sleep_first: float) -> str:
    """A job that counts its attempts in its own folder (``folder/attempts``) and, on the first
    one, sleeps ``sleep_first`` s (long enough to be cut off by its cap)."""
    return ('python3 -c "import os, sys, time; d = sys.argv[1]; os.makedirs(d, exist_ok=True); '
            "p = os.path.join(d, 'attempts'); n = len(open(p).read()) + 1 "
            "if os.path.exists(p) else 1; open(p, 'a').write('x'); "
            f'time.sleep({sleep_first} if n == 1 else 0); print(\'attempt\', n)" {folder}')


def test_a_resume_job_goes_on_in_its_folder_where_others_start_afresh(tmp_path):
    """Cut off by its cap, a `resume` job is paused (not done); the next call runs it again in the
    same folder, where it finishes. A job without `resume` is moved aside and starts afresh."""
    out = tmp_path / "out"
    jobs = _jobs(tmp_path / "jobs.txt", [
        f"long 2 0 resume {_attempts(out / 'long', 30)}",
        f"plain 2 1 {_attempts(out / 'plain', 30)}",
    ])
    first = _run(jobs, out, "0,1")
    assert first.returncode == 1
    assert "paused (a later call resumes it): long" in first.stdout
    assert "FAILED (timeout): plain" in first.stdout
    second = _run(jobs, out, "0,1")
    assert (out / "long" / "attempts").read_text() == "xx"  # went on in its folder
    assert (out / ".done" / "long").exists()
    log = (out / "logs" / "long.log").read_text()
    assert log.count("=== session of") == 2 and "attempt 2" in log  # one log over both
    assert (out / "plain" / "attempts").read_text() == "x"  # moved aside: attempt 1 again
    assert len(list((out / ".attempts").glob("plain.*"))) == 1
    assert second.returncode == 1 and "FAILED (timeout): plain" in second.stdout
    statuses = [json.loads(l)["status"]
                for l in (out / "results" / "timings.jsonl").read_text().splitlines()
                if json.loads(l)["job"] == "long"]
    assert statuses == ["paused", "ok"]


def _workdir_job(folder: str) -> str:
    """A job that writes ``made`` into the folder it gets as ``--workdir``."""
    return ('python3 -c "import os, sys; d = sys.argv[2]; os.makedirs(d, exist_ok=True); '
            f"open(os.path.join(d, 'made'), 'w').write(d)\" --workdir {folder}")


def test_a_workdir_outside_out_is_refused_before_any_job_starts(tmp_path):
    """A job whose --workdir is not OUT/NAME would leave its files where the driver never
    collects them (a session lost four runs' evaluation episodes this way): refused, exit 2,
    nothing run; `{out}` in a command is --out, so the same jobs file works for any --out."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    jobs = _jobs(tmp_path / "jobs.txt", [
        f"fine 40 0 {_workdir_job('{out}/fine')}",
        f"lost 40 1 {_workdir_job(str(elsewhere / 'lost'))}",
    ])
    refused = _run(jobs, out, "0,1")
    assert refused.returncode == 2
    assert f"job lost writes to --workdir {elsewhere / 'lost'}, not to {out}/lost" in refused.stderr
    assert "job fine" not in refused.stderr
    assert not out.exists() and not elsewhere.exists()  # nothing ran, no folder made
    jobs = _jobs(tmp_path / "jobs.txt", [f"fine 40 0 {_workdir_job('{out}/fine')}"])
    ran = _run(jobs, out, "0")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (out / "fine" / "made").read_text() == f"{out}/fine"


def test_a_sft_rl_pipeline_job_is_collected_as_its_rl_and_sft_runs(tmp_path):
    """A `launch/sft_rl.py` job keeps experts/, sft/ and rl/ in OUT/NAME: its RL run's small
    files reach RESULTS/NAME, its SFT run's and the experts' meta files RESULTS/NAME_sft."""
    out = tmp_path / "out"
    maker = tmp_path / "pipeline.py"
    maker.write_text(
        "import json, os, sys\n"
        "d = sys.argv[2]\n"
        "for part, step in (('sft', 3), ('rl', 7)):\n"
        "    os.makedirs(os.path.join(d, part), exist_ok=True)\n"
        "    for name, value in (('summary.json', {'finished_step': step}),\n"
        "                        ('config.json', {'part': part})):\n"
        "        json.dump(value, open(os.path.join(d, part, name), 'w'))\n"
        "    open(os.path.join(d, part, 'metrics.jsonl'), 'w')"
        ".write(json.dumps({'step': step}) + '\\n')\n"
        "os.makedirs(os.path.join(d, 'experts'))\n"
        "json.dump({'episodes': 8}, open(os.path.join(d, 'experts', 'babyai.meta.json'), 'w'))\n")
    jobs = _jobs(tmp_path / "jobs.txt", [f"pipe 40 0 python3 {maker} --workdir {out}/pipe"])
    done = _run(jobs, out, "0")
    assert done.returncode == 0, done.stdout + done.stderr
    results = out / "results"
    assert json.loads((results / "pipe" / "summary.json").read_text()) == {"finished_step": 7}
    assert json.loads((results / "pipe" / "config.json").read_text()) == {"part": "rl"}
    assert json.loads((results / "pipe_sft" / "summary.json").read_text()) == {"finished_step": 3}
    assert json.loads((results / "pipe_sft" / "babyai.meta.json").read_text()) == {"episodes": 8}
    assert not (results / "pipe" / "babyai.meta.json").exists()


def test_a_large_run_file_reaches_results_compressed(tmp_path):
    """--results gets a run's JSON-lines files over 64 KiB as `X.jsonl.gz` (results/README.md:
    the GPU machine's copy limit), holding the same bytes; a small one stays plain."""
    import gzip

    out = tmp_path / "out"
    maker = tmp_path / "run.py"
    maker.write_text(
        "import json, os, sys\n"
        "d = sys.argv[2]\n"
        "os.makedirs(d, exist_ok=True)\n"
        "with open(os.path.join(d, 'metrics.jsonl'), 'w') as f:\n"
        "    for s in range(400):\n"
        "        f.write(json.dumps({'step': s, 'pad': 'x' * 300}) + '\\n')\n"
        "with open(os.path.join(d, 'trajectories_eval.jsonl'), 'w') as f:\n"
        "    f.write(json.dumps({'step': 0, 'env': 'e', 'task_id': 't', 'reward': 1.0}) + '\\n')\n"
        "json.dump({'finished_step': 400}, open(os.path.join(d, 'summary.json'), 'w'))\n")
    jobs = _jobs(tmp_path / "jobs.txt", [f"big 40 0 python3 {maker} --workdir {out}/big"])
    done = _run(jobs, out, "0")
    assert done.returncode == 0, done.stdout + done.stderr
    collected = out / "results" / "big"
    assert sorted(p.name for p in collected.iterdir()) == [
        "eval_episodes.jsonl", "metrics.jsonl.gz", "summary.json"]
    assert (gzip.decompress((collected / "metrics.jsonl.gz").read_bytes())
            == (out / "big" / "metrics.jsonl").read_bytes())


def test_mem_gives_one_job_its_own_memory_fraction_and_a_bad_one_is_refused(tmp_path):
    """`mem=F` sets that job's XLA_PYTHON_CLIENT_MEM_FRACTION; the other jobs of a GPU keep the
    even share 0.9 / --per-gpu (0.45 with two lanes); after= and mem= combine; a fraction
    outside (0, 0.95] stops the driver before any job starts (exit 2)."""
    show = ('python3 -c "import os; print(os.environ.get(\'XLA_PYTHON_CLIENT_MEM_FRACTION\', '
            '\'unset\'))"')
    jobs = _jobs(tmp_path / "jobs.txt", [
        f"big 40 0 mem=0.6 {show}",
        f"even 40 1 {show}",
        f"small 40 1 after=big mem=.1 resume {show}",
    ])
    out = tmp_path / "out"
    done = _run(jobs, out, "0", "--per-gpu", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    seen = {name: (out / "logs" / f"{name}.log").read_text().split()[-1]
            for name in ("big", "even", "small")}
    assert seen == {"big": "0.6", "even": "0.45", "small": ".1"}
    plan = _run(jobs, tmp_path / "plan", "0", "--per-gpu", "2", "--dry-run")
    assert "plan: big  lane 0, GPU 0, memory 0.6" in plan.stdout
    for bad in ("1.5", "0", "abc", "0.96"):
        refused = _run(_jobs(tmp_path / f"bad_{bad}.txt", [f"x 40 0 mem={bad} {show}"]),
                       tmp_path / f"out_{bad}", "0")
        assert refused.returncode == 2, (bad, refused.stdout)
        assert f"mem={bad} is not a fraction" in refused.stderr
        assert not (tmp_path / f"out_{bad}" / "logs" / "x.log").exists()


def test_archive_packs_the_results_folder_even_when_a_job_fails(tmp_path):
    """--archive FILE: the whole results folder in one tar.gz (a GPU call returns only a few
    files), written before the driver exits 1 for the failed job."""
    import tarfile

    out, results = tmp_path / "out", tmp_path / "res"
    maker = tmp_path / "run.py"
    maker.write_text("import json, os, sys\n"
                     "d = sys.argv[2]\n"
                     "os.makedirs(d, exist_ok=True)\n"
                     "json.dump({'finished_step': 3},\n"
                     "          open(os.path.join(d, 'summary.json'), 'w'))\n")
    jobs = _jobs(tmp_path / "jobs.txt", [f"good 40 0 python3 {maker} --workdir {out}/good",
                                         "bad 40 0 python3 -c 'raise SystemExit(3)'"])
    archive = tmp_path / "ship" / "res.tgz"
    done = _run(jobs, out, "0", "--results", str(results), "--archive", str(archive))
    assert done.returncode == 1, done.stdout + done.stderr
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        summary = json.load(tar.extractfile("res/good/summary.json"))
    assert summary == {"finished_step": 3}
    assert "res/logs/bad.log" in names and "res/timings.jsonl" in names


def test_only_runs_the_selected_jobs_and_refuses_an_unmet_after(tmp_path):
    """--only REGEX: the jobs whose names match run, the others are not started or mentioned;
    a selected job that runs after an unselected job no call has done is refused (exit 2)."""
    jobs = _jobs(tmp_path / "jobs.txt", [
        f"arm_s0 40 0 {_printer('arm_s0')}",
        f"arm_s1 40 0 {_printer('arm_s1')}",
        f"other_s1 40 1 {_printer('other_s1')}",
        f"late_s1 40 1 after=arm_s0 {_printer('late_s1')}",
    ])
    out = tmp_path / "out"
    refused = _run(jobs, out, "0", "--per-gpu", "2", "--only", "_s1$")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "job late_s1 runs after arm_s0" in refused.stderr
    assert not (out / "logs").exists()
    first = _run(jobs, out, "0", "--per-gpu", "2", "--only", "^arm_s0$")
    assert first.returncode == 0, first.stdout + first.stderr
    assert sorted(p.name for p in (out / "logs").glob("*.log")) == ["arm_s0.log"]
    assert "start: arm_s1" not in first.stdout and "skip arm_s1" not in first.stdout
    second = _run(jobs, out, "0", "--per-gpu", "2", "--only", "_s1$")  # arm_s0 is done now
    assert second.returncode == 0, second.stdout + second.stderr
    assert sorted(p.name for p in (out / "logs").glob("*.log")) == [
        "arm_s0.log", "arm_s1.log", "late_s1.log", "other_s1.log"]
    assert "start: arm_s0" not in second.stdout and "skip arm_s0" not in second.stdout


def test_a_resume_job_without_time_for_its_grace_is_skipped_not_run_with_a_negative_limit(tmp_path):
    """With 40 s left a resume job's limit after its 45 s checkpoint grace is -5 s: `timeout`
    refused that (exit 125, "Try 'timeout --help'") and the job counted as failed. It is skipped,
    and the next call with time runs it."""
    out = tmp_path / "out"
    jobs = _jobs(tmp_path / "jobs.txt", [f"late 1300 0 resume {_attempts(out / 'late', 0)}"])
    r = _run(jobs, out, "0", "--budget", "45")
    assert r.returncode == 1
    skipped = re.search(r"SKIPPED late: (\d+) s left of the budget, (-?\d+) s for the job after "
                        r"its 45 s grace", r.stdout)
    assert skipped, r.stdout
    left, limit = int(skipped[1]), int(skipped[2])
    assert left <= 40 and limit == left - 45 < 0
    assert not (out / "late" / "attempts").exists()  # never started
    timing = json.loads((out / "results" / "timings.jsonl").read_text().splitlines()[-1])
    assert (timing["job"], timing["status"]) == ("late", "skipped")
    again = _run(jobs, out, "0")
    assert again.returncode == 0 and (out / "late" / "attempts").read_text() == "x"


def _closing(lines: list[str], sleep: float) -> str:
    """A job that prints ``lines`` (launch/run.py's closing summary) and then takes ``sleep`` s
    to exit, as a run shutting down its servers does."""
    text = "\\n".join(lines)
    return f'python3 -c "import time; print(\'{text}\', flush=True); time.sleep({sleep})"'


def test_a_run_cut_off_after_its_closing_summary_is_done_not_paused(tmp_path):
    """Two 20-turn runs printed `run finished:` as their limit came and were killed while they
    shut down (exit 124): they were called paused, the summary's `outputs:` line given as why,
    and a next call had to start them to hear that they were done. A run whose final evaluation
    is "not a result", or one stopped by SIGTERM, is still paused."""
    out = tmp_path / "out"
    finished = ["run finished: steps 82->120, final horizon 20",
                "  eval @ step 120: avg@4=0.468 (128 tasks)", "  outputs: /tmp/w"]
    invalid = ["run finished: steps 82->120, final horizon 20",
               "  eval @ step 120: not a result: 3 of 512 episodes dropped", "  outputs: /tmp/w"]
    stopped = ["run stopped by SIGTERM: steps 65->85, final horizon 20", "  outputs: /tmp/w"]
    jobs = _jobs(tmp_path / "jobs.txt", [f"ended 2 0 resume {_closing(finished, 30)}",
                                         f"invalid 2 1 resume {_closing(invalid, 30)}",
                                         f"cut 2 2 resume {_closing(stopped, 30)}"])
    r = _run(jobs, out, "0,1,2")
    assert "note: ended reached its limit after 'run finished:'" in r.stdout, r.stdout
    assert "done: ended" in r.stdout and (out / ".done" / "ended").exists()
    assert "paused (a later call resumes it): invalid" in r.stdout
    assert "paused (a later call resumes it): cut" in r.stdout
    rows = {json.loads(l)["job"]: json.loads(l)
            for l in (out / "results" / "timings.jsonl").read_text().splitlines()}
    assert (rows["ended"]["status"], rows["ended"]["exit"]) == ("ok", 124)
    assert rows["invalid"]["status"] == rows["cut"]["status"] == "paused"
    # a session that finished earlier does not make a later cut-off session done
    again = _jobs(tmp_path / "again.txt", [f"ended 2 0 resume {_closing(stopped, 30)}"])
    (out / ".done" / "ended").unlink()
    r2 = _run(again, out, "0")
    assert "paused (a later call resumes it): ended" in r2.stdout, r2.stdout
