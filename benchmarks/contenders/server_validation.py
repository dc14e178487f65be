"""Request parsing + validation cost of the rollout server: hand-written checks vs declared models.

The hand-written validator is the ``agentrl_jax/rollout/server.py`` of an older commit (by
default the parent of the commit that added ``api_models.py``), read with ``git show`` and
imported as a separate module; the declared (pydantic v2) one is the current server. Both run
in this process on the same bodies, against the same stand-in server (engine limits
``max_length=4096``, ``max_queue=4096``; no engine, nothing is generated or tokenized), in
alternating rounds so that load on the machine hits both alike.

Timed per request (microseconds, median over rounds):

* ``/generate`` with 2,000 ``input_ids`` and typical RL ``sampling_params`` (what the actor pool
  sends each turn), from the raw bytes: orjson parse + ``_plan_generate``;
* the same body already parsed (validation only);
* a ``/generate`` batch of 64 such prompts;
* ``/v1/chat/completions`` with a short conversation: parse + ``_plan_chat`` + the sampling
  parameters (the old handler's inline checks are repeated here; template rendering and
  tokenization, identical in both, are left out);
* for reference, what both paths then do in ``Engine.validate`` (``check_input_ids`` +
  ``SamplingParams.validate``), and the element check of 2,000 / 100,000 ids alone: pydantic's
  ``list[StrictInt]``, ``all(type(t) is int ...)`` and the old ``_is_int`` loop.

    python benchmarks/contenders/server_validation.py [--rounds 15] [--old-rev REV] [--json OUT]

Pass: new <= 1.2 x old for the single ``/generate`` and the chat body (``--check`` makes a
failure exit 1).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types
from typing import Any, Callable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from pydantic import StrictInt, TypeAdapter  # noqa: E402

from agentrl_jax.rollout.servers import app as new_server  # noqa: E402
from agentrl_jax.rollout.servers.protocol import parse_json_object  # noqa: E402
from agentrl_jax.rollout.contract import check_input_ids  # noqa: E402

#: the current server (application, handlers, request models): a dirty tree is reported
SERVER_PATH = "agentrl_jax/rollout/servers"
#: where the server and its request models were before rollout/ had sub-packages (the old
#: revisions this benchmark reads)
OLD_SERVER_PATH = "agentrl_jax/rollout/server.py"
OLD_API_MODELS_PATH = "agentrl_jax/rollout/api_models.py"
#: the modules the old server imports, by their old name -> where they are now
MOVED = {
    "agentrl_jax.rollout.base": "agentrl_jax.rollout.contract",
    "agentrl_jax.rollout.engine_config": "agentrl_jax.rollout.engine.engine_config",
    "agentrl_jax.rollout.engine": "agentrl_jax.rollout.engine.engine",
    "agentrl_jax.rollout.forward": "agentrl_jax.rollout.engine.forward",
    "agentrl_jax.rollout.chat_template_sandbox": "agentrl_jax.rollout.servers.chat_template_sandbox",
    "environments.core.httpguard": "agentrl_common.httpguard",
}
MOVED_MODULES = re.compile(r"\b(" + "|".join(re.escape(m) for m in MOVED) + r")\b(?!\.)")

MAX_LENGTH = 4096
MAX_QUEUE = 4096
VOCAB = 49152


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", REPO, *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def default_old_rev() -> str:
    """The parent of the commit that added api_models.py (HEAD if it is not committed yet)."""
    added = _git("log", "--diff-filter=A", "--format=%H", "--", OLD_API_MODELS_PATH)
    return f"{added.splitlines()[-1]}^" if added else "HEAD"


def load_old_server(rev: str) -> types.ModuleType:
    """``server.py`` as of ``rev``, imported as the module ``_old_rollout_server``."""
    source = _git("show", f"{rev}:{OLD_SERVER_PATH}")
    if "parse_sampling_params" not in source:
        raise SystemExit(f"{rev}:{OLD_SERVER_PATH} is not the hand-written validator")
    source = MOVED_MODULES.sub(lambda m: MOVED[m.group(1)], source)
    path = os.path.join(tempfile.mkdtemp(prefix="old_server_"), "_old_rollout_server.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("_old_rollout_server", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["_old_rollout_server"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def stand_in(module: types.ModuleType) -> Any:
    """A ``RolloutServer`` of ``module`` without an engine: only what validation reads."""
    server = module.RolloutServer.__new__(module.RolloutServer)
    server.engine = types.SimpleNamespace(vocab_size=VOCAB, config=types.SimpleNamespace(
        max_length=MAX_LENGTH, max_queue=MAX_QUEUE, max_batch=32, max_stop_ids=8))
    server.tokenizer = object()  # chat needs one to exist; nothing is tokenized here
    server._max_token_chars = None
    server.allow_request_chat_template = False
    server.max_body_bytes = module.DEFAULT_MAX_BODY_BYTES
    return server


def bodies() -> dict[str, dict[str, Any]]:
    ids = [(i * 7919) % VOCAB for i in range(2000)]
    sampling = {"max_new_tokens": 512, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                "stop_token_ids": [2, 0], "sampling_seed": 1234, "skip_special_tokens": False}
    generate = {"input_ids": ids, "sampling_params": sampling, "return_logprob": True,
                "rid": "episode-17-turn-3", "session_id": "episode-17"}
    batch = {"input_ids": [ids] * 64, "sampling_params": sampling, "return_logprob": True}
    chat = {"model": "smollm2", "messages": [
        {"role": "system", "content": "You are a helpful agent in a text game."},
        {"role": "user", "content": "You see a red ball and a blue key. What do you do?"},
        {"role": "assistant", "content": "go to red ball"},
        {"role": "user", "content": [{"type": "text", "text": "You are next to the red ball."}]}],
        "max_tokens": 128, "temperature": 0.7, "top_p": 0.95, "logprobs": True,
        "session_id": "episode-17", "seed": 7}
    return {"generate": generate, "generate_batch64": batch, "chat": chat}


def old_paths(old: types.ModuleType, server: Any) -> dict[str, Callable[[dict], Any]]:
    def chat(body: dict) -> Any:  # the old handler's validation, in its order
        messages, kwargs, template = server._plan_chat(body)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            max_tokens = server._max_tokens_default(100)
        sampling = server._openai_sampling(body, max_tokens)
        logprobs = body.get("logprobs", False)
        old._expect(isinstance(logprobs, bool), "logprobs must be a boolean")
        sid, rid = body.get("session_id"), body.get("rid")
        old._expect(sid is None or isinstance(sid, str), "session_id must be a string")
        old._expect(rid is None or isinstance(rid, str), "rid must be a string")
        return messages, kwargs, template, sampling, logprobs, sid, rid

    return {"generate": server._plan_generate, "generate_batch64": server._plan_generate,
            "chat": chat}


def new_paths(server: Any) -> dict[str, Callable[[dict], Any]]:
    def chat(body: dict) -> Any:
        req = server._plan_chat(body)
        kwargs, template = req.template()
        max_tokens = req.requested_max_tokens()
        if max_tokens is None:
            max_tokens = server._max_tokens_default(100)
        return (req.conversation(), kwargs, template, req.sampling(max_tokens), req.logprobs,
                req.session_id, req.rid)

    return {"generate": server._plan_generate, "generate_batch64": server._plan_generate,
            "chat": chat}


def per_call_us(fn: Callable[[], Any], min_time: float = 0.05) -> float:
    """Microseconds per call of ``fn`` over a loop of at least ``min_time`` seconds."""
    n = 1
    while True:
        started = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - started
        if elapsed >= min_time:
            return elapsed / n * 1e6
        n *= 2 if elapsed == 0 else max(2, min(10, int(min_time / elapsed) + 1))


def compare(cases: dict[str, tuple[Callable[[], Any], Callable[[], Any]]], rounds: int
            ) -> dict[str, dict[str, float]]:
    """Median microseconds per call of each (old, new) pair, in alternating rounds."""
    times: dict[str, dict[str, list[float]]] = {k: {"old": [], "new": []} for k in cases}
    for _ in range(rounds):
        for name, (old_fn, new_fn) in cases.items():
            times[name]["old"].append(per_call_us(old_fn))
            times[name]["new"].append(per_call_us(new_fn))
    out = {}
    for name, t in times.items():
        o, n = statistics.median(t["old"]), statistics.median(t["new"])
        out[name] = {"old_us": round(o, 2), "new_us": round(n, 2), "new_over_old": round(n / o, 3),
                     "old_min_us": round(min(t["old"]), 2), "new_min_us": round(min(t["new"]), 2)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--old-rev", default=None, help="commit with the hand-written validator")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--check", action="store_true", help="exit 1 if new > 1.2 x old")
    args = p.parse_args(argv)

    rev = args.old_rev or default_old_rev()
    old = load_old_server(rev)
    old_srv, new_srv = stand_in(old), stand_in(new_server)
    olds, news = old_paths(old, old_srv), new_paths(new_srv)
    raw = {k: json.dumps(v).encode() for k, v in bodies().items()}

    for name, body in bodies().items():  # both accept every body, with the same result
        a, b = olds[name](body), news[name](body)
        if name.startswith("generate"):
            a, b = ((x.prompts, x.samplings, x.rids, x.sessions, x.return_logprob) for x in (a, b))
        assert a == b, (name, a, b)

    cases: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {}
    for name in raw:
        body = bodies()[name]
        cases[f"{name} parse+validate"] = (
            lambda r=raw[name], f=olds[name]: f(old._parse_json_object(r)),
            lambda r=raw[name], f=news[name]: f(parse_json_object(r)))
        cases[f"{name} validate"] = (lambda b=body, f=olds[name]: f(b),
                                     lambda b=body, f=news[name]: f(b))
    results = compare(cases, args.rounds)

    # reference: the engine's own check (both servers call it next), and element checks alone
    body = bodies()["generate"]
    sampling = new_srv._plan_generate(body).samplings[0]
    reference = {"engine_validate_2000_ids_us": round(statistics.median(
        per_call_us(lambda: (check_input_ids(body["input_ids"], VOCAB, MAX_LENGTH),
                             sampling.validate(VOCAB))) for _ in range(args.rounds)), 2)}
    strict_ints = TypeAdapter(list[StrictInt])
    for n in (2000, 100_000):
        ids = list(range(n))
        reference[f"elements_{n}"] = {
            "pydantic_list_strictint_us": round(statistics.median(
                per_call_us(lambda: strict_ints.validate_python(ids)) for _ in range(5)), 1),
            "all_type_is_int_us": round(statistics.median(
                per_call_us(lambda: all(type(t) is int for t in ids)) for _ in range(5)), 1),
            "old_is_int_loop_us": round(statistics.median(
                per_call_us(lambda: all(old._is_int(t) for t in ids)) for _ in range(5)), 1)}

    dirty = _git("status", "--porcelain", "--", SERVER_PATH)
    report = {"old_rev": _git("rev-parse", "--short", rev),
              "new_rev": _git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else ""),
              "python": platform.python_version(), "machine": platform.processor() or
              platform.machine(), "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
              "pydantic": __import__("pydantic").VERSION, "rounds": args.rounds,
              "results": results, "reference": reference}
    width = max(map(len, results))
    print(f"old {report['old_rev']} vs new {report['new_rev']} (us per request, median of "
          f"{args.rounds} rounds; load {report['load_avg'][0]:.2f} on {report['cpus']} CPUs)")
    for name, r in results.items():
        print(f"  {name:<{width}}  old {r['old_us']:>9.1f}  new {r['new_us']:>9.1f}  "
              f"new/old {r['new_over_old']:.2f}")
    print("  reference:", json.dumps(reference))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    slow = [k for k in ("generate parse+validate", "chat parse+validate")
            if results[k]["new_over_old"] > 1.2]
    if slow:
        print(f"SLOWER than 1.2 x old: {slow}")
    return 1 if (slow and args.check) else 0


if __name__ == "__main__":
    raise SystemExit(main())
