"""kopf handlers: the trigger loop of every TrainingJob (docs/design.md, "Data path" 5;
Mycroft §4.3).

A ``kopf.timer`` on trainingjobs runs every ``settings.trigger.interval_s`` (1 s by default; a
job's ``spec.diagnosis.trigger.intervalSeconds`` can only make its own ticks rarer). One tick:

1. the job's pods and nodes come from ``memo.pods`` (noted by ``handlers.opted_in_pod``);
2. when they changed (or a pod has no rank yet), each node's agent is asked ``/v1/ranks`` and
   the rings of the job's pods give rank -> node (``jobs.rank_placement``); agents are found
   through ``memo.directory`` (``jobs.AgentDirectory``: a URL template over node name and host
   IP by default);
   at the same time one empty-range window of every rank brings its ``comm`` records, from
   which the groups are inferred (``groups.infer``) unless ``spec.parallelism`` declares them;
3. the sample (``spec.diagnosis.sampling.maxRanks``, default 10; >= 1 per DP group, spread
   over nodes; with more DP groups than that, part of it rotates over the groups,
   ``analysis.rotation``) is kept or chosen again, and the ranks it watches at this tick
   number are taken from it;
4. the last ``window_s`` of the watched ranks' records (``join_history_s`` on a tick where a
   rank joins, so that it brings its history) are pulled from their agents in parallel
   (``agents.pull_window``), numbered like the previous ticks' (``numbering``) and fed to the
   job's ``analysis.trigger.TriggerState`` (kept in ``memo.jobs``), which runs Mycroft
   Algorithm 1;
5. on a trigger, a Diagnosis named after the incident is created (409 = already open: one per
   job and incident; a slowdown's incident is an episode of its communicator, so a second
   slowdown there after the first one ended opens a new one); ``diagnosis_handlers``
   analyses it; the job's Diagnoses beyond the newest ``diagnosis_retention`` go
   (``retention``: finished ones, never one a marked node names);
6. the status (counts of ranks, nodes and groups, the sample, health with the ``Hung`` and
   ``Slow`` conditions, ``AgentsReachable`` naming unreachable nodes, the last trigger and its
   Diagnosis; ``status.trainingjob_status``, bounded whatever the job's size) is patched when
   it changed. An unreachable agent is never fatal.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Mapping
from typing import Any, cast

import kopf

from collscope.operator import errors
from collscope.operator.analysis import trigger
from collscope.operator.clients import agents, kube
from collscope.operator.domain import (
    groups,
    ids,
    jobs,
    metrics,
    owners,
    resources,
    retention,
    sampling,
    settings,
    status,
)

NS = 1_000_000_000
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


async def forget(*, name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A deleted TrainingJob's trigger state goes (no finalizer of its own: ``optional``)."""
    runtimes: dict[jobs.JobKey, jobs.JobRuntime] = memo.jobs
    runtimes.pop((namespace or "", name), None)


def add_to_memo(
    memo: kopf.Memo,
    *,
    config: settings.Settings,
    directory: jobs.AgentDirectory,
    meters: metrics.OperatorMetrics,
) -> kopf.Memo:
    """Add what the trigger loop and the Diagnosis handlers share to ``handlers.memo_for``'s."""
    memo.settings = config
    memo.directory = directory
    memo.metrics = meters
    memo.jobs = {}
    memo.clients = {}
    memo.diagnoses_seen = set()
    return memo


def client_for(memo: kopf.Memo, node: str, host_ip: str) -> agents.AgentClient | None:
    """The (cached) client of a node's agent; None when the directory does not know it."""
    directory: jobs.AgentDirectory = memo.directory
    url = directory(node, host_ip)
    if url is None:
        return None
    cache: dict[tuple[str, str], agents.AgentClient] = memo.clients
    client = cache.get((node, url))
    if client is None:
        cfg: settings.Settings = memo.settings
        client = agents.AgentClient(node, url, access=cfg.agents)
        cache[(node, url)] = client
    return client


async def close_clients(memo: kopf.Memo, **_: Any) -> None:
    cache: dict[tuple[str, str], agents.AgentClient] = memo.clients
    for client in cache.values():
        await client.aclose()
    cache.clear()


def clients_of(memo: kopf.Memo, key: jobs.JobKey) -> dict[str, agents.AgentClient]:
    pods: jobs.Pods = memo.pods
    out = {}
    for node, ip in pods.nodes(key).items():
        c = client_for(memo, node, ip)
        if c is not None:
            out[node] = c
    return out


def note_failures(memo: kopf.Memo, failed: list[agents.Unreachable]) -> None:
    meters: metrics.OperatorMetrics = memo.metrics
    for f in failed:
        meters.agent_errors.labels(node=f.node).inc()


async def discover(
    memo: kopf.Memo, key: jobs.JobKey, rt: jobs.JobRuntime, now_s: float
) -> list[agents.Unreachable]:
    """Rank -> node, GPU and NIC of the job from its nodes' agents (``/v1/ranks``)."""
    pods: jobs.Pods = memo.pods
    places = dict(pods.by_job.get(key, {}))
    clients = clients_of(memo, key)
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


def job_groups(spec: Mapping[str, Any], rt: jobs.JobRuntime) -> groups.JobGroups:
    """Declared groups when ``spec.parallelism`` fits the ranks found; else those inferred from
    communicator membership at discovery (none yet: sampling spreads over nodes)."""
    par = spec.get("parallelism")
    world = max(rt.ranks, default=-1) + 1
    if par and world > 0:
        try:
            parsed = groups.parse(",".join(f"{k}={v}" for k, v in par.items()))
            d = groups.declared(parsed, world)
            return groups.JobGroups("declared", rt.groups.comms, d.tp, d.pp, d.dp)
        except errors.ParallelismError:
            pass
    return rt.groups


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
    memo: kopf.Memo,
    logger: Logger,
    **_: Any,
) -> None:
    cfg: settings.Settings = memo.settings
    meters: metrics.OperatorMetrics = memo.metrics
    namespace = namespace or ""
    key = (namespace, name)
    runtimes: dict[jobs.JobKey, jobs.JobRuntime] = memo.jobs
    rt = runtimes.setdefault(key, jobs.JobRuntime())
    every_s = float(((spec.get("diagnosis") or {}).get("trigger") or {}).get("intervalSeconds", 0))
    now_s = time.monotonic()
    if now_s - rt.last_tick_s < max(every_s, cfg.trigger.interval_s) * 0.9:
        return
    rt.last_tick_s = now_s
    meters.ticks.inc()
    pods: jobs.Pods = memo.pods
    unreachable: list[agents.Unreachable] = []
    if rt.needs_discovery(pods.by_job.get(key, {}), now_s, cfg.trigger.rediscover_s):
        unreachable += await discover(memo, key, rt, now_s)
    analysis = jobs.analysis_settings(resources.TrainingJobSpec.parse(spec))
    max_ranks = int(((spec.get("diagnosis") or {}).get("sampling") or {}).get("maxRanks", 0))
    rt.set_max_ranks(max_ranks or sampling.DEFAULT_MAX_RANKS)
    chosen_groups = job_groups(spec, rt)
    sample = rt.resample(analysis.trigger, chosen_groups)
    hit: trigger.TriggerResult | None = None
    health: status_mod.Health = "Unknown"
    last_trigger: dict[str, Any] | None = None
    if sample and rt.state is not None:
        t_ns = time.time_ns()
        joins = not set(sample) <= set(rt.state.sampled.tolist())
        back_s = max(cfg.trigger.window_s, cfg.trigger.join_history_s if joins else 0.0)
        try:
            bundle, failed = await agents.pull_window(
                clients_of(memo, key),
                jobs.by_node(sample, rt.ranks),
                jobs.bundle_job(name, rt.ranks),
                since_ns=t_ns - int(back_s * NS),
                until_ns=t_ns,
                workloads=jobs.workloads_by_node(rt.ranks),
            )
        except errors.CollscopeError as e:  # e.g. a rank beyond the world size seen so far
            logger.warning("trigger tick of %s/%s: %s", namespace, name, e)
            rt.pods_seen = frozenset()  # discover again on the next tick
            return
        unreachable += failed
        if len(failed) < len(jobs.by_node(sample, rt.ranks)):
            bundle = rt.numbering.apply(bundle)
            rt.state.watch(tuple(int(r) for r in sample), bundle)
            hit = rt.state.update(bundle, t_ns)
            health = "Healthy" if hit is None else ("Hung" if hit.kind == "hang" else "Slow")
            if hit is not None:
                comm = None if hit.comm is None else bundle.comm_id(hit.comm)
                last_trigger = await _open_incident(
                    memo, rt=rt, namespace=namespace, name=name, uid=uid, hit=hit, comm=comm,
                    cfg=cfg, logger=logger, body=body,
                    tick_s=max(every_s, cfg.trigger.interval_s),
                )  # fmt: skip
            rt.advance()
    note_failures(memo, unreachable)
    now = datetime.datetime.now(datetime.UTC)
    new = _job_status(
        rt, current=status, meta=meta, health=health, hit=hit, unreachable=unreachable, now=now,
        job_groups=chosen_groups if rt.ranks else None, last_trigger=last_trigger,
    )  # fmt: skip
    if last_trigger is not None:
        new["lastTrigger"] = last_trigger
    if any(status.get(k) != v for k, v in new.items()):
        patch.status.update(new)


async def _open_incident(
    memo: kopf.Memo,
    *,
    rt: jobs.JobRuntime,
    namespace: str,
    name: str,
    uid: str | None,
    hit: trigger.TriggerResult,
    comm: str | None,
    cfg: settings.Settings,
    logger: Logger,
    body: kopf.Body,
    tick_s: float,
) -> dict[str, Any] | None:
    """Create the incident's Diagnosis once; the ``lastTrigger`` status entry when new."""
    if hit.kind == "slow":
        incident = rt.slow_incident(comm, hit, rt.quiet_ticks(cfg.trigger.episode_quiet_ticks))
    else:
        incident = jobs.incident_of(hit, comm)
    diag = jobs.diagnosis_name(name, incident)
    if diag in rt.incidents:
        return None
    detected = datetime.datetime.fromtimestamp(hit.at_ns / NS, datetime.UTC)
    doc = jobs.diagnosis_body(
        namespace, name, uid, trigger_kind=hit.kind, incident=incident,
        detected_at=status.timestamp(detected),
        window_s=rt.diagnosis_window_s(cfg.diagnosis_window_s, tick_s),
    )  # fmt: skip
    api: kube.Cluster = memo.kube
    try:
        created = await api.create_diagnosis(doc)
    except errors.KubeError as e:
        logger.warning("cannot create Diagnosis %s: %s", diag, e)
        return None
    rt.incidents.add(diag)
    rt.watched_when[diag] = rt.sample  # the replay of its analysis watches the same ranks
    if created:
        meters: metrics.OperatorMetrics = memo.metrics
        meters.triggers.labels(kind=hit.kind, namespace=namespace, trainingjob=name).inc()
        logger.info("trigger (%s): %s -> Diagnosis %s", hit.kind, hit.reason, diag)
        text = f"{hit.kind}: {hit.reason}; Diagnosis {diag}"
        kopf.warn(body, reason="Triggered", message=text)
        workload = owners.workload_of(resources.TrainingJob.parse(body))
        if workload is not None:  # also where the job's owner looks
            target = kopf.Body(cast(kopf.RawBody, workload))  # kopf reads only the reference
            kopf.warn(target, reason="Triggered", message=f"TrainingJob {name}: {text}"[:1000])
        await retain(memo, namespace, name, logger)
    return {"time": status.timestamp(detected), "trigger": hit.kind, "diagnosis": diag,
            "message": hit.reason[:1024]}  # fmt: skip


async def retain(memo: kopf.Memo, namespace: str, job: str, logger: Logger) -> list[str]:
    """Retention after a new Diagnosis of ``job`` (the rule: ``retention``); the names deleted.
    The API unreachable or refusing: logged, tried again at the next Diagnosis."""
    cfg: settings.Settings = memo.settings
    api: kube.Cluster = memo.kube
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
