"""Render client-supplied chat templates in a separate, killable process with a time bound.

A Jinja template sent by a client (``chat_template_kwargs.chat_template``) is code: even inside
Jinja's sandbox a loop of ``range(10**5)`` nested a few times, or ``'x' * 10**9``, runs for
minutes or takes gigabytes. The rollout server therefore refuses such templates unless started
with ``--allow-request-chat-template``, and then renders them here: in a child process
(``python -m agentrl_jax.rollout.servers.chat_template_sandbox``) with transformers' own renderer
(``render_jinja_template``, the function behind ``apply_chat_template``), an address-space limit,
and a deadline after which the child is killed (and restarted for the next request).

Protocol (one JSON object per line): the child prints ``{"ready": true}`` once imported, then
answers each ``{"template", "messages", "kwargs", "max_chars"}`` with ``{"text"}`` or
``{"error"}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

START_TIMEOUT_S = 60.0
MEMORY_BUDGET_MB = 512
_LINE_LIMIT = 64 * 1024 * 1024


class TemplateError(Exception):
    """The template failed, was too slow, or its output too long (the client's fault: a 400)."""


class TemplateBusy(Exception):
    """Another render held the worker for the whole time budget (a 503)."""


class TemplateSandbox:
    """One worker process, one render at a time, each bounded by ``timeout_s``."""

    def __init__(self, timeout_s: float = 2.0, memory_mb: int = MEMORY_BUDGET_MB) -> None:
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self._proc: asyncio.subprocess.Process | None = None
        self._lock: asyncio.Lock | None = None
        self.kills = 0

    async def render(self, template: str, messages: list[dict[str, Any]], kwargs: dict[str, Any], max_chars: int) -> str:
        """``template`` rendered over ``messages`` (generation prompt added) with ``kwargs``."""
        self._lock = self._lock or asyncio.Lock()
        try:
            await asyncio.wait_for(self._lock.acquire(), self.timeout_s)
        except asyncio.TimeoutError:
            raise TemplateBusy("the chat-template renderer is busy; retry later") from None
        try:
            proc = await self._worker()
            request = {"template": template, "messages": messages, "kwargs": kwargs, "max_chars": max_chars}
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            try:
                await proc.stdin.drain()
                line = await asyncio.wait_for(proc.stdout.readline(), self.timeout_s)
            except asyncio.TimeoutError:
                await self._kill()
                raise TemplateError(f"the chat template did not render within {self.timeout_s:g} s") from None
            except (ConnectionError, ValueError, asyncio.LimitOverrunError):
                await self._kill()
                raise TemplateError("the chat-template renderer failed") from None
            if not line:
                await self._kill()
                raise TemplateError("the chat-template renderer died (memory limit?)")
            answer = json.loads(line)
            if "error" in answer:
                raise TemplateError(answer["error"])
            return answer["text"]
        finally:
            self._lock.release()

    async def _worker(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", __name__, str(self.memory_mb),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            limit=_LINE_LIMIT,
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            ready = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            ready = b""
        if not ready.startswith(b'{"ready"'):
            self._proc = proc
            await self._kill()
            raise TemplateError("the chat-template renderer did not start")
        self._proc = proc
        return proc

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            self.kills += 1
            proc.kill()
            await proc.wait()

    async def close(self) -> None:
        """Stop the worker process (if any)."""
        await self._kill()


# ------------------------------------------------------------------------------ the child side


def _limit_memory(budget_mb: int) -> None:
    """Cap the address space at what is mapped now plus ``budget_mb``."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return
    with open("/proc/self/status") as status:
        vm_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    limit = vm_kb * 1024 + budget_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _render_one(request: dict[str, Any], render: Any) -> dict[str, Any]:
    try:
        rendered, _ = render(conversations=[request["messages"]], chat_template=request["template"],
                             add_generation_prompt=True, **request["kwargs"])
        text = rendered[0]
    except MemoryError:
        return {"error": "the chat template used too much memory"}
    except Exception as e:  # noqa: BLE001 -- any template failure is reported, the worker lives on
        return {"error": f"cannot render the chat template: {type(e).__name__}: {e}"}
    if not isinstance(text, str) or len(text) > request["max_chars"]:
        return {"error": f"the rendered chat is longer than {request['max_chars']} characters"}
    return {"text": text}


def _child_main(budget_mb: int) -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    _limit_memory(budget_mb)
    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            answer = _render_one(json.loads(line), render_jinja_template)
            out.write(json.dumps(answer) + "\n")
        except MemoryError:
            out.write('{"error": "the chat template used too much memory"}\n')
        out.flush()


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    _child_main(int(sys.argv[1]) if len(sys.argv) > 1 else MEMORY_BUDGET_MB)
