"""How fast the trajectory viewer answers on a large run: index build, cache reload, incremental
update, and the latency of result pages and episode views through its HTTP API.

    python benchmarks/speed/viewer_index.py --episodes 100000 --dir /tmp/viewer_bench --out result.json

Writes a synthetic run (``agentrl_jax/viewer/synthetic.py``: the trainer's record layout,
system prompt 250 words, observations 50 words, up to 10 turns (~18 kB a line), fake token ids
and log-probabilities) unless ``--dir`` already holds one of that size, then measures (wall
clock, this machine):

* ``build_s``: a cold index build of every trajectory file (no cache);
* ``reload_s``: a new process's index from the on-disk cache (nothing to parse);
* ``append_1000_s``: indexing 1,000 episodes appended to the training file (the live view);
* per query: the first answer (``first_ms``: filter + sort computed) and the median of 10
  repeats (``median_ms``: the sorted result cached, the page read from the file by offset),
  through ``GET /api/episodes`` (page of 50 with previews) or ``/api/episode``;
* ``--browser``: in headless Chromium, the time from a user action (open the list, next / last
  page, a status filter, a sort, a typed search, open an episode, its token view) to the new
  content on screen.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_jax.viewer import Viewer  # noqa: E402
from agentrl_jax.viewer.index import RunIndex  # noqa: E402
from agentrl_jax.viewer.server import BackgroundServer  # noqa: E402
from agentrl_jax.viewer.synthetic import make_episode, write_synthetic_run  # noqa: E402

QUERIES = (  # (name, path + query)
    ("first page", "/api/episodes?run=0&limit=50"),
    ("last page (offset N - 50)", "/api/episodes?run=0&limit=50&offset={last}"),
    ("status=done, env=babyai, sort reward desc", "/api/episodes?run=0&status=done&env=babyai"
     "&sort=reward&order=desc&limit=50"),
    ("task contains + step range, sort turns", "/api/episodes?run=0&task=seed%3D1&step_min=1000"
     "&step_max=5000&sort=num_turns&limit=50"),
    ("text search 'not a valid action', page 3", "/api/episodes?run=0&q=not%20a%20valid%20action"
     "&offset=100&limit=50"),
    ("text search 'ep-00' (rare)", "/api/episodes?run=0&q=ep-00&limit=50"),
    ("episode view with tokens (row N - 1000)", "/api/episode?run=0&file=0&row={deep}"),
)


def fetch_ms(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as r:
        body = r.read()
    return 1000 * (time.perf_counter() - t0), len(body)


def browser_timings(url: str, repeats: int = 3) -> list[dict]:
    """Milliseconds from a user action to the new content rendered, measured inside the page
    (``performance.now()``; the page marks the end of every render), in headless Chromium."""
    from benchmarks.analysis.viewer_screenshots import browser

    driver = browser(1360, 900)
    driver.set_script_timeout(600)
    rendered = "document.body.dataset.rendered !== before"
    actions = (  # (name, JavaScript doing it, JavaScript condition: done)
        ("open the episode list", "location.hash = '#episodes?run=0'",
         rendered + " && document.getElementById('range')"),
        ("next page", "document.querySelectorAll('.pager button')[2].click()", rendered),
        ("last page", "document.querySelectorAll('.pager button')[3].click()", rendered),
        ("status filter 'done'",
         "document.querySelector('input[name=status][value=done]').click()", rendered),
        ("sort by reward, descending",
         "const f = document.querySelector('form.filters'); f.elements.sort.value = 'reward';"
         "f.elements.order.value = 'desc'; f.dispatchEvent(new Event('change'))", rendered),
        ("text search 'locked door'",
         "const q = document.querySelector('input[name=q]'); q.value = 'locked door';"
         "q.dispatchEvent(new Event('change', {bubbles: true}))", rendered),
        ("open an episode (turns)", "document.querySelector('table.list tbody tr').click()",
         rendered + " && document.querySelector('.turn[data-turn]')"),
        ("its token view", "document.querySelector('.tabs button[data-tab=tokens]').click()",
         rendered + " && document.querySelector('#tokens .tok')"),
    )
    results = []
    try:
        for _ in range(repeats):
            driver.get(url + "#runs")
            time.sleep(1.0)
            for name, action, cond in actions:
                ms = driver.execute_async_script(
                    "const done = arguments[arguments.length - 1];"
                    "const before = document.body.dataset.rendered; const t0 = performance.now();"
                    f"{action};"
                    f"(function check() {{ if ({cond}) done(performance.now() - t0);"
                    " else setTimeout(check, 1); })();")
                results.append({"action": name, "ms": ms})
    finally:
        driver.quit()
    summary = []
    for name, _, _ in actions:
        ms = [r["ms"] for r in results if r["action"] == name]
        # the first round computes every filter / sort / search; later rounds hit the caches
        summary.append({"action": name, "first_ms": ms[0], "median_ms": statistics.median(ms)})
        print(f"browser: {name:36s} first {ms[0]:7.0f} ms   median {statistics.median(ms):7.0f}"
              " ms", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=100_000)
    p.add_argument("--dir", default=None, help="run directory (default: a temporary one)")
    p.add_argument("--out", default=None, help="write the numbers as JSON here")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--browser", action="store_true",
                   help="also time the page in headless Chromium (paging, a filter, a search)")
    a = p.parse_args(argv)
    run = a.dir or tempfile.mkdtemp(prefix="viewer_bench_")
    train = os.path.join(run, "trajectories_train.jsonl")
    have = sum(1 for _ in open(train, "rb")) if os.path.exists(train) else 0
    out: dict = {"episodes": a.episodes, "run_dir": run}
    if have != a.episodes:
        t0 = time.perf_counter()
        write_synthetic_run(run, a.episodes, eval_steps=(0, 1000), eval_tasks=64,
                            eval_samples=4, horizon=10, fast_json=True,
                            episode_kwargs=dict(prompt_words=250, obs_words=50))
        out["generate_s"] = time.perf_counter() - t0
    out["train_file_mb"] = os.path.getsize(train) / 1e6
    print(f"run {run}: {a.episodes} training episodes, {out['train_file_mb']:.0f} MB", flush=True)

    cache = tempfile.mkdtemp(prefix="viewer_bench_cache_")
    t0 = time.perf_counter()
    index = RunIndex(run, cache_dir=cache)
    index.update()
    out["build_s"] = time.perf_counter() - t0
    out["indexed_episodes"] = len(index.table())
    out["cache_mb"] = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(cache)
                          for f in fs) / 1e6
    print(f"cold index build: {out['build_s']:.1f} s for {out['indexed_episodes']} episodes "
          f"({out['train_file_mb'] / out['build_s']:.0f} MB/s); cache {out['cache_mb']:.0f} MB",
          flush=True)
    index.close()
    t0 = time.perf_counter()
    index = RunIndex(run, cache_dir=cache)
    index.update()
    len(index.table())
    out["reload_s"] = time.perf_counter() - t0
    print(f"reload from the cache: {out['reload_s']:.2f} s", flush=True)
    index.close()

    viewer = Viewer([run], cache_dir=cache, load_tokenizer=False)
    viewer.update()
    total = len(viewer.runs[0].index.table())
    results = []
    with BackgroundServer(viewer, poll_s=3600) as url:  # no background re-index: timed below
        for name, path in QUERIES:
            full = url.rstrip("/") + path.format(last=total - 50, deep=max(a.episodes - 1000, 0))
            first, size = fetch_ms(full)
            rest = [fetch_ms(full)[0] for _ in range(a.repeats)]
            results.append({"query": name, "first_ms": first, "median_ms": statistics.median(rest),
                            "max_ms": max(rest), "bytes": size})
            print(f"{name:48s} first {first:8.1f} ms   median {statistics.median(rest):7.1f} ms"
                  f"   ({size / 1e3:.0f} kB)", flush=True)
        if a.browser:
            out["browser"] = browser_timings(url)
        # the live view: 1,000 new episodes appended, then indexed
        import random
        rng = random.Random(1)
        with open(os.path.join(run, "trajectories_train.jsonl"), "a") as f:
            for i in range(1000):
                f.write(json.dumps(make_episode(rng, "babyai", f"new/{i}", 0, i, 99999, 8,
                                                prompt_words=250, obs_words=50)) + "\n")
        t0 = time.perf_counter()
        added = viewer.runs[0].index.update()
        out["append_1000_s"] = time.perf_counter() - t0
        first, _ = fetch_ms(url + "api/episodes?run=0&step_min=99999&limit=50")
        out["after_append_first_page_ms"] = first
        print(f"1,000 appended episodes indexed in {out['append_1000_s']:.2f} s ({added} rows); "
              f"first page after it {first:.0f} ms", flush=True)
        # undo the append so the run can be measured again
        with open(os.path.join(run, "trajectories_train.jsonl"), "rb+") as f:
            f.truncate(viewer.runs[0].index.files[0].rows()["offset"][-1000])
    viewer.close()
    out["queries"] = results
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
