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

The same runs by itself (``wanted``, ``request``) for a slow verdict whose cause may lie in a
rank's own code: no culprit, a confidence below ``LOW_CONFIDENCE``, ``slow.host`` or
``slow.compute``. The last is the main case of EROICA §4: a slow data loader (or any host or
Python work) on one rank makes it arrive late at every collective, so the collective evidence
names the rank and says "late" but only the probe can name the function. A network verdict
(``slow.network``, ``slow.mixed``, a NIC or link culprit) never profiles: a function profile
says nothing about a NIC. ``diagnosis_handlers`` then sets the annotation to ``auto-<that
Diagnosis>``, once per Diagnosis; the profiling's function culprits and evidence (``functions:
...``) are added to that Diagnosis rather than written as a new one. A user asks the same of any
Diagnosis with ``spec.requestedActions: [profile]`` (``on_requested``: the annotation becomes
``auto-<Diagnosis>/<generation>``, so removing and adding ``profile`` again runs it again).
``off`` on the TrainingJob turns all of it off.

The Diagnosis profiled says how it goes in ``status.profiling`` (``note``): ``Requested``
(``UserRequested``, ``SlowVerdict``), ``Running`` (``Armed``, with the request id), ``Done``
(``FunctionFound`` or ``NoFunctionCulprit``, with the ranks profiled) or ``Failed`` with the
reason: ``ProfilingOff``, ``TrainingJobNotFound``, ``NoRanks`` or ``NoAgentArmed`` (arming is
retried for ``GIVE_UP_S``, then given up), ``Superseded`` (another profiling of the job started
before it ended) or ``KubeError``.

The Diagnosis carries the label ``collscope.dev/profile`` so that ``diagnosis_handlers`` leaves
it alone (it is analysed here, from profiles, not from a window of records) and it is never
remediated: a Python function on one rank is no node's fault. What is pending (and the last one
done, so that a repeated handling of the same value arms nothing) is kept in
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
from collscope.operator.domain import jobs, resources, status

ANNOTATION = "collscope.dev/profile"
LABEL = "collscope.dev/profile"  # on a Diagnosis written here: diagnosis_handlers skips it
# After the agents' deadline, how long a rank still shown as sampling is waited for (its probe
# writes the result file when the window ends; the agent reads it on the next pull).
LATE_S = 5.0
# Below this, a slow verdict's culprit is a guess worth checking function by function.
LOW_CONFIDENCE = 0.6
AUTO_PREFIX = "auto-"
REQUESTED = "profile"  # in a Diagnosis's spec.requestedActions
# Arming is retried this long (no ranks discovered yet, no agent armed), then given up.
GIVE_UP_S = 120.0
# Slow categories whose cause may be the culprit rank's own code (module docstring).
OWN_CODE = ("slow.compute", "slow.host")
NETWORK = ("slow.network", "slow.mixed")
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
    # Done: kept so that kopf handing the same annotation value over again (a stale body)
    # does not arm the job once more; a new value starts a new profiling.
    finished: bool = False


class NotArmed(kopf.TemporaryError):
    """Nothing to arm yet; ``reason`` is ``status.profiling``'s if it stays so."""

    def __init__(self, message: str, reason: str, delay: float) -> None:
        super().__init__(message, delay=delay)
        self.reason = reason


def register(registry: kopf.OperatorRegistry) -> None:
    kopf.on.field(
        kube.GROUP, kube.VERSION, kube.TRAININGJOBS, id="profile", registry=registry,
        field=("metadata", "annotations", ANNOTATION),
    )(on_annotation)  # fmt: skip
    kopf.on.field(
        kube.GROUP, kube.VERSION, kube.DIAGNOSES, id="profile", registry=registry,
        field=("spec", "requestedActions"),
    )(on_requested)  # fmt: skip


async def on_requested(
    *,
    name: str,
    namespace: str | None,
    old: Any,
    new: Any,
    spec: kopf.Spec,
    meta: kopf.Meta,
    memo: OperatorState,
    logger: Logger,
    **_: Any,
) -> None:
    """``profile`` added to a Diagnosis's ``spec.requestedActions`` (at creation or later):
    profile its job into it. Once per addition: the annotation's value names the generation."""
    if REQUESTED not in (new or ()) or REQUESTED in (old or ()):
        return
    job = resources.DiagnosisSpec.parse(spec).training_job.name
    tag = f"/{meta.get('generation') or 0}"
    await request(memo.kube, namespace or "", job, name, logger, reason="UserRequested", tag=tag)


async def on_annotation(
    *,
    name: str,
    namespace: str | None,
    new: Any,
    meta: kopf.Meta,
    memo: OperatorState,
    logger: Logger,
    runtime: datetime.timedelta | None = None,
    **_: Any,
) -> None:
    if not new or str(new).strip().lower() == "off":
        return
    key: jobs.JobKey = (namespace or "", name)
    value, api = str(new), memo.kube
    target = target_of(value)
    profiles = memo.profiles
    p = profiles.get(key)
    if p is not None and p.value == value and p.finished:
        return  # handled already: kopf repeats a change while its own patches are in flight
    if p is None or p.value != value:
        if p is not None and not p.finished and target_of(p.value):
            why = f"profiling {p.id} left for {ANNOTATION}={value}"
            old = target_of(p.value)
            await note(api, key[0], old, "Failed", "Superseded", message=why, id=p.id)
            profiles.pop(key, None)
        try:
            p = await start(memo, key, value)
        except NotArmed as e:
            if runtime is None or runtime.total_seconds() < GIVE_UP_S:
                raise
            logger.warning("profiling of %s given up: %s", name, e)
            await note(api, key[0], target, "Failed", e.reason, message=str(e))
            return
        profiles[key] = p
        logger.info("profiling %s: %d node(s) armed for %g s", p.id, len(p.nodes), p.window_s)
        msg = f"{len(p.nodes)} node(s) armed for {p.window_s:g} s"
        await note(api, key[0], target, "Running", "Armed", message=msg, id=p.id)
        raise kopf.TemporaryError(f"profiling {p.id}: the window runs", delay=p.window_s + 1)
    reports, failed = await profiling.pull(trigger_loop.clients_of(memo, key), p.nodes, p.id)
    if profiling.pending(reports) and time.time_ns() < p.deadline_ns + LATE_S * NS:
        raise kopf.TemporaryError(f"profiling {p.id}: ranks still sampling", delay=1)
    result = await asyncio.to_thread(profiling.localise, reports, p.job, [*p.failed, *failed])
    done = done_status(p, result, sum(r.state == "done" for x in reports.values() for r in x.ranks))
    if not target or not await write_into(api, key[0], target, result):
        await write(api, key, str(meta.get("uid") or ""), p, result, done=done)
    else:
        await note(api, key[0], target, **done)
    p.finished = True
    logger.info("profiling %s: %s", p.id, done["message"])


def target_of(value: str) -> str:
    """The Diagnosis an annotation's value profiles into (``auto-<name>[/<generation>]``);
    "" for a profiling of its own (``now``, a timestamp)."""
    if not value.startswith(AUTO_PREFIX):
        return ""
    return value[len(AUTO_PREFIX) :].split("/", 1)[0]


def done_status(p: Pending, result: diagnosis.Diagnosis, profiled: int) -> dict[str, Any]:
    """``note``'s arguments for a profiling that ended."""
    named = [f"rank {c.rank} {c.function}" for c in result.culprits if c.function]
    message = "; ".join(named) or (result.evidence[0] if result.evidence else "")
    return {
        "state": "Done", "reason": "FunctionFound" if named else "NoFunctionCulprit",
        "message": message or "no function culprit", "id": p.id, "ranks_profiled": profiled,
    }  # fmt: skip


async def note(
    api: kube.Cluster,
    namespace: str,
    name: str,
    state: str,
    reason: str,
    *,
    message: str = "",
    id: str | None = None,
    ranks_profiled: int | None = None,
) -> None:
    """Set ``status.profiling`` of Diagnosis ``name`` (nothing when ``name`` is ""); a failure
    is logged, never raised: the profiling itself goes on."""
    if not name:
        return
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    # Every key written (None deletes under a merge patch): no stale id or count stays.
    body = {"state": state, "reason": reason, "message": message[:1024] or None, "id": id,
            "ranksProfiled": ranks_profiled, "time": now}  # fmt: skip
    try:
        await api.patch_status(kube.DIAGNOSES, namespace, name, {"profiling": body})
    except errors.KubeError as e:
        logging.getLogger(__name__).warning("status.profiling of %s not set: %s", name, e)


def wanted(result: diagnosis.Diagnosis) -> bool:
    """Whether a fresh verdict asks for function-level profiling (module docstring)."""
    if not result.anomaly or result.trigger != "slow" or result.category in NETWORK:
        return False
    if result.culprits and result.culprits[0].component in ("nic", "link"):
        return False
    return (
        not result.culprits
        or result.confidence < LOW_CONFIDENCE
        or result.category is None
        or result.category in OWN_CODE
    )


async def request(
    api: kube.Cluster,
    namespace: str,
    job: str,
    diagnosis_name: str,
    logger: Logger,
    *,
    reason: str = "SlowVerdict",
    tag: str = "",
) -> bool:
    """Ask for a profiling of ``job`` into ``diagnosis_name`` by the job's annotation
    (``on_annotation`` runs it), unless the job says ``off``; False when not asked. Either way
    the Diagnosis's ``status.profiling`` says so. Asked already (the annotation holds this very
    value: kopf handed the same creation or change over again, or the Diagnosis was processed
    again): True, and its ``status.profiling``, perhaps Running or Done by now, is left as it is.
    """
    value = AUTO_PREFIX + diagnosis_name + tag
    try:
        tj = await api.get_trainingjob(namespace, job)
        annotations = ((tj or {}).get("metadata") or {}).get("annotations") or {}
        if str(annotations.get(ANNOTATION, "")) == value:
            return True
        if tj is None:
            why = ("TrainingJobNotFound", f"TrainingJob {namespace}/{job} not found")
        elif str(annotations.get(ANNOTATION, "")).strip().lower() == "off":
            why = ("ProfilingOff", f"TrainingJob {job} says {ANNOTATION}=off")
        else:
            asked = f"asked by {ANNOTATION}={value} on TrainingJob {job}"
            await note(api, namespace, diagnosis_name, "Requested", reason, message=asked)
            await api.annotate_trainingjob(namespace, job, {ANNOTATION: value})
            return True
    except errors.KubeError as e:
        logger.warning("profiling of %s/%s not requested: %s", namespace, job, e)
        why = ("KubeError", str(e))
    await note(api, namespace, diagnosis_name, "Failed", why[0], message=why[1])
    return False


async def start(state: OperatorState, key: jobs.JobKey, value: str) -> Pending:
    """Find the job's ranks and arm them; TemporaryError when there is nothing to arm yet."""
    rt = state.jobs.setdefault(key, jobs.JobRuntime())
    failed: list[agents.Unreachable] = []
    if not rt.ranks:
        failed += await trigger_loop.discover(state, key, rt, time.monotonic())
    if not rt.ranks:
        raise NotArmed(f"no ranks of TrainingJob {key[1]} found yet", "NoRanks", delay=5)
    clients = trigger_loop.clients_of(state, key)
    req_id = profiling.request_id(key[1], time.time_ns())
    by_node = jobs.by_node(rt.ranks, rt.ranks)
    armed, more = await profiling.arm(clients, by_node, req_id, window_s=profiling.WINDOW_S)
    failed += more
    trigger_loop.note_failures(state, failed)
    if not armed:
        why = "; ".join(f"{f.node}: {f.reason}" for f in failed) or "no agent"
        raise NotArmed(f"no agent armed ({why})", "NoAgentArmed", delay=10)
    deadline = max(a.deadline_ns for a in armed.values())
    return Pending(value, req_id, profiling.WINDOW_S, deadline, sorted(armed),
                   jobs.bundle_job(key[1], rt.ranks), failed)  # fmt: skip


async def write_into(
    api: kube.Cluster, namespace: str, name: str, profiled: diagnosis.Diagnosis
) -> bool:
    """Add a profiling's function culprits and evidence (``functions:``, after the verdict's
    first sentence) to the Diagnosis that asked for it, in place of an earlier profiling's;
    False when it is gone. Waits (``TemporaryError``) while its own analysis runs."""
    try:
        found = [d for d in await api.list_diagnoses(namespace)
                 if (d.get("metadata") or {}).get("name") == name]  # fmt: skip
        if not found:
            return False
        st = found[0].get("status") or {}
        if not st.get("result") and st.get("phase") != "Failed":
            raise kopf.TemporaryError(f"profiling into {name}: its analysis runs", delay=2)
        old = diagnosis.Diagnosis.model_validate(st.get("result") or {"anomaly": False})
        lines = [f"functions: {e}" for e in profiled.evidence]
        kept = [e for e in old.evidence if not e.startswith("functions: ")]
        merged = old.model_copy(
            update={
                "culprits": [*(c for c in old.culprits if not c.function),
                             *(c for c in profiled.culprits if c.function)],
                "evidence": [*kept[:1], *lines, *kept[1:]],
            }
        )  # fmt: skip
        await api.patch_status(kube.DIAGNOSES, namespace, name, {"result": status.result(merged)})
    except errors.KubeError as e:
        raise kopf.TemporaryError(f"profiling into {name}: {e}", delay=2) from e
    return True


async def write(
    api: kube.Cluster,
    key: jobs.JobKey,
    job_uid: str,
    p: Pending,
    result: Any,
    *,
    done: dict[str, Any] | None = None,
) -> str:
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
    if done:
        await note(api, key[0], name, **done)
    return name
