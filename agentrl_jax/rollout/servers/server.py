"""SGLang-compatible HTTP server over the embedded engine (aiohttp): this module runs it (the
command line, ``ServerThread`` for tests and embedding); the application is ``app.py``, its
handlers ``routes.py`` and ``openai_routes.py``, shared pieces ``protocol.py``.

Follows the HTTP API of SGLang 0.5.x (``sglang.srt.entrypoints.http_server``): ``/generate``,
``/health``, ``/health_generate``, ``/get_model_info``, ``/get_server_info``, ``/flush_cache``,
``/update_weights_from_disk``, ``/abort_request``, ``/pause_generation``,
``/continue_generation``, ``/close_session`` (here: free a finished episode's cached prefix),
``/release_memory_occupation`` / ``/resume_memory_occupation`` (the KV cache only) and the
OpenAI-compatible ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` (non-streaming). See docs/ROLLOUT.md for the field-by-field coverage.

    python -m agentrl_jax.rollout.servers.server --model smollm2 --port 30000

Every malformed request gets a 4xx JSON ``{"error": {"message", "type", "code"}}``; a full
admission queue gets 503 with ``Retry-After``. Request bodies are declared pydantic models
(``api_models.py``); their validation errors are 400s naming the failing fields.

Limits (``agentrl_common.httpguard``): an optional API key (``--api-key``, as SGLang's:
``Authorization: Bearer <key>`` on every route but ``/health*``; required to bind a
non-loopback address), a body size limit (413), read timeouts for headers and bodies (408), a
connection limit (503), weight loading confined to ``--weights-dir`` directories, and client
chat templates refused unless ``--allow-request-chat-template`` (then rendered in a killable
child process with a deadline). Bodies over ``INLINE_BYTES`` are parsed and validated on a
worker thread, so one large request does not hold up the event loop. Requests a web page could
send are refused (``httpguard.request_guard_middleware``): every state-changing route is POST
only (405 otherwise, ``/flush_cache`` included) and takes ``Content-Type: application/json``
only (415), a foreign ``Origin`` is 403, and on loopback (or with ``--allowed-host``) a ``Host``
that is not one of the server's names is 421 (DNS rebinding).

The engine's options (``--max-batch``, ``--max-length``, ``--prefill-kv-buckets``, ...) are
generated from ``EngineConfig``'s fields (``engine_flags.py``): the same names, defaults and
checks as the run config's ``rollout`` section. Their ``auto`` values are resolved by the engine
for its devices as the trainer's engine resolves them (``rollout.engine.resolution``): on CPU
at most as many slots as fit a sixth of host RAM, one-sequence prefill calls over the whole row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import threading

from aiohttp import web

from agentrl_common.httpguard import (DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT_S, GuardedSite,
                                     Limits, exit_with_parent, fit_connection_limit,
                                     freeze_startup_objects, require_key_off_loopback, run_app)
from agentrl_jax.rollout.engine.engine import Engine
from agentrl_jax.rollout.servers.app import RolloutServer
from agentrl_jax.rollout.servers.engine_flags import add_engine_arguments, engine_config_from_args
from agentrl_jax.rollout.servers.protocol import API_KEY_ENV, DEFAULT_MAX_BODY_BYTES

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- running it
class ServerThread:
    """Run a ``RolloutServer`` on its own event loop in a background thread (tests, notebooks,
    colocated setups). ``start()`` returns the base URL."""

    def __init__(self, server: RolloutServer, host: str = "127.0.0.1", port: int = 0):
        self.server, self.host, self.port = server, host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> str:
        """Start serving (raises ``ValueError`` for a non-loopback host without an API key)."""
        require_key_off_loopback(self.host, self.server.limits.api_key)
        self._thread = threading.Thread(target=self._run, name="rollout-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("server did not start")
        if self._error is not None:
            raise RuntimeError(f"server failed to start: {self._error}") from self._error
        return self.url

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            limits = self.server.limits
            self._runner = web.AppRunner(self.server.app(self.host), access_log=None,
                                         handler_cancellation=True, **limits.runner_kwargs())
            loop.run_until_complete(self._runner.setup())
            site = GuardedSite(self._runner, self.host, self.port,
                               max_connections=limits.max_connections,
                               refusal_body=_REFUSAL_BODY)
            loop.run_until_complete(site.start())
            self.port = site.port  # the bound port (port=0 picks one)
        except BaseException as e:  # noqa: BLE001
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self._runner.cleanup())
        loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=30)


_REFUSAL_BODY = json.dumps({"error": {"message": "too many connections; retry later",
                                       "type": "overloaded", "code": 503}}).encode()


def _token_ids(text: str) -> tuple[int, ...]:
    """``--output-token-ids``: ``"1,5,9"`` -> ``(1, 5, 9)`` (argparse reports a bad value)."""
    try:
        ids = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated token ids: {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("names no token id")
    return ids


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="SGLang-compatible rollout server (embedded JAX "
                                            "engine)")
    p.add_argument("--model", "--model-path", dest="model", default="smollm2",
                   help="known name (smollm2), HF directory or .gguf file")
    p.add_argument("--host", default="127.0.0.1",
                   help="interface to bind (default loopback; any other needs --api-key)")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                   help="require 'Authorization: Bearer <key>' on every route but /health* "
                        f"(default: ${API_KEY_ENV})")
    p.add_argument("--weights-dir", action="append", default=[],
                   help="a directory /update_weights_from_disk may load from (repeatable; the "
                        "served model's own directory always may)")
    p.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT_S,
                   help="seconds allowed for a request's headers and for its body (408)")
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                   help="open connections at most (503 and closed beyond)")
    p.add_argument("--allow-request-chat-template", action="store_true",
                   help="accept chat_template_kwargs.chat_template (rendered in a child process)")
    p.add_argument("--chat-template-timeout", type=float, default=2.0,
                   help="seconds a client chat template may take to render")
    p.add_argument("--allowed-host", action="append", default=[],
                   help="a host name clients reach this server by (repeatable); requests "
                        "naming another Host are refused (421). Default: the loopback names "
                        "on loopback, any Host elsewhere (the API key guards)")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tensor-parallel", type=int, default=1,
                   help="shard the engine over this process's first N local devices")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="shut down when this process is gone (engine_servers sets it)")
    p.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--output-token-ids", type=_token_ids, default=None,
                   help="comma-separated token ids: the policy restricted to them (every other "
                        "token's logit -inf, in sampling and reported log-probs alike; "
                        "models/output_tokens.py). A run's model.output_tokens resolved")
    p.add_argument("--log-level", default="info")
    add_engine_arguments(p)  # --max-batch, --max-length, ...: generated from EngineConfig
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # before the model is loaded: refuse at once
        config = engine_config_from_args(args)
        require_key_off_loopback(args.host, args.api_key)
        Limits(max_body=int(args.max_body_mb * 2**20), read_timeout=args.read_timeout,
               max_connections=args.max_connections, api_key=args.api_key)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    import jax

    devices = jax.local_devices()
    if not 1 <= args.tensor_parallel <= len(devices):
        raise SystemExit(f"error: --tensor-parallel {args.tensor_parallel}: this process has "
                         f"{len(devices)} local device(s)")
    from agentrl_jax.models.pretrained import load_pretrained

    pretrained = load_pretrained(args.model)
    if args.output_token_ids is not None:
        try:
            pretrained.model.cfg = pretrained.model.cfg.replace(
                output_token_ids=args.output_token_ids)
        except ValueError as e:
            raise SystemExit(f"error: --output-token-ids: {e}") from None
    log.info("compiling the engine on %d device(s)", args.tensor_parallel)
    from agentrl_jax.rollout.engine.kv_memory import KVCacheDoesNotFit

    try:
        engine = Engine(pretrained, config, devices=devices[:args.tensor_parallel])
    except KVCacheDoesNotFit as e:
        raise SystemExit(f"error: {e}") from None
    log.info("engine: %s", engine.config)  # "auto" resolved for these devices
    server = RolloutServer(engine, model_path=pretrained.path,
                           served_model_name=args.served_model_name,
                           max_body_bytes=int(args.max_body_mb * 2**20), api_key=args.api_key,
                           weights_dirs=args.weights_dir, read_timeout=args.read_timeout,
                           max_connections=fit_connection_limit(args.max_connections),
                           allow_request_chat_template=args.allow_request_chat_template,
                           chat_template_timeout_s=args.chat_template_timeout,
                           allowed_hosts=args.allowed_host)
    log.info("serving %s on http://%s:%d (weights may load from %s)", pretrained.path,
             args.host, args.port, server.weights_dirs)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the
    # request in the engine (frees its slot) instead of generating for nobody.
    app = server.app(args.host)
    app.on_startup.append(freeze_startup_objects)  # the model, compiled engine, modules
    if args.parent_pid is not None:
        async def watch_parent(app: web.Application):
            task = asyncio.create_task(exit_with_parent(args.parent_pid))
            yield
            task.cancel()
        app.cleanup_ctx.append(watch_parent)
    try:
        run_app(app, host=args.host, port=args.port, limits=server.limits,
                refusal_body=_REFUSAL_BODY, handler_cancellation=True)
    finally:
        engine.close()


if __name__ == "__main__":
    main()
