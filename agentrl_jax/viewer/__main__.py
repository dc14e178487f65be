"""The trajectory viewer's command line.

    python -m agentrl_jax.viewer runs/babyai [runs/other ...]            # serve the page
    python -m agentrl_jax.viewer runs/babyai --export out.html --status done --limit 20
    python -m agentrl_jax.viewer runs/babyai --print --search "pick up" --limit 3

Serving: a local web page at http://127.0.0.1:8765/ (``--host`` / ``--port``; loopback by
default, any other address needs ``--api-key``; nothing fetched from the network) with the runs
side by side, the episode browser, one episode turn by turn and token by token, and the before /
after comparison; it follows runs that are still training. ``--export FILE.html`` writes one self-contained HTML file of the episodes
chosen by the filter options (of run ``--run``) instead; ``--print`` prints them as text.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from agentrl_common.httpguard import require_key_off_loopback
from agentrl_jax.viewer.file_index import default_cache_dir
from agentrl_jax.viewer.index import SORT_KEYS, Query


API_KEY_ENV = "AGENTRL_VIEWER_API_KEY"  # the default of --api-key


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agentrl_jax.viewer",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (--workdir)")
    p.add_argument("--host", default="127.0.0.1",
                   help="interface to bind (default loopback; any other needs --api-key)")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                   help="require 'Authorization: Bearer <key>' on every /api/ route (the page "
                        f"asks for it) (default: ${API_KEY_ENV})")
    p.add_argument("--allowed-host", action="append", default=[],
                   help="a host name clients reach this viewer by (repeatable); requests "
                        "naming another Host are refused (421). Default: the loopback names "
                        "on loopback, any Host elsewhere (the API key guards)")
    p.add_argument("--port", type=int, default=8765, help="port (0: any free port)")
    p.add_argument("--cache", default=None,
                   help=f"index cache directory (default {default_cache_dir()})")
    p.add_argument("--no-cache", action="store_true",
                   help="keep the index in a temporary directory (rebuilt every start)")
    p.add_argument("--no-tokenizer", action="store_true",
                   help="do not load the runs' tokenizers (token view shows ids)")
    p.add_argument("--poll", type=float, default=1.0,
                   help="seconds between checks for new episodes (live view)")
    out = p.add_argument_group("export / print (instead of serving)")
    out.add_argument("--export", metavar="FILE.html", help="write a self-contained HTML file")
    out.add_argument("--print", action="store_true", dest="print_text",
                     help="print the chosen episodes turn by turn")
    out.add_argument("--run", type=int, default=0, help="which RUN_DIR (0-based)")
    out.add_argument("--kind", choices=("train", "eval", "other"), action="append")
    out.add_argument("--env", action="append", help="environment (repeatable)")
    out.add_argument("--task", help="task id contains this (case-insensitive)")
    out.add_argument("--status", action="append",
                     help="done / max_turns / context_limit / env_error / engine_error")
    out.add_argument("--step-min", type=int)
    out.add_argument("--step-max", type=int)
    out.add_argument("--reward-min", type=float)
    out.add_argument("--reward-max", type=float)
    out.add_argument("--turns-min", type=int)
    out.add_argument("--turns-max", type=int)
    out.add_argument("--success", choices=("yes", "no"))
    out.add_argument("--invalid", choices=("yes", "no"), help="with / without invalid actions")
    out.add_argument("--search", help="text in the episode (replies, observations, errors)")
    out.add_argument("--sort", choices=SORT_KEYS, default="order")
    out.add_argument("--desc", action="store_true", help="sort descending")
    out.add_argument("--offset", type=int, default=0)
    out.add_argument("--limit", type=int, default=50)
    out.add_argument("--no-tokens", action="store_true", help="export without the token view")
    return p


def query_from_args(a: argparse.Namespace) -> Query:
    yes_no = {"yes": True, "no": False, None: None}
    return Query(kinds=tuple(a.kind) if a.kind else None, envs=tuple(a.env) if a.env else None,
                 task=a.task, statuses=tuple(a.status) if a.status else None,
                 step_min=a.step_min, step_max=a.step_max, reward_min=a.reward_min,
                 reward_max=a.reward_max, turns_min=a.turns_min, turns_max=a.turns_max,
                 success=yes_no[a.success], invalid=yes_no[a.invalid], search=a.search,
                 sort=a.sort, descending=a.desc, offset=max(a.offset, 0),
                 limit=max(a.limit, 1))


async def serve(viewer, host: str, port: int, poll: float, api_key: str | None = None,
                allowed_hosts: tuple[str, ...] = ()) -> None:
    from agentrl_jax.viewer.server import make_app, start_site

    app = make_app(viewer, poll_s=poll, host=host, allowed_hosts=allowed_hosts,
                   api_key=api_key)
    runner, site = await start_site(app, host, port, api_key)
    bound = site.port
    shown = host if ":" not in host else f"[{host}]"
    keyed = "; the page asks for the API key" if api_key else ""
    print(f"viewer: http://{shown}:{bound}/  ({len(viewer.runs)} run(s){keyed}; Ctrl-C stops)",
          flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if not (a.export or a.print_text):
        try:  # before anything is read: refuse at once
            require_key_off_loopback(a.host, a.api_key)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    missing = [r for r in a.runs if not os.path.isdir(r)]
    if missing:
        print(f"not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    from agentrl_jax.viewer.api import Viewer

    cache = None if a.no_cache else (a.cache or default_cache_dir())
    viewer = Viewer(a.runs, cache_dir=cache, load_tokenizer=not a.no_tokenizer)
    try:
        if a.export or a.print_text:
            if not 0 <= a.run < len(a.runs):
                print(f"--run {a.run}: there are {len(a.runs)} run directories", file=sys.stderr)
                return 2
            viewer.update()
            q = query_from_args(a)
            if a.export:
                from agentrl_jax.viewer.export import MAX_EPISODES, write_export

                if q.limit > MAX_EPISODES:
                    print(f"--limit {q.limit}: an export holds at most {MAX_EPISODES}",
                          file=sys.stderr)
                    return 2
                written = write_export(viewer, a.run, q, a.export, tokens=not a.no_tokens)
                print(written.line(a.export))
            if a.print_text:
                page = viewer.episodes(a.run, q, preview=False)
                print(f"{page['total']} matching episodes; showing {len(page['rows'])}")
                for r in page["rows"]:
                    print()
                    print(viewer.render(a.run, r["file"], r["row"]))
            return 0
        try:
            asyncio.run(serve(viewer, a.host, a.port, a.poll, a.api_key,
                              tuple(a.allowed_host)))
        except KeyboardInterrupt:
            print("viewer stopped", file=sys.stderr)
        except OSError as e:
            print(f"cannot serve on {a.host}:{a.port}: {e}", file=sys.stderr)
            return 1
        return 0
    finally:
        viewer.close()


if __name__ == "__main__":
    raise SystemExit(main())
