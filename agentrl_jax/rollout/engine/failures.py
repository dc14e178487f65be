"""What the engine does when a step fails: isolate the request that caused it (retry the others
without it), fail that request's future with a clear error, recover the device state (a fresh
KV cache) or, when that is impossible, refuse new work; at shutdown, fail every pending request
and command with ``BackendUnavailableError``. A mixin of
:class:`~agentrl_jax.rollout.engine.engine.Engine`."""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any, Callable


from agentrl_jax.rollout.contract import (BackendUnavailableError, InvalidRequestError,
                                               RequestFailedError, RolloutError)
from agentrl_jax.rollout.engine.compiled import ACT, STOP
from agentrl_jax.rollout.engine.requests import DONE, PREFILL, Request
from agentrl_jax.rollout.engine.slots import SlotTable

log = logging.getLogger(__name__)


class FailureHandling:
    """Failure isolation and recovery; ``self`` is an ``Engine``."""

    def _isolated(self, req: Request, fn: Callable[..., Any], *args: Any) -> bool:
        """``fn(*args)``, host-side work of ``req`` alone; if it raises, ``req`` fails (and
        only it: ``_fail_request``). Returns whether it succeeded."""
        try:
            fn(*args)
            return True
        except Exception as e:  # noqa: BLE001 -- reported to the request's caller
            self._fail_request(req, e)
            return False

    def _fail_request(self, req: Request, error: BaseException) -> None:
        """Fail one request after an error in its own host-side work; every other request
        goes on. Its sequences leave the queues and their slots (no prefix is cached from
        them: their KV may be incomplete); its future gets the error: an
        ``InvalidRequestError`` as it is (HTTP 400), anything else as a
        ``RequestFailedError`` naming the request and the cause (HTTP 500)."""
        if isinstance(error, InvalidRequestError):
            exc: Exception = error
            log.warning("request %s refused in the engine: %s", req.rid, error)
        else:
            exc = RequestFailedError(f"request {req.rid!r} failed in the engine (the other "
                                     f"requests go on): {type(error).__name__}: {error}")
            log.error("request %s failed alone: %s: %s", req.rid, type(error).__name__, error,
                      exc_info=error)
        with self._cv:
            self._requests.pop(req.rid, None)
        if req in self._waiting:
            self._waiting.remove(req)
            self._dequeued()
        for seq in req.seqs:
            if seq.state == PREFILL:
                self._orphan_followers(seq)
            if seq in self._prefill_queue:
                self._prefill_queue.remove(seq)
            if seq in self._fork_ready:
                self._fork_ready.remove(seq)
            if seq.slot is not None:
                slot = seq.slot
                self._ints[slot, ACT] = 0
                self._has_stop_str[slot] = False
                self._stop_masks[slot] = None
                if self._slot_seq.get(slot) is seq:
                    del self._slot_seq[slot]
                self._slots.release(slot)
                seq.slot = None
            seq.state = DONE
        if not req.future.done():
            try:
                req.future.set_exception(exc)
            except concurrent.futures.InvalidStateError:
                pass

    def _recover(self, error: BaseException) -> None:
        """After a failed device call (or an error in the engine's shared bookkeeping, which no
        single request explains): fail every in-flight request, reset the cache."""
        message = f"{type(error).__name__}: {error}"
        self._deliver()  # finished before the failure: their results stand
        with self._cv:
            requests = list(self._requests.values())
            self._requests.clear()
            self._num_waiting = 0
        for req in requests:
            if not req.future.done():
                req.future.set_exception(RolloutError(f"engine step failed: {message}"))
        self._waiting.clear()
        self._prefill_queue, self._fork_ready = [], []
        self._prompt_leaders.clear()
        self._slot_seq.clear()
        self._ints[:, :STOP] = 0
        self._has_stop_str[:] = False
        self._slots = SlotTable(self.config.max_batch)
        try:
            self._cache = self._new_cache()
        except Exception as e:  # noqa: BLE001
            self._error = f"cannot reallocate the KV cache after {message}: {e}"

    def _shutdown(self) -> None:
        self._deliver()  # finished before the close: their results stand
        with self._cv:
            requests = list(self._requests.values())
            self._requests.clear()
            commands, self._commands = self._commands, []
        for req in requests:
            if not req.future.done():
                req.future.set_exception(BackendUnavailableError("the engine was closed"))
        for _, future in commands:
            if not future.done():
                future.set_exception(BackendUnavailableError("the engine was closed"))


__all__ = ["FailureHandling"]
