"""When a verdict starts function-level profiling by itself (``profile_handlers.wanted``): a slow
verdict without a culprit, with low confidence, or naming no hardware fault; never a hang, a
healthy job, or a confident hardware verdict."""

from __future__ import annotations

from collscope.operator.analysis import diagnosis
from collscope.operator.controller import profile_handlers


def verdict(trigger: str = "slow", category: str | None = "slow.host", confidence: float = 0.9,
            culprit: bool = True, anomaly: bool = True) -> diagnosis.Diagnosis:  # fmt: skip
    c = [diagnosis.Culprit(rank=5, component="host", score=0.9)] if culprit else []
    return diagnosis.Diagnosis(anomaly=anomaly, trigger=trigger, category=category,
                               culprits=c, confidence=confidence)  # fmt: skip


def test_slow_verdicts_that_leave_the_function_open() -> None:
    assert profile_handlers.wanted(verdict(culprit=False))
    assert profile_handlers.wanted(verdict(category="slow.compute", confidence=0.5))
    assert profile_handlers.wanted(verdict(category="slow.host"))  # host side: which function?


def test_not_for_hangs_healthy_jobs_or_confident_hardware() -> None:
    assert not profile_handlers.wanted(verdict(trigger="hang", category="hang.gpu"))
    assert not profile_handlers.wanted(verdict(anomaly=False, category=None, culprit=False))
    assert not profile_handlers.wanted(verdict(category="slow.compute", confidence=0.9))
