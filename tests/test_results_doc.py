"""docs/RESULTS.md's results tables against the committed run files (issue 50, item 5).

The block between ``<!-- results-table:begin -->`` and ``<!-- results-table:end -->`` is what
``benchmarks/analysis/results_table.py --stage table`` wrote. This test parses its markdown tables,
rebuilds them from the committed evaluation episodes with the same code
(``results_table.DOC_SOURCES`` / ``DOC_ALIASES``) and compares every cell at its printed
precision, so no table outlives its data. It reads small JSON files only.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "analysis"))
import results_table  # noqa: E402

DOC = os.path.join(ROOT, "docs", "RESULTS.md")


def doc_block(text: str) -> str:
    """The generated block of a results page."""
    if results_table.BEGIN not in text or results_table.END not in text:
        raise AssertionError(f"docs/RESULTS.md has no {results_table.BEGIN} block")
    return text.split(results_table.BEGIN, 1)[1].split(results_table.END, 1)[0]


def markdown_tables(block: str) -> list[dict]:
    """Every markdown table of ``block``: ``{"title": the bold line above it, "header": [...],
    "rows": {first cells joined by " / ": [cells]}}`` (rows keyed by their label cells)."""
    tables, title, current = [], "", None
    for line in block.splitlines():
        if line.startswith("**"):
            title = line
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if current is None:
            current = {"title": title, "header": cells, "rows": {}}
            tables.append(current)
        elif not all(re.fullmatch(r"-+", c) for c in cells):
            n_label = 2 if current["header"][0].startswith("comparison") else 1
            current["rows"][" / ".join(cells[:n_label])] = cells[n_label:]
    return tables


def compare(doc: list[dict], rebuilt: list[dict]) -> list[str]:
    """Where the two sets of tables differ (cell by cell, as printed)."""
    problems = []
    if [t["header"] for t in doc] != [t["header"] for t in rebuilt]:
        return [f"table headers differ: {[t['header'] for t in doc]} vs "
                f"{[t['header'] for t in rebuilt]}"]
    for d, r in zip(doc, rebuilt):
        if d["title"] != r["title"]:
            problems.append(f"title {d['title']!r} vs rebuilt {r['title']!r}")
        for key in sorted(set(d["rows"]) | set(r["rows"])):
            if d["rows"].get(key) != r["rows"].get(key):
                problems.append(f"{d['title']} row {key!r}: doc {d['rows'].get(key)} vs "
                                f"rebuilt {r['rows'].get(key)}")
    return problems


@pytest.fixture(scope="module")
def rebuilt_block() -> str:
    runs = results_table.find_runs([os.path.join(ROOT, d) for d in results_table.DOC_SOURCES],
                                   {job: os.path.join(ROOT, path)
                                    for job, path in results_table.DOC_ALIASES.items()})
    return results_table.markdown(results_table.build_tables(runs), runs)


def test_results_doc_tables_match_the_committed_runs(rebuilt_block):
    with open(DOC) as f:
        doc = markdown_tables(doc_block(f.read()))
    rebuilt = markdown_tables(rebuilt_block)
    assert len(rebuilt) == 4  # Avg@k, its comparisons, Pass@k, success rate
    assert any("Avg@4 (mean task score)" in t["title"] for t in rebuilt)
    assert compare(doc, rebuilt) == []
    # the footnote names the same run folders
    runs_line = rebuilt_block.rsplit("Runs: ", 1)[1]
    assert runs_line in doc_block(open(DOC).read())


def test_a_changed_number_is_caught(rebuilt_block):
    """The comparison fails on one digit changed in a cell, and on a row left out."""
    tables = markdown_tables(rebuilt_block)
    line = next(x for x in rebuilt_block.splitlines() if x.startswith("| BabyAI | "))
    first = re.search(r"\d+\.\d", line).group(0)  # the base cell's mean, one decimal
    bumped = f"{float(first) + 0.1:.1f}"
    changed = markdown_tables(rebuilt_block.replace(line, line.replace(first, bumped, 1), 1))
    problems = compare(changed, tables)
    assert len(problems) == 1 and "row 'BabyAI'" in problems[0] and bumped in problems[0]
    dropped = markdown_tables("\n".join(line for line in rebuilt_block.splitlines()
                                        if not line.startswith("| deep search |")))
    assert len(compare(dropped, tables)) == 3  # one row in each of the three cell tables
