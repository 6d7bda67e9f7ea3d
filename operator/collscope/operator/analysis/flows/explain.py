"""Findings of flow analysis as culprits and evidence sentences of a Diagnosis.

A switch finding names the switch (component ``link``); a DP-group finding names every member
GPU (rank, node and GPU from job.json's topology, the flow endpoint, the job and the group), a
member whose own PP flows are also slow first as the likely ``nic``; a job finding names the
job (component ``gpu``: its DP flows are no slower, so the time went into compute or the
host). Scores: 0.5 at the k-sigma threshold rising to 1 at 2k, times (0.5 + 0.5 x the share of
tested steps or bins since the first outlier that were outliers too).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.operator.analysis import diagnosis
from collscope.operator.analysis.flows import findings, jobs, parallelism, table, topology

NS = 1_000_000_000
# A member's PP flows this much slower (time per byte) than its group peers' make it the
# likely NIC behind a slow ring.
NIC_SUSPECT_RATIO = 1.5


@dataclass(frozen=True)
class Context:
    """What explaining a finding needs: the analysed window and its results."""

    flows: table.FlowTable
    rec: jobs.Recognition
    par: parallelism.Parallelism
    topo: topology.Topology
    settings: findings.FindingSettings
    t0: int  # window start (ns): evidence times are relative to it


def score(f: findings.Finding, k: float) -> float:
    st = f.stat
    strength = 0.5 + 0.5 * min(1.0, max(0.0, (st.z - k) / k))
    share = st.outliers / st.tested if st.tested else 1.0
    return round(min(0.99, strength * (0.5 + 0.5 * share)), 3)


def category(f: findings.Finding) -> diagnosis.Category:
    if f.level == "job" and not f.dp_slowdown:
        return diagnosis.Category.SLOW_COMPUTE
    return diagnosis.Category.SLOW_NETWORK


def gpu_label(endpoint: str, topo: topology.Topology) -> str:
    info = topo.rank_info(endpoint)
    if info is None:
        return endpoint
    where = [p for p in (info.node, None if info.gpu is None else f"GPU {info.gpu}") if p]
    return f"rank {info.rank} ({', '.join(where)})" if where else f"rank {info.rank}"


def job_label(job: jobs.Job, par: parallelism.Parallelism, jidx: int) -> str:
    """'job-2 (64 GPUs on 8 servers gpu-node-0012..gpu-node-0099; DP 4, PP 2, 8 per server)'."""
    gpus, servers = len(job.endpoints), len(job.servers)
    sizes = np.bincount(par.group_of[par.group_of >= 0])
    mine = sizes[np.flatnonzero(par.group_job == jidx)] if len(sizes) else sizes
    dp = int(np.median(mine)) if len(mine) else 1
    pp_pairs = int(np.count_nonzero((par.job == jidx) & ~par.dp))
    pp = 1 + round(pp_pairs / max(1, gpus - pp_pairs)) if pp_pairs else 1
    span = job.servers[0] if servers == 1 else f"{job.servers[0]}..{job.servers[-1]}"
    return (
        f"{job.label} ({gpus} GPUs on {servers} servers {span}; "
        f"DP {dp}, PP {pp}, {gpus // max(1, servers)} per server)"
    )


def when(ns: int, t0: int) -> str:
    return f"t=+{(ns - t0) / NS:.1f} s"


def sentence(f: findings.Finding, ctx: Context) -> str:
    flows, rec, par, topo, settings, t0 = (
        ctx.flows,
        ctx.rec,
        ctx.par,
        ctx.topo,
        ctx.settings,
        ctx.t0,
    )
    st, k = f.stat, settings.k
    run = f"{st.outliers} of {st.tested}"
    if f.level == "switch":
        change = (st.value / st.mean - 1) * 100 if st.mean else 0.0
        return (
            f"switch {f.name}: bandwidth (p{settings.switch_quantile * 100:.0f} of the "
            f"training flows through it) {st.value:.1f} GB/s vs {st.mean:.1f} ± "
            f"{st.sigma:.1f} GB/s on the {st.peers} other switches ({change:+.0f} %), below "
            f"mean - {k:g} sigma in {run} {settings.switch_bin_s:g}-s bins since "
            f"{when(f.since_ns, t0)}; {f.extra}"
            + (
                f"; its slow flows belong to rings that also cross {', '.join(f.explained_by)}"
                if f.explained_by
                else ""
            )
        )
    if f.level == "group":
        members = par.group_members(f.group)
        names = ", ".join(gpu_label(flows.endpoints[m], topo) for m in members[:4])
        more = f" and {len(members) - 4} more" if len(members) > 4 else ""
        why = (
            f"; its ring crosses {', '.join(f.explained_by)}"
            if f.explained_by
            else "; its ring crosses no flagged switch"
        )
        return (
            f"DP group {f.name} of {rec.jobs[f.job].label} ({len(members)} GPUs: {names}{more}): "
            f"its DP flows move {1 / st.value:.1f} GB/s vs {1 / st.mean:.1f} GB/s in the job's "
            f"{st.peers} other DP groups (time per byte {st.value / st.mean:.2f}x, z = "
            f"{st.z:.0f}), beyond mean + {k:g} sigma in {run} steps since "
            f"{when(f.since_ns, t0)}{why}"
        )
    label = job_label(rec.jobs[f.job], par, f.job)
    if f.explained_by:
        tail = f"; explained by {', '.join(f.explained_by)}"
    elif f.dp_slowdown:
        tail = (
            f"; its DP flows are {f.dp_slowdown:.2f}x slower per byte than before, all its DP "
            "groups alike and no switch singled out: the network under the whole job (a shared "
            "switch or uplink, or switches the flow records do not name)"
        )
    else:
        tail = (
            "; no DP group or switch of it beyond k-sigma and its DP flows as fast as before: "
            "the time goes into compute, data loading or the host, not the network"
        )
    return (
        f"{label}: steps take {st.value / NS:.2f} s vs {st.mean / NS:.2f} ± "
        f"{st.sigma / NS:.2f} s before ({(st.value / st.mean - 1) * 100:+.0f} %), above mean + "
        f"{k:g} sigma in {run} steps since {when(f.since_ns, t0)}{tail}"
    )


def culprits(f: findings.Finding, ctx: Context) -> tuple[list[diagnosis.Culprit], str | None]:
    """Culprits of one primary finding, and an extra evidence line (a NIC suspect) if any."""
    flows, rec, par, topo = ctx.flows, ctx.rec, ctx.par, ctx.topo
    s = score(f, ctx.settings.k)
    if f.level == "switch":
        return [diagnosis.Culprit(switch=f.name, component="link", score=s)], None
    job = rec.jobs[f.job].label
    if f.level == "job":
        component: diagnosis.Component = "link" if f.dp_slowdown else "gpu"
        return [diagnosis.Culprit(job=job, component=component, score=s)], None
    members = par.group_members(f.group)
    suspect = _nic_suspect(flows, par, members, f.since_ns)
    order = sorted(members.tolist(), key=lambda m: (m != suspect, flows.endpoints[m]))
    out = []
    for m in order:
        ep = flows.endpoints[m]
        info = topo.rank_info(ep)
        out.append(
            diagnosis.Culprit(
                rank=None if info is None else info.rank,
                node=topo.server(ep),
                gpu=None if info is None else info.gpu,
                nic=None if info is None else info.nic,
                component="nic" if m == suspect else "link",
                score=s if m == suspect or suspect is None else round(s * 0.8, 3),
                job=job,
                group=f.name,
                endpoint=ep,
            )
        )
    note = None
    if suspect is not None:
        note = (
            f"{gpu_label(flows.endpoints[suspect], topo)} of {f.name}: its PP flows are also "
            f"over {NIC_SUSPECT_RATIO:g}x slower per byte than its group peers': its NIC or "
            "link is the likely cause of the slow ring"
        )
    return out, note


def _nic_suspect(
    flows: table.FlowTable,
    par: parallelism.Parallelism,
    members: npt.NDArray[np.int64],
    since: int,
) -> int | None:
    """The member whose PP flows since ``since`` are much slower per byte than the others'."""
    pp_rows = par.rows[~par.dp[par.flow_pair]]
    pp_rows = pp_rows[(flows.ts[pp_rows] >= since) & (flows.nbytes[pp_rows] > 0)]
    per_byte = flows.duration[pp_rows] / flows.nbytes[pp_rows]
    med = []
    for m in members.tolist():
        mine = (flows.src[pp_rows] == m) | (flows.dst[pp_rows] == m)
        med.append(float(np.median(per_byte[mine])) if mine.any() else np.nan)
    vals = np.array(med)
    if np.isnan(vals).sum() > len(vals) - 2:
        return None
    top = int(np.nanargmax(vals))
    rest = np.delete(vals, top)
    if vals[top] > NIC_SUSPECT_RATIO * float(np.nanmedian(rest)):
        return int(members[top])
    return None
