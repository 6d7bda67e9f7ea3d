"""Cross-step, cross-group and switch-level diagnosis: LLMPrism §IV-D with the k-sigma rule.

- **cross-step** (per job): each job step's duration against the job's earlier steps
  (``ksigma.along``): the job got slower;
- **cross-group** (per job, per step): each DP group's DP time per byte (median over the DP
  flows its members send in that step) against the job's other groups (``ksigma.across``):
  one group's gradient sync is slow, a network problem;
- **switch-level** (per time bin): each switch's bandwidth against the other switches'. The
  statistic is the ``switch_quantile`` (0.9) of bytes/duration over the training flows through
  it: a ring moves at its slowest link's pace, so a congested switch slows whole rings whose
  other links cross healthy switches; a healthy switch still carries some fast rings (high
  quantile fine), a congested one none. The paper uses DP flows only; PP flows are added by
  default (``switch_flows``) because a switch that only pipelines cross would otherwise slow a
  job with no network culprit in sight, which reads as compute. The paper's other switch
  signal, how many DP flows a switch carries, is reported as evidence.

Which findings explain which others is ``attribution``'s business.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.operator.analysis.flows import jobs, ksigma, parallelism, table, timeline

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
NS = 1_000_000_000


@dataclass(frozen=True)
class FindingSettings:
    # Every setting below is a count of steps or bins, a ratio or a share: none is a time
    # except ``switch_bin_s``, which scales with the measured step (``switch_bin_ns``). Flows
    # are records of transfers, not samples, so no setting depends on a sampling interval.
    # LLMPrism §IV-D: "k is set to 3" (mean + 3 sigma of the reference).
    k: float = 3.0
    # Consecutive outlier steps (cross-step, cross-group) or switch bins before a unit is
    # reported. Picked: one outlier step is a hiccup (a checkpoint, a GC pause), two in a row
    # a condition; checked on bench/flows_accuracy.py (no false alarm on healthy fabrics).
    # A count, so detection takes two steps (two bins, each at least a step) however long.
    persist: int = 2
    # Units a unit is compared with (cross-group, switch-level) and earlier steps a step is
    # compared with (cross-step). Picked: fewer than 3 give no spread to speak of (a sigma
    # from two values); the paper gives no minimum. Counts, not times.
    min_peers: int = 3
    min_baseline: int = 3
    # Sigma floors as a share of the reference mean, so that an unusually quiet reference does
    # not turn noise into an alarm. Picked on the simulator (bench/flows_accuracy.py): step
    # durations agree to ~0.5 % step to step (floor 1 %); DP groups' time per byte and
    # switches' bandwidth to a few % (rate jitter, ECMP; floor 5 %). Ratios: independent of
    # step length.
    step_rel_sigma: float = 0.01
    group_rel_sigma: float = 0.05
    switch_rel_sigma: float = 0.05
    # Switch-level time bins: a bin must hold every job's DP phase (once per step), or a
    # switch's bandwidth quantile swings with which jobs' phases fell into the bin. So the bin
    # is at least ``switch_bin_steps`` of the longest measured job step (median over the
    # window's reconstructed steps, ``timeline``): one step is the least that holds a DP phase
    # end of every job in every bin. It is never shorter than ``switch_bin_s``, picked: 10 s
    # holds one to four steps of the simulator's jobs (2.6-6.5 s measured on its 256- and
    # 512-GPU presets; the longest it can build, pp 8 at 200 ms per forward, about 9.5 s), so
    # the scaling changes nothing on bench/flows_accuracy.py; LLMPrism gives no bin. Steps over
    # 10 s (long sequences, large global batches) now get bins of one step, not 10 s bins that
    # some jobs' DP phases skip.
    switch_bin_s: float = 10.0
    switch_bin_steps: float = 1.0
    # The statistic of a switch in a bin: the 0.9 quantile of its flows' bandwidth (module
    # docstring: a congested switch carries no fast ring). Picked on the simulator's
    # switch faults; a ratio, independent of time.
    switch_quantile: float = 0.9
    # Flows a switch needs in a bin to be judged: fewer give no quantile worth comparing.
    # Picked (a DP ring phase crosses a leaf with a few flows per ring); a bin holds at least
    # one step of every job, so the count is of flows per step, whatever the step length.
    min_switch_flows: int = 8
    switch_flows: str = "dp+pp"  # or "dp": the paper's choice


@dataclass(frozen=True)
class Stat:
    """A unit's statistic over its outlier steps or bins (medians of each)."""

    value: float
    mean: float  # the reference's mean and sigma
    sigma: float
    z: float
    outliers: int  # outlier steps or bins from the first of the run on
    tested: int  # steps or bins tested from the first of the run on
    peers: int  # units (or earlier steps) in the reference


@dataclass(frozen=True)
class Finding:
    """One unit beyond k-sigma for ``persist`` consecutive steps or bins."""

    level: str  # "switch", "group" or "job"
    name: str  # switch name, group label, job label
    job: int  # job index (-1 for a switch)
    group: int  # DP group index (-1 unless level == "group")
    since_ns: int  # end of the first outlier step or bin of the run
    detected_ns: int  # when the run reached ``persist``
    stat: Stat
    extra: str = ""  # level-specific detail for the evidence line
    explained_by: tuple[str, ...] = ()
    # job findings: the job's own DP flows slowed too (x this factor per byte), all its groups
    # alike, so the cause is network even with no group or switch to blame; 0.0 when not
    dp_slowdown: float = 0.0
    bin_ns: int = 0  # switch findings: the bin width they were judged in (``switch_bin_ns``)


def cell_quantile(
    unit: IntArray, time: IntArray, value: FloatArray, shape: tuple[int, int], q: float
) -> tuple[FloatArray, IntArray]:
    """The ``q`` quantile (lower) of ``value`` per (unit, time) cell, and the cell counts."""
    cell = unit * shape[1] + time
    order = np.lexsort((value, cell))
    cell, value = cell[order], value[order]
    counts = np.bincount(cell, minlength=shape[0] * shape[1])
    start = np.cumsum(counts) - counts
    has = counts > 0
    out = np.full(shape[0] * shape[1], np.nan)
    out[has] = value[start[has] + np.floor(q * (counts[has] - 1)).astype(np.int64)]
    return out.reshape(shape), counts.reshape(shape)


def _summarise(
    scores: ksigma.Scores,
    flags: npt.NDArray[np.bool_],
    values: FloatArray,
    unit: int,
    first: int,
) -> Stat:
    idx = np.flatnonzero(flags[unit, first:]) + first
    return Stat(
        value=float(np.median(values[unit, idx])),
        mean=float(np.median(scores.mean[unit, idx])),
        sigma=float(np.median(scores.sigma[unit, idx])),
        z=float(np.median(scores.z[unit, idx])),
        outliers=len(idx),
        tested=int(np.count_nonzero(~np.isnan(scores.z[unit, first:]))),
        peers=int(np.median(scores.peers[unit, idx])),
    )


def cross_step(
    flows: table.FlowTable,
    tl: timeline.Timelines,
    rec: jobs.Recognition,
    s: FindingSettings,
) -> list[Finding]:
    per_byte = _job_dp_per_byte(flows, tl, rec)
    out = []
    for j, steps in enumerate(tl.jobs):
        if len(steps.durations) <= s.min_baseline:
            continue
        d = steps.durations[None, :]
        scores, flags = ksigma.along(
            steps.durations, k=s.k, rel_sigma=s.step_rel_sigma, min_baseline=s.min_baseline
        )
        first, reached = ksigma.persistent(flags, s.persist)
        if reached[0] < 0:
            continue
        # did the job's DP flows slow down over time as well (temporal, not across groups)?
        series = per_byte[j, : len(steps.durations)]
        net_scores, net_flags = ksigma.along(
            series, k=s.k, rel_sigma=s.group_rel_sigma, min_baseline=s.min_baseline
        )
        _, net_reached = ksigma.persistent(net_flags, s.persist)
        slowdown = 0.0
        if net_reached[0] >= 0:
            idx = np.flatnonzero(net_flags[0])
            slowdown = float(np.median(series[idx] / net_scores.mean[0, idx]))
        out.append(
            Finding(
                level="job",
                name=rec.jobs[j].label,
                job=j,
                group=-1,
                since_ns=int(steps.ends[first[0]]),
                detected_ns=int(steps.ends[reached[0]]),
                stat=_summarise(scores, flags, d, 0, int(first[0])),
                dp_slowdown=slowdown,
            )
        )
    return out


def _job_dp_per_byte(
    flows: table.FlowTable, tl: timeline.Timelines, rec: jobs.Recognition
) -> FloatArray:
    """Median DP time per byte (ns/B) of each job in each of its steps: [jobs, max steps]."""
    width = max((len(j.ends) for j in tl.jobs), default=0)
    rows = tl.flow_rows
    step = tl.seg_step[tl.flow_seg]
    job = rec.job_of[flows.src[rows]].astype(np.int64)
    ok = (step >= 0) & (job >= 0) & (flows.nbytes[rows] > 0)
    rows, step, job = rows[ok], step[ok], job[ok]
    grid, _ = cell_quantile(
        job, step, flows.duration[rows] / flows.nbytes[rows], (len(rec.jobs), width), 0.5
    )
    return grid


def cross_group(
    flows: table.FlowTable,
    par: parallelism.Parallelism,
    tl: timeline.Timelines,
    rec: jobs.Recognition,
    s: FindingSettings,
) -> list[Finding]:
    rows = tl.flow_rows
    step = tl.seg_step[tl.flow_seg]
    group = par.group_of[flows.src[rows]]
    ok = (step >= 0) & (group >= 0) & (flows.nbytes[rows] > 0)
    rows, step, group = rows[ok], step[ok], group[ok]
    per_byte = flows.duration[rows] / flows.nbytes[rows]  # ns per byte
    out = []
    for j, steps in enumerate(tl.jobs):
        mine = np.flatnonzero(par.group_job == j)
        if len(mine) <= s.min_peers or not len(steps.ends):
            continue
        local = np.full(len(par.group_label), -1, dtype=np.int64)
        local[mine] = np.arange(len(mine))
        sel = local[group] >= 0
        shape = (len(mine), len(steps.ends))
        # median (0.5) time per byte of each group's DP flows in each step: robust to a few
        # retransmitted or cut records; per step, so independent of step length
        grid, _ = cell_quantile(local[group[sel]], step[sel], per_byte[sel], shape, 0.5)
        # when each group's DP phase of each step ended (its own, not the job's median)
        ended, _ = cell_quantile(
            local[group[sel]], step[sel], flows.end[rows[sel]].astype(np.float64), shape, 1.0
        )
        scores, flags = ksigma.across(
            grid, k=s.k, rel_sigma=s.group_rel_sigma, min_peers=s.min_peers, worse="high"
        )
        first, reached = ksigma.persistent(flags, s.persist)
        for u in np.flatnonzero(reached >= 0).tolist():
            g = int(mine[u])
            out.append(
                Finding(
                    level="group",
                    name=par.group_label[g],
                    job=j,
                    group=g,
                    since_ns=int(ended[u, first[u]]),
                    detected_ns=int(ended[u, reached[u]]),
                    stat=_summarise(scores, flags, grid, u, int(first[u])),
                )
            )
    return out


def switch_bin_ns(tl: timeline.Timelines | None, s: FindingSettings) -> int:
    """The switch-level bin: ``switch_bin_steps`` of the longest job's median measured step,
    at least ``switch_bin_s`` (``FindingSettings``)."""
    steps = [] if tl is None else [j.durations[~np.isnan(j.durations)] for j in tl.jobs]
    step = max((float(np.median(d)) for d in steps if d.size), default=0.0)
    return max(int(s.switch_bin_s * NS), int(s.switch_bin_steps * step))


def switch_level(
    flows: table.FlowTable,
    par: parallelism.Parallelism,
    s: FindingSettings,
    tl: timeline.Timelines | None = None,
) -> list[Finding]:
    """Switches slower than the others for ``persist`` bins (``switch_bin_ns``; ``tl``: the
    window's timelines, whose steps set the bin; None: ``switch_bin_s``)."""
    rows = par.rows if s.switch_flows != "dp" else par.rows[par.dp[par.flow_pair]]
    rows = rows[flows.duration[rows] > 0]
    span = flows.time_span()
    if not len(rows) or not len(flows.switches) or span is None:
        return []
    flow, sw = flows.path_rows(rows)
    dp_of_row = np.zeros(len(flows), dtype=bool)
    dp_of_row[par.rows] = par.dp[par.flow_pair]
    is_dp = dp_of_row[flow]
    bin_ns = switch_bin_ns(tl, s)
    bins = (flows.ts[flow] - span[0]) // bin_ns
    n_bins = int(bins.max()) + 1 if len(bins) else 0
    bw = flows.nbytes[flow] / flows.duration[flow]  # bytes per ns = GB/s
    shape = (len(flows.switches), n_bins)
    grid, counts = cell_quantile(sw.astype(np.int64), bins, bw, shape, s.switch_quantile)
    grid[counts < s.min_switch_flows] = np.nan
    scores, flags = ksigma.across(
        grid, k=s.k, rel_sigma=s.switch_rel_sigma, min_peers=s.min_peers, worse="low"
    )
    first, reached = ksigma.persistent(flags, s.persist)
    out = []
    dp_counts = np.bincount(
        (sw.astype(np.int64) * n_bins + bins)[is_dp], minlength=shape[0] * shape[1]
    ).reshape(shape)
    for u in np.flatnonzero(reached >= 0).tolist():
        busy = dp_counts[u, first[u] :]
        others = np.delete(dp_counts[:, first[u] :], u, axis=0)
        loaded = others[others > 0]
        extra = (
            f"{int(np.median(busy))} DP flows per bin vs a median of "
            f"{int(np.median(loaded)) if len(loaded) else 0} elsewhere"
        )
        out.append(
            Finding(
                level="switch",
                name=flows.switches[u],
                job=-1,
                group=-1,
                since_ns=span[0] + int(first[u]) * bin_ns,
                detected_ns=span[0] + (int(reached[u]) + 1) * bin_ns,
                extra=extra,
                stat=_summarise(scores, flags, grid, u, int(first[u])),
                bin_ns=bin_ns,
            )
        )
    return out
