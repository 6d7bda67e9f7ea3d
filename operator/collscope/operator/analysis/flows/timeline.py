"""Training timelines per GPU from its DP flows: LLMPrism §IV-C.

"Each training step concludes with a segment of DP collective communication traffic". For every
GPU, its DP flows (sent or received, on pairs ``parallelism`` labelled DP) in time order, the
idle intervals between them, and BOCD (``bocd``, as in step division) split them into DP
phases; the end of a phase's last flow is the end of a training step. A GPU's last phase may be
cut by the window's end, so only the phases before it count as *complete* step ends.

Per job, the GPUs' step ends are aligned into job steps: sorted together they fall into clusters
separated by more than half a step (a step's DP phases end within the pipeline's drain across
stages, well inside one step). Job step ``k``'s duration is the median, over the GPUs that ended
both ``k - 1`` and ``k`` in the window, of the time between their two ends.

Everything between communication events is compute, as in the paper's Fig. 2; ``events`` lists
one GPU's PP and DP flows with their step for display.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.operator.analysis.flows import bocd, parallelism, table

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class JobSteps:
    """Aligned steps of one job: ``ends[k]`` median end (ns); ``durations[k]`` ns, NaN for
    the first step (nothing before it in the window)."""

    ends: IntArray
    durations: FloatArray
    gpus: IntArray  # GPUs that ended step k in the window


@dataclass(frozen=True)
class Timelines:
    """DP phases (segments) of every GPU; a segment is one step's DP phase."""

    seg_gpu: IntArray  # [segments] endpoint index
    seg_start: IntArray  # first DP flow start (ns)
    seg_end: IntArray  # DP phase end = step end (ns)
    seg_complete: BoolArray  # not the GPU's last segment
    seg_step: IntArray  # job step index within the GPU's job (-1: incomplete)
    flow_rows: IntArray  # DP flow rows of the FlowTable, seen from their source GPU
    flow_seg: IntArray  # segment of each of flow_rows
    jobs: tuple[JobSteps, ...]  # per recognised job (empty steps for jobs without DP)

    def step_ends(self, gpu: int) -> IntArray:
        """Complete step ends of one GPU (ns, ascending)."""
        out: IntArray = self.seg_end[(self.seg_gpu == gpu) & self.seg_complete]
        return out


def reconstruct(
    flows: table.FlowTable,
    par: parallelism.Parallelism,
    job_of: npt.NDArray[np.int32],
    n_jobs: int,
    settings: bocd.BocdSettings | None = None,
) -> Timelines:
    """Step boundaries of every GPU that has DP flows, and the job steps they align into."""
    dp_rows = np.sort(par.rows[par.dp[par.flow_pair]])  # table rows: start order
    # Each DP flow belongs to the timelines of both its ends.
    gpu = np.concatenate((flows.src[dp_rows], flows.dst[dp_rows])).astype(np.int64)
    rows = np.concatenate((dp_rows, dp_rows))
    is_src = np.repeat([True, False], len(dp_rows))
    order = np.argsort(gpu * (len(flows) + 1) + rows, kind="stable")
    gpu, rows, is_src = gpu[order], rows[order], is_src[order]
    ts, end = flows.ts[rows], flows.end[rows]
    first = np.ones(len(rows), dtype=bool)
    first[1:] = gpu[1:] != gpu[:-1]
    idle = (ts[1:] - parallelism.running_max(end, gpu)[:-1])[~first[1:]]
    counts = np.diff(np.r_[np.flatnonzero(first), len(rows)]) if len(rows) else np.zeros(0, int)
    settings = settings or bocd.BocdSettings()
    x = bocd.log_intervals(idle.astype(np.float64), settings)
    flags = bocd.boundaries_flat(x, counts - 1, settings)
    opens = first.copy()
    opens[np.flatnonzero(~first)[flags]] = True
    seg = np.cumsum(opens) - 1
    n_seg = int(seg[-1]) + 1 if len(seg) else 0
    seg_gpu = gpu[opens]
    seg_start = ts[opens]
    seg_end = np.full(n_seg, np.iinfo(np.int64).min)
    np.maximum.at(seg_end, seg, end)
    seg_complete = np.ones(n_seg, dtype=bool)
    if n_seg:
        seg_complete[:-1] = seg_gpu[1:] == seg_gpu[:-1]
        seg_complete[-1] = False
    seg_step, jobs = _align(seg_gpu, seg_end, seg_complete, job_of, n_jobs)
    return Timelines(
        seg_gpu=seg_gpu,
        seg_start=seg_start,
        seg_end=seg_end,
        seg_complete=seg_complete,
        seg_step=seg_step,
        flow_rows=rows[is_src],
        flow_seg=seg[is_src],
        jobs=jobs,
    )


def _align(
    seg_gpu: IntArray,
    seg_end: IntArray,
    complete: BoolArray,
    job_of: npt.NDArray[np.int32],
    n_jobs: int,
) -> tuple[IntArray, tuple[JobSteps, ...]]:
    """Job step index of every complete segment, and each job's steps."""
    seg_step = np.full(len(seg_gpu), -1, dtype=np.int64)
    seg_job = job_of[seg_gpu] if len(seg_gpu) else np.zeros(0, dtype=np.int32)
    out: list[JobSteps] = []
    for j in range(n_jobs):
        idx = np.flatnonzero(complete & (seg_job == j))
        if not len(idx):
            out.append(JobSteps(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64)))
            continue
        # typical step: median time between a GPU's consecutive complete ends
        same = seg_gpu[idx][1:] == seg_gpu[idx][:-1]
        diffs = np.diff(seg_end[idx])[same]
        period = float(np.median(diffs)) if len(diffs) else np.inf
        order = idx[np.argsort(seg_end[idx], kind="stable")]
        # a new job step where consecutive phase ends lie more than half a measured step apart
        # (module docstring): relative to this job's own step, so any step length works
        jump = np.diff(seg_end[order]) > period / 2
        step = np.concatenate(([0], np.cumsum(jump)))
        seg_step[order] = step
        n_steps = int(step[-1]) + 1
        ends = np.array(
            [int(np.median(v)) for v in _runs(seg_end[order].astype(np.float64), step)],
            dtype=np.int64,
        )
        gpus = np.bincount(step, minlength=n_steps).astype(np.int64)
        # per-GPU durations between consecutive aligned steps -> median per step
        mine = idx  # sorted by (gpu, time): consecutive entries of one GPU are adjacent
        k_now, k_prev = seg_step[mine][1:], seg_step[mine][:-1]
        ok = same & (k_now == k_prev + 1)
        dur = np.diff(seg_end[mine])[ok].astype(np.float64)
        durations = np.full(n_steps, np.nan)
        by = np.argsort(k_now[ok], kind="stable")
        for k, v in zip(np.unique(k_now[ok]).tolist(), _runs(dur[by], k_now[ok][by]), strict=True):
            durations[k] = float(np.median(v))
        out.append(JobSteps(ends=ends, durations=durations, gpus=gpus))
    return seg_step, tuple(out)


def _runs(values: FloatArray, keys: IntArray) -> list[FloatArray]:
    """``values`` split where the (sorted) ``keys`` change."""
    cuts = np.flatnonzero(np.diff(keys)) + 1
    return np.split(values, cuts)


def events(
    flows: table.FlowTable, par: parallelism.Parallelism, tl: Timelines, gpu: int
) -> npt.NDArray[np.void]:
    """One GPU's flows as a timeline: start, end, kind ("dp"/"pp"), peer, bytes (by start)."""
    mine = (flows.src[par.rows] == gpu) | (flows.dst[par.rows] == gpu)
    rows = par.rows[mine]
    dp = par.dp[par.flow_pair[mine]]
    peer = np.where(flows.src[rows] == gpu, flows.dst[rows], flows.src[rows])
    out = np.zeros(
        len(rows),
        dtype=[("start", "i8"), ("end", "i8"), ("kind", "U2"), ("peer", "i4"), ("bytes", "i8")],
    )
    out["start"], out["end"] = flows.ts[rows], flows.end[rows]
    out["kind"] = np.where(dp, "dp", "pp")
    out["peer"], out["bytes"] = peer, flows.nbytes[rows]
    return np.sort(out, order="start")
