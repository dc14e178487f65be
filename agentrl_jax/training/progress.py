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
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import time
from typing import Any, Callable, Iterator

BAR, LINES, OFF = "bar", "lines", "off"


def format_seconds(seconds: float) -> str:
    """``"42.0 s"``, ``"3 min 05 s"``, ``"1 h 02 min"``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def progress_mode(enabled: bool = True, force_bar: bool = False, stream: Any = None) -> str:
    """``bar`` on a terminal (or when forced), ``lines`` otherwise, ``off`` when disabled."""
    if not enabled:
        return OFF
    stream = sys.stderr if stream is None else stream
    return BAR if force_bar or stream.isatty() else LINES


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


class TurnCounter:
    """A rollout backend that counts the ``generate`` calls (assistant turns) and generated
    tokens passing through it; everything else is the wrapped backend's."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.turns = 0
        self.tokens = 0

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.backend.generate(*args, **kwargs)
        self.turns += 1
        self.tokens += len(result.output_ids)
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
        self._counted_before = (0, 0)  # the counter's (turns, tokens) when the round started
        self._start = self._last_line = time.monotonic()
        self._bar: Any = None
        self._ticker: asyncio.Task | None = None

    def __call__(self, _trajectory: Any = None) -> None:
        self.update(1)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def turns(self) -> tuple[int, int] | None:
        """(assistant turns, generated tokens) of this round so far, if counted."""
        if self.counter is None:
            return None
        return (self.counter.turns - self._counted_before[0],
                self.counter.tokens - self._counted_before[1])

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
        if self.counter is not None:
            self._counted_before = (self.counter.turns, self.counter.tokens)
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
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
            self._ticker = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
