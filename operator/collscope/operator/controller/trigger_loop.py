"""kopf handlers: the trigger loop of every TrainingJob (docs/design.md, "Data path" 5;
Mycroft §4.3).

A ``kopf.timer`` on trainingjobs runs every ``settings.trigger.interval_s`` (1 s by default; a
job's ``spec.diagnosis.trigger.intervalSeconds`` can only make its own ticks rarer). Steps 1-4
are ``step``, free of kopf, which the one-box (``onebox/watch.py``) runs too; ``tick``, the
handler, runs it and then steps 5 and 6. One tick:

1. the job's pods and nodes come from ``OperatorState.pods`` (noted by
   ``handlers.opted_in_pod``);
2. when they changed (or a pod has no rank yet), each node's agent is asked ``/v1/ranks`` and
   the rings of the job's pods give rank -> node (``jobs.rank_placement``); agents are found
   through ``OperatorState.directory`` (``jobs.AgentDirectory``: a URL template over node name
   and host IP by default);
   at the same time one empty-range window of every rank brings its ``comm`` records, from
   which the groups are inferred (``groups.infer``) unless ``spec.parallelism`` declares them;
3. the sample (``spec.diagnosis.sampling.maxRanks``, default 10; >= 1 per DP group, spread
   over nodes; with more DP groups than that, part of it rotates over the groups,
   ``analysis.rotation``) is kept or chosen again, and the ranks it watches at this tick
   number are taken from it;
4. the last ``window_s`` of the watched ranks' records (``join_history_s`` on a tick where a
   rank joins, so that it brings its history) are pulled from their agents in parallel
   (``agents.pull_window``), numbered like the previous ticks' (``numbering``) and fed to the
   job's ``analysis.trigger.TriggerState`` (kept in ``OperatorState.jobs``), which runs
   Mycroft Algorithm 1; every rank's summary (``agents.pull_summaries``, ``/v1/summaries``)
   goes with it for the job-wide hang check (``analysis.jobwide``); a trigger is given its
   incident (below), except a slowdown that would open a new incident while the job's own
   profiling may be slowing it (``slow_incident``: the probe's cost is never a Diagnosis);
5. on a trigger, a Diagnosis named after the incident is created (409 = already open: one per
   job and incident; a slowdown's incident is an episode of its communicator, so a second
   slowdown there after the first one ended opens a new one); ``diagnosis_handlers``
   analyses it; the job's Diagnoses beyond the newest ``diagnosis_retention`` go
   (``retention``: finished ones, never one a marked node names);
6. the status (counts of ranks, nodes and groups, the sample, health with the ``Hung`` and
   ``Slow`` conditions, ``AgentsReachable`` naming unreachable nodes, the last trigger and its
   Diagnosis; ``status.trainingjob_status``, bounded whatever the job's size) is patched when
   it changed. An unreachable agent is never fatal.

Why one module: it is the tick, one path from discovery to the status patch, and ``step`` is
shared with the one-box; the Diagnosis creation, retention and status it ends in are read
with it.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Mapping
from typing import Any, cast

import kopf

from collscope.nodeagent.bundle import tables
from collscope.operator import errors
from collscope.operator.analysis import summaries, trigger
from collscope.operator.clients import agents, kube
from collscope.operator.controller.state import OperatorState
from collscope.operator.domain import (
    groups,
    ids,
    jobs,
    owners,
    resources,
    retention,
    sampling,
    settings,
    status,
)

NS = 1_000_000_000
# The completion window of the job-wide summaries, one definition with the replay's model of
# them (``analysis.summaries``, which ``collscope analyze`` and the Diagnosis replay use).
JOBWIDE_WINDOW_S = summaries.WINDOW_S
Logger = logging.Logger | logging.LoggerAdapter[Any]


status_mod = status  # the module; ``status`` is kopf's kwarg inside handlers


def register(registry: kopf.OperatorRegistry, config: settings.Settings) -> None:
    kopf.timer(
        kube.GROUP, kube.VERSION, kube.TRAININGJOBS,
        interval=config.trigger.interval_s, id="trigger", registry=registry,
    )(tick)  # fmt: skip
    kopf.on.cleanup(registry=registry)(close_clients)
    kopf.on.delete(
        kube.GROUP, kube.VERSION, kube.TRAININGJOBS, id="forget", optional=True, registry=registry
    )(forget)


async def forget(*, name: str, namespace: str | None, memo: OperatorState, **_: Any) -> None:
    """A deleted TrainingJob's trigger state and pending profiling go (no finalizer of its own:
    ``optional``)."""
    memo.jobs.pop((namespace or "", name), None)
    memo.profiles.pop((namespace or "", name), None)


def client_for(state: OperatorState, node: str, host_ip: str) -> agents.AgentClient | None:
    """The (cached) client of a node's agent; None when the directory does not know it."""
    url = state.directory(node, host_ip)
    if url is None:
        return None
    client = state.clients.get((node, url))
    if client is None:
        client = agents.AgentClient(node, url, access=state.settings.agents)
        state.clients[(node, url)] = client
    return client


async def close_clients(memo: OperatorState, **_: Any) -> None:
    for client in memo.clients.values():
        await client.aclose()
    memo.clients.clear()


def clients_of(state: OperatorState, key: jobs.JobKey) -> dict[str, agents.AgentClient]:
    out = {}
    for node, ip in state.pods.nodes(key).items():
        c = client_for(state, node, ip)
        if c is not None:
            out[node] = c
    return out


def note_failures(state: OperatorState, failed: list[agents.Unreachable]) -> None:
    for f in failed:
        state.metrics.agent_errors.labels(node=f.node).inc()


async def discover(
    state: OperatorState, key: jobs.JobKey, rt: jobs.JobRuntime, now_s: float
) -> list[agents.Unreachable]:
    """Rank -> node, GPU and NIC of the job from its nodes' agents (``/v1/ranks``)."""
    pods = state.pods
    places = dict(pods.by_job.get(key, {}))
    clients = clients_of(state, key)
    nodes = pods.nodes(key)
    answers, failed = await agents.gather({n: c.ranks() for n, c in clients.items()})
    failed += [
        agents.Unreachable(n, "no agent URL for this node") for n in nodes if n not in clients
    ]
    rt.ranks = jobs.rank_placement(key[0], places, answers)
    rt.device_asks = rt.device_asks + 1 if rt.pods_seen == frozenset(places.values()) else 0
    rt.pods_seen = frozenset(places.values())
    rt.discovered_at_s = now_s
    if rt.ranks:  # the comm records come with any window, even an empty range
        t_ns = time.time_ns()
        try:
            bundle, more = await agents.pull_window(
                clients, jobs.by_node(rt.ranks, rt.ranks), jobs.bundle_job(key[1], rt.ranks),
                since_ns=t_ns, until_ns=t_ns, workloads=jobs.workloads_by_node(rt.ranks),
            )  # fmt: skip
        except errors.CollscopeError as e:
            more = [agents.Unreachable("-", f"communicators: {e}")]
        else:
            nodes_of = {r: p.node for r, p in rt.ranks.items()}
            world = max(rt.ranks) + 1
            rt.groups = groups.infer(jobs.members_of(bundle), world, nodes_of)
        failed += [f for f in more if f.node not in {x.node for x in failed}]
    return failed


def job_groups(spec: resources.TrainingJobSpec, rt: jobs.JobRuntime) -> groups.JobGroups:
    """Declared groups when ``spec.parallelism`` fits the ranks found; else those inferred from
    communicator membership at discovery (none yet: sampling spreads over nodes)."""
    declared = "" if spec.parallelism is None else spec.parallelism.as_text()
    world = max(rt.ranks, default=-1) + 1
    if declared and world > 0:
        try:
            parsed = groups.parse(declared)
            d = groups.declared(parsed, world)
            return groups.JobGroups("declared", rt.groups.comms, d.tp, d.pp, d.dp)
        except errors.ParallelismError:
            pass
    return rt.groups


@dataclasses.dataclass
class TickResult:
    """What ``step`` saw at one tick of a job: the groups and the ranks watched, the window
    pulled from them (numbered; None when none was pulled), the trigger and its incident (None:
    none), the health it gives and the agents that failed. ``error``: the pull failed as a whole
    (nothing was fed to the trigger; the job is discovered again on the next tick)."""

    groups: groups.JobGroups
    sample: tuple[ids.Rank, ...]
    unreachable: list[agents.Unreachable]
    bundle: tables.Bundle | None = None
    hit: trigger.TriggerResult | None = None
    incident: str | None = None
    health: status.Health = "Unknown"
    error: errors.CollscopeError | None = None


async def step(
    state: OperatorState, key: jobs.JobKey, spec: resources.TrainingJobSpec, *, now_s: float
) -> TickResult:
    """Steps 1-4 of a tick of the TrainingJob ``key`` with its parsed ``spec`` (module
    docstring): discovery when due, the sample, the watched ranks' window and the trigger."""
    cfg = state.settings
    rt = state.jobs.setdefault(key, jobs.JobRuntime())
    unreachable: list[agents.Unreachable] = []
    if rt.needs_discovery(state.pods.by_job.get(key, {}), now_s, cfg.trigger.rediscover_s):
        unreachable += await discover(state, key, rt, now_s)
    analysis = jobs.analysis_settings(spec)
    rt.set_max_ranks(spec.diagnosis.sampling.max_ranks or sampling.DEFAULT_MAX_RANKS)
    chosen_groups = job_groups(spec, rt)
    sample = rt.resample(analysis.trigger, chosen_groups)
    out = TickResult(chosen_groups, sample, unreachable)
    if not sample or rt.state is None:
        return out
    t_ns = time.time_ns()
    joins = not set(sample) <= set(rt.state.sampled.tolist())
    back_s = max(cfg.trigger.window_s, cfg.trigger.join_history_s if joins else 0.0)
    try:
        bundle, failed = await agents.pull_window(
            clients_of(state, key),
            jobs.by_node(sample, rt.ranks),
            jobs.bundle_job(key[1], rt.ranks),
            since_ns=t_ns - int(back_s * NS),
            until_ns=t_ns,
            workloads=jobs.workloads_by_node(rt.ranks),
        )
    except errors.CollscopeError as e:  # e.g. a rank beyond the world size seen so far
        rt.pods_seen = frozenset()  # discover again on the next tick
        out.error = e
        return out
    unreachable += failed
    rows, more = await agents.pull_summaries(
        clients_of(state, key), jobs.by_node(rt.ranks, rt.ranks),
        jobs.workloads_by_node(rt.ranks), window_s=JOBWIDE_WINDOW_S,
    )  # fmt: skip
    unreachable += [f for f in more if f.node not in {u.node for u in unreachable}]
    if len(failed) < len(jobs.by_node(sample, rt.ranks)):
        out.bundle = bundle = rt.numbering.apply(bundle)
        rt.state.watch(tuple(int(r) for r in sample), bundle)
        out.hit = hit = rt.state.update(bundle, t_ns, rows)
        out.health = "Healthy" if hit is None else ("Hung" if hit.kind == "hang" else "Slow")
        if hit is not None:  # before ``advance``: a slowdown's episode counts the ticks run
            comm = None if hit.comm is None else bundle.comm_id(hit.comm)
            if hit.kind == "slow":
                quiet = rt.quiet_ticks(cfg.trigger.episode_quiet_ticks)
                out.incident = slow_incident(state, key, rt, comm, hit, quiet=quiet, t_ns=t_ns)
            else:
                out.incident = jobs.incident_of(hit, comm)
        rt.advance()
    return out


def profiled_until_ns(state: OperatorState, key: jobs.JobKey) -> int | None:
    """Until when the job's own profiling may slow it (None: none armed): the dormant probe
    sampling every rank costs 3-6 % an iteration (bench/README.md), far more when the node's
    CPUs are short, so a slowdown seen then may be collscope's own. The agents' deadline (the
    window's end) plus the trigger's window and one tick, since the records of the armed window
    stay that long in what each tick pulls."""
    p = state.profiles.get(key)
    if p is None:
        return None
    cfg = state.settings.trigger
    return p.deadline_ns + int((cfg.window_s + cfg.interval_s) * NS)


def slow_incident(
    state: OperatorState,
    key: jobs.JobKey,
    rt: jobs.JobRuntime,
    comm: str | None,
    hit: trigger.TriggerResult,
    *,
    quiet: int,
    t_ns: int,
) -> str | None:
    """A slow trigger's incident (``JobRuntime.slow_incident``), or None while the job's own
    profiling may be what slows it (``profiled_until_ns``) and the trigger would open a new
    incident: a slowdown collscope causes must never become a Diagnosis. A trigger of an episode
    already open goes on as before (its Diagnosis exists); a real slowdown that began during the
    window still holds after it and is reported then."""
    base = rt.episode_base(comm, hit, quiet)
    before = rt.episodes.get(base)
    incident = rt.slow_incident(comm, hit, quiet)
    until = profiled_until_ns(state, key)
    if until is None or t_ns > until or (before is not None and incident == before[0]):
        return incident
    if before is None:  # no episode opened by a trigger that is not reported
        rt.episodes.pop(base, None)
    else:
        rt.episodes[base] = before
    logging.getLogger(__name__).info(
        "%s/%s: slow trigger during its own profiling, no Diagnosis: %s", *key, hit.reason
    )
    return None


async def tick(
    *,
    name: str,
    namespace: str | None,
    uid: str,
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: OperatorState,
    logger: Logger,
    **_: Any,
) -> None:
    cfg = memo.settings
    namespace = namespace or ""
    key = (namespace, name)
    parsed = resources.TrainingJobSpec.parse(spec)  # SpecError: kopf logs it, the tick fails
    rt = memo.jobs.setdefault(key, jobs.JobRuntime())
    every_s = parsed.diagnosis.trigger.interval_seconds or 0.0
    now_s = time.monotonic()
    if now_s - rt.last_tick_s < max(every_s, cfg.trigger.interval_s) * 0.9:
        return
    rt.last_tick_s = now_s
    memo.metrics.ticks.inc()
    got = await step(memo, key, parsed, now_s=now_s)
    if got.error is not None:
        logger.warning("trigger tick of %s/%s: %s", namespace, name, got.error)
        return
    last_trigger: dict[str, Any] | None = None
    if got.hit is not None and got.incident is not None:
        last_trigger = await _open_incident(
            memo, rt=rt, namespace=namespace, name=name, uid=uid, hit=got.hit,
            incident=got.incident, cfg=cfg, logger=logger, body=body,
            tick_s=max(every_s, cfg.trigger.interval_s),
        )  # fmt: skip
    note_failures(memo, got.unreachable)
    now = datetime.datetime.now(datetime.UTC)
    new = _job_status(
        rt, current=status, meta=meta, health=got.health, hit=got.hit,
        unreachable=got.unreachable, now=now,
        job_groups=got.groups if rt.ranks else None, last_trigger=last_trigger,
    )  # fmt: skip
    if last_trigger is not None:
        new["lastTrigger"] = last_trigger
    if any(status.get(k) != v for k, v in new.items()):
        patch.status.update(new)


async def _open_incident(
    state: OperatorState,
    *,
    rt: jobs.JobRuntime,
    namespace: str,
    name: str,
    uid: str | None,
    hit: trigger.TriggerResult,
    incident: str,
    cfg: settings.Settings,
    logger: Logger,
    body: kopf.Body,
    tick_s: float,
) -> dict[str, Any] | None:
    """Create the incident's Diagnosis once; the ``lastTrigger`` status entry when new."""
    diag = jobs.diagnosis_name(name, incident)
    if diag in rt.incidents:
        return None
    detected = datetime.datetime.fromtimestamp(hit.at_ns / NS, datetime.UTC)
    doc = jobs.diagnosis_body(
        namespace, name, uid, trigger_kind=hit.kind, incident=incident,
        detected_at=status.timestamp(detected),
        window_s=rt.diagnosis_window_s(cfg.diagnosis_window_s, tick_s),
    )  # fmt: skip
    try:
        created = await state.kube.create_diagnosis(doc)
    except errors.KubeError as e:
        logger.warning("cannot create Diagnosis %s: %s", diag, e)
        return None
    rt.incidents.add(diag)
    rt.watched_when[diag] = rt.sample  # the replay of its analysis watches the same ranks
    if created:
        state.metrics.triggers.labels(kind=hit.kind, namespace=namespace, trainingjob=name).inc()
        logger.info("trigger (%s): %s -> Diagnosis %s", hit.kind, hit.reason, diag)
        text = f"{hit.kind}: {hit.reason}; Diagnosis {diag}"
        kopf.warn(body, reason="Triggered", message=text)
        workload = owners.workload_of(resources.TrainingJob.parse(body))
        if workload is not None:  # also where the job's owner looks
            target = kopf.Body(cast(kopf.RawBody, workload))  # kopf reads only the reference
            kopf.warn(target, reason="Triggered", message=f"TrainingJob {name}: {text}"[:1000])
        await retain(state, namespace, name, logger)
    return {"time": status.timestamp(detected), "trigger": hit.kind, "diagnosis": diag,
            "message": hit.reason[:1024]}  # fmt: skip


async def retain(state: OperatorState, namespace: str, job: str, logger: Logger) -> list[str]:
    """Retention after a new Diagnosis of ``job`` (the rule: ``retention``); the names deleted.
    The API unreachable or refusing: logged, tried again at the next Diagnosis."""
    cfg, api = state.settings, state.kube
    gone: list[str] = []
    try:
        listed = [resources.Diagnosis.parse(o) for o in await api.list_diagnoses(namespace)]
        old = retention.beyond(listed, job=job, keep=cfg.diagnosis_retention)
        nodes = sorted({n for o in old if (n := retention.culprit_node(o)) is not None})
        held = retention.named_by_marks([await api.get_node(n) for n in nodes])
        for o in old:
            name = str(o.metadata["name"])
            if f"{namespace}/{name}" not in held:
                await api.delete_diagnosis(namespace, name)
                gone.append(name)
    except errors.KubeError as e:
        logger.warning("Diagnosis retention of %s/%s: %s", namespace, job, e)
    if gone:
        logger.info(
            "deleted %d Diagnoses of %s/%s beyond the newest %d: %s",
            len(gone), namespace, job, cfg.diagnosis_retention, ", ".join(gone),
        )  # fmt: skip
    return gone


def _job_status(
    rt: jobs.JobRuntime,
    *,
    current: Mapping[str, Any],
    meta: Mapping[str, Any],
    health: status.Health,
    hit: trigger.TriggerResult | None,
    unreachable: list[agents.Unreachable],
    now: datetime.datetime,
    job_groups: groups.JobGroups | None,
    last_trigger: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    placement = [{"rank": int(r), "node": p.node} for r, p in rt.ranks.items()]  # counted only
    trigger_message = ""
    if hit is not None:
        last = last_trigger or current.get("lastTrigger") or {}
        named = f"; Diagnosis {last['diagnosis']}" if last.get("trigger") == hit.kind else ""
        trigger_message = hit.reason + named
    phase: status.JobPhase = "Pending" if not rt.ranks else "Watching"
    if hit is not None:
        phase = "Diagnosing"
    generation = meta.get("generation")
    new = status.trainingjob_status(
        placement=placement,
        job_groups=job_groups,
        sampled=[ids.Rank(r) for r in rt.sample],
        phase=phase,
        health=health,
        generation=generation,
        conditions=current.get("conditions"),
        now=now,
        unreachable=sorted({ids.NodeName(u.node) for u in unreachable}),
        trigger_message=trigger_message,
    )
    down = sorted({u.node for u in unreachable})
    new["conditions"] = status.set_condition(
        new["conditions"],
        type_="AgentsReachable",
        status="False" if down else "True",
        reason="AgentUnreachable" if down else "AllReachable",
        message="; ".join(f"{u.node}: {u.reason}" for u in unreachable)[:2000] or "ok",
        generation=generation,
        now=now,
    )
    return new
