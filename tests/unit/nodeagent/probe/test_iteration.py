"""Iteration and degradation detection (EROICA §4.1) driven by a synthetic clock."""

from __future__ import annotations

from collscope.nodeagent.probe import iteration

MS = 1_000_000


def _feed(d: iteration.IterationDetector, n: int, t: int, dur_ms: float, nexts: int = 2) -> int:
    """n iterations of `nexts` x next then 2 x step (gradient accumulation), each dur_ms."""
    for _ in range(n):
        step = int(dur_ms * MS) // (nexts + 2)
        for _ in range(nexts):
            d.event("next", t)
            t += step
        d.event("step", t)
        t += step
        d.event("step", t)
        t += step
    return t


def test_pattern_is_learned_after_m_identical_sequences() -> None:
    d = iteration.IterationDetector()
    t = _feed(d, 10, 0, 100)
    assert d.pattern is None  # the 10th sequence ends only at the next `next`
    t = _feed(d, 1, t, 100)
    assert d.pattern == ("next", "next", "step", "step")
    t = _feed(d, 5, t, 100)
    assert d.iterations == 6  # the 11th, detected at its first `next`, and 5 more
    assert abs((d.mean_ns() or 0) - 75 * MS) < MS  # first next .. last step = 3 of 4 quarters


def test_irregular_events_delay_detection() -> None:
    d = iteration.IterationDetector()
    t = _feed(d, 5, 0, 100)
    t = _feed(d, 1, t, 100, nexts=3)  # one odd sequence breaks the run of identical ones
    t = _feed(d, 5, t, 100)
    assert d.pattern is None
    _feed(d, 10, t, 100)
    assert d.pattern == ("next", "next", "step", "step")


def test_degradation_when_recent_mean_exceeds_best_by_5_percent() -> None:
    d = iteration.IterationDetector()
    t = _feed(d, 61, 0, 100)
    assert len(d.durations) == 50 and not d.degraded()
    t = _feed(d, 1, t, 104)
    assert not d.degraded()  # one slightly slow iteration moves the mean by < 5 %
    _feed(d, 5, t, 200)
    assert d.degraded()


def test_blocked_after_5x_mean_without_events() -> None:
    d = iteration.IterationDetector()
    t = _feed(d, 20, 0, 100)
    d.event("next", t)
    mean = d.mean_ns() or 0
    assert not d.blocked(t + int(4 * mean))
    assert d.blocked(t + int(5 * mean))


def test_redetects_after_k_unmatched_events() -> None:
    d = iteration.IterationDetector(iteration.IterationSettings(redetect_after=20))
    t = _feed(d, 15, 0, 100)
    assert d.pattern is not None
    for _ in range(20):
        d.event("step", t)  # a different phase: steps without data (e.g. evaluation)
        t += MS
    assert d.pattern is None
    _feed(d, 12, t, 100, nexts=1)
    assert d.pattern == ("next", "step", "step")
