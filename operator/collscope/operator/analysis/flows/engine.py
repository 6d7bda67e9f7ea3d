"""``diagnose_flows(flows, settings) -> Diagnosis``: black-box diagnosis from network flows.

LLMPrism's four phases (Fig. 2) over one window of ``flows.jsonl``:

1. job recognition (``jobs``, Algorithm 1, §IV-A) using job.json's ranks as the physical
   topology (``topology``);
2. DP/PP identification per GPU pair (``parallelism``, Algorithm 2 with BOCD, §IV-B);
3. per-GPU training timelines from the DP flows (``timeline``, §IV-C);
4. cross-step, cross-group and switch-level k-sigma diagnosis (``findings``, §IV-D), the most
   specific unexplained findings (``attribution``) as culprits and evidence (``explain``).

Where the flows come from does not matter as long as they fill ``flows.jsonl``'s fields. A
flow is one RDMA queue pair's burst between two NICs (RoCEv2 gives each QP its own UDP source
port, so the 5-tuple separates them):

- *switch mirroring* (ERSPAN, what LLMPrism uses): switches mirror the headers of RoCE packets
  to a collector, which rebuilds each flow: ``ts`` = first packet's mirror timestamp (ERSPAN
  type III carries one), ``duration`` = last - first, ``bytes`` = the packets' IP lengths
  summed, ``src``/``dst`` = the NICs' IP addresses, ``switches`` = the switches whose sessions
  mirrored it, in path order (one flow seen at three hops is one record);
- *IPFIX / NetFlow v9*: one record per flow and export interval from each exporting switch:
  ``ts`` = flowStartMilliseconds (or -Microseconds), ``duration`` = flowEnd - flowStart,
  ``bytes`` = octetDeltaCount, ``src``/``dst`` = source/destinationIPv4Address; the collector
  merges the records of one flow from several exporters into one line, ``switches`` = the
  exporters. A flow crossing an export boundary becomes two records (tolerated as noise);
  millisecond stamps are why intervals are floored at 1 ms (``bocd``);
- *sFlow*: 1-in-N packet samples aggregated per 5-tuple by the collector: ``ts``/``duration``
  from the first and last sample, ``bytes`` = samples x N x frame size, ``switches`` = the
  agents that sampled it. Sizes are estimates, so set ``ParallelismSettings.size_rel_tol``
  above the sampling error (and expect coarser timelines): mirroring or IPFIX is better;
- *NIC telemetry* (per-QP byte counters read from the RDMA NIC by a host agent): ``src`` = this
  NIC's address, ``dst`` = the QP's remote address, ``ts``/``duration`` from the first and last
  counter change of a burst (at the polling resolution), ``bytes`` = the counter delta;
  ``switches`` empty: the host does not see the path, so switch-level diagnosis is skipped and
  the rest works unchanged.

Endpoint ids must match job.json's ``ranks[].nic`` (see ``topology``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from collscope.nodeagent.bundle import models
from collscope.operator.analysis import diagnosis
from collscope.operator.analysis.flows import (
    attribution,
    bocd,
    explain,
    findings,
    jobs,
    parallelism,
    table,
    timeline,
    topology,
)


@dataclass(frozen=True)
class FlowSettings:
    """Every threshold of flow analysis, by phase; defaults are the paper's where it has one."""

    jobs: jobs.JobSettings = field(default_factory=jobs.JobSettings)
    parallelism: parallelism.ParallelismSettings = field(
        default_factory=parallelism.ParallelismSettings
    )
    timeline: bocd.BocdSettings = field(default_factory=bocd.BocdSettings)
    findings: findings.FindingSettings = field(default_factory=findings.FindingSettings)


@dataclass(frozen=True)
class FlowReport:
    """Everything flow analysis learned from one window (for tests, benchmarks, displays)."""

    flows: table.FlowTable
    topology: topology.Topology
    recognition: jobs.Recognition
    parallelism: parallelism.Parallelism
    timelines: timeline.Timelines
    findings: tuple[findings.Finding, ...]


def analyze(
    flows: table.FlowTable | Iterable[models.NetFlow],
    settings: FlowSettings = FlowSettings(),
    *,
    job: models.Job | None = None,
) -> FlowReport:
    """Phases 1-4 over ``flows``; ``job`` (job.json) gives the physical topology."""
    ft = flows if isinstance(flows, table.FlowTable) else table.FlowTable.from_flows(flows)
    topo = topology.Topology.from_job(job)
    rec = jobs.recognize(ft, topo, settings.jobs)
    par = parallelism.identify(ft, rec, settings.parallelism)
    tl = timeline.reconstruct(ft, par, rec.job_of, len(rec.jobs), settings.timeline)
    s = settings.findings
    found = [
        *findings.switch_level(ft, par, s, tl),
        *findings.cross_group(ft, par, tl, rec, s),
        *findings.cross_step(ft, tl, rec, s),
    ]
    found = attribution.attribute(found, ft, par, rec, s)
    return FlowReport(ft, topo, rec, par, tl, tuple(found))


def diagnose_flows(
    flows: table.FlowTable | Iterable[models.NetFlow],
    settings: FlowSettings = FlowSettings(),
    *,
    job: models.Job | None = None,
) -> diagnosis.Diagnosis:
    """The Diagnosis of docs/spec/bundle-v1.md for one window of flows (see module docstring)."""
    return to_diagnosis(analyze(flows, settings, job=job), settings)


_LEVEL_ORDER = {"switch": 0, "group": 1, "job": 2}


def primary(report: FlowReport) -> list[findings.Finding]:
    """Unexplained findings, most specific first, strongest first within a level."""
    left = [f for f in report.findings if not f.explained_by]
    return sorted(left, key=lambda f: (_LEVEL_ORDER[f.level], -f.stat.z, f.name))


def to_diagnosis(
    report: FlowReport, settings: FlowSettings = FlowSettings()
) -> diagnosis.Diagnosis:
    ft, rec, par = report.flows, report.recognition, report.parallelism
    span = ft.time_span()
    t0 = span[0] if span is not None else 0
    summary = _summary(report)
    s = settings.findings
    top = primary(report)
    if not top:
        return diagnosis.Diagnosis(
            anomaly=False,
            evidence=[
                summary,
                f"no job step, DP group or switch beyond mean ± {s.k:g} sigma for {s.persist} "
                "consecutive steps or bins",
            ],
        )
    ctx = explain.Context(ft, rec, par, report.topology, s, t0)
    culprits: list[diagnosis.Culprit] = []
    evidence = []
    for f in top:
        found, note = explain.culprits(f, ctx)
        culprits += found
        evidence.append(explain.sentence(f, ctx))
        if note:
            evidence.append(note)
    for f in report.findings:
        if f.explained_by:
            evidence.append("also: " + explain.sentence(f, ctx))
    first = top[0]
    return diagnosis.Diagnosis(
        anomaly=True,
        trigger="slow",
        detected_at=min(f.detected_ns for f in top if f.level == first.level),
        category=explain.category(first).value.name,
        culprits=culprits,
        confidence=explain.score(first, s.k),
        evidence=[*evidence, summary],
    )


def _summary(report: FlowReport) -> str:
    ft, rec, par = report.flows, report.recognition, report.parallelism
    gpus = int(np.count_nonzero(rec.job_of >= 0))
    servers = len({s for j in rec.jobs for s in j.servers})
    clusters = sum(j.clusters for j in rec.jobs)
    n_dp = int(np.count_nonzero(par.dp))
    refined = int(np.count_nonzero(par.dp & ~par.dp_raw))
    return (
        f"flows: {len(ft):,} flows; {gpus:,} GPUs on {servers:,} servers form {len(rec.jobs)} "
        f"jobs ({clusters} cross-machine clusters merged by server set, LLMPrism Alg. 1); "
        f"{len(par.a):,} GPU pairs: {n_dp:,} DP ({refined} by transitive refinement), "
        f"{len(par.a) - n_dp:,} PP (Alg. 2); {len(par.group_label):,} DP groups"
    )


def combine(collective: diagnosis.Diagnosis, flows: diagnosis.Diagnosis) -> diagnosis.Diagnosis:
    """One Diagnosis for a bundle with both collective records and flows.

    The collective analysis sees inside NCCL, so its verdict leads whenever it found an
    anomaly: its trigger, category, confidence and culprits come first, the flow analysis'
    culprits follow, and its evidence is appended prefixed ``flows:``. When only the flows
    show an anomaly (e.g. a slow switch the sampled ranks never cross), the flow diagnosis is
    the result, with the collective evidence appended prefixed ``collectives:``.
    """
    if collective.anomaly or not flows.anomaly:
        return collective.model_copy(
            update={
                "anomaly": collective.anomaly or flows.anomaly,
                "culprits": [*collective.culprits, *flows.culprits],
                "evidence": [*collective.evidence, *(f"flows: {e}" for e in flows.evidence)],
            }
        )
    return flows.model_copy(
        update={"evidence": [*flows.evidence, *(f"collectives: {e}" for e in collective.evidence)]}
    )
