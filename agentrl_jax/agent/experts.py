"""Expert policies behind the rollout-backend interface, for recording behaviour-cloning data.

An :class:`ExpertBackend` stands where the LLM engine stands: the actor pool, the episodes, the
environment servers (HTTP), the prompts and the chat formatting are exactly those of RL, and
each "generation" is an expert's action written the way the policy answers in RL: after the
turn's response prefix (``agent.response_prefix``, e.g. ``"Action:"``: ``" go to red ball 1"``)
and ending with the turn's stop string (``"\\n"``; the engine keeps the token that completed the
stop, so the policy's turn ends with it too) or, without one, the model's EOS token. A recorded
trajectory therefore has the token layout RL trains on, and behaviour cloning trains on its
``loss_mask`` (the action tokens only).

Each environment family's registry entry carries its expert (``Family.expert``, in
``environments/<name>/expert.py``) and named variants (``Family.expert_variants``);
``EXPERT_POLICIES`` reads them by name, each reading what the agent reads:

* ``babyai``: minigrid's ``BabyAIBot`` on a local replica of the task's level (primitive
  actions; ``environments/babyai/expert.py``); ``babyai_macro`` (``launch/record_experts.py
  --expert babyai_macro``): the bot's solution shortened with the environment's macro actions
  (``environments/babyai/macro_expert.py``);
* ``textcraft``: the recipe expert, planning from the crafting commands of the first
  observation and the answers to its actions (``environments/textcraft/expert.py``);
* ``scienceworld``: the task's gold action sequence from the ScienceWorld package
  (``environments/scienceworld/expert.py``);
* ``miniwob``: the rule-based expert over the text observation (``environments/miniwob/
  expert.py``);
* ``deepsearch``: the retrieval oracle (``environments/deepsearch/expert.py``): it searches with
  the question and answers with the golden answer a passage contains (else "unknown", which
  fails and is not trained on), i.e. "search the question, copy the matching title".

An expert with no action left (``None``) or that fails (minigrid's bot asserts on some
levels) ends its episode as an ``engine_error``: such episodes are counted
(``ExpertBackend.failures``, by exception type) and never trained on.

An expert never hangs the recorder. Experts run synchronously on the recorder's event loop, so
one call that does not return would stop every episode and every progress line (what happened
on BabyAI: minigrid's ``BabyAIBot`` loops forever on most ``BabyAI-UnlockToUnlock-v0`` seeds,
12 of 1,500 sampled train tasks, pushing subgoals without end: docs/TRAINING.md). Two caps:

* ``environments.babyai.expert.BoundedSubgoalStack`` replaces the bot's subgoal stack: more than ``max_len`` subgoals
  (normal episodes peak at 16) or more than ``max_reads`` reads of the stack in one call
  (normal: at most 9) raise :class:`ExpertStuck`;
* every ``act`` call (the expert's construction included) runs under a wall-clock deadline
  (``ExpertBackend(act_timeout_s=...)``, :func:`call_with_deadline`): past it,
  :class:`ExpertTimeout` is raised inside the call (``SIGALRM``; main thread only).

Either ends the episode as an ``engine_error`` with the reason in its ``error``.

An expert class whose work is bounded but may be slow, and must not be interrupted, sets
``interruptible = False`` and runs without the deadline, in a worker thread (so the event loop,
and the HTTP timeouts of the other episodes in flight, never wait for it): the ScienceWorld
expert (each task's gold path costs seconds in the JVM, the first call starts one; an exception
raised inside a py4j socket read left the gateway broken, so every later episode of that process
failed with ``Py4JError``, and a blocked loop let another episode's request time out) and the
deep-search oracle (its first call builds the shared BM25 index, which takes seconds).
"""

from __future__ import annotations

import asyncio
import collections
import signal
import threading
import time
from typing import Any, Callable, Iterator, Mapping, TypeVar

from agentrl_jax.agent.trajectory import Trajectory
from environments.core.base import ExpertPolicy, ExpertStuck
from environments.registry import FAMILIES, get_family
from agentrl_jax.rollout.contract import GenerateResult, RolloutBackend, RolloutError


T = TypeVar("T")


class ExpertTimeout(ExpertStuck):
    """An expert call that ran past its wall-clock deadline."""


#: seconds between repeated deadline signals once a call is past its deadline
DEADLINE_RETRY_S = 0.5


def call_with_deadline(fn: Callable[[], T], seconds: float | None) -> T:
    """``fn()``, interrupted by :class:`ExpertTimeout` after ``seconds`` of wall time.

    Uses ``SIGALRM`` (``setitimer``), so it only limits calls on the main thread of a POSIX
    process (the recorder's event loop); elsewhere, or with ``seconds`` None / <= 0, ``fn`` runs
    without a limit. The exception is raised between Python bytecodes, so pure-Python loops
    (minigrid's bot) are interrupted; a single long C call finishes first. A real-time timer
    already pending (e.g. pytest-timeout's) keeps its due time: if it is due first, its own
    handler runs then; otherwise it is re-armed with what is left of it afterwards.

    Past the deadline the timer fires again every :data:`DEADLINE_RETRY_S` until the call has
    ended: an ``ExpertTimeout`` raised while the interpreter runs a finaliser (``__del__``, a gc
    callback) is printed and dropped by Python, and a one-shot timer then left the call running
    for ever (seen as a hung test in a CI run)."""
    if (not seconds or seconds <= 0 or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()):
        return fn()
    t0 = time.monotonic()
    outer_due = 0.0  # seconds from t0 to a pending outer timer (0: none)
    ended = outer_fired = False

    def on_alarm(signum: int, frame: Any) -> None:
        nonlocal outer_fired
        if ended:
            return
        if outer_due and time.monotonic() - t0 >= outer_due - 1e-3 and callable(previous):
            signal.signal(signal.SIGALRM, previous)
            outer_fired = True  # its one due time is spent: not re-armed afterwards
            previous(signum, frame)
            return
        raise ExpertTimeout(f"no action within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    outer_due, outer_interval = signal.setitimer(signal.ITIMER_REAL, float(seconds),
                                                 DEADLINE_RETRY_S)
    if 0 < outer_due < seconds:
        signal.setitimer(signal.ITIMER_REAL, outer_due)
    try:
        return fn()
    finally:
        ended = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_due and not outer_fired:
            left = outer_due - (time.monotonic() - t0)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), outer_interval)
        elif outer_fired and outer_interval:  # a periodic outer timer goes on from here
            signal.setitimer(signal.ITIMER_REAL, outer_interval, outer_interval)


class FamilyExperts(Mapping[str, Callable[[str], ExpertPolicy]]):
    """Every expert by name, read from the environment families' registry entries
    (``Family.expert`` under the family's name, ``Family.expert_variants`` under
    ``"<family>_<variant>"``): adding a family with its expert is its one registration.

    Looking a name up imports only the family it names; listing the names imports every
    family module (they are light: the experts import their simulator when called)."""

    def __getitem__(self, name: str) -> Callable[[str], ExpertPolicy]:
        for family in _families_named_by(name):
            factory = get_family(family).experts().get(name)
            if factory is not None:
                return factory
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(
            name in get_family(f).experts() for f in _families_named_by(name))

    def __iter__(self) -> Iterator[str]:
        return iter([n for f in FAMILIES.names() for n in get_family(f).experts()])

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _families_named_by(name: str) -> list[str]:
    """The registered families an expert ``name`` may belong to: ``name`` itself or a prefix
    of it followed by ``_``."""
    return [f for f in FAMILIES.names() if name == f or name.startswith(f + "_")]


#: expert name -> ``factory(task_id) -> ExpertPolicy``, from the families' entries
EXPERT_POLICIES = FamilyExperts()


def reply_text(action: str, response_prefix: str, stop: str | None) -> str:
    """The policy's reply for ``action``: continues ``response_prefix`` (a space after a prefix
    that does not end in one; ``"Action: "`` first when there is no prefix) and ends with
    ``stop`` (``None``: nothing; the caller appends EOS)."""
    if response_prefix:
        text = action if response_prefix.endswith((" ", "\n")) else " " + action
    else:
        text = "Action: " + action
    return text + (stop or "")


class ExpertBackend(RolloutBackend):
    """A rollout backend whose replies are expert actions (see the module docstring).

    ``sessions`` maps each episode's session id to its trajectory (filled by the caller
    before the episode runs, e.g. :class:`~agentrl_jax.training.jobs.record_experts.ExpertPool`); the
    expert of a session is created on its first turn from the trajectory's environment and
    task, and sees the trajectory's latest user message (the observation).

    ``act_timeout_s``: the wall-clock limit of one expert call (its construction included;
    :func:`call_with_deadline`); None or 0: none. Policies whose factory has
    ``interruptible = False`` run without it. ``failures`` counts the failed calls by
    exception type (``ExpertStuck``, ``ExpertTimeout``, the bot's ``AssertionError``, ...)."""

    name = "expert"

    def __init__(self, formatter: Any, response_prefix: str, stop: str | None,
                 eos_token_id: int | None,
                 policies: Mapping[str, Callable[[str], ExpertPolicy]] | None = None,
                 act_timeout_s: float | None = 10.0):
        if stop is None and eos_token_id is None:
            raise ValueError("an expert turn needs a stop string or an EOS token to end with")
        if act_timeout_s is not None and act_timeout_s < 0:
            raise ValueError(f"act_timeout_s must be >= 0 or None (got {act_timeout_s})")
        self.formatter, self.response_prefix, self.stop = formatter, response_prefix, stop
        self.eos_token_id = eos_token_id
        # the families' experts (looked up on first use) or a plain mapping (tests)
        self.policies = EXPERT_POLICIES if policies is None else dict(policies)
        self.act_timeout_s = act_timeout_s
        self.sessions: dict[str, Trajectory] = {}
        self._experts: dict[str, ExpertPolicy] = {}
        self.failures: collections.Counter[str] = collections.Counter()

    def expert_for(self, session_id: str) -> ExpertPolicy:
        if session_id not in self._experts:
            traj = self.sessions[session_id]
            if traj.env not in self.policies:
                raise RolloutError(f"no expert for environment {traj.env!r} "
                                   f"(have {sorted(self.policies)})")
            self._experts[session_id] = self.policies[traj.env](traj.task_id)
        return self._experts[session_id]

    async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
        if session_id not in self.sessions:
            raise RolloutError(f"unknown expert session {session_id!r}")
        traj = self.sessions[session_id]
        observation = next(m["content"] for m in reversed(traj.messages) if m["role"] == "user")
        factory = self.policies[traj.env] if traj.env in self.policies else None
        try:
            if getattr(factory, "interruptible", True):
                action = call_with_deadline(
                    lambda: self.expert_for(session_id).act(observation), self.act_timeout_s)
            else:
                action = await asyncio.to_thread(
                    lambda: self.expert_for(session_id).act(observation))
        except RolloutError:
            raise
        except Exception as e:  # noqa: BLE001 -- an expert's own failure ends only its episode
            self.failures[type(e).__name__] += 1
            self._experts.pop(session_id, None)  # a stuck expert's state is not reused
            raise RolloutError(f"the expert failed: {type(e).__name__}: {e}") from e
        if action is None:
            self.failures["no_action"] += 1
            raise RolloutError("the expert has no action")
        ids = self.formatter.encode_text(reply_text(action, self.response_prefix, self.stop))
        if self.stop is None:
            ids.append(self.eos_token_id)
        return GenerateResult(output_ids=ids, output_logprobs=[0.0] * len(ids),
                              finish_reason="stop", prompt_tokens=len(input_ids))

    def end_session(self, session_id: str) -> None:
        """Forget a finished episode (its expert holds a simulator replica)."""
        self.sessions.pop(session_id, None)
        self._experts.pop(session_id, None)

    async def update_weights(self, params=None, *, path=None, version=None):
        raise RolloutError("an expert backend has no weights")

    async def health(self):
        return True

    async def aclose(self):
        self._experts.clear()
