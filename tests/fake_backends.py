"""The tests' fake rollout backends (a quiet base, scripted replies, a recording wrapper around
a real engine) and a lettered-choice BabyAI episode that drives one (no JAX).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from agentrl_jax.agent.chat import ChatFormatter
from agentrl_jax.agent.episode import Episode
from agentrl_jax.agent.parsing import get_parser
from agentrl_jax.agent.trajectory import Trajectory
from agentrl_jax.rollout.contract import GenerateResult, RolloutBackend, SamplingParams
from environments.core.client import EnvClient

#: a BabyAI task solved in three moves: turn left, turn right, go to red ball 1
GO_TO_RED_BALL = "BabyAI-GoToRedBallNoDists-v0/seed=0"


class Call(NamedTuple):
    """One ``generate`` call: the prompt ids, the sampling and session it came with, the reply."""

    input_ids: list[int]
    sampling: SamplingParams | None
    session_id: str | None
    result: GenerateResult


class QuietBackend(RolloutBackend):
    """A rollout backend whose weight updates, health checks and closing do nothing; a test's
    fake defines only ``generate``."""

    async def update_weights(self, params=None, *, path=None, version=None):
        pass

    async def health(self):
        return True

    async def aclose(self):
        pass


class _Recorded:
    """Views of a backend's call log ``self.log`` (a list of ``Call``, in call order)."""

    log: list[Call]

    @property
    def calls(self) -> dict[str | None, list[tuple[list[int], GenerateResult]]]:
        """Per session (episode id): ``(input ids, result)`` of each of its calls, in order."""
        sessions: dict[str | None, list[tuple[list[int], GenerateResult]]] = {}
        for call in self.log:
            sessions.setdefault(call.session_id, []).append((call.input_ids, call.result))
        return sessions

    @property
    def prompts(self) -> list[list[int]]:
        """The input ids of every call, in call order."""
        return [call.input_ids for call in self.log]

    @property
    def sampling(self) -> list[SamplingParams | None]:
        """The sampling parameters of every call, in call order."""
        return [call.sampling for call in self.log]


class ScriptedBackend(_Recorded, QuietBackend):
    """Replies with fixed texts after ``delay`` seconds; records every call (``log``, in the
    order the calls end).

    replies: one text, the reply to every call (its ids: ``ids``), or a sequence: call ``k``
    (0-based, in the order the calls begin) gets ``replies[k]``. A reply's ids are
    ``tokenizer.encode(text)`` then the EOS id when ``eos`` (finish reason ``"stop"``), else the
    text's ids alone (``"length"``). logprob: each generated id's log-prob, a constant or
    ``logprob(k, i)`` for the ``i``-th id of call ``k``.
    """

    name = "scripted"

    def __init__(self, tokenizer: Any, replies: str | Sequence[str], *, eos: bool = True,
                 logprob: float | Callable[[int, int], float] = -0.25, delay: float = 0.0,
                 takes_id_arrays: bool = False):
        self.takes_id_arrays = takes_id_arrays  # (RolloutBackend.takes_id_arrays)
        texts = [replies] if isinstance(replies, str) else list(replies)
        tail = [tokenizer.eos_token_id] if eos else []
        self.replies = [tokenizer.encode(t, add_special_tokens=False) + tail for t in texts]
        self.repeat = isinstance(replies, str)
        self.finish_reason = "stop" if eos else "length"
        self.logprob, self.delay = logprob, delay
        self.started = 0  # calls begun; call k is the k-th to begin (0-based)
        self.log: list[Call] = []
        self.id_types: list[type] = []  # the type of each call's input_ids, in ``log`` order

    @property
    def ids(self) -> list[int]:
        """The reply's ids (a backend built with one text)."""
        assert self.repeat, "ids: this backend has one reply per call"
        return self.replies[0]

    async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
        k, self.started = self.started, self.started + 1
        await asyncio.sleep(self.delay)
        ids = list(self.replies[0 if self.repeat else k])
        logprob = self.logprob
        logprobs = [logprob(k, i) if callable(logprob) else logprob for i in range(len(ids))]
        result = GenerateResult(output_ids=ids, output_logprobs=logprobs,
                                finish_reason=self.finish_reason, prompt_tokens=len(input_ids))
        self.log.append(Call(list(input_ids), sampling, session_id, result))
        self.id_types.append(type(input_ids))
        return result


class RecordingBackend(_Recorded, QuietBackend):
    """Wraps a real backend (``inner``, e.g. an ``Engine``): its ``generate`` and
    ``end_session``, recording every call (``log``)."""

    name = "recording"

    def __init__(self, inner: RolloutBackend):
        self.inner = inner
        self.log: list[Call] = []

    @property
    def takes_id_arrays(self) -> bool:  # as the wrapped backend
        return bool(getattr(self.inner, "takes_id_arrays", False))

    async def generate(self, input_ids, sampling=None, session_id=None, rid=None):
        result = await self.inner.generate(input_ids, sampling, session_id=session_id, rid=rid)
        self.log.append(Call(list(input_ids), sampling, session_id, result))
        return result

    def end_session(self, session_id):
        self.inner.end_session(session_id)


async def choice_episode(url: str, backend: RolloutBackend, tokenizer: Any, *, horizon: int,
                         max_new_tokens: int, task: str = GO_TO_RED_BALL,
                         option_limits: bool = False, action_text: bool = True) -> Trajectory:
    """One lettered-choice episode (``parser="choice"``, ``prompt_style="choice"``, response
    prefix ``"Action:"``, whole history) of BabyAI ``task`` on the server at ``url``, replies
    from ``backend``; ``action_text=False`` keeps the action list out of the observations."""
    async with EnvClient(url, action_text=action_text) as client:
        episode = Episode(env_client=client, backend=backend, formatter=ChatFormatter(tokenizer),
                          parser=get_parser("choice"), env_name="babyai", task_id=task,
                          group_id=0, sample_index=0, horizon=horizon,
                          sampling=SamplingParams(max_new_tokens=max_new_tokens),
                          max_context=4096, policy_version=0, prompt_style="choice",
                          response_prefix="Action:", history_turns=0, history_stride=1,
                          option_limits=option_limits, shuffle_options=False)
        return await episode.run()
