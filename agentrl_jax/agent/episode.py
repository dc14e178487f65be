"""One multi-turn episode as a small state machine: create -> {generate -> parse -> step} -> close.

The two halves of a turn (``generate_turn`` and ``env_turn``) are separate coroutines so the
actor pool can run episodes fully asynchronously (each episode loops on its own) or, for
comparison, in lock-step rounds.

**History window** (``history_turns = N > 0``, config ``agent.history_turns``; stride
``K = history_stride``, ``agent.history_stride``, 1 <= K <= N): the prompt of a turn holds the
system prompt, the first user message (the task) and at most the last ``N`` (assistant reply,
observation) pairs; when turns were dropped the first user message ends with one line "(k
earlier turns omitted)". Turns ``0..N`` extend one token sequence as without a window; the
turn that would see ``N + 1`` pairs drops the oldest ``K`` of them, so its prompt holds
``N - K + 1`` pairs, is no longer an extension of the previous one and starts a new *chunk* of
the trajectory (``Trajectory.chunk_starts``); the next ``K - 1`` turns extend that chunk, until
it would hold ``N + 1`` pairs again. ``K = 1``: every turn past ``N`` starts a chunk holding the
last ``N`` pairs; a larger ``K`` starts one every ``K`` turns, so past the window a rollout
prefills and the learner trains about ``K`` times fewer repeated tokens, at the price of
prompts that hold between ``N - K + 1`` and ``N`` pairs. The prompt is built from token
pieces: the first prompt's ids for the windowed first message, then each kept turn's own ids
(its generated ids, its observation ids, the response prefix) exactly as they stood in the
sequence they were generated in. The engine is given exactly the current chunk
(``Trajectory.context_ids``), and the learner trains each chunk as one row, so a generated id
is trained in the very context it was sampled in (``training/rl/batching.py``). The prompt
stops growing with the turn count; the cost is a fresh prefill per chunk (the engine reuses
only the prefix the new prompt shares with the session's previous sequence: the system prompt
and the task up to the omitted-turns line) and learner rows that repeat the kept turns as
context.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import uuid
from typing import Any, Callable, Mapping

from agentrl_common.seeding import derive_seed
from environments.core.base import SHAPING_KEY
from agentrl_jax.agent.chat import ChatFormatter
from agentrl_jax.agent.context_ids import ContextIds
from agentrl_jax.agent.loop_times import LoopTimes
from agentrl_jax.agent.parsing import (CHOICE_LABELS, INVALID_FORMAT_FEEDBACK, ParsedAction,
                                       option_order, options_block, takes_options)
from agentrl_jax.agent.prompts import first_user_message, system_prompt, windowed_first_message
from agentrl_jax.agent.trajectory import (STATUS_CONTEXT_LIMIT, STATUS_DONE, STATUS_ENGINE_ERROR,
                                          STATUS_ENV_ERROR, STATUS_MAX_TURNS, Trajectory,
                                          anchor_state)
from agentrl_jax.rollout.contract import RolloutError, SamplingParams

_clock = time.perf_counter
MIN_NEW_TOKENS = 8  # a turn with less room than this ends the episode with context_limit


class Episode:
    """Drives one episode; ``trajectory`` holds the result once ``finished``."""

    def __init__(self, *, env_client: Any, backend: Any, formatter: ChatFormatter,
                 parser: Callable[[str], ParsedAction], env_name: str, task_id: str,
                 group_id: int, sample_index: int, horizon: int, sampling: SamplingParams,
                 max_context: int, policy_version: int, seed: int | None = None,
                 prompt_style: str, response_prefix: str, history_turns: int,
                 history_stride: int, option_limits: bool, shuffle_options: bool,
                 option_seed: int = 0,
                 env_errors: tuple[type[BaseException], ...] = (Exception,),
                 version_fn: Callable[[], int] | None = None):
        """``option_limits`` (``agent.option_limits``): a turn that lists ``n`` options asks
        the backend to sample only the first ``n`` option tokens (``SamplingParams.
        option_count``) and records ``n`` on its generated ids (``Trajectory.option_counts``).
        ``shuffle_options`` (``agent.shuffle_options``): a multiple-choice turn lists the
        environment's options in the order ``parsing.option_order(options, option_seed)`` (a
        function of the seed and the option list, not of the sample), and a reply's letter names
        the option shown at it.
        ``prompt_style``, ``response_prefix``, ``history_turns``, ``history_stride``:
        ``agent.*`` of the run config (no defaults here: one source per setting).
        ``history_turns``: 0 keeps the whole history; ``N > 0``: the history window of the
        module docstring, which drops ``history_stride`` turns at once. ``version_fn``: the
        weights version the backend serves now, read when a turn starts (default:
        ``policy_version`` throughout). Weights only get newer, so that is the oldest
        version any token of the turn can come from, also when they change mid-turn; it is
        the turn's entry of ``trajectory.turn_versions``."""
        self.env_client, self.backend, self.formatter, self.parser = (env_client, backend,
                                                                     formatter, parser)
        self.sampling, self.max_context, self.horizon = sampling, max_context, horizon
        self.seed = seed
        if not isinstance(history_turns, int) or history_turns < 0:
            raise ValueError(f"history_turns must be an integer >= 0 (got {history_turns!r})")
        if not isinstance(history_stride, int) or not (
                1 <= history_stride <= max(history_turns, 1)):
            raise ValueError(f"history_stride must be an integer in 1..{max(history_turns, 1)} "
                             f"(history_turns={history_turns}; got {history_stride!r})")
        self.history_turns, self.history_stride = history_turns, history_stride
        self._kept = 0  # the (reply, observation) pairs the current chunk holds
        # the kept turns' token spans (reply ids + observation ids + response prefix), newest
        # last, and the first user message: the pieces of a windowed prompt
        self._spans: collections.deque[list[int]] = collections.deque(maxlen=history_turns or 1)
        self._first_user = ""
        self.version_fn = version_fn
        self.env_errors = env_errors
        self.prompt_style = prompt_style
        # Text that opens every assistant turn (e.g. "Action:"): part of the prompt side of the
        # trajectory (loss mask 0); the model continues it.
        self.response_prefix = response_prefix
        self._prefix_ids = formatter.encode_text(response_prefix) if response_prefix else []
        self.session_id = f"ep-{uuid.uuid4().hex[:16]}"
        self.trajectory = Trajectory(env=env_name, task_id=task_id, group_id=group_id,
                                     sample_index=sample_index, horizon=horizon,
                                     episode_id=self.session_id,
                                     policy_version=policy_version)
        self.env_id: str | None = None
        self.system: str | None = None
        self.finished = False
        self._last_generated: list[int] = []
        self._pending_action: ParsedAction | None = None
        # the environment state the next turn acts from (GiGPO anchor; unchanged by a turn
        # whose reply had no action, since the environment was not stepped)
        self._state: str = ""
        self._start = time.monotonic()
        # where this episode's wall time goes (``loop_times.py``; always on, a few clock reads)
        self.times = LoopTimes(episodes=1)
        self._created = _clock()
        self._waited = 0.0  # the current coroutine's time in its await (not host work)
        # a multiple-choice parser (parsing.parse_choice): the environment's valid actions of
        # the current state are shown after each observation and read with the reply
        self._takes_options = takes_options(parser)
        self._options: list[str] = []  # as shown (permuted with ``shuffle_options``)
        self._order: list[int] = []  # shown option k is the environment's option _order[k]
        self.option_limits = bool(option_limits)
        self.shuffle_options = bool(shuffle_options)
        self.option_seed = int(option_seed)
        self._id_arrays = bool(getattr(backend, "takes_id_arrays", False))
        self._context = ContextIds()

    def turn_seed(self, turn: int) -> int | None:
        """The sampling seed of assistant turn ``turn``: derived from the episode's seed and the
        turn index, so every generation call draws fresh randomness (reusing one seed would
        replay the same random stream over a near-identical prompt, and the agent would repeat
        its last turn) while the run stays reproducible. ``None`` (unseeded) stays ``None``."""
        if self.sampling.seed is None:
            return None
        return derive_seed(self.sampling.seed, turn)

    def _with_options(self, observation: str, info: dict[str, Any] | None) -> str:
        """``observation`` followed by the options block, for a multiple-choice parser; the
        options are the client's listed actions (``agent.list_valid_actions``), else the
        environment's ``available_actions``, in the environment's order or, with
        ``shuffle_options``, permuted (``parsing.option_order``); ``info`` None keeps the
        current ones."""
        if not self._takes_options:
            return observation
        if info is not None:
            options = info.get("listed_actions") or info.get("available_actions") or []
            listed = [str(o) for o in options]
            self._order = (option_order(listed, self.option_seed) if self.shuffle_options
                           else list(range(len(listed))))
            self._options = [listed[i] for i in self._order]
        return f"{observation}\n{options_block(self._options)}" if self._options else observation

    def _finish(self, status: str, error: str | None = None) -> None:
        self.trajectory.status = status
        self.trajectory.error = error
        self.trajectory.elapsed_s = time.monotonic() - self._start
        self.finished = True

    async def start(self) -> None:
        t0 = _clock()
        waited = 0.0
        try:
            try:
                created = await self.env_client.create(task_id=self.trajectory.task_id,
                                                       seed=self.seed)
            except self.env_errors as e:
                self._finish(STATUS_ENV_ERROR, f"create: {e}")
                return
            finally:
                waited = _clock() - t0
                self.times.env_s += waited
                self.times.env_calls += 1
            self._start_prompt(created)
        finally:
            self.times.host_s += _clock() - t0 - waited

    def _start_prompt(self, created: tuple) -> None:
        """The first prompt from ``create``'s answer."""
        self.env_id, observation, info = created
        self._state = anchor_state(observation, info)
        self.system = system_prompt(info.get("instructions", ""), self.trajectory.env,
                                    self.prompt_style)
        user = first_user_message(self._with_options(observation, info))
        self._first_user = user
        self.trajectory.messages = [{"role": "system", "content": self.system},
                                    {"role": "user", "content": user}]
        prompt = self.formatter.prompt_ids(self.system, user) + self._prefix_ids
        self.trajectory.prompt_length = len(prompt)
        self.trajectory.append(prompt, generated=False, turn=-1)
        if len(prompt) + MIN_NEW_TOKENS > self.max_context:
            self._finish(STATUS_CONTEXT_LIMIT,
                         f"the first prompt takes {len(prompt)} of the {self.max_context} tokens "
                         f"of the context: fewer than {MIN_NEW_TOKENS} are left to generate")

    async def generate_turn(self) -> None:
        """Ask the backend for the next assistant turn and parse its action."""
        t0 = _clock()
        self._waited = 0.0
        try:
            await self._generate_turn()
        finally:
            self.times.host_s += _clock() - t0 - self._waited

    async def _generate_turn(self) -> None:
        traj = self.trajectory
        # the current chunk, exactly what the engine is given: an array kept up to date for a
        # backend that takes one (context_ids.py), else a new list
        context = (self._context.of(traj) if self._id_arrays else traj.context_ids())
        room = self.max_context - len(context)
        if room < MIN_NEW_TOKENS:
            self._finish(STATUS_CONTEXT_LIMIT)
            return
        # the options block names at most len(CHOICE_LABELS) options (parsing.options_block)
        count = (min(len(self._options), len(CHOICE_LABELS))
                 if self.option_limits and self._options else None)
        sampling = dataclasses.replace(self.sampling,
                                       max_new_tokens=min(self.sampling.max_new_tokens, room),
                                       seed=self.turn_seed(traj.num_turns), option_count=count)
        version = self.version_fn() if self.version_fn is not None else traj.policy_version
        t1 = _clock()
        try:
            result = await self.backend.generate(context, sampling, session_id=self.session_id)
        except (RolloutError, OSError, TimeoutError) as e:
            self._finish(STATUS_ENGINE_ERROR, f"generate: {e}")
            return
        finally:
            self._waited = _clock() - t1
            self.times.gen_s += self._waited
        self.times.turns += 1
        self.times.engine_s += float(getattr(result, "latency_s", None) or 0.0)
        if result.finish_reason == "abort":
            self._finish(STATUS_ENGINE_ERROR, "generation aborted")
            return
        turn = traj.num_turns
        traj.append(list(result.output_ids), generated=True, turn=turn,
                    logprobs=[float(x) for x in result.output_logprobs],
                    option_count=count or 0)
        traj.num_turns += 1
        traj.turn_states.append(self._state)
        traj.turn_versions.append(version)
        self._last_generated = list(result.output_ids)
        text = self.response_prefix + self.formatter.decode(result.output_ids)
        traj.messages.append({"role": "assistant", "content": text})
        if result.finish_reason == "length" and traj.context_tokens >= self.max_context:
            self._finish(STATUS_CONTEXT_LIMIT)
            return
        if self._takes_options:
            parsed = self.parser(text, self._options)
            # the option it named, as shown and in the environment's order (-1: none)
            shown = -1 if parsed.option is None else parsed.option
            self.trajectory.letter_picks.append(shown)
            self.trajectory.option_picks.append(-1 if shown < 0 else self._order[shown])
            self._pending_action = parsed
        else:
            self._pending_action = self.parser(text)

    async def env_turn(self) -> None:
        """Step the environment with the parsed action and append the observation ids."""
        t0 = _clock()
        self._waited = 0.0
        try:
            await self._env_turn()
        finally:
            self.times.host_s += _clock() - t0 - self._waited

    async def _env_turn(self) -> None:
        traj = self.trajectory
        parsed = self._pending_action
        self._pending_action = None
        done = False
        if parsed is None or parsed.action is None:
            traj.invalid_actions += 1
            traj.parse_failures += 1
            traj.turn_rewards.append(0.0)
            observation = self._with_options(INVALID_FORMAT_FEEDBACK, None)
        else:
            t1 = _clock()
            try:
                step = await self.env_client.step(self.env_id, parsed.action)
            except self.env_errors as e:
                self._finish(STATUS_ENV_ERROR, f"step: {e}")
                return
            finally:
                self._waited = _clock() - t1
                self.times.env_s += self._waited
                self.times.env_calls += 1
            traj.turn_rewards.append(float(step.reward))
            traj.reward += float(step.reward)
            traj.shaping += float(step.info.get(SHAPING_KEY, 0.0))
            if step.info.get("invalid_action"):
                traj.invalid_actions += 1
            if "success" in step.info:
                traj.success = bool(step.info["success"])
            self._state = anchor_state(step.observation, step.info)
            done = step.done or step.truncated
            observation = step.observation if done else self._with_options(step.observation,
                                                                           step.info)
        if done:
            self._finish(STATUS_DONE)
            return
        if traj.num_turns >= self.horizon:
            self._finish(STATUS_MAX_TURNS)
            return
        obs_ids = self.formatter.observation_ids(self.system, observation, self._last_generated)
        tail = obs_ids + self._prefix_ids
        if self.history_turns:
            self._spans.append(self._last_generated + tail)
            self._kept += 1
        if self.history_turns and self._kept > self.history_turns:
            # the window is full: the next prompt drops the oldest history_stride turns and
            # starts a new chunk
            self._kept = self.history_turns - self.history_stride + 1
            omitted = traj.num_turns - self._kept
            kept = list(self._spans)[-self._kept:]
            prompt = (self.formatter.prompt_ids(
                self.system, windowed_first_message(self._first_user, omitted))
                + self._prefix_ids + [i for span in kept for i in span])
            if len(prompt) + MIN_NEW_TOKENS > self.max_context:
                self._finish(STATUS_CONTEXT_LIMIT)
                return
            traj.messages.append({"role": "user", "content": observation})
            traj.start_chunk(prompt)
            return
        if traj.context_tokens + len(tail) + MIN_NEW_TOKENS > self.max_context:
            self._finish(STATUS_CONTEXT_LIMIT)
            return
        traj.messages.append({"role": "user", "content": observation})
        traj.append(tail, generated=False, turn=traj.num_turns - 1)

    async def close(self) -> None:
        if self.env_id is not None:
            env_id, self.env_id = self.env_id, None
            t0 = _clock()
            try:
                await self.env_client.close(env_id)
            except self.env_errors:
                pass  # the server may be gone; its reaper cleans up
            finally:
                self.times.env_s += _clock() - t0
                self.times.env_calls += 1
        if not self.finished:  # an exception or cancellation interrupted the episode
            self._finish(STATUS_ENV_ERROR, "episode interrupted")
        self.times.wall_s = _clock() - self._created
        end_session = getattr(self.backend, "end_session", None)  # duck-typed backends may lack it
        if end_session is not None:
            end_session(self.session_id)

    async def run(self) -> Trajectory:
        """The whole episode, asynchronously (no waiting on other episodes)."""
        try:
            await self.start()
            while not self.finished:
                await self.generate_turn()
                if self.finished:
                    break
                await self.env_turn()
        finally:
            await self.close()
        return self.trajectory


@dataclasses.dataclass(frozen=True)
class TaskRef:
    """One task of one environment family."""

    env: str
    task_id: str


def start_episode(task: TaskRef, group_id: int, sample_index: int, horizon: int,
                  policy_version: int, seed: int | None, *, env_clients: Mapping[str, Any],
                  backend: Any, formatter: ChatFormatter, parser: Callable[[str], ParsedAction],
                  sampling: SamplingParams, max_context: int,
                  env_errors: tuple[type[BaseException], ...], prompt_style: str,
                  response_prefix: str, history_turns: int, history_stride: int,
                  option_limits: bool, shuffle_options: bool,
                  version_fn: Callable[[], int] | None = None) -> Episode:
    """The :class:`Episode` of sample ``sample_index`` of group ``group_id`` (the actor pool's
    and an actor worker's). With a seed (``seed``, else ``sampling.seed``) the episode's base
    seed is ``derive_seed(seed, group_id, sample_index)``; the episode derives every turn's
    from it. ``shuffle_options``: the options' order comes from that seed before the
    per-sample derivation (0 when there is none), so the samples of a group, and every group
    of the rollout, see one order per option list (identical first prompts within a group,
    which the engine shares). ``KeyError`` for a family without a client in ``env_clients``."""
    if task.env not in env_clients:
        raise KeyError(f"no environment client for {task.env!r} (have {sorted(env_clients)})")
    base = seed if seed is not None else sampling.seed
    if base is not None:
        sampling = dataclasses.replace(sampling, seed=derive_seed(base, group_id, sample_index))
    return Episode(env_client=env_clients[task.env], backend=backend, formatter=formatter,
                   parser=parser, env_name=task.env, task_id=task.task_id, group_id=group_id,
                   sample_index=sample_index, horizon=horizon, sampling=sampling,
                   max_context=max_context, policy_version=policy_version,
                   env_errors=env_errors, prompt_style=prompt_style,
                   response_prefix=response_prefix, version_fn=version_fn,
                   history_turns=history_turns, history_stride=history_stride,
                   option_limits=option_limits,
                   shuffle_options=shuffle_options, option_seed=base or 0)
