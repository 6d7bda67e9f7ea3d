"""Training-iteration detection and degradation detection without user code (EROICA §4.1).

The probe feeds two events: ``"next"`` (a DataLoader iterator's ``__next__``) and ``"step"``
(``Optimizer.step``). One iteration is a few ``next`` then a few ``step``; which exactly is
learned, not assumed:

- *iteration detection*: after M = 10 identical consecutive sequences, each starting at a
  ``next`` that follows a ``step`` and ending at the last ``step`` before the next ``next``,
  that sequence is the *training iteration sequence*;
- *degradation detection*: every fully matched iteration records its duration (first ``next``
  to last ``step``); degraded when the mean of the recent N = 50 iterations exceeds the
  shortest of them by more than 5 %, or (``blocked``) when nothing arrived for 5x the mean
  iteration time while an iteration was open;
- after K = 200 events without a complete match, back to iteration detection.

Pure: the clock is the caller's (``now_ns`` arguments), so tests drive it directly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

Event = Literal["next", "step"]


@dataclass(frozen=True)
class IterationSettings:
    identical: int = 10  # M: identical sequences that define the iteration
    recent: int = 50  # N: iterations whose mean is compared with their shortest
    slower: float = 0.05  # mean > (1 + slower) x shortest => degraded
    blocked_factor: float = 5.0  # no event for this x mean iteration => blocked
    redetect_after: int = 200  # K: events without a match => detect again


class IterationDetector:
    """Feed ``event(kind, now_ns)``; read ``iterations``, ``degraded()``, ``blocked(now_ns)``."""

    def __init__(self, settings: IterationSettings = IterationSettings()) -> None:
        self.s = settings
        self.pattern: tuple[Event, ...] | None = None
        self.iterations = 0  # complete iterations matched since the pattern was found
        self.durations: deque[int] = deque(maxlen=settings.recent)
        self._seq: list[Event] = []  # the sequence being built (detection)
        self._seq_start = 0
        self._candidates: deque[tuple[Event, ...]] = deque(maxlen=settings.identical)
        self._pos = 0  # matching: events of the pattern seen so far
        self._start_ns = 0
        self._last_ns: int | None = None
        self._unmatched = 0

    def event(self, kind: Event, now_ns: int) -> bool:
        """Record one event; True when it completed an iteration."""
        self._last_ns = now_ns
        if self.pattern is None:
            return self._detect(kind, now_ns)
        return self._match(kind, now_ns)

    def _detect(self, kind: Event, now_ns: int) -> bool:
        if kind == "next" and self._seq and self._seq[-1] == "step":
            seq = tuple(self._seq)
            self._candidates.append(seq)
            if len(self._candidates) == self.s.identical and len(set(self._candidates)) == 1:
                self.pattern = seq
                self._pos = 1
                self._start_ns = now_ns
                self._unmatched = 0
                self._seq = []
                return False
            self._seq = []
        if not self._seq:
            self._seq_start = now_ns
        self._seq.append(kind)
        return False

    def _match(self, kind: Event, now_ns: int) -> bool:
        assert self.pattern is not None
        if self._pos < len(self.pattern) and self.pattern[self._pos] == kind:
            if self._pos == 0:
                self._start_ns = now_ns
            self._pos += 1
            if self._pos == len(self.pattern):
                self.durations.append(now_ns - self._start_ns)
                self.iterations += 1
                self._pos = 0
                self._unmatched = 0
                return True
            return False
        # out of pattern: restart at this event if it can begin an iteration
        self._unmatched += 1
        if self._unmatched >= self.s.redetect_after:
            self.pattern = None
            self._candidates.clear()
            self._seq = [kind]
            self._seq_start = now_ns
            return False
        self._pos = 1 if kind == self.pattern[0] else 0
        self._start_ns = now_ns
        return False

    @property
    def last_ns(self) -> int | None:
        """When the last event arrived (the caller's clock)."""
        return self._last_ns

    def mean_ns(self) -> float | None:
        return sum(self.durations) / len(self.durations) if self.durations else None

    def degraded(self) -> bool:
        """Recent mean more than 5 % above the recent shortest (needs N iterations)."""
        if len(self.durations) < self.s.recent:
            return False
        best = min(self.durations)
        return best > 0 and sum(self.durations) / len(self.durations) > (1 + self.s.slower) * best

    def blocked(self, now_ns: int) -> bool:
        """No event for 5x the mean iteration while training was under way."""
        mean = self.mean_ns()
        if mean is None or self._last_ns is None or self.pattern is None:
            return False
        return now_ns - self._last_ns >= self.s.blocked_factor * mean
