"""benchmarks/gpu/carry_run.py: a run folder out of one machine and into the next in parts.

The round trip pack -> emit (one call's parts at a time) -> collect -> groups -> copy-in ->
unpack gives back the run folder byte for byte, less its lock and every checkpoint step but the
latest; a damaged, missing or foreign part is named and nothing is written."""

from __future__ import annotations

import filecmp
import json
import os
import random
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
import carry_run  # noqa: E402

KIB = 1024


def _run_folder(root: Path) -> Path:
    """A run folder shaped as launch/run.py leaves it: small files, two checkpoint steps (and an
    unfinished orbax write), a lock, random bytes that do not compress."""
    run = root / "babyai_curve"
    rng = random.Random(0)
    files = {"config.json": 300, "summary.json": 200, "metrics.jsonl": 5 * KIB,
             "tensorboard/events.out": 3 * KIB, "run.lock": 10,
             "checkpoints/10/params/d/abc": 90 * KIB, "checkpoints/10/opt_state/d/def": 70 * KIB,
             "checkpoints/15/params/d/abc": 90 * KIB, "checkpoints/15/opt_state/d/def": 70 * KIB,
             "checkpoints/15/trainer_state/state.json": 100,
             "checkpoints/20.orbax-checkpoint-tmp-1/params/x": 10 * KIB}
    for name, size in files.items():
        path = run / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(rng.getrandbits(8) for _ in range(size)))
    return run


def _carry(tmp_path: Path, run: Path, part_mib: float = 40 / 1024) -> tuple[Path, dict]:
    """Pack on "machine 1", emit every call's parts into its own returned folder, collect them
    here; returns (the local store, its manifest)."""
    stage = tmp_path / "m1_carry"
    assert carry_run.main(["pack", str(run), str(stage), "--part-mib", str(part_mib),
                           "--per-call", "3"]) == 0
    manifest = json.loads((stage / "carry.json").read_text())
    calls = -(-len(manifest["parts"]) // 3)
    store = tmp_path / "here"
    for index in range(calls):
        returned = tmp_path / f"returned_{index}"
        assert carry_run.main(["emit", str(stage), str(returned), str(index)]) == 0
        assert len(list(returned.iterdir())) <= 4  # carry.json and at most 3 parts
        assert carry_run.main(["collect", str(store), str(returned)]) == 0
    return store, manifest


def test_a_run_folder_comes_back_whole_with_only_its_latest_checkpoint(tmp_path, capsys):
    run = _run_folder(tmp_path / "m1")
    store, manifest = _carry(tmp_path, run)
    assert manifest["step"] == 15 and len(manifest["parts"]) >= 5
    assert all(p["bytes"] <= 40 * KIB for p in manifest["parts"])
    assert "complete" in capsys.readouterr().out.splitlines()[-1]
    assert carry_run.main(["groups", str(store), "--mib", str(100 / 1024)]) == 0
    folders = sorted(store.glob("in-*"))
    assert len(folders) >= 2 and all(
        sum(f.stat().st_size for f in d.glob("part-*")) <= 100 * KIB for d in folders)
    stage2 = tmp_path / "m2_carry"  # the copy-in of each carried folder on machine 2
    stage2.mkdir()
    for folder in folders:
        for f in folder.iterdir():
            shutil.copyfile(f, stage2 / f.name)
    assert carry_run.main(["unpack", str(stage2), str(tmp_path / "m2")]) == 0
    back = tmp_path / "m2" / "babyai_curve"
    expected = {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()}
    expected -= {"run.lock", "checkpoints/10/params/d/abc", "checkpoints/10/opt_state/d/def",
                 "checkpoints/20.orbax-checkpoint-tmp-1/params/x"}
    got = {str(p.relative_to(back)) for p in back.rglob("*") if p.is_file()}
    assert got == expected
    assert all(filecmp.cmp(run / name, back / name, shallow=False) for name in expected)
    assert [p.name for p in (tmp_path / "m2").iterdir()] == ["babyai_curve"]  # no scratch left


def test_a_damaged_or_missing_part_is_named_and_nothing_is_unpacked(tmp_path, capsys):
    run = _run_folder(tmp_path / "m1")
    store, manifest = _carry(tmp_path, run)
    first, second = (store / p["name"] for p in manifest["parts"][:2])
    data = bytearray(first.read_bytes())
    data[100] ^= 0xFF
    first.write_bytes(bytes(data))
    second.unlink()
    parent = tmp_path / "m2"
    assert carry_run.main(["unpack", str(store), str(parent)]) == 1
    err = capsys.readouterr().err
    assert f"missing parts ['{second.name}']" in err and f"damaged parts ['{first.name}']" in err
    assert not parent.exists()
    # collect refuses the damaged copy and says which emit call to run again
    returned = tmp_path / "bad_return"
    returned.mkdir()
    shutil.copyfile(first, returned / first.name)
    assert carry_run.main(["collect", str(store), str(returned)]) == 1
    out, err = capsys.readouterr()
    assert "emit indexes still to call: [0]" in out and first.name in err


def test_an_existing_run_is_kept_unless_replace_and_a_foreign_part_is_refused(tmp_path, capsys):
    run = _run_folder(tmp_path / "m1")
    store, manifest = _carry(tmp_path, run)
    parent = tmp_path / "m2"
    (parent / "babyai_curve").mkdir(parents=True)
    (parent / "babyai_curve" / "mine").write_text("earlier")
    assert carry_run.main(["unpack", str(store), str(parent)]) == 1
    assert "pass --replace" in capsys.readouterr().err
    assert carry_run.main(["unpack", str(store), str(parent), "--replace"]) == 0
    assert (parent / "babyai_curve" / "summary.json").is_file()
    aside = [p for p in parent.iterdir() if p.name.startswith("babyai_curve.before-carry.")]
    assert len(aside) == 1 and (aside[0] / "mine").read_text() == "earlier"
    # a second packing of the run (another step) does not mix with the first
    (run / "checkpoints" / "15" / "params" / "d" / "abc").write_bytes(os.urandom(90 * KIB))
    other = tmp_path / "m1_again"
    assert carry_run.main(["pack", str(run), str(other), "--part-mib", str(40 / 1024)]) == 0
    assert carry_run.main(["collect", str(store), str(other)]) == 1
    assert "another packing" in capsys.readouterr().err


def test_pack_refuses_a_folder_that_is_not_a_run_and_a_stage_in_use(tmp_path, capsys):
    assert carry_run.main(["pack", str(tmp_path / "nothing"), str(tmp_path / "s")]) == 1
    run = _run_folder(tmp_path / "m1")
    stage = tmp_path / "s"
    stage.mkdir()
    (stage / "part-00000").write_bytes(b"x")
    assert carry_run.main(["pack", str(run), str(stage)]) == 1
    assert "not empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        carry_run.main(["emit"])


@pytest.mark.slow
def test_a_carried_run_resumes_on_the_next_machine_from_its_checkpoint(tmp_path, compile_cache_env):
    """A real run (the tiny temperature-1 BabyAI config, 2 steps) carried in parts to another
    folder, as to the next session's machine, goes on there at step 3 from its checkpoint and
    ends with each step once in its metrics."""
    import subprocess

    from agentrl_common.jsonl_files import read_records

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, **compile_cache_env, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # the unit suite's 8 host devices are not a run's

    def run(workdir: Path, steps: int) -> str:
        done = subprocess.run(
            [sys.executable, "launch/run.py", "--config", "experiments/babyai.py:choice_tiny_t1",
             "--workdir", str(workdir), f"--config.train.total_steps={steps}",
             "--config.train.save_every=1"],
            cwd=root, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    first = tmp_path / "machine1" / "babyai_curve"
    run(first, 2)
    store, manifest = _carry(tmp_path, first, part_mib=4)
    assert manifest["step"] == 2 and len(manifest["parts"]) >= 2
    second = tmp_path / "machine2"
    assert carry_run.main(["unpack", str(store), str(second)]) == 0
    out = run(second / "babyai_curve", 3)
    assert "resumed at step 2" in out
    summary = json.loads((second / "babyai_curve" / "summary.json").read_text())
    assert summary["finished_step"] == 3
    steps = [r["step"] for r in read_records(str(second / "babyai_curve" / "metrics.jsonl"))
             if "rollout/mean_reward" in r]
    assert sorted(set(steps)) == [1, 2, 3] and len(steps) == 3, steps
