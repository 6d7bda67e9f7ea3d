"""kopf handler: function-level diagnosis of a live job on request (EROICA §4, issue 18).

``kubectl annotate trainingjob X collscope.dev/profile=now`` (any new value runs it again, e.g.
a timestamp) makes the operator, without blocking a kopf worker:

1. arm the dormant probe of every rank of the job through its node's agent
   (``profiling.arm``; EROICA §4.1 profiles every worker), then ask kopf to come back after the
   window (``kopf.TemporaryError`` with that delay, as the confirmation re-check of
   ``diagnosis_handlers`` does);
2. pull the agents' reports, and come back every second while a rank is still sampling and its
   agent's deadline is not past;
3. localise (``profiling.localise``: differential distance among workers, §4.3) and write the
   result as a Diagnosis ``<job>-profile-<hash>`` of trigger ``manual``, owned by the job, phase
   ``Diagnosed``: ``culprits[].function`` and the evidence naming each function with β/μ/sigma
   against the median worker, and the ranks that could not be profiled.

The same runs by itself (``wanted``, ``request``): when a slow verdict names no culprit, has a
confidence below ``LOW_CONFIDENCE`` or names no hardware fault (a host-side or software slowdown,
where the function is the question), ``diagnosis_handlers`` sets the annotation to
``auto-<that Diagnosis>``, once per Diagnosis; the profiling's function culprits and evidence
(``functions: ...``) are then added to that Diagnosis rather than written as a new one.
``off`` on the TrainingJob turns both off.

The Diagnosis carries the label ``collscope.dev/profile`` so that ``diagnosis_handlers`` leaves
it alone (it is analysed here, from profiles, not from a window of records) and it is never
remediated: a Python function on one rank is no node's fault. What is pending is kept in
``OperatorState.profiles`` (an operator restart during the window loses it; the annotation is then
handled already and a new value starts again).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from typing import Any

import kopf

from collscope.nodeagent.bundle import models
from collscope.operator import errors
from collscope.operator.analysis import diagnosis
from collscope.operator.clients import agents, kube
from collscope.operator.controller import profiling, trigger_loop
from collscope.operator.controller.state import OperatorState
from collscope.operator.domain import jobs, status

ANNOTATION = "collscope.dev/profile"
LABEL = "collscope.dev/profile"  # on a Diagnosis written here: diagnosis_handlers skips it
# After the agents' deadline, how long a rank still shown as sampling is waited for (its probe
# writes the result file when the window ends; the agent reads it on the next pull).
LATE_S = 5.0
# Below this, a slow verdict's culprit is a guess worth checking function by function.
LOW_CONFIDENCE = 0.6
AUTO_PREFIX = "auto-"
NS = 1_000_000_000
Logger = logging.Logger | logging.LoggerAdapter[Any]


@dataclasses.dataclass
class Pending:
    """One job's profiling between arming and its Diagnosis."""

    value: str  # the annotation's value that started it
    id: str
    window_s: float
    deadline_ns: int
    nodes: list[str]
    job: models.Job
    failed: list[agents.Unreachable]


def register(registry: kopf.OperatorRegistry) -> None:
    kopf.on.field(
        kube.GROUP, kube.VERSION, kube.TRAININGJOBS, id="profile", registry=registry,
        field=("metadata", "annotations", ANNOTATION),
    )(on_annotation)  # fmt: skip


async def on_annotation(
    *,
    name: str,
    namespace: str | None,
    new: Any,
    meta: kopf.Meta,
    memo: OperatorState,
    logger: Logger,
    **_: Any,
) -> None:
    if not new or str(new).strip().lower() == "off":
        return
    key: jobs.JobKey = (namespace or "", name)
    profiles = memo.profiles
    p = profiles.get(key)
    if p is None or p.value != str(new):
        p = await start(memo, key, str(new))
        profiles[key] = p
        logger.info("profiling %s: %d node(s) armed for %g s", p.id, len(p.nodes), p.window_s)
        raise kopf.TemporaryError(f"profiling {p.id}: the window runs", delay=p.window_s + 1)
    reports, failed = await profiling.pull(trigger_loop.clients_of(memo, key), p.nodes, p.id)
    if profiling.pending(reports) and time.time_ns() < p.deadline_ns + LATE_S * NS:
        raise kopf.TemporaryError(f"profiling {p.id}: ranks still sampling", delay=1)
    result = await asyncio.to_thread(profiling.localise, reports, p.job, [*p.failed, *failed])
    target = p.value[len(AUTO_PREFIX) :] if p.value.startswith(AUTO_PREFIX) else ""
    if not target or not await write_into(memo.kube, key[0], target, result):
        await write(memo.kube, key, str(meta.get("uid") or ""), p, result)
    profiles.pop(key, None)
    named = [f"rank {c.rank} {c.function}" for c in result.culprits if c.function]
    logger.info("profiling %s: %s", p.id, "; ".join(named) or "no function culprit")


def wanted(result: diagnosis.Diagnosis) -> bool:
    """Whether a fresh verdict asks for function-level profiling (module docstring)."""
    if not result.anomaly or result.trigger != "slow":
        return False
    if not result.culprits or result.confidence < LOW_CONFIDENCE or result.category is None:
        return True
    try:
        return not diagnosis.Category.from_name(result.category).value.hardware
    except ValueError:
        return True


async def request(
    api: kube.Cluster, namespace: str, job: str, diagnosis_name: str, logger: Logger
) -> bool:
    """Ask for a profiling of ``job`` by its annotation (``on_annotation`` runs it), unless
    the job says ``off``; False when not asked."""
    try:
        tj = await api.get_trainingjob(namespace, job)
        current = str(((tj or {}).get("metadata") or {}).get("annotations", {}).get(ANNOTATION, ""))
        if tj is None or current.strip().lower() == "off":
            return False
        await api.annotate_trainingjob(namespace, job, {ANNOTATION: AUTO_PREFIX + diagnosis_name})
    except errors.KubeError as e:
        logger.warning("profiling of %s/%s not requested: %s", namespace, job, e)
        return False
    return True


async def start(state: OperatorState, key: jobs.JobKey, value: str) -> Pending:
    """Find the job's ranks and arm them; TemporaryError when there is nothing to arm yet."""
    rt = state.jobs.setdefault(key, jobs.JobRuntime())
    failed: list[agents.Unreachable] = []
    if not rt.ranks:
        failed += await trigger_loop.discover(state, key, rt, time.monotonic())
    if not rt.ranks:
        raise kopf.TemporaryError(f"profiling: no ranks of TrainingJob {key[1]} found yet", delay=5)
    clients = trigger_loop.clients_of(state, key)
    req_id = profiling.request_id(key[1], time.time_ns())
    by_node = jobs.by_node(rt.ranks, rt.ranks)
    armed, more = await profiling.arm(clients, by_node, req_id, window_s=profiling.WINDOW_S)
    failed += more
    trigger_loop.note_failures(state, failed)
    if not armed:
        why = "; ".join(f"{f.node}: {f.reason}" for f in failed) or "no agent"
        raise kopf.TemporaryError(f"profiling: no agent armed ({why})", delay=10)
    deadline = max(a.deadline_ns for a in armed.values())
    return Pending(value, req_id, profiling.WINDOW_S, deadline, sorted(armed),
                   jobs.bundle_job(key[1], rt.ranks), failed)  # fmt: skip


async def write_into(
    api: kube.Cluster, namespace: str, name: str, profiled: diagnosis.Diagnosis
) -> bool:
    """Add a profiling's function culprits and evidence (``functions:``, after the verdict's
    first sentence) to the Diagnosis that asked for it; False when it is gone."""
    try:
        found = [d for d in await api.list_diagnoses(namespace)
                 if (d.get("metadata") or {}).get("name") == name]  # fmt: skip
        if not found:
            return False
        old = diagnosis.Diagnosis.model_validate((found[0].get("status") or {}).get("result") or {})
        lines = [f"functions: {e}" for e in profiled.evidence]
        merged = old.model_copy(
            update={
                "culprits": [*old.culprits, *(c for c in profiled.culprits if c.function)],
                "evidence": [*old.evidence[:1], *lines, *old.evidence[1:]],
            }
        )
        await api.patch_status(kube.DIAGNOSES, namespace, name, {"result": status.result(merged)})
    except errors.KubeError as e:
        raise kopf.TemporaryError(f"profiling into {name}: {e}", delay=2) from e
    return True


async def write(api: kube.Cluster, key: jobs.JobKey, job_uid: str, p: Pending, result: Any) -> str:
    """The Diagnosis of a profiling (module docstring); its name."""
    now = datetime.datetime.now(datetime.UTC)
    body = jobs.diagnosis_body(
        key[0], key[1], job_uid or None, trigger_kind="manual", incident=f"profile/{p.id}",
        detected_at=now.strftime("%Y-%m-%dT%H:%M:%SZ"), window_s=p.window_s,
    )  # fmt: skip
    body["metadata"]["labels"][LABEL] = p.id
    name = str(body["metadata"]["name"])
    try:
        await api.create_diagnosis(body)
        new = status.diagnosis_status(
            result, phase="Diagnosed", generation=None, conditions=None, now=now
        )
        await api.patch_status(kube.DIAGNOSES, key[0], name, new)
    except errors.KubeError as e:
        raise kopf.TemporaryError(f"profiling {p.id}: {e}", delay=2) from e
    return name
