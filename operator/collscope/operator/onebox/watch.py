"""The operator's trigger loop and root cause over the one-box agents, without a cluster.

What ``trigger_loop.tick`` and ``diagnosis_handlers.analyse`` do for a TrainingJob, with the
operator's own functions and no Kubernetes API: the job's pods are known from the layout
(``jobs.Pods``, as ``handlers.opted_in_pod`` notes them), rank placement and groups come from
the agents (``trigger_loop.discover``: ``/v1/ranks`` and the comm records), the sample from
``jobs.JobRuntime.resample`` (Mycroft §4.3: <= 10 ranks, >= 1 per DP group), and every tick the
last ``window_s`` of the sampled ranks is pulled (``agents.pull_window``) into the job's
``analysis.trigger.TriggerState`` (Mycroft Algorithm 1). On a trigger, the Diagnosis is
analysed exactly as the handler analyses it (``diagnosis_handlers.analyse``: the window of every
rank from every agent, ``analysis.engine.diagnose``). Nothing here detects anything itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from collscope.nodeagent.bundle import tables
from collscope.operator import errors
from collscope.operator.analysis import diagnosis, trigger
from collscope.operator.clients import agents
from collscope.operator.controller import diagnosis_handlers, trigger_loop
from collscope.operator.domain import jobs, metrics, resources, sampling, settings
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


class _Cluster:
    """The one call ``diagnosis_handlers.analyse`` makes to the API: the TrainingJob."""

    async def get_trainingjob(self, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": namespace}, "spec": {}}


def memo_for(
    layout: box.Layout, urls: Mapping[str, str], uids: Mapping[int, str], config: settings.Settings
) -> kopf.Memo:
    """The memo the operator's handlers share, filled as they would fill it for this job."""
    memo = trigger_loop.add_to_memo(
        kopf.Memo(),
        config=config,
        directory=lambda node, _ip: urls.get(node),
        meters=metrics.OperatorMetrics(),
    )
    pods = jobs.Pods()
    for r in range(layout.world):
        node = layout.node_of(r)
        place = jobs.PodPlace(layout.pod_of(r), uids[r], node, layout.address_of(node))
        pods.note((box.NAMESPACE, layout.job), place)
    memo.pods = pods
    memo.kube = _Cluster()
    return memo


async def watch(
    memo: kopf.Memo,
    layout: box.Layout,
    *,
    duration_s: float,
    on_tick: Callable[[int, str], None] | None = None,
) -> Outcome:
    """Tick like the trigger loop until a trigger (then analyse) or ``duration_s``."""
    cfg: settings.Settings = memo.settings
    key = (box.NAMESPACE, layout.job)
    rt: jobs.JobRuntime = memo.jobs.setdefault(key, jobs.JobRuntime())
    out = Outcome()
    spec: dict[str, Any] = {}
    analysis = jobs.analysis_settings(resources.TrainingJobSpec.parse(spec))
    rt.set_max_ranks(sampling.DEFAULT_MAX_RANKS)
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        started = time.monotonic()
        out.ticks += 1
        pods: jobs.Pods = memo.pods
        if rt.needs_discovery(pods.by_job.get(key, {}), started, cfg.trigger.rediscover_s):
            out.unreachable += await trigger_loop.discover(memo, key, rt, started)
        sample = rt.resample(analysis.trigger, trigger_loop.job_groups(spec, rt))
        out.sampled = tuple(int(r) for r in sample)
        hit = None
        if sample and rt.state is not None:
            t_ns = time.time_ns()
            try:
                bundle, failed = await agents.pull_window(
                    trigger_loop.clients_of(memo, key),
                    jobs.by_node(sample, rt.ranks),
                    jobs.bundle_job(layout.job, rt.ranks),
                    since_ns=t_ns - int(cfg.trigger.window_s * NS),
                    until_ns=t_ns,
                )
            except errors.CollscopeError:
                rt.pods_seen = frozenset()
                failed = []
            else:
                out.unreachable += failed
                if len(failed) < len(jobs.by_node(sample, rt.ranks)):
                    hit = rt.state.update(bundle, t_ns)
        if on_tick is not None:
            on_tick(out.ticks, "no trigger" if hit is None else f"{hit.kind}: {hit.reason}")
        if hit is not None:
            out.hit = hit
            t0 = time.perf_counter()
            out.result, failed = await diagnosis_handlers.analyse(
                memo, box.NAMESPACE, layout.job, {"windowSeconds": cfg.diagnosis_window_s}
            )
            out.analysed_in_s = time.perf_counter() - t0
            out.unreachable += failed
            out.bundle = await window(memo, layout, cfg.diagnosis_window_s)
            return out
        await asyncio.sleep(max(0.0, cfg.trigger.interval_s - (time.monotonic() - started)))
    return out


async def window(memo: kopf.Memo, layout: box.Layout, window_s: float) -> tables.Bundle:
    """Every rank's last ``window_s`` from the agents (what the Diagnosis was made from)."""
    key = (box.NAMESPACE, layout.job)
    rt: jobs.JobRuntime = memo.jobs[key]
    t_ns = time.time_ns()
    bundle, _ = await agents.pull_window(
        trigger_loop.clients_of(memo, key),
        jobs.by_node(rt.ranks, rt.ranks),
        jobs.bundle_job(layout.job, rt.ranks),
        since_ns=t_ns - int(window_s * NS),
        until_ns=t_ns,
    )
    return bundle
