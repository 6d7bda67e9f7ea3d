"""kopf handlers of Diagnosis objects: analyse, then confirm and remediate (docs/design.md,
"Data path" 6-7).

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
  ``evidence``; then remediation as below. An analysis that fails (an agent or the API
  unreachable, a bundle the engine rejects, an exception inside the engine, ``MemoryError``
  included) ends the Diagnosis ``Failed`` with the reason in its ``Diagnosed`` condition and a
  Warning Event, once: it is not retried;
- ``Diagnosed`` without ``status.actions``: remediation (``remediator.Remediator``: policy
  under the cluster's bounds, hardware corroboration, the re-check, breaker, node marks). The
  re-check ``confirm_delay_s`` later does not hold the handler: the pending confirmation is
  written to ``status.confirmation`` and kopf is asked to come back (``kopf.TemporaryError``
  with that delay). Phase ``Remediated`` when a node was marked; ``status.action`` says what was
  done (the ``Action`` printer column), the ``Confirmed`` condition why.

There is no delete handler, hence no finalizer: deleting a Diagnosis (or its job, which owns it)
releases nothing; an ``on.event`` handler (``gone``) only forgets its pending re-check. A node
found faulty stays marked until ``collscope uncordon NODE``. At start-up (``on.startup``) the
breaker's held set is rebuilt from the nodes' marks. Events are posted with
``kopf.info``/``kopf.warn`` on the Diagnosis; ``Diagnosed``, ``AnalysisFailed`` and
remediation's decisions also on the workload that owns the TrainingJob (``owners.workload_of``:
the PyTorchJob, JobSet or Job), where ``kubectl describe`` of the job shows them.

Why one module: analysis, evidence and remediation are one sequence over one Diagnosis's
status, patched in that order from one parse of the object (``resources.Diagnosis``); the
collection (``evidence``) and the remediation gates (``remediator``) are modules of their own,
and what stays here is their order and the patches and Events between them.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Mapping
from typing import Any, cast

import kopf

from collscope.operator import errors
from collscope.operator.analysis import diagnosis, engine, summaries
from collscope.operator.clients import agents, kube
from collscope.operator.controller import evidence, profile_handlers, remediator, trigger_loop
from collscope.operator.controller import state as state_mod
from collscope.operator.controller.state import OperatorState
from collscope.operator.domain import ids, jobs, owners, resources, status

NS = 1_000_000_000
Logger = logging.Logger | logging.LoggerAdapter[Any]


def register(registry: kopf.OperatorRegistry) -> None:
    for on in (kopf.on.create, kopf.on.resume):
        on(kube.GROUP, kube.VERSION, kube.DIAGNOSES, id="process", registry=registry)(process)
    kopf.on.event(kube.GROUP, kube.VERSION, kube.DIAGNOSES, id="gone", registry=registry)(gone)
    kopf.on.startup(id="breaker", registry=registry)(rebuild_breaker)


async def rebuild_breaker(memo: OperatorState, logger: Logger, **_: Any) -> None:
    """The breaker counts the nodes that carry collscope's marks now, not a stale record."""
    try:
        summary = await memo.remediator.rebuild()
    except (errors.KubeError, errors.RemediationError) as e:
        logger.warning("circuit breaker not rebuilt from the nodes at start-up: %s", e)
        return
    logger.info("circuit breaker %s; nodes held: %s", summary["state"], summary["held"] or "none")


async def gone(event: kopf.RawEvent, body: kopf.Body, memo: OperatorState, **_: Any) -> None:
    """A deleted Diagnosis's pending re-check is forgotten (``OperatorState.forget_diagnosis``);
    watched only: no finalizer, nothing released."""
    if event.get("type") == "DELETED":
        meta = body.get("metadata") or {}
        key = state_mod.diagnosis_key(
            meta.get("namespace"), meta.get("name", ""), meta.get("uid", "")
        )
        memo.forget_diagnosis(key)


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
    memo: OperatorState,
    logger: Logger,
    **_: Any,
) -> None:
    # kopf may hand the same creation over again while its own patches are in flight (and
    # with a stale body): each Diagnosis is processed once per operator lifetime.
    if profile_handlers.LABEL in (meta.get("labels") or {}):
        return  # written whole by profile_handlers: function-level, never remediated
    seen = memo.diagnoses_seen
    key = state_mod.diagnosis_key(namespace, name, meta.get("uid", ""))
    if key in seen:
        return
    seen.add(key)
    try:
        # A retry after an error may come with a body older than this handler's own status
        # patches (the watch has not caught up): judged on it, a Diagnosis already analysed
        # would be analysed again and its result (profiling's findings included) rewritten.
        # The status is read from the API server instead; a Diagnosis gone meanwhile is done.
        try:
            latest = await memo.kube.get_diagnosis(namespace or "", name)
        except errors.KubeError as e:
            raise kopf.TemporaryError(str(e), delay=2) from e
        if latest is None:
            return
        await _process(
            name, namespace or "", body=body, spec=spec, status=latest.get("status") or {},
            meta=meta, state=memo, logger=logger,
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
    status: Mapping[str, Any],
    meta: kopf.Meta,
    state: OperatorState,
    logger: Logger,
) -> None:
    api = state.kube
    generation = meta.get("generation")
    try:
        diag = resources.Diagnosis.parse({"spec": dict(spec), "status": dict(status)})
    except errors.SpecError as e:  # the CRD's schema refuses these: a hand-made object only
        if status.get("phase") not in ("Remediated", "Failed"):
            await _failed(
                api, namespace=namespace, name=name, body=body, phase=status.get("phase"),
                conditions=status.get("conditions"), generation=generation, why=str(e), job="",
            )  # fmt: skip
        return
    current = diag.status
    phase: str | None = current.phase
    conditions = _conditions(current)
    if phase in ("Remediated", "Failed") or (phase == "Diagnosed" and current.actions is not None):
        return
    job = diag.spec.training_job.name
    if phase != "Diagnosed":
        for step in ("Detected", "Analyzing")[1 if phase == "Analyzing" else 0 :]:
            new = status_phase(phase, step, conditions, generation, f"{step} for job {job}")
            await _patch(api, namespace, name, new)
            phase, conditions = step, new["conditions"]
        try:
            result, failed = await analyse(state, namespace, job, diag.spec, diagnosis_name=name)
        except (errors.AgentError, errors.KubeError, errors.AnalysisError) as e:
            await _failed(
                api, namespace=namespace, name=name, body=body, phase=phase,
                conditions=conditions, generation=generation, why=str(e), job=job,
            )  # fmt: skip
            return
        except Exception as e:  # a bug or a hostile bundle: Failed once, never a retry loop
            logger.exception("analysis of Diagnosis %s/%s failed", namespace, name)
            why = f"analysis failed: {type(e).__name__}: {e}".rstrip(": ")
            await _failed(
                api, namespace=namespace, name=name, body=body, phase=phase,
                conditions=conditions, generation=generation, why=why, job=job,
            )  # fmt: skip
            return
        new = status_mod.diagnosis_status(
            result, phase="Diagnosed", generation=generation, conditions=conditions, now=now_utc()
        )
        new["agentErrors"] = [
            {"node": f.node, "message": f.reason[:1000]}
            for f in failed[: status_mod.MAX_AGENT_ERRORS]
        ]
        await _patch(api, namespace, name, new)
        category = result.category or "none"
        labels = {"category": category, "namespace": namespace, "trainingjob": job}
        state.metrics.diagnoses.labels(**labels).inc()
        summary = _summary(result)
        workload = await _workload(api, namespace, job)
        event(body, workload, name, warning=result.anomaly, reason="Diagnosed", message=summary)
        logger.info("Diagnosis %s/%s: %s", namespace, name, summary)
        conditions = new["conditions"]
        found = await evidence.collect(
            state, namespace, job=job, spec=diag.spec, result=result, logger=logger
        )
        if found:
            await _patch(api, namespace, name, found)
        if profile_handlers.wanted(result):  # the function behind a host-side slowdown
            await profile_handlers.request(api, namespace, job, name, logger)
    else:
        result = current.result or diagnosis.Diagnosis.model_validate({})
    await remediate(
        state, api, namespace=namespace, name=name, job=job, result=result,
        conditions=conditions, generation=generation, body=body, diag=diag,
    )  # fmt: skip


def _conditions(current: resources.DiagnosisStatus) -> list[dict[str, Any]]:
    """``status.conditions`` as written, the dictionaries ``status.set_condition`` merges."""
    return [c.model_dump(by_alias=True, exclude_unset=True) for c in current.conditions or ()]


status_mod = status  # the module, shadowed by kopf's ``status`` kwarg inside handlers


def status_phase(
    current: Any, new: Any, conditions: Any, generation: Any, message: str, *, reason: str = ""
) -> dict[str, Any]:
    return status_mod.phase_status(
        current, new, reason=reason or new, message=message[:2000], generation=generation,
        conditions=conditions, now=now_utc(),
    )  # fmt: skip


async def _failed(
    api: kube.Cluster,
    *,
    namespace: str,
    name: str,
    body: kopf.Body,
    phase: Any,
    conditions: Any,
    generation: Any,
    why: str,
    job: str,
) -> None:
    """Phase ``Failed``, condition ``Diagnosed`` False with reason ``AnalysisFailed``."""
    new = status_phase(phase, "Failed", conditions, generation, why, reason="AnalysisFailed")
    new["action"] = "none"
    await _patch(api, namespace, name, new)
    workload = await _workload(api, namespace, job)
    event(body, workload, name, warning=True, reason="AnalysisFailed", message=why)


async def _workload(api: kube.Cluster, namespace: str, job: str) -> dict[str, Any] | None:
    """The workload of the Diagnosis's TrainingJob (``owners.workload_of``), None when there
    is none or it cannot be read (its Events then go to the Diagnosis only)."""
    try:
        tj = await api.get_trainingjob(namespace, job) if job else None
    except errors.KubeError:
        return None
    return None if (parsed := _trainingjob(tj)) is None else owners.workload_of(parsed)


def _trainingjob(tj: Mapping[str, Any] | None) -> resources.TrainingJob | None:
    """``tj`` parsed; None when there is none or it is not of its CRD's shape (logged: the
    cluster's remediation policy applies then, as to a TrainingJob policy it cannot use)."""
    if tj is None:
        return None
    try:
        return resources.TrainingJob.parse(tj)
    except errors.SpecError as e:
        logging.getLogger(__name__).warning("%s", e)
        return None


def event(
    body: kopf.Body,
    workload: dict[str, Any] | None,
    name: str,
    *,
    warning: bool,
    reason: str,
    message: str,
) -> None:
    """An Event on the Diagnosis and, prefixed with its name, on the owning workload."""
    post = kopf.warn if warning else kopf.info
    post(body, reason=reason, message=message[:1000])
    if workload is not None:
        target = kopf.Body(cast(kopf.RawBody, workload))  # kopf reads only the reference
        post(target, reason=reason, message=f"Diagnosis {name}: {message}"[:1000])


async def _patch(api: kube.Cluster, namespace: str, name: str, new: Mapping[str, Any]) -> None:
    try:
        await api.patch_status(kube.DIAGNOSES, namespace, name, new)
    except errors.KubeError as e:
        raise kopf.TemporaryError(str(e), delay=2) from e


async def analyse(
    state: OperatorState,
    namespace: str,
    job: str,
    spec: resources.DiagnosisSpec,
    *,
    diagnosis_name: str = "",
) -> tuple[diagnosis.Diagnosis, list[agents.Unreachable]]:
    """Pull the window of every rank of ``job`` and run root-cause analysis on it.

    The replay watches the ranks the trigger watched when it opened this Diagnosis (with a
    rotating sample, the current ones may be other groups'), else the ones watched now. The
    window holds every rank, so each replayed tick also gets every rank's summary row
    (``analysis.summaries``, the agent's own builder) for the job-wide hang check, as the
    live trigger pulled them and as ``collscope analyze`` replays: the replay finds a hang of
    unsampled ranks when the live trigger would, not later when it reaches the sampled ones."""
    cfg, meters = state.settings, state.metrics
    key = (namespace, job)
    rt = state.jobs.setdefault(key, jobs.JobRuntime())
    failed: list[agents.Unreachable] = []
    if not rt.ranks:
        failed += await trigger_loop.discover(state, key, rt, time.monotonic())
    if not rt.ranks:
        raise errors.AnalysisError(f"no ranks of TrainingJob {job} found on any agent")
    tj = await state.kube.get_trainingjob(namespace, job)
    tj_spec = resources.TrainingJob.parse(tj or {}).spec
    window_s = float(spec.window_seconds or cfg.diagnosis_window_s)
    started = time.perf_counter()
    t_ns = time.time_ns()
    bundle, more = await agents.pull_window(
        trigger_loop.clients_of(state, key),
        jobs.by_node(rt.ranks, rt.ranks),
        jobs.bundle_job(job, rt.ranks),
        since_ns=t_ns - int(window_s * NS),
        until_ns=t_ns,
        workloads=jobs.workloads_by_node(rt.ranks),
    )
    failed += more
    trigger_loop.note_failures(state, failed)
    watched = rt.watched_when.get(diagnosis_name, rt.sample)
    sampled = [int(r) for r in watched if r in rt.ranks] or None
    try:
        result = await asyncio.to_thread(
            engine.diagnose,
            bundle,
            jobs.analysis_settings(tj_spec),
            sampled=sampled,
            summaries=summaries.Summaries(),
        )
    except Exception as e:  # MemoryError included: the engine's failure is this Diagnosis's
        raise errors.AnalysisError(f"analysis failed: {type(e).__name__}: {e}".rstrip(": ")) from e
    meters.analysis_seconds.observe(time.perf_counter() - started)
    return result, failed


async def remediate(
    state: OperatorState,
    api: kube.Cluster,
    *,
    namespace: str,
    name: str,
    job: str,
    result: diagnosis.Diagnosis,
    conditions: Any,
    generation: Any,
    body: kopf.Body,
    diag: resources.Diagnosis,
) -> None:
    """The next remediation step of the Diagnosis ``diag`` (as the handler got it: its
    ``status.confirmation`` is the re-check to resume after a restart)."""
    rem, cfg = state.remediator, state.settings
    tj = await api.get_trainingjob(namespace, job) if job else None
    parsed = _trainingjob(tj)
    overrides = None if parsed is None else parsed.spec.diagnosis.remediation.overrides()
    pendings = state.confirmations
    uid = state_mod.diagnosis_key(namespace, name, body.get("metadata", {}).get("uid", ""))
    pending = diag.status.confirmation or pendings.get(uid)
    if pending is not None and pending.state != "Pending":
        pending = pendings.get(uid)
    request = remediator.Request(
        f"{namespace}/{name}", result, overrides, pending=pending, conditions=conditions,
        generation=generation, hardware=hardware_source(state, (namespace, job)),
        window_s=float(diag.spec.window_seconds or cfg.diagnosis_window_s),
    )  # fmt: skip
    try:
        step = await rem.remediate(request)
    except (errors.KubeError, errors.RemediationError) as e:
        raise kopf.TemporaryError(f"remediation: {e}", delay=5) from e
    new = dict(step.status)
    if step.marked:  # the step's conditions carry Confirmed: Diagnosed is set over them
        cond = new.get("conditions") or conditions
        new.update(status_phase("Diagnosed", "Remediated", cond, generation, "node marked"))
    if new:
        await _patch(api, namespace, name, new)
    workload = None if parsed is None else owners.workload_of(parsed)
    for warning, reason, message in step.events:
        event(body, workload, name, warning=warning, reason=reason, message=message)
    for a in new.get("actions") or ():
        text = f"{a['action']} {a.get('node', '')}: {a['outcome']} {a.get('message', '')}"
        if a["outcome"] in ("Done", "Blocked", "Failed"):
            kopf.warn(body, reason=f"Remediation{a['outcome']}", message=text.strip())
        else:
            kopf.info(body, reason=f"Remediation{a['outcome']}", message=text.strip())
    if step.retry_in_s is not None:
        if "confirmation" in new:
            pendings[uid] = resources.Confirmation.model_validate(new["confirmation"])
        raise kopf.TemporaryError(
            f"re-checking the hardware of the culprit node in {step.retry_in_s:.1f} s",
            delay=max(step.retry_in_s, 0.1),
        )
    pendings.pop(uid, None)


def hardware_source(state: OperatorState, job: jobs.JobKey) -> remediator.HardwareSource:
    """The hardware samples of a node from its agent (``AgentClient.hardware``), the agent
    found from the Node's InternalIP, else from the host IP of the job's pods there (the job
    may be gone by the re-check: the Node's address comes first); ``OperatorState.hardware``
    replaces it (tests)."""
    if state.hardware is not None:
        return state.hardware
    cfg = state.settings

    async def read(node: ids.NodeName, since_ns: int, until_ns: int) -> list[Any]:
        obj = await state.kube.get_node(node) or {}
        addresses = (obj.get("status") or {}).get("addresses") or []
        ip = next((str(a.get("address")) for a in addresses if a.get("type") == "InternalIP"), "")
        url = state.directory(node, ip or state.pods.nodes(job).get(node, ""))
        if url is None:
            raise errors.AgentUnreachable(f"no agent URL for node {node}")
        client = agents.AgentClient(
            node, url, timeout_s=cfg.agents.timeout_s + 2.0, retries=1, access=cfg.agents
        )
        try:
            got = await client.hardware(since_ns=since_ns, until_ns=until_ns)
        finally:
            await client.aclose()
        return list(got.records)

    return read


def _summary(result: diagnosis.Diagnosis) -> str:
    if not result.anomaly:
        return "no anomaly: " + (result.evidence[0] if result.evidence else "")[:500]
    top = result.culprits[0] if result.culprits else None
    where = "" if top is None else f" rank {top.rank} on {top.node} ({top.component})"
    return f"{result.category}{where}, confidence {result.confidence:.2f}"
