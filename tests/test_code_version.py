"""The code a session ran (``training/outputs/code_version.py``) and ``run_code.py``'s match of
it against commits: in a throw-away git repository, the working tree's digest equals the one
computed from git's objects for the commit, and an edit tells them apart."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from agentrl_jax.training.config.experiment import base_config, to_run_config
from agentrl_jax.training.outputs import code_version as cv
from agentrl_jax.training.outputs.run_output import RunOutput, SessionEnd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks",
                                "analysis"))
import run_code  # noqa: E402

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def test_digest_by_hand_and_in_path_order():
    expected = hashlib.sha256(b"a/x.py\x00one\x00b.py\x00two\x00").hexdigest()
    assert cv.digest([("b.py", b"two"), ("a/x.py", b"one")]) == expected
    assert cv.digest([("a/x.py", b"one"), ("b.py", b"two")]) == expected
    # the separators keep a path from running into its bytes
    assert cv.digest([("a", b"b.py")]) != cv.digest([("ab.py", b"")])


def _git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    for rel, text in {"agentrl_jax/a.py": "A = 1\n", "agentrl_jax/sub/b.py": "B = 2\n",
                      "agentrl_common/c.py": "C = 3\n", "environments/e.py": "E = 4\n",
                      "agentrl_jax/notes.md": "not code\n", "launch/run.py": "outside\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    _git(root.parent, "init", "-q", str(root))
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return root


@needs_git
def test_the_tree_and_its_commit_agree_and_an_edit_tells_them_apart(repo):
    cv.code_version.cache_clear()
    head = _git(repo, "rev-parse", "HEAD")
    files = sorted(cv.source_files(str(repo)))
    assert files == ["agentrl_common/c.py", "agentrl_jax/a.py", "agentrl_jax/sub/b.py",
                     "environments/e.py"]
    (repo / "agentrl_jax" / "__pycache__").mkdir()
    (repo / "agentrl_jax" / "__pycache__" / "a.py").write_text("cache")  # skipped
    version = cv.code_version(str(repo))
    assert version == {"source_sha256": run_code.commit_digest(str(repo), head),
                       "git_commit": head, "git_dirty": False}
    # a file outside the packages changes nothing
    (repo / "launch" / "run.py").write_text("edited\n")
    assert cv.source_digest(str(repo)) == version["source_sha256"]
    (repo / "agentrl_jax" / "a.py").write_text("A = 10\n")
    cv.code_version.cache_clear()
    edited = cv.code_version(str(repo))
    assert edited["git_dirty"] is True and edited["git_commit"] == head
    assert edited["source_sha256"] != version["source_sha256"]
    # a copy without .git (a GPU machine's tree): the digest alone
    copy = repo.parent / "copy"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))
    cv.code_version.cache_clear()
    assert cv.code_version(str(copy)) == {"source_sha256": edited["source_sha256"]}
    cv.code_version.cache_clear()


@needs_git
def test_run_code_names_the_commit_a_session_ran(repo, tmp_path, capsys):
    head = _git(repo, "rev-parse", "HEAD")
    committed = run_code.commit_digest(str(repo), head)
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"sessions": [
        {"ended": "t0"},
        {"ended": "t1", "code": {"source_sha256": committed}},
        {"ended": "t2", "code": {"source_sha256": "0" * 64, "git_commit": head,
                                 "git_dirty": True}}]}))
    assert run_code.main([str(run), "--repo", str(repo), "--commits", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("no code recorded (written before the field)")
    assert lines[1].endswith(f"= the sources of {head[:10]}")
    assert lines[2].endswith(f"no commit of the last 1; ran from a checkout at {head[:10]} "
                             "with edits")


def test_a_session_record_carries_the_code():
    output = RunOutput(to_run_config(base_config()), "/tmp/unused")
    record = output.session_record(SessionEnd(0, 0, "total_steps", []))
    assert record["code"] == cv.code_version()
    assert record["code"]["source_sha256"] == cv.source_digest()
