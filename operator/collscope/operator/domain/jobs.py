"""What the operator keeps in memory per TrainingJob between trigger ticks, and the pure steps
of a tick (no kopf, no HTTP: the handler modules do the I/O).

- ``PodPlace``: an opted-in pod of the job and the node it runs on, recorded by the pod event
  handler (``handlers.opted_in_pod``); ``Pods`` keeps them per job.
- Agent discovery (``AgentDirectory``): a node's agent URL from a template over the node name
  and the pods' ``status.hostIP`` (the DaemonSet listens on the host network, port 9464), or
  any other callable of the same shape (tests map nodes to in-process agents).
- Rank mapping (``rank_placement``): the rings each node's agent lists (``/v1/ranks``) whose
  pod is one of the job's pods on that node, with the GPU (index, UUID) and NIC the agent's
  device map found for each (``bundle_job`` writes them into the pulled window's ``job.json``,
  so that every culprit names its node, pod, GPU and NIC).
- ``JobRuntime``: the sample (``sampling.Sampler``: a plan that rotates part of it over the DP
  groups, tick by tick), the trigger (``analysis.trigger``, Mycroft Algorithm 1 §4.3) fed once
  per tick with the watched ranks' records, numbered alike from tick to tick (``numbering``),
  and the incidents seen.
- Incident naming (``incident_of``/``diagnosis_name``): one Diagnosis per job and incident, the
  name derived from (kind, communicator, sequence) for a hang, so creating it twice answers
  409. A slowdown lasts many operations, so its incident is an *episode* of its communicator
  (``JobRuntime.slow_incident``): triggers on that communicator belong to the open episode
  until none held for ``quiet_ticks`` ticks; the next one opens a new episode and a new
  Diagnosis, named after the episode's first trigger, so a second slowdown on a communicator
  that already has a Diagnosis is reported rather than deduplicated into the first.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from collscope.nodeagent import api
from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import engine, trigger
from collscope.operator.domain import groups, ids, numbering, resources, sampling

# (node name, host IP or "") -> base URL of that node's agent, or None when unknown.
AgentDirectory = Callable[[str, str], str | None]
# Rediscoveries while some rank's GPU or NIC is unknown: an agent's device map settles within a
# second or two of a ring appearing (NVML lists the process at its next 1 Hz sample), and a
# node without NVML or without NICs in sysfs never settles, so the asking stops.
DEVICE_RETRIES = 3


def template_directory(template: str) -> AgentDirectory:
    """``http://{node_ip}:9464``-style discovery; None for a node without an IP if needed."""

    def url(node: str, node_ip: str) -> str | None:
        if "{node_ip}" in template and not node_ip:
            return None
        return template.format(node=node, node_ip=node_ip)

    return url


@dataclass(frozen=True)
class PodPlace:
    name: str
    uid: str
    node: str  # "" while unscheduled
    host_ip: str


JobKey = tuple[str, str]  # (namespace, TrainingJob name)


@dataclass
class Pods:
    """Opted-in pods per TrainingJob, and the job of each pod (to forget deleted pods)."""

    by_job: dict[JobKey, dict[str, PodPlace]] = field(default_factory=dict)
    job_of: dict[tuple[str, str], JobKey] = field(default_factory=dict)

    def note(self, job: JobKey, place: PodPlace) -> None:
        self.by_job.setdefault(job, {})[place.name] = place
        self.job_of[(job[0], place.name)] = job

    def forget(self, namespace: str, pod: str) -> None:
        job = self.job_of.pop((namespace, pod), None)
        if job is not None:
            self.by_job.get(job, {}).pop(pod, None)

    def nodes(self, job: JobKey) -> dict[str, str]:
        """node -> host IP of the job's scheduled pods."""
        return {p.node: p.host_ip for p in self.by_job.get(job, {}).values() if p.node}


@dataclass(frozen=True)
class RankPlace:
    rank: ids.Rank
    node: ids.NodeName
    pod: str
    pod_uid: str
    gpu: int | None = None  # NVML index on the node
    gpu_uuid: str | None = None
    nic: str | None = None  # as NCCL names it: mlx5_0, mlx5_0:1, eth2
    unresolved: str | None = None  # the agent's reason when gpu or nic is None
    # The agent's key for the rank's data besides the rank (``api.RankInfo.workload``: the pod
    # uid); None from an agent that does not key by workload.
    workload: str | None = None


def rank_placement(
    namespace: str, pods: Mapping[str, PodPlace], answers: Mapping[str, api.RanksResponse]
) -> dict[ids.Rank, RankPlace]:
    """Rings of the job's pods, from each node's ``/v1/ranks`` (a ring counts on the node whose
    agent lists it, and only when its pod is one of the job's pods scheduled there). The pod
    name and namespace are the ring header's, which its writer controls: where the agent knows
    the ring's pod uid (from the kubelet's path), it must be the pod's too, or another tenant's
    ring naming this job's pod would be taken for one of its ranks."""
    out: dict[ids.Rank, RankPlace] = {}
    for node, answer in sorted(answers.items()):
        for info in answer.ranks:
            pod = pods.get(info.pod_name)
            if info.rank is None or pod is None or pod.node != node:
                continue
            if info.pod_namespace and info.pod_namespace != namespace:
                continue
            if info.health in ("error", "retired"):
                continue
            if info.pod_uid and pod.uid and info.pod_uid != pod.uid:
                continue
            out[ids.Rank(info.rank)] = RankPlace(
                ids.Rank(info.rank),
                ids.NodeName(node),
                pod.name,
                info.pod_uid or pod.uid,
                gpu=info.gpu_index,
                gpu_uuid=info.gpu_uuid,
                nic=info.nic,
                unresolved=info.unresolved or None,
                workload=info.workload,
            )
    return out


def workloads_by_node(placement: Mapping[ids.Rank, RankPlace]) -> dict[str, list[str]]:
    """node -> the agent's workloads of the job's ranks there, for requests that name them
    (``api`` module docstring): only another job's rank 0 on the same node is then left out.
    A node with a rank whose agent gave no workload (an older agent) is left out: it would
    reject the parameter."""
    out: dict[str, set[str]] = {}
    old: set[str] = set()
    for p in placement.values():
        if p.workload:
            out.setdefault(p.node, set()).add(p.workload)
        else:
            old.add(p.node)
    return {node: sorted(ws) for node, ws in out.items() if node not in old}


def bundle_job(name: str, ranks: Mapping[ids.Rank, RankPlace]) -> models.Job:
    """The ``job.json`` of a pulled window: world size and where each rank runs (node, pod,
    and the GPU and NIC its agent resolved, None where it could not, with the agent's reason)."""
    world = max(ranks, default=0) + 1
    return models.Job(
        job=name,
        world_size=world,
        ranks=[
            models.RankInfo(
                rank=r,
                node=p.node,
                pod=p.pod,
                gpu=p.gpu,
                gpu_uuid=p.gpu_uuid,
                nic=p.nic,
                unresolved=p.unresolved,
            )
            for r, p in sorted(ranks.items())
        ],
    )


def by_node(
    ranks: Iterable[ids.Rank], placement: Mapping[ids.Rank, RankPlace]
) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in sorted(ranks):
        if r in placement:
            out.setdefault(placement[r].node, []).append(int(r))
    return out


def members_of(bundle: tables.Bundle) -> list[groups.CommMember]:
    """Communicator memberships from the ``comm`` records of a pulled window (the agents
    send them with every window), for group inference (``groups.infer``)."""
    out = []
    for row in bundle.comms:
        name = int(row["name"])
        out.append(
            groups.CommMember(
                comm=ids.CommHash(bundle.comm_id(int(row["comm"]))),
                rank=ids.Rank(int(row["rank"])),
                comm_rank=ids.CommRank(int(row["comm_rank"])),
                nranks=int(row["nranks"]),
                name=bundle.string(name) if name >= 0 else "",
            )
        )
    return out


NO_GROUPS = groups.JobGroups("inferred", (), (), (), ())


@dataclass
class JobRuntime:
    """One TrainingJob's trigger state; lives in ``OperatorState.jobs`` while the operator runs."""

    pods_seen: frozenset[PodPlace] = frozenset()
    ranks: dict[ids.Rank, RankPlace] = field(default_factory=dict)
    discovered_at_s: float = float("-inf")
    sampler: sampling.Sampler = field(default_factory=sampling.Sampler)
    sample: tuple[ids.Rank, ...] = ()
    state: trigger.TriggerState | None = None
    last_tick_s: float = float("-inf")
    incidents: set[str] = field(default_factory=set)  # Diagnoses this job opened
    groups: groups.JobGroups = NO_GROUPS  # inferred at discovery from communicator membership
    tick: int = 0  # ticks run on the current plan: ``plan.at(tick)`` is watched now
    ticks_run: int = 0  # ticks run since the operator started watching the job (episodes)
    numbering: numbering.StableNumbering = field(default_factory=numbering.StableNumbering)
    # open slowdown episodes: "slow/<comm>" -> (its incident, ``ticks_run`` of its last trigger)
    episodes: dict[str, tuple[str, int]] = field(default_factory=dict)
    watched_when: dict[str, tuple[ids.Rank, ...]] = field(default_factory=dict)  # diag -> ranks
    device_asks: int = 0  # discoveries since the pods last changed (``DEVICE_RETRIES``)

    def needs_discovery(self, pods: Mapping[str, PodPlace], now_s: float, every_s: float) -> bool:
        """Ask the agents again: the pods changed, or, once ``every_s`` passed, some pod has no
        rank yet (rings appear when the process initialises NCCL) or some rank's GPU or NIC is
        still unknown (at most ``DEVICE_RETRIES`` times)."""
        if frozenset(pods.values()) != self.pods_seen:
            return True
        if now_s - self.discovered_at_s < every_s:
            return False
        missing = {p.name for p in pods.values() if p.node} - {r.pod for r in self.ranks.values()}
        unplaced = any(r.gpu is None or r.nic is None for r in self.ranks.values())
        return bool(missing) or (unplaced and self.device_asks < DEVICE_RETRIES)

    def set_max_ranks(self, max_ranks: int) -> None:
        """The job's ``spec.diagnosis.sampling.maxRanks``; a change chooses the sample again."""
        if max_ranks != self.sampler.max_ranks:
            self.sampler = sampling.Sampler(max_ranks)

    def resample(
        self, trigger_settings: trigger.TriggerSettings, job_groups: Any
    ) -> tuple[ids.Rank, ...]:
        """The ranks to watch at this tick (``sampling``); a new plan starts a fresh trigger
        state at its tick 0 (``advance`` moves the plan on once the tick was run)."""
        placement = {
            r: sampling.Placement(ids.PodUID(p.pod_uid), p.node) for r, p in self.ranks.items()
        }
        chosen, changed = self.sampler.update(placement, job_groups)
        if changed or self.state is None:
            self.tick = 0
            self.sample = chosen.at(0)
            self.state = trigger.TriggerState(tuple(int(r) for r in self.sample), trigger_settings)
            self.numbering = numbering.StableNumbering()
            return self.sample
        self.sample = chosen.at(self.tick)
        return self.sample

    def advance(self) -> None:
        """One tick of the plan done (the trigger saw this tick's watched set)."""
        self.tick += 1
        self.ticks_run += 1

    def quiet_ticks(self, floor: int) -> int:
        """Ticks without a trigger that end a slowdown episode: at least ``floor``, and at least
        one rotation period plus one visit, so that the watchers of every DP group had a whole
        visit since (a slowdown seen by a rotating rank triggers once per visit)."""
        p = self.sampler.current.plan if self.sampler.current is not None else None
        return max(floor, 0 if p is None else p.period_ticks + p.dwell_ticks)

    def diagnosis_window_s(self, base_s: float, tick_s: float) -> float:
        """History its Diagnosis pulls: ``base_s``, plus one rotation period when the sample
        rotates, because a slowdown first seen by a rank that rotated in may be that much older
        than the trigger, and its analysis learns its baselines from before it."""
        p = self.sampler.current.plan if self.sampler.current is not None else None
        return base_s + (p.period_ticks * tick_s if p is not None and p.rotation else 0.0)

    def slow_incident(self, comm_id: str | None, hit: trigger.TriggerResult, quiet: int) -> str:
        """The incident of a slow trigger at this tick: its communicator's open episode.

        Triggers on one communicator belong to its open episode while at most ``quiet`` ticks
        passed since the last one; otherwise the episode is over (the slowdown was resolved, or
        its watchers saw none for a whole visit) and this trigger opens the next, named after
        its detection time (``slow/<comm>@<unix ms>``), so that its Diagnosis is a new object
        and not the first one's 409.

        A trigger without a communicator (throughput halved or the interval doubled: rules on
        the job's sampled ranks as a whole, Mycroft Algorithm 1) joins the job's most recently
        triggered open episode, whichever communicator it is of: a job-wide measure is moved by
        the slowdown already being diagnosed, and would otherwise open a second Diagnosis of it.
        """
        base = self.episode_base(comm_id, hit, quiet)
        open_ = self.episodes.get(base)
        if open_ is not None and self.ticks_run - open_[1] <= quiet:
            self.episodes[base] = (open_[0], self.ticks_run)
            return open_[0]
        incident = f"{base}@{hit.at_ns // 1_000_000}"  # unix ms of its first trigger
        self.episodes[base] = (incident, self.ticks_run)
        return incident

    def episode_base(self, comm_id: str | None, hit: trigger.TriggerResult, quiet: int) -> str:
        """The episode key (``slow/<comm>``) a slow trigger belongs to at this tick: its own
        communicator's, or for a trigger without one the most recently triggered open episode
        (``slow_incident``)."""
        base = incident_of(hit, comm_id)
        if comm_id is None:
            live = [(t, b) for b, (_, t) in self.episodes.items() if self.ticks_run - t <= quiet]
            base = max(live)[1] if live else base
        return base


def incident_of(hit: trigger.TriggerResult, comm_id: str | None) -> str:
    """The dedupe key of a trigger: a hang is one (communicator, operation); a slowdown is one
    per communicator (it lasts many operations), split into episodes by
    ``JobRuntime.slow_incident``."""
    if hit.kind == "hang":
        return f"hang/{comm_id or '-'}/{hit.seq if hit.seq is not None else '-'}"
    return f"slow/{comm_id or '-'}"


def diagnosis_name(job: str, incident: str) -> str:
    """``<job>-<kind>-<8 hex>``: stable per (job, incident), within the 253-char name limit."""
    digest = hashlib.sha256(f"{job}\0{incident}".encode()).hexdigest()[:8]
    kind = incident.split("/", 1)[0]
    return f"{job[: 253 - len(kind) - 10]}-{kind}-{digest}"


def diagnosis_body(
    namespace: str,
    job: str,
    job_uid: str | None,
    *,
    trigger_kind: str,
    incident: str,
    detected_at: str,
    window_s: float,
) -> dict[str, Any]:
    """A Diagnosis the trigger loop creates, owned by its TrainingJob (deleted with it)."""
    meta: dict[str, Any] = {
        "name": diagnosis_name(job, incident),
        "namespace": namespace,
        "labels": {"collscope.dev/trainingjob": job, "app.kubernetes.io/managed-by": "collscope"},
    }
    if job_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "collscope.dev/v1alpha1", "kind": "TrainingJob", "name": job,
             "uid": job_uid, "controller": True, "blockOwnerDeletion": False}
        ]  # fmt: skip
    return {
        "apiVersion": "collscope.dev/v1alpha1",
        "kind": "Diagnosis",
        "metadata": meta,
        "spec": {
            "trainingJob": {"name": job},
            "trigger": trigger_kind,
            "incident": incident[:253],
            "detectedAt": detected_at,
            "windowSeconds": window_s,
        },
    }


def analysis_settings(spec: resources.TrainingJobSpec) -> engine.AnalysisSettings:
    """The engine's settings with a TrainingJob's trigger overrides applied."""
    trig = spec.diagnosis.trigger
    base = engine.AnalysisSettings()
    t = base.trigger
    changes: dict[str, Any] = {}
    if trig.hang_floor_seconds is not None:
        changes["hang_floor_s"] = trig.hang_floor_seconds
    if trig.throughput_drop is not None:
        changes["throughput_drop"] = trig.throughput_drop
    if trig.interval_growth is not None:
        changes["interval_growth"] = trig.interval_growth
    if not changes:
        return base
    return dataclasses.replace(base, trigger=dataclasses.replace(t, **changes))
