"""When a verdict starts function-level profiling by itself (``profile_handlers.wanted``): a slow
verdict without a culprit, with low confidence, or whose cause may be the culprit rank's own code
(``slow.compute``: it arrives late; ``slow.host``); never a hang, a healthy job, or a network
verdict (``slow.network``, ``slow.mixed``, a NIC or link culprit), whatever its confidence.

A request or an annotation value handled again (kopf repeats a change while its patches are in
flight, a Diagnosis processed again) changes nothing. And the trigger of a job being profiled
opens no new slow incident until the armed window's records left its window
(``trigger_loop.slow_incident``): a slowdown the probe causes is never a Diagnosis.

``test_profile_requests.py``: the same handlers through kopf, asked by a Diagnosis's field.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest

from collscope.operator.analysis import diagnosis, trigger
from collscope.operator.controller import profile_handlers, trigger_loop
from collscope.operator.domain import jobs, settings

pytestmark = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")
NS = 1_000_000_000
KEY = ("ml", "tj")


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


def pending(value: str, deadline_s: float, *, finished: bool = False) -> profile_handlers.Pending:
    return profile_handlers.Pending(value, "tj-1", 10.0, int(deadline_s * NS), ["n0"],
                                    jobs.bundle_job("tj", {}), [], finished=finished)  # fmt: skip


def slow(at_s: float) -> trigger.TriggerResult:
    return trigger.TriggerResult("slow", int(at_s * NS), 0, 0, (1,), 0, None, "throughput halved")


def test_no_new_slow_incident_while_the_job_is_profiled() -> None:
    """Armed until t=110 s (the agents' deadline): with the trigger's 5 s window and a 1 s tick,
    a slow trigger that would open a new incident up to t=116 s opens none (and no episode that
    a later trigger would continue); one of the episode open before arming goes on; from 116 s
    a slowdown still there is reported, as a new incident."""
    state: Any = types.SimpleNamespace(profiles={}, settings=settings.Settings())
    rt = jobs.JobRuntime()
    quiet = 3

    def incident(comm: str | None, at_s: float) -> str | None:
        rt.ticks_run = int(at_s)
        return trigger_loop.slow_incident(
            state, KEY, rt, comm, slow(at_s), quiet=quiet, t_ns=int(at_s * NS)
        )

    assert incident("0xab", 99) == "slow/0xab@99000"  # the slowdown being profiled
    state.profiles[KEY] = pending("auto-tj-slow-1", 110)
    assert incident("0xab", 101) == "slow/0xab@99000"  # its episode, its Diagnosis
    # Throughput halved under the probe: a job-wide trigger joins the open episode (its
    # Diagnosis exists), never a new one.
    assert incident(None, 104) == "slow/0xab@99000"
    assert incident(None, 116) is None and "slow/-" not in rt.episodes  # none open: not reported
    assert incident("0xab", 110) is None  # its episode ended (> quiet ticks): a new one
    assert rt.episodes["slow/0xab"] == ("slow/0xab@99000", 104)
    assert incident(None, 116.5) == "slow/-@116500"  # still slow after the window: reported
    state.profiles[KEY].finished = True
    assert incident("0xcd", 117) == "slow/0xcd@117000"


class Api:
    """A TrainingJob carrying ``annotations``; records the writes."""

    def __init__(self, annotations: dict[str, str]) -> None:
        self.tj = {"metadata": {"name": "tj", "annotations": annotations}}
        self.writes: list[tuple[str, Any]] = []

    async def get_trainingjob(self, namespace: str, name: str) -> Any:
        return self.tj

    async def patch_status(self, plural: str, namespace: str, name: str, body: Any) -> None:
        self.writes.append((name, body))

    async def annotate_trainingjob(self, namespace: str, name: str, body: Any) -> None:
        self.writes.append((name, body))


@pytest.mark.asyncio
async def test_a_request_made_again_leaves_the_profiling_as_it_is() -> None:
    """The annotation already holds ``auto-d1``: d1's profiling was asked (it may be Running or
    Done by now); asking again (its Diagnosis processed again) writes nothing."""
    api = Api({profile_handlers.ANNOTATION: "auto-d1"})
    log = logging.getLogger("test")
    assert await profile_handlers.request(api, "ml", "tj", "d1", log)  # type: ignore[arg-type]
    assert api.writes == []
    assert await profile_handlers.request(api, "ml", "tj", "d2", log)  # type: ignore[arg-type]
    assert api.writes[0][0] == "d2" and api.writes[0][1]["profiling"]["state"] == "Requested"
    assert api.writes[1] == ("tj", {profile_handlers.ANNOTATION: "auto-d2"})


@pytest.mark.asyncio
async def test_an_annotation_value_done_is_not_armed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    async def start(*_: Any) -> Any:
        raise AssertionError("armed again")

    monkeypatch.setattr(profile_handlers, "start", start)
    memo: Any = types.SimpleNamespace(profiles={KEY: pending("auto-d1", 0, finished=True)},
                                      kube=Api({}))  # fmt: skip
    meta: Any = {}
    await profile_handlers.on_annotation(name="tj", namespace="ml", new="auto-d1", meta=meta,
                                         memo=memo, logger=logging.getLogger("test"))  # fmt: skip
    assert memo.kube.writes == []
