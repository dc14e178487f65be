"""Progress output for the long phases of a run: a bar on a terminal, plain lines otherwise.

* :func:`timed` wraps a phase (model load, compilation, checkpoint save): ``"<what> ..."`` when
  it starts and ``"... done in N s"`` when it ends (on the same line on a terminal, two lines in
  a log file), so a slow phase is never silent.
* :class:`EpisodeProgress` counts the finished episodes of one round (rollout or evaluation):
  a tqdm bar on stderr when stderr is a terminal (or ``mode="bar"``), else plain lines on stdout
  (CI logs) every ``interval_s`` seconds, also while no episode finishes ("0/64 episodes").
  With a :class:`TurnCounter` between the actor pool and the rollout backend it also shows the
  assistant turns and tokens generated so far: a 20-turn episode of a small model on a CPU
  takes minutes, and the turn count shows the round moving before the first episode ends.
  The count is exact: each turn an episode appends (a generation that is not aborted) is
  counted to the round whose task generated it (a context variable that the round's episode
  tasks inherit), so a rollout that overlaps an update or another round is not mixed in; when
  the generations come from elsewhere (actor worker processes), the finished episodes' own
  ``num_turns`` / ``num_generated`` are counted. At the end of a round it equals the sum of the
  episodes' ``num_turns`` and generated tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import shutil
import sys
import time
from typing import Any, Callable, Iterator

from agentrl_jax.compile_notice import format_seconds

BAR, LINES, OFF = "bar", "lines", "off"
__all__ = ["BAR", "LINES", "OFF", "EpisodeProgress", "ProgressSettings", "TurnCounter",
           "format_seconds", "progress_mode", "timed"]


def progress_mode(enabled: bool = True, force_bar: bool = False, stream: Any = None) -> str:
    """``bar`` on a terminal (or when forced), ``lines`` otherwise, ``off`` when disabled."""
    if not enabled:
        return OFF
    stream = sys.stderr if stream is None else stream
    return BAR if force_bar or stream.isatty() else LINES


def say_line(*parts: Any, sep: str = " ", end: str = "\n") -> None:
    """``print(*parts, sep=sep, end=end, flush=True)`` to stdout in ONE write: ``print`` writes
    the text and its end separately, and with ``PYTHONUNBUFFERED`` (common in containers) each
    is a system call of its own, so a log line of another thread or process sharing the
    terminal or pipe (absl's warnings on stderr) could land between a line and its newline."""
    sys.stdout.write(sep.join(str(p) for p in parts) + end)
    sys.stdout.flush()


@contextlib.contextmanager
def timed(say: Callable[..., None], what: str, inline: bool | None = None) -> Iterator[None]:
    """Announce ``what``, run the block, report its duration (nothing more if it raises).

    ``say(message, end=...)`` prints. ``inline`` (default: stdout is a terminal) completes the
    announcement on its own line (``"<what> ... done in N s"``); otherwise the end is a second
    line, so a log shows the start of a phase that is still running.
    """
    inline = sys.stdout.isatty() if inline is None else inline
    t0 = time.monotonic()
    say(f"{what} ...", end="" if inline else "\n")
    try:
        yield
    except BaseException:
        if inline:
            say(" interrupted")
        raise
    took = format_seconds(time.monotonic() - t0)
    say(f" done in {took}" if inline else f"{what} ... done in {took}")


#: the round (:class:`EpisodeProgress`) whose episodes run in this context
_ROUND: contextvars.ContextVar[EpisodeProgress | None] = contextvars.ContextVar(
    "progress_round", default=None)


class TurnCounter:
    """A rollout backend that counts the assistant turns (``generate`` calls that were not
    aborted: an episode appends each of them as a turn) and their generated tokens, in all
    (``turns``, ``tokens``) and for the round of the calling task; everything else is the
    wrapped backend's."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.turns = 0
        self.tokens = 0

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.backend.generate(*args, **kwargs)
        if getattr(result, "finish_reason", None) != "abort":
            n = len(result.output_ids)
            self.turns += 1
            self.tokens += n
            round_ = _ROUND.get()
            if round_ is not None:
                round_.live_turns += 1
                round_.live_tokens += n
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)


class EpisodeProgress:
    """Finished episodes of one round; use ``async with`` and pass the instance (a callable
    taking a trajectory) as the actor pool's ``progress`` callback. ``counter``: the pool's
    :class:`TurnCounter` (turns and tokens of this round are shown too)."""

    def __init__(self, total: int, desc: str, mode: str = LINES, interval_s: float = 30.0,
                 say: Callable[[str], None] = print, unit: str = "episodes",
                 counter: TurnCounter | None = None):
        self.total, self.desc, self.mode = int(total), desc, mode
        self.interval_s, self.say, self.unit = float(interval_s), say, unit
        self.counter = counter
        self.done = 0
        self.live_turns = self.live_tokens = 0  # turns generated by this round's tasks
        self.finished_turns = self.finished_tokens = 0  # of the finished episodes
        self._context_token: Any = None
        self._start = self._last_line = time.monotonic()
        self._bar: Any = None
        self._ticker: asyncio.Task | None = None

    def __call__(self, trajectory: Any = None) -> None:
        if trajectory is not None:
            self.finished_turns += int(getattr(trajectory, "num_turns", 0))
            self.finished_tokens += int(getattr(trajectory, "num_generated", 0))
        self.update(1)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def turns(self) -> tuple[int, int] | None:
        """(assistant turns, generated tokens) of this round so far, if counted: those its
        tasks generated, or (generations not seen here) those of its finished episodes."""
        if self.counter is None:
            return None
        return (max(self.live_turns, self.finished_turns),
                max(self.live_tokens, self.finished_tokens))

    def line(self) -> str:
        turns = self.turns()
        work = f", {turns[0]} turns, {turns[1]} tokens" if turns is not None else ""
        return (f"{self.desc}: {self.done}/{self.total} {self.unit}{work} "
                f"({format_seconds(self.elapsed)})")

    def _refresh_bar(self) -> None:
        turns = self.turns()
        if turns is not None:
            self._bar.set_postfix_str(f"{turns[0]} turns, {turns[1]} tokens", refresh=False)
        self._bar.refresh()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.mode == LINES and time.monotonic() - self._last_line >= self.interval_s:
            self._print_line()

    def _print_line(self) -> None:
        self._last_line = time.monotonic()
        self.say(self.line())

    async def _tick(self) -> None:
        """Keeps the output alive while no episode finishes: redraws the bar (its clock) each
        second, or prints a line when ``interval_s`` passed since the last one."""
        while True:
            await asyncio.sleep(1.0 if self._bar is not None else max(self.interval_s, 0.1))
            if self._bar is not None:
                self._refresh_bar()
            elif time.monotonic() - self._last_line >= self.interval_s:
                self._print_line()

    async def __aenter__(self) -> EpisodeProgress:
        self._start = self._last_line = time.monotonic()
        self._context_token = _ROUND.set(self)  # the episode tasks started inside inherit it
        if self.mode == BAR:
            from tqdm import tqdm
            # a terminal that reports no size (a bare pty) gets 100 x 20, not a hidden bar
            size = shutil.get_terminal_size((100, 20))
            self._bar = tqdm(total=self.total, desc=self.desc, unit="ep", leave=False,
                             file=sys.stderr, ncols=size.columns, nrows=size.lines)
        if self.mode != OFF and self.total > 0:
            self._ticker = asyncio.ensure_future(self._tick())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._context_token is not None:
            _ROUND.reset(self._context_token)
            self._context_token = None
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
            self._ticker = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None


@dataclasses.dataclass
class ProgressSettings:
    """How a job's rounds (rollouts, evaluations) show their episodes: ``mode`` (``BAR``,
    ``LINES`` or ``OFF``), a line every ``seconds`` without a terminal, and the turn counter
    between the actor pool and the backend (``None`` until the backend runs)."""

    mode: str
    seconds: float
    turn_counter: TurnCounter | None = None
