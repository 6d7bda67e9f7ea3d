"""Findings of flow analysis as culprits and evidence sentences of a Diagnosis.

A switch finding names the switch (component ``link``); a DP-group finding names every member
GPU (rank, node and GPU from job.json's topology, the flow endpoint, the job and the group), the
member whose every hop is slow (``nic``: its ring hops in and out, its PP flows) first as the
culprit ``nic``, or the members that cannot be told apart as ``nic`` with equal scores and the
reason; a job finding names the job (component ``gpu``: its DP flows are no slower, so the
time went into compute or the host). Scores: 0.5 at the k-sigma threshold rising to 1 at 2k,
times (0.5 + 0.5 x the share of tested steps or bins since the first outlier that were
outliers too); group members that are no NIC candidate get ``OTHER_MEMBER_SHARE`` of that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collscope.operator.analysis import diagnosis
from collscope.operator.analysis.flows import findings, jobs, nic, parallelism, table, topology

NS = 1_000_000_000
# Score of a group member that is not a NIC candidate, relative to the candidates': below
# them, above nothing (it is in the slow group). Picked; a ratio of scores, no time.
OTHER_MEMBER_SHARE = 0.8
LISTED = 4  # members whose hops an evidence line spells out (a DP ring may have hundreds)


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
    """0.5 at z = k rising to 1 at z = 2k, times 0.5 + 0.5 x the share of tested steps or bins
    since the first outlier that were outliers; at most 0.99 (flows never see the fault
    itself). Picked (module docstring); counts of steps or bins, not times."""
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
        bin_s = f.bin_ns / NS if f.bin_ns else settings.switch_bin_s
        change = (st.value / st.mean - 1) * 100 if st.mean else 0.0
        return (
            f"switch {f.name}: bandwidth (p{settings.switch_quantile * 100:.0f} of the "
            f"training flows through it) {st.value:.1f} GB/s vs {st.mean:.1f} ± "
            f"{st.sigma:.1f} GB/s on the {st.peers} other switches ({change:+.0f} %), below "
            f"mean - {k:g} sigma in {run} {bin_s:g}-s bins since "
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
    """Culprits of one primary finding, and for a DP group the evidence line of ``nic``."""
    flows, rec, par, topo = ctx.flows, ctx.rec, ctx.par, ctx.topo
    s = score(f, ctx.settings.k)
    if f.level == "switch":
        return [diagnosis.Culprit(switch=f.name, component="link", score=s)], None
    job = rec.jobs[f.job].label
    if f.level == "job":
        component: diagnosis.Component = "link" if f.dp_slowdown else "gpu"
        return [diagnosis.Culprit(job=job, component=component, score=s)], None
    members = par.group_members(f.group)
    where = nic.localise(flows, par, f.group, f.since_ns, ctx.settings)
    suspects = set(where.candidates)
    order = sorted(members.tolist(), key=lambda m: (m not in suspects, flows.endpoints[m]))
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
                component="nic" if m in suspects else "link",
                score=s if m in suspects or not suspects else round(s * OTHER_MEMBER_SHARE, 3),
                job=job,
                group=f.name,
                endpoint=ep,
            )
        )
    return out, nic_note(where, f.name, flows, topo)


def _hops_text(m: nic.Member) -> str:
    """'in 2.49x, out 2.51x, PP 2.47x'."""
    names = {"in": "in", "out": "out", "pp": "PP"}
    return ", ".join(f"{names[h.kind]} {h.ratio:.2f}x" for h in m.hops)


def nic_note(
    where: nic.Localisation, group: str, flows: table.FlowTable, topo: topology.Topology
) -> str:
    """The evidence line of a DP group's member localisation (``nic``)."""
    by_ep = {m.endpoint: m for m in where.members}
    limit = max((h.limit for m in where.members for h in m.hops), default=float("nan"))
    ref = (
        f"time per byte of each hop vs the same hops elsewhere in the job, slow beyond {limit:.2f}x"
    )
    if where.nic is not None:
        m = by_ep[where.nic]
        others = [min(h.ratio for h in o.hops) for o in where.members if o.hops and o is not m]
        return (
            f"{gpu_label(flows.endpoints[m.endpoint], topo)} of {group}: every hop its NIC "
            f"carries is slow ({_hops_text(m)}; {ref}) while every other member has a hop at "
            f"{max(others, default=float('nan')):.2f}x or less: its NIC or link is the cause "
            "of the slow ring"
        )
    if where.candidates:
        names = ", ".join(gpu_label(flows.endpoints[c], topo) for c in where.candidates)
        hops = "; ".join(
            f"{gpu_label(flows.endpoints[c], topo)}: {_hops_text(by_ep[c])}"
            for c in where.candidates[:LISTED]
        )
        if len(where.candidates) > LISTED:
            hops += f"; {len(where.candidates) - LISTED} more alike"
        if len(where.members) == 2 and not where.pp:
            why = (
                "a ring of two members carries the same two links into and out of both, and "
                "no PP flows tell them apart"
            )
        elif not where.pp:
            why = (
                "every ring hop is as slow as the slowest (the ring moves each link at its "
                "slowest link's pace), and no PP flows tell the members apart"
            )
        else:
            why = "their hops are slow alike"
        return (
            f"{names} of {group}: every hop their NICs carry is slow ({hops}; {ref}); the "
            f"flows cannot choose between them: {why}"
        )
    slow = [m for m in where.members if any(h.slow for h in m.hops)]
    detail = "; ".join(
        f"{gpu_label(flows.endpoints[m.endpoint], topo)}: {_hops_text(m)}" for m in slow
    )
    return (
        f"no member of {group} has every hop slow ({detail or 'no hop judged'}; {ref}): the "
        "slow hops do not meet at one NIC"
    )
