"""The operator's trigger loop and root cause over the one-box agents, without a cluster.

What ``trigger_loop.tick`` and ``diagnosis_handlers.analyse`` do for a TrainingJob, with the
operator's own functions and no Kubernetes API: the job's pods are known from the layout
(``jobs.Pods`` in the operator's ``OperatorState``, as ``handlers.opted_in_pod`` notes them),
and every second the tick's kopf-free part runs, ``trigger_loop.step``, the one the operator's
timer runs: rank placement and groups from the agents (``trigger_loop.discover``: ``/v1/ranks``
and the comm records), the sample (``jobs.JobRuntime.resample``; Mycroft §4.3: <= 10 ranks,
>= 1 per DP group), the last ``window_s`` of the sampled ranks pulled from the agents
(``agents.pull_window``) into the job's ``analysis.trigger.TriggerState`` (Mycroft Algorithm
1). On a trigger, the Diagnosis is analysed exactly as the handler analyses it
(``diagnosis_handlers.analyse``: the window of every rank from every agent,
``analysis.engine.diagnose``). Nothing here detects anything itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import diagnosis, trigger
from collscope.operator.clients import agents, kube
from collscope.operator.controller import diagnosis_handlers, trigger_loop
from collscope.operator.controller.state import OperatorState
from collscope.operator.domain import jobs, resources, settings
from collscope.operator.onebox import box

NS = 1_000_000_000


@dataclasses.dataclass
class Outcome:
    """What the watch saw: the trigger (None: none within the time), the Diagnosis, the
    window it was made from (for the report) and the agents that failed."""

    hit: trigger.TriggerResult | None = None
    result: diagnosis.Diagnosis | None = None
    bundle: tables.Bundle | None = None
    unreachable: list[agents.Unreachable] = dataclasses.field(default_factory=list)
    ticks: int = 0
    sampled: tuple[int, ...] = ()
    analysed_in_s: float = 0.0


class _Cluster(kube.Cluster):
    """The one call ``diagnosis_handlers.analyse`` makes to the API: the TrainingJob."""

    def __init__(self) -> None:  # no API client: nothing else is ever called
        pass

    async def get_trainingjob(self, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": namespace}, "spec": {}}


def operator_state(
    layout: box.Layout, urls: Mapping[str, str], uids: Mapping[int, str], config: settings.Settings
) -> OperatorState:
    """The state the operator's handlers share, with the job's pods noted as
    ``handlers.opted_in_pod`` notes them."""
    state = OperatorState.create(_Cluster(), config, lambda node, _ip: urls.get(node))
    for r in range(layout.world):
        node = layout.node_of(r)
        place = jobs.PodPlace(layout.pod_of(r), uids[r], node, layout.address_of(node))
        state.pods.note((box.NAMESPACE, layout.job), place)
    return state


async def watch(
    state: OperatorState,
    layout: box.Layout,
    *,
    duration_s: float,
    on_tick: Callable[[int, str], None] | None = None,
) -> Outcome:
    """Tick like the trigger loop (``trigger_loop.step``) until a trigger (then analyse) or
    ``duration_s``."""
    cfg = state.settings
    key = (box.NAMESPACE, layout.job)
    out = Outcome()
    spec = resources.TrainingJobSpec()  # the one-box's job declares nothing: all defaults
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        started = time.monotonic()
        out.ticks += 1
        got = await trigger_loop.step(state, key, spec, now_s=started)
        out.sampled = tuple(int(r) for r in got.sample)
        out.unreachable += got.unreachable
        hit = got.hit
        if on_tick is not None:
            on_tick(out.ticks, "no trigger" if hit is None else f"{hit.kind}: {hit.reason}")
        if hit is not None:
            out.hit = hit
            t0 = time.perf_counter()
            out.result, failed = await diagnosis_handlers.analyse(
                state, box.NAMESPACE, layout.job,
                resources.DiagnosisSpec(window_seconds=cfg.diagnosis_window_s),
            )  # fmt: skip
            out.analysed_in_s = time.perf_counter() - t0
            out.unreachable += failed
            out.bundle = await window(state, layout, cfg.diagnosis_window_s)
            return out
        await asyncio.sleep(max(0.0, cfg.trigger.interval_s - (time.monotonic() - started)))
    return out


async def window(state: OperatorState, layout: box.Layout, window_s: float) -> tables.Bundle:
    """Every rank's last ``window_s`` from the agents (what the Diagnosis was made from)."""
    key = (box.NAMESPACE, layout.job)
    rt = state.jobs[key]
    t_ns = time.time_ns()
    bundle, _ = await agents.pull_window(
        trigger_loop.clients_of(state, key),
        jobs.by_node(rt.ranks, rt.ranks),
        jobs.bundle_job(layout.job, rt.ranks),
        since_ns=t_ns - int(window_s * NS),
        until_ns=t_ns,
    )
    return bundle
