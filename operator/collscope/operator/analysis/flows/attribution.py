"""Which findings explain which: the most specific unexplained finding is the culprit.

One fault shows at several levels (LLMPrism §IV-D's three diagnoses): a congested switch slows
every ring with a link through it (cross-group), and through the rings their jobs
(cross-step); it can even make another switch look congested when all of that switch's DP
traffic belongs to those rings. So:

1. *switch by switch*: a flagged switch is independent when its DP flows of rings that cross
   no other flagged switch are still below its reference's mean - k sigma (their
   ``switch_quantile``); a dependent switch is explained by the independent ones whose rings it
   shares (if none is independent, the strongest stays the culprit);
2. *group by switch*: a flagged DP group whose ring crosses a flagged switch is explained by it;
3. *job by group or switch*: a slow job with a flagged group, or with a flagged switch on any
   of its paths, is explained by them.

What is left unexplained is reported as culprits: switches and groups are network faults, a
slow job whose DP flows are normal spent its time in compute, data loading or the host.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from collscope.operator.analysis.flows import findings, jobs, parallelism, table

IntArray = npt.NDArray[np.int64]


def attribute(
    found: list[findings.Finding],
    flows: table.FlowTable,
    par: parallelism.Parallelism,
    rec: jobs.Recognition,
    settings: findings.FindingSettings,
) -> list[findings.Finding]:
    """``found`` with ``explained_by`` filled in (same order)."""
    switches = _switch_by_switch([f for f in found if f.level == "switch"], flows, par, settings)
    bad = np.array(sorted(flows.switches.index(f.name) for f in switches), dtype=np.int64)
    out: list[findings.Finding] = []
    slow_groups: dict[int, list[str]] = {}
    by_name = {f.name: f for f in switches}
    for f in found:
        if f.level == "switch":
            out.append(by_name[f.name])
        elif f.level == "group":
            dp_rows = par.rows[par.dp[par.flow_pair]]
            rows = dp_rows[par.group_of[flows.src[dp_rows]] == f.group]
            out.append(dataclasses.replace(f, explained_by=_switches_on(flows, rows, bad)))
            slow_groups.setdefault(f.job, []).append(f.name)
        else:
            out.append(f)
    final = []
    for f in out:
        if f.level == "job":
            rows = np.flatnonzero(rec.job_of[flows.src] == f.job)
            why = tuple(slow_groups.get(f.job, [])) + _switches_on(flows, rows, bad)
            final.append(dataclasses.replace(f, explained_by=why))
        else:
            final.append(f)
    return final


def _switch_by_switch(
    found: list[findings.Finding],
    flows: table.FlowTable,
    par: parallelism.Parallelism,
    s: findings.FindingSettings,
) -> list[findings.Finding]:
    if len(found) < 2:
        return found
    dp_rows = par.rows[par.dp[par.flow_pair]]
    dp_rows = dp_rows[flows.duration[dp_rows] > 0]
    flow, sw = flows.path_rows(dp_rows)
    group = par.group_of[flows.src[flow]]
    idx = [flows.switches.index(f.name) for f in found]
    rings = {i: set(np.unique(group[sw == i]).tolist()) - {-1} for i in idx}
    independent = []
    for f, i in zip(found, idx, strict=True):
        others = set().union(*(rings[j] for j in idx if j != i))
        sel = (sw == i) & (flows.ts[flow] >= f.since_ns)
        sel &= ~np.isin(group, np.fromiter(others, dtype=np.int64, count=len(others)))
        rows = flow[sel]
        bw = flows.nbytes[rows] / flows.duration[rows]
        limit = f.stat.mean - s.k * f.stat.sigma
        independent.append(
            len(bw) >= s.min_switch_flows and float(np.quantile(bw, s.switch_quantile)) < limit
        )
    if not any(independent):
        strongest = max(range(len(found)), key=lambda n: found[n].stat.z)
        independent[strongest] = True
    out = []
    for f, i, free in zip(found, idx, independent, strict=True):
        if free:
            out.append(f)
            continue
        causes = tuple(
            g.name
            for g, j, ok in zip(found, idx, independent, strict=True)
            if ok and rings[i] & rings[j]
        )
        causes = causes or tuple(g.name for g, ok in zip(found, independent, strict=True) if ok)
        out.append(dataclasses.replace(f, explained_by=causes))
    return out


def _switches_on(flows: table.FlowTable, rows: IntArray, bad: IntArray) -> tuple[str, ...]:
    """Flagged switches (indices ``bad``) on the paths of ``rows``."""
    if not len(bad) or not len(rows):
        return ()
    _, sw = flows.path_rows(rows)
    hit = np.intersect1d(np.unique(sw), bad)
    return tuple(flows.switches[i] for i in hit.tolist())
