"""When a verdict starts function-level profiling by itself (``profile_handlers.wanted``): a slow
verdict without a culprit, with low confidence, or whose cause may be the culprit rank's own code
(``slow.compute``: it arrives late; ``slow.host``); never a hang, a healthy job, or a network
verdict (``slow.network``, ``slow.mixed``, a NIC or link culprit), whatever its confidence.

``test_profile_requests.py``: the same handlers through kopf, asked by a Diagnosis's field.
"""

from __future__ import annotations

from collscope.operator.analysis import diagnosis
from collscope.operator.controller import profile_handlers


def verdict(*, trigger: str = "slow", category: str | None = "slow.host", confidence: float = 0.9,
            culprit: bool = True, anomaly: bool = True,
            component: diagnosis.Component = "host") -> diagnosis.Diagnosis:  # fmt: skip
    c = [diagnosis.Culprit(rank=5, component=component, score=0.9)] if culprit else []
    return diagnosis.Diagnosis(anomaly=anomaly, trigger=trigger, category=category,
                               culprits=c, confidence=confidence)  # fmt: skip


def test_slow_verdicts_that_leave_the_function_open() -> None:
    assert profile_handlers.wanted(verdict(culprit=False))
    assert profile_handlers.wanted(verdict(category="slow.compute", confidence=0.5))
    assert profile_handlers.wanted(verdict(category="slow.host"))  # host side: which function?


def test_a_confident_late_rank_is_profiled() -> None:
    """A slow data loader on rank 5: slow.compute naming rank 5 with confidence, the GPU as the
    category's component; only the probe can say which function of rank 5 is slow."""
    assert profile_handlers.wanted(verdict(category="slow.compute", component="gpu"))
    assert profile_handlers.wanted(verdict(category="slow.compute", confidence=1.0))


def test_not_for_hangs_healthy_jobs_or_the_network() -> None:
    assert not profile_handlers.wanted(verdict(trigger="hang", category="hang.gpu"))
    assert not profile_handlers.wanted(verdict(anomaly=False, category=None, culprit=False))
    for low in (0.9, 0.3):
        assert not profile_handlers.wanted(verdict(category="slow.network", confidence=low,
                                                   component="nic"))  # fmt: skip
        assert not profile_handlers.wanted(verdict(category="slow.mixed", confidence=low,
                                                   component="gpu"))  # fmt: skip
        for comp in ("nic", "link"):
            assert not profile_handlers.wanted(verdict(category=None, confidence=low,
                                                       component=comp))  # fmt: skip


def test_target_of_an_annotation_value() -> None:
    assert profile_handlers.target_of("auto-job-slow-1") == "job-slow-1"
    assert profile_handlers.target_of("auto-d1/3") == "d1"
    assert profile_handlers.target_of("now") == ""
