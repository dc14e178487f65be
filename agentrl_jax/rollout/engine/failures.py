"""What the engine does when something fails.

* One request's host-side work raised (admission, activation, building its prefill row, stop
  detection, detokenisation): that request alone fails (``Scheduler.isolated`` /
  ``Scheduler.fail_request``), with the error :func:`request_error` names; the batch goes on.
* A device call (prefill, decode, row copy) or the engine's shared bookkeeping raised:
  :meth:`FailurePolicy.recover` fails every request in flight ("engine step failed"), forgets
  the scheduler's state and allocates a fresh KV cache -- or, when that is impossible, marks
  the engine failed so it refuses new work.
* At shutdown (:meth:`FailurePolicy.shutdown`) every pending request and command fails with
  ``BackendUnavailableError``.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Protocol

from agentrl_jax.rollout.contract import (BackendUnavailableError, InvalidRequestError,
                                          RequestFailedError, RolloutError)
from agentrl_jax.rollout.engine.inbox import EngineInbox
from agentrl_jax.rollout.engine.kv_memory import KVCacheMemory
from agentrl_jax.rollout.engine.requests import Request

log = logging.getLogger(__name__)


def request_error(req: Request, error: BaseException) -> Exception:
    """The error ``req``'s caller gets when its own host-side work raised ``error``: an
    ``InvalidRequestError`` as it is (HTTP 400), anything else as a ``RequestFailedError``
    naming the request and the cause (HTTP 500). Logs it."""
    if isinstance(error, InvalidRequestError):
        log.warning("request %s refused in the engine: %s", req.rid, error)
        return error
    log.error("request %s failed alone: %s: %s", req.rid, type(error).__name__, error,
              exc_info=error)
    return RequestFailedError(f"request {req.rid!r} failed in the engine (the other "
                              f"requests go on): {type(error).__name__}: {error}")


def fail_future(future: concurrent.futures.Future, error: BaseException) -> None:
    """Set ``error`` on ``future`` unless it is done already."""
    if not future.done():
        try:
            future.set_exception(error)
        except concurrent.futures.InvalidStateError:
            pass


class Resettable(Protocol):
    """What recovery needs of the scheduler (``scheduler.Scheduler``)."""

    def deliver(self) -> None: ...

    def reset(self) -> None: ...


class FailurePolicy:
    """Engine-wide failures: recovery after a failed step, and shutdown. Owns no state of its
    own; it acts on the ``inbox`` (the requests and commands in flight), the ``scheduler``
    (its queues and slots) and the ``kv`` cache memory."""

    def __init__(self, inbox: EngineInbox, scheduler: Resettable, kv: KVCacheMemory):
        self._inbox = inbox
        self._scheduler = scheduler
        self._kv = kv

    def recover(self, error: BaseException) -> None:
        """After a failed device call (or an error in the engine's shared bookkeeping, which
        no single request explains): fail every in-flight request, reset the scheduler and the
        cache; if no cache can be allocated, the engine refuses new work (``inbox.error``)."""
        message = f"{type(error).__name__}: {error}"
        self._scheduler.deliver()  # finished before the failure: their results stand
        for req in self._inbox.take_all():
            fail_future(req.future, RolloutError(f"engine step failed: {message}"))
        self._scheduler.reset()
        try:
            self._kv.reset()
        except Exception as e:  # noqa: BLE001
            self._inbox.error = f"cannot reallocate the KV cache after {message}: {e}"

    def shutdown(self) -> None:
        """Fail every pending request and command: the engine was closed."""
        self._scheduler.deliver()  # finished before the close: their results stand
        requests = self._inbox.take_all(reset_waiting=False)
        commands = self._inbox.take_commands()
        for req in requests:
            fail_future(req.future, BackendUnavailableError("the engine was closed"))
        for _, future in commands:
            fail_future(future, BackendUnavailableError("the engine was closed"))


__all__ = ["FailurePolicy", "Resettable", "fail_future", "request_error"]
