"""kopf handlers of Diagnosis objects: analyse, remediate, release (DESIGN.md §6-7).

``on.create`` + ``on.resume`` (``process``), by phase:

- none / ``Detected`` / ``Analyzing`` (created by the trigger loop, or by a user with
  ``trigger: manual``): phase ``Detected`` -> ``Analyzing``; the window of every rank of the
  TrainingJob over ``spec.windowSeconds`` is pulled from their agents in parallel
  (``agents.pull_window``), ``analysis.engine.diagnose`` runs on it in a worker thread (the same
  code as ``collscope analyze``), the status gets the result, phase ``Diagnosed``, the agents
  that could not be reached; then, in a second patch so that collection never delays
  ``Diagnosed``, the evidence gathered concurrently: for an anomaly (or ``requestedActions:
  [stacks]``) the py-spy stacks of the culprits and sampled ranks grouped into a rank grid
  (``stackgrid``), for a hang or slow trigger (or ``requestedActions: [flightRecorder]``) the
  Flight Recorder dumps of the involved ranks grouped by last-collective state
  (``flightrecorder``; an agent or rank without one is a note, never a failure), both in
  ``evidence``; then remediation as below;
- ``Diagnosed`` without ``status.actions``: remediation (``remediator.Remediator``: policy,
  breaker, node marks); phase ``Remediated`` when a node was marked.

``on.delete`` (``release``) is a real delete handler, so kopf keeps its finalizer on every
Diagnosis (our own object): deleting one removes exactly the node marks collscope placed for
it and frees its place in the breaker. Events are posted with ``kopf.info``/``kopf.warn``.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from collscope.operator import (
    agents,
    errors,
    evidence,
    ids,
    jobs,
    kube,
    metrics,
    remediator,
    settings,
    status,
    trigger_loop,
)
from collscope.operator.analysis import diagnosis, engine

NS = 1_000_000_000
Logger = logging.Logger | logging.LoggerAdapter[Any]


def register(registry: kopf.OperatorRegistry) -> None:
    for on in (kopf.on.create, kopf.on.resume):
        on(kube.GROUP, kube.VERSION, kube.DIAGNOSES, id="process", registry=registry)(process)
    kopf.on.delete(kube.GROUP, kube.VERSION, kube.DIAGNOSES, id="release", registry=registry)(
        release
    )


def now_utc() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


async def process(
    *,
    name: str,
    namespace: str | None,
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    memo: kopf.Memo,
    logger: Logger,
    **_: Any,
) -> None:
    # kopf may hand the same creation over again while its own patches are in flight (and
    # with a stale body): each Diagnosis is processed once per operator lifetime.
    seen: set[str] = memo.diagnoses_seen
    key = f"{namespace}/{name}/{meta.get('uid', '')}"
    if key in seen:
        return
    seen.add(key)
    try:
        await _process(
            name, namespace or "", body=body, spec=spec, status=status, meta=meta, memo=memo,
            logger=logger,
        )  # fmt: skip
    except BaseException:
        seen.discard(key)
        raise


async def _process(
    name: str,
    namespace: str,
    *,
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    memo: kopf.Memo,
    logger: Logger,
) -> None:
    api: kube.Cluster = memo.kube
    phase = status.get("phase")
    generation = meta.get("generation")
    conditions = list(status.get("conditions") or [])
    if phase in ("Remediated", "Failed") or (phase == "Diagnosed" and "actions" in status):
        return
    job = str((spec.get("trainingJob") or {}).get("name", ""))
    if phase != "Diagnosed":
        for step in ("Detected", "Analyzing")[1 if phase == "Analyzing" else 0 :]:
            new = status_phase(phase, step, conditions, generation, f"{step} for job {job}")
            await _patch(api, namespace, name, new)
            phase, conditions = step, new["conditions"]
        try:
            result, failed = await analyse(memo, namespace, job, spec, diagnosis_name=name)
        except (errors.AgentError, errors.KubeError, errors.AnalysisError) as e:
            new = status_phase(phase, "Failed", conditions, generation, str(e))
            await _patch(api, namespace, name, new)
            kopf.warn(body, reason="AnalysisFailed", message=str(e))
            return
        new = status_mod.diagnosis_status(
            result, phase="Diagnosed", generation=generation, conditions=conditions, now=now_utc()
        )
        new["agentErrors"] = [{"node": f.node, "message": f.reason[:1000]} for f in failed]
        await _patch(api, namespace, name, new)
        meters: metrics.OperatorMetrics = memo.metrics
        meters.diagnoses.labels(category=result.category or "none").inc()
        summary = _summary(result)
        if result.anomaly:
            kopf.warn(body, reason="Diagnosed", message=summary)
        else:
            kopf.info(body, reason="Diagnosed", message=summary)
        logger.info("Diagnosis %s/%s: %s", namespace, name, summary)
        conditions = new["conditions"]
        found = await evidence.collect(
            memo, namespace, job=job, spec=spec, result=result, logger=logger
        )
        if found:
            await _patch(api, namespace, name, found)
    else:
        result = diagnosis.Diagnosis.model_validate(status.get("result") or {})
    await remediate(
        memo, api, namespace=namespace, name=name, job=job, result=result,
        conditions=conditions, generation=generation, body=body,
    )  # fmt: skip


status_mod = status  # the module, shadowed by kopf's ``status`` kwarg inside handlers


def status_phase(
    current: Any, new: Any, conditions: Any, generation: Any, message: str
) -> dict[str, Any]:
    return status_mod.phase_status(
        current, new, reason=new, message=message[:2000], generation=generation,
        conditions=conditions, now=now_utc(),
    )  # fmt: skip


async def _patch(api: kube.Cluster, namespace: str, name: str, new: Mapping[str, Any]) -> None:
    try:
        await api.patch_status(kube.DIAGNOSES, namespace, name, new)
    except errors.KubeError as e:
        raise kopf.TemporaryError(str(e), delay=2) from e


async def analyse(
    memo: kopf.Memo,
    namespace: str,
    job: str,
    spec: Mapping[str, Any],
    *,
    diagnosis_name: str = "",
) -> tuple[diagnosis.Diagnosis, list[agents.Unreachable]]:
    """Pull the window of every rank of ``job`` and run root-cause analysis on it.

    The replay watches the ranks the trigger watched when it opened this Diagnosis (with a
    rotating sample, the current ones may be other groups'), else the ones watched now."""
    cfg: settings.Settings = memo.settings
    meters: metrics.OperatorMetrics = memo.metrics
    key = (namespace, job)
    runtimes: dict[jobs.JobKey, jobs.JobRuntime] = memo.jobs
    rt = runtimes.setdefault(key, jobs.JobRuntime())
    failed: list[agents.Unreachable] = []
    if not rt.ranks:
        failed += await trigger_loop.discover(memo, key, rt, time.monotonic())
    if not rt.ranks:
        raise errors.AnalysisError(f"no ranks of TrainingJob {job} found on any agent")
    api: kube.Cluster = memo.kube
    tj = await api.get_trainingjob(namespace, job)
    tj_spec: Mapping[str, Any] = (tj or {}).get("spec") or {}
    window_s = float(spec.get("windowSeconds") or cfg.diagnosis_window_s)
    started = time.perf_counter()
    t_ns = time.time_ns()
    bundle, more = await agents.pull_window(
        trigger_loop.clients_of(memo, key),
        jobs.by_node(rt.ranks, rt.ranks),
        jobs.bundle_job(job, rt.ranks),
        since_ns=t_ns - int(window_s * NS),
        until_ns=t_ns,
    )
    failed += more
    trigger_loop.note_failures(memo, failed)
    watched = rt.watched_when.get(diagnosis_name, rt.sample)
    sampled = [int(r) for r in watched if r in rt.ranks] or None
    result = await asyncio.to_thread(
        engine.diagnose, bundle, jobs.analysis_settings(tj_spec), sampled=sampled
    )
    meters.analysis_seconds.observe(time.perf_counter() - started)
    return result, failed


async def remediate(
    memo: kopf.Memo,
    api: kube.Cluster,
    *,
    namespace: str,
    name: str,
    job: str,
    result: diagnosis.Diagnosis,
    conditions: Any,
    generation: Any,
    body: kopf.Body,
) -> None:
    rem: remediator.Remediator = memo.remediator
    tj = await api.get_trainingjob(namespace, job) if job else None
    overrides = (((tj or {}).get("spec") or {}).get("diagnosis") or {}).get("remediation")
    try:
        actions, marked = await rem.remediate(f"{namespace}/{name}", result, overrides, now_utc())
    except (errors.KubeError, errors.RemediationError) as e:
        raise kopf.TemporaryError(f"remediation: {e}", delay=5) from e
    new: dict[str, Any] = {"actions": actions}
    if marked:
        new.update(status_phase("Diagnosed", "Remediated", conditions, generation, "node marked"))
    await _patch(api, namespace, name, new)
    for a in actions:
        text = f"{a['action']} {a.get('node', '')}: {a['outcome']} {a.get('message', '')}"
        if a["outcome"] in ("Done", "Blocked", "Failed"):
            kopf.warn(body, reason=f"Remediation{a['outcome']}", message=text.strip())
        else:
            kopf.info(body, reason=f"Remediation{a['outcome']}", message=text.strip())


async def release(
    *,
    name: str,
    namespace: str | None,
    status: kopf.Status,
    memo: kopf.Memo,
    logger: Logger,
    **_: Any,
) -> None:
    """Remove the node marks collscope placed for this Diagnosis (if any)."""
    nodes = {a.get("node") for a in status.get("actions") or [] if a.get("outcome") == "Done"}
    rem: remediator.Remediator = memo.remediator
    for node in sorted(n for n in nodes if n):
        try:
            released = await rem.release(f"{namespace}/{name}", ids.NodeName(node))
        except (errors.KubeError, errors.RemediationError) as e:
            raise kopf.TemporaryError(f"releasing {node}: {e}", delay=5) from e
        if released:
            logger.info("released node %s held for Diagnosis %s/%s", node, namespace, name)


def _summary(result: diagnosis.Diagnosis) -> str:
    if not result.anomaly:
        return "no anomaly: " + (result.evidence[0] if result.evidence else "")[:500]
    top = result.culprits[0] if result.culprits else None
    where = "" if top is None else f" rank {top.rank} on {top.node} ({top.component})"
    return f"{result.category}{where}, confidence {result.confidence:.2f}"
