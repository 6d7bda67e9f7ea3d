"""Progress of a long run (a 16k-rank ``collscope simulate``, a bench sweep) on stderr.

A bar redrawn in place, at most every ``every_s`` seconds, and only when the stream is a
terminal: piped or captured output (CI logs, ``2>file``, tests) stays exactly what it was::

    simulating 16384 ranks [##########..........]  50%  41s elapsed, ~41s left

``Progress`` is a callable taking the fraction done in [0, 1], so a library loop reports
through a plain ``Callable[[float], None]`` and never imports this module; ``done()`` ends the
line. ``count(n)`` wraps an iteration of known length.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO, TypeVar

_T = TypeVar("_T")
BAR_WIDTH = 20  # characters: fits an 80-column terminal beside the label and the times
EVERY_S = 0.5  # redraws per second: smooth enough, and a 16k-rank loop calls far more often


class Progress:
    """A progress bar on ``stream`` (stderr), silent unless ``stream`` is a terminal."""

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_tty(self.stream) if enabled is None else enabled
        self.every_s = every_s
        self.clock = clock
        self.start = clock()
        self._drawn_at: float | None = None
        self._fraction = 0.0

    def __call__(self, fraction: float) -> None:
        self._fraction = min(max(fraction, 0.0), 1.0)
        if not self.enabled:
            return
        now = self.clock()
        if self._drawn_at is not None and now - self._drawn_at < self.every_s:
            return
        self._drawn_at = now
        self.stream.write("\r" + self.line(now))
        self.stream.flush()

    def line(self, now: float) -> str:
        f = self._fraction
        filled = round(f * BAR_WIDTH)
        elapsed = now - self.start
        # The first few percent predict badly (start-up costs): no estimate before 5 %.
        left = f"~{elapsed * (1 - f) / f:.0f}s left" if f >= 0.05 else "estimating"
        return (
            f"{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {f * 100:3.0f}%"
            f"  {elapsed:.0f}s elapsed, {left}\x1b[K"  # erase what a longer line left
        )

    def done(self) -> None:
        """Draw 100 % and end the line (nothing when silent or never drawn)."""
        if self.enabled and self._drawn_at is not None:
            self._fraction = 1.0
            self.stream.write("\r" + self.line(self.clock()) + "\n")
            self.stream.flush()

    def count(self, items: Iterable[_T], total: int) -> Iterator[_T]:
        """Yield ``items``, reporting i/total after each; ``done()`` at the end."""
        for i, item in enumerate(items, 1):
            yield item
            self(i / total if total else 1.0)
        self.done()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False
