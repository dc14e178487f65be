"""Every link and repository path in the hand-written docs points at something that exists.

Checked files: README.md, docs/*.md, benchmarks/README.md and the README.md files of results/
(the run files' own reports are records of their day and are not checked). In each:

* every relative markdown link ``[text](target)`` or ``![alt](target)``, resolved against the
  file's folder (``#anchor`` and ``?query`` parts dropped; web and mail links skipped);
* every repository path inside backquotes that starts with ``results/``, ``benchmarks/`` or
  ``docs/`` (also inside a backquoted command: ``python benchmarks/speed/engine.py --small``),
  resolved against the repository root. Shell braces are expanded (``run{,_s1}``), globs must
  match something, and paths with a placeholder (``$OUT``, ``NAME``, ``<dir>``, ``...``) or
  that a command creates (``--out``, ``--json``, ``>``) are skipped.

Nothing is imported or run: it reads the markdown files only.
"""

from __future__ import annotations

import glob
import itertools
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PREFIXES = ("results/", "benchmarks/", "docs/")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
# an argument after which a path is an output the command writes, not an input
OUTPUT_FLAGS = {"--out", "--json", "--dir", "--workdir", "--results", "-o", ">", ">>", "pack"}


def checked_files(repo: pathlib.Path = REPO) -> list[pathlib.Path]:
    """The hand-written markdown files whose links are checked."""
    files = [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
    files += [p for p in [repo / "benchmarks" / "README.md"] if p.exists()]
    files += sorted((repo / "results").glob("**/README.md"))
    return [p for p in files if p.exists()]


def _expand_braces(text: str) -> list[str]:
    """Shell brace expansion of the first ``{a,b}`` group, recursively: ``x{,_s1}`` -> x, x_s1."""
    match = re.search(r"\{([^{}]*,[^{}]*)\}", text)
    if not match:
        return [text]
    head, tail = text[:match.start()], text[match.end():]
    return list(itertools.chain.from_iterable(
        _expand_braces(head + part + tail) for part in match.group(1).split(",")))


def _is_placeholder(path: str) -> bool:
    """A path written as a pattern for the reader to fill in, not a file of the repository."""
    if any(c in path for c in "$<>%") or "..." in path or "…" in path:
        return True
    # an upper-case segment without an extension: results/NAME, benchmarks/jobs/JOBS
    return any(re.fullmatch(r"[A-Z][A-Z0-9_]*", seg) for seg in path.split("/"))


def _clean(token: str) -> str:
    """The path part of a token: quotes, trailing punctuation and ``:name`` suffixes dropped."""
    token = token.strip("\"'()[],;")
    token = re.sub(r"(\.(?:py|sh|md|json|jsonl|txt|png|log)):[\w.\-]*$", r"\1", token)
    return token.rstrip(".:,;")


def repo_paths_in_code(span: str) -> list[str]:
    """The repository paths a backquoted span names (inputs only, see the module docstring)."""
    tokens = span.split()
    paths = []
    for i, raw in enumerate(tokens):
        token = raw.split("=", 1)[1] if raw.startswith("--") and "=" in raw else raw
        token = _clean(token)
        if not token.startswith(PREFIXES):
            continue
        if i and tokens[i - 1] in OUTPUT_FLAGS:
            continue
        if _is_placeholder(token):
            continue
        paths.append(token)
    return paths


def broken_links(path: pathlib.Path, repo: pathlib.Path = REPO) -> list[str]:
    """Every link or repository path of the markdown file ``path`` that does not resolve."""
    text = path.read_text(encoding="utf-8")
    problems = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http:, https:, mailto: and anchors on the same page
        local = target.split("#", 1)[0].split("?", 1)[0]
        if local and not (path.parent / local).exists():
            problems.append(f"{path.relative_to(repo)}: link ({target}) does not resolve")
    spans = [m.group(2) for m in CODE_SPAN.finditer(FENCE.sub("", text))]
    spans += [block for block in FENCE.findall(text)]
    for span in spans:
        for written in repo_paths_in_code(span):
            for candidate in _expand_braces(written):
                if any(c in candidate for c in "*?["):
                    if glob.glob(str(repo / candidate)):
                        continue
                elif (repo / candidate).exists():
                    continue
                problems.append(f"{path.relative_to(repo)}: `{written}` does not exist")
                break
    return problems


@pytest.mark.parametrize("doc", checked_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_and_repository_path_resolves(doc):
    assert broken_links(doc) == []


def test_the_checked_files_include_the_results_readme():
    names = {str(p.relative_to(REPO)) for p in checked_files()}
    assert {"README.md", "docs/RESULTS.md", "results/README.md"} <= names


def test_a_broken_link_or_path_is_reported(tmp_path):
    """The checker itself: a hand-made tree with one good and one bad item of each kind."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "results" / "run_a").mkdir(parents=True)
    (tmp_path / "results" / "run_a" / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "tool.py").write_text("")
    doc = tmp_path / "docs" / "PAGE.md"
    doc.write_text(
        "[good](../results/run_a/metrics.jsonl) [bad](../results/run_b/metrics.jsonl)\n"
        "![figure](missing.png) [web](https://example.org/x) [anchor](#top)\n"
        "`python benchmarks/tool.py --out results/new_run` `benchmarks/gone.py`\n"
        "`results/run_a{,_s1}/metrics.jsonl` `results/NAME/config.json` `results/*/metrics.jsonl`\n"
        "```bash\npython3 benchmarks/other.py results/run_a\n```\n")
    assert broken_links(doc, tmp_path) == [
        "docs/PAGE.md: link (../results/run_b/metrics.jsonl) does not resolve",
        "docs/PAGE.md: link (missing.png) does not resolve",
        "docs/PAGE.md: `benchmarks/gone.py` does not exist",
        "docs/PAGE.md: `results/run_a{,_s1}/metrics.jsonl` does not exist",
        "docs/PAGE.md: `benchmarks/other.py` does not exist",
    ]


def test_results_readme_names_every_run_set():
    """results/README.md's table has a row for every folder of results/ and no other."""
    text = (REPO / "results" / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([\w.-]+)/` \|", text, re.M))
    on_disk = {p.name for p in (REPO / "results").iterdir() if p.is_dir()}
    assert listed == on_disk


def benchmarks_readme_listing(readme: pathlib.Path) -> dict[str, set[str]]:
    """``{folder: {script names}}`` of benchmarks/README.md: its ``## `folder/` ...`` sections
    and the first backquoted cell of each table row under them."""
    listing: dict[str, set[str]] = {}
    folder = None
    for line in readme.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"^## `([\w-]+)/`", line)
        if heading:
            folder = heading.group(1)
            listing.setdefault(folder, set())
        row = re.match(r"^\| `([\w.-]+)` \|", line)
        if row and folder:
            listing[folder].add(row.group(1))
    return listing


def test_benchmarks_readme_lists_every_script_and_only_those():
    """benchmarks/README.md names each script of each folder (jobs/ holds job lists, not
    scripts), and every name it lists is a file of that folder."""
    listing = benchmarks_readme_listing(REPO / "benchmarks" / "README.md")
    on_disk = {p.name: sorted(f.name for f in p.iterdir() if f.suffix in (".py", ".sh"))
               for p in (REPO / "benchmarks").iterdir() if p.is_dir() and p.name != "jobs"
               and p.name != "__pycache__"}
    assert set(listing) - {"jobs"} == set(on_disk)
    for folder, names in on_disk.items():
        assert sorted(listing[folder]) == names, folder
    loose = [p.name for p in (REPO / "benchmarks").iterdir() if p.is_file()]
    assert len(loose) <= 12, loose  # issue 46: at most 12 loose files at benchmarks/' top
