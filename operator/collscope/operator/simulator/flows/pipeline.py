"""One job's training steps as network flows: a 1F1B pipeline, then a bucketed DP ring.

Per step, for every pipeline replica ``d`` (the TP group of one server moves in lockstep, so a
stage of a replica is one server):

- stage ``s`` runs the 1F1B order (``pp - s - 1`` warm-up forwards, then forward/backward
  pairs, then the remaining backwards). Each forward of ``s < pp - 1`` ends with one flow per
  TP rank to the same TP rank of stage ``s + 1`` (activations), each backward of ``s > 0`` with
  one back to ``s - 1`` (their gradients): same size every micro-batch (PP). A stage waits for
  all TP shards of its input;
- when every replica has finished its last backward on stage ``s``, each DP group (stage ``s``,
  TP rank ``t``) all-reduces its gradients bucket after bucket on a ring ``d -> d + 1``: one
  flow per ring link per bucket, ``2 (dp - 1) / dp`` of the bucket, of a different size per
  bucket (DP). A ring moves at the pace of its slowest link: every link's flow lasts the
  bucket's time (``Fabric.ring_pacing`` "ring"), or its own transfer time ("link");
- then the optimizer; the server's step ends (ground truth, what a training log prints) when
  all its GPUs have synchronised and stepped, and the next step starts.

Times are float seconds in the reference clock. Work that starts at or after a slow-job
fault's onset takes ``mult`` x longer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from collscope.operator.simulator.flows import config, fabric

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

PP, DP = 0, 1  # flow kinds (ground truth only; the collector does not know them)
LAUNCH_JITTER_S = 30e-6  # spread of the TP ranks' sends after a compute span
BUCKET_GAP_S = (20e-6, 80e-6)  # launch gap between consecutive DP buckets


@dataclass(frozen=True)
class ComputeSlowdown:
    mult: float = 1.0
    onset_s: float = float("inf")


@dataclass
class JobFlows:
    """Flows of one job and its ground-truth step ends."""

    src: list[IntArray] = field(default_factory=list)
    dst: list[IntArray] = field(default_factory=list)
    start: list[FloatArray] = field(default_factory=list)
    dur: list[FloatArray] = field(default_factory=list)
    nbytes: list[IntArray] = field(default_factory=list)
    kind: list[IntArray] = field(default_factory=list)
    step_ends: list[FloatArray] = field(default_factory=list)  # per step: [pp, dp] (s)

    def add(
        self,
        src: IntArray,
        dst: IntArray,
        start: FloatArray,
        dur: FloatArray,
        *,
        nb: int,
        kind: int,
    ) -> None:
        self.src.append(src.ravel())
        self.dst.append(dst.ravel())
        self.start.append(start.ravel())
        self.dur.append(dur.ravel())
        self.nbytes.append(np.full(src.size, nb, dtype=np.int64))
        self.kind.append(np.full(src.size, kind, dtype=np.int64))


def gpu_grid(job: config.JobSpec, gpus_per_server: int) -> IntArray:
    """Global GPU index of (stage, replica, TP rank): ``[pp, dp, tp]``."""
    srv = np.array(job.servers, dtype=np.int64).reshape(job.pp, job.dp)
    return srv[:, :, None] * gpus_per_server + np.arange(gpus_per_server)


def one_f_one_b(pp: int, micro_batches: int, stage: int) -> list[tuple[str, int]]:
    """The 1F1B (PipeDream-flush) order of one stage: ("F"|"B", micro-batch)."""
    warm = min(pp - stage - 1, micro_batches)
    ops = [("F", i) for i in range(warm)]
    for i in range(micro_batches - warm):
        ops += [("F", warm + i), ("B", i)]
    ops += [("B", i) for i in range(micro_batches - warm, micro_batches)]
    return ops


def simulate(
    job: config.JobSpec,
    fab: fabric.FabricModel,
    slow: fabric.Slowdowns,
    compute: ComputeSlowdown,
    *,
    duration_s: float,
    rng: np.random.Generator,
) -> JobFlows:
    """Every step of ``job`` that starts before ``duration_s``."""
    out = JobFlows()
    gpu = gpu_grid(job, fab.cfg.gpus_per_server)
    ready = np.full((job.pp, job.dp), job.start_s)
    while float(ready.min()) < duration_s:
        done = _pipeline(job, gpu, ready, fab=fab, slow=slow, compute=compute, out=out, rng=rng)
        synced = _dp_sync(job, gpu, done, fab=fab, slow=slow, out=out, rng=rng)
        opt = job.optimizer_ms * 1e-3 * (1 + job.jitter * rng.standard_normal(ready.shape))
        ready = synced.max(axis=2) + opt
        out.step_ends.append(ready.copy())
    return out


def _pipeline(
    job: config.JobSpec,
    gpu: IntArray,
    ready: FloatArray,
    *,
    fab: fabric.FabricModel,
    slow: fabric.Slowdowns,
    compute: ComputeSlowdown,
    out: JobFlows,
    rng: np.random.Generator,
) -> FloatArray:
    """One step's forward/backward passes; returns each stage's last backward end [pp, dp]."""
    pp, m = job.pp, job.micro_batches
    orders = [one_f_one_b(pp, m, s) for s in range(pp)]
    free = [ready[s].copy() for s in range(pp)]
    f_end: list[dict[int, FloatArray]] = [{} for _ in range(pp)]
    arrive_f: list[dict[int, FloatArray]] = [{} for _ in range(pp)]
    arrive_b: list[dict[int, FloatArray]] = [{} for _ in range(pp)]
    ptr = [0] * pp
    while any(ptr[s] < len(orders[s]) for s in range(pp)):
        moved = False
        for s in range(pp):
            while ptr[s] < len(orders[s]):
                kind, i = orders[s][ptr[s]]
                if kind == "F":
                    dep = arrive_f[s].get(i) if s > 0 else free[s]
                else:
                    dep = arrive_b[s].get(i) if s < pp - 1 else f_end[s].get(i)
                if dep is None:
                    break
                start = np.maximum(free[s], dep)
                base = (job.fwd_ms if kind == "F" else job.bwd_ms) * 1e-3
                span = base * np.maximum(1 + job.jitter * rng.standard_normal(job.dp), 0.5)
                span = span * np.where(start >= compute.onset_s, compute.mult, 1.0)
                end = start + span
                free[s] = end
                if kind == "F":
                    f_end[s][i] = end
                    if s < pp - 1:
                        arrive_f[s + 1][i] = _send(
                            job, gpu[s], gpu[s + 1], end, fab=fab, slow=slow, out=out, rng=rng
                        )
                elif s > 0:
                    arrive_b[s - 1][i] = _send(
                        job, gpu[s], gpu[s - 1], end, fab=fab, slow=slow, out=out, rng=rng
                    )
                ptr[s] += 1
                moved = True
        if not moved:  # 1F1B never deadlocks; this guards a broken order
            raise RuntimeError(f"pipeline of {job.name} made no progress")
    return np.stack(free)


def _send(
    job: config.JobSpec,
    src: IntArray,
    dst: IntArray,
    ready: FloatArray,
    *,
    fab: fabric.FabricModel,
    slow: fabric.Slowdowns,
    out: JobFlows,
    rng: np.random.Generator,
) -> FloatArray:
    """PP flows of every TP rank of every replica ``[dp, tp]``; returns arrival per replica."""
    start = ready[:, None] + rng.uniform(0.0, LAUNCH_JITTER_S, src.shape)
    dur = fab.transfer_s(src, dst, float(job.act_bytes), start, slow=slow, rng=rng)
    out.add(src, dst, start, dur, nb=job.act_bytes, kind=PP)
    arrive: FloatArray = (start + dur).max(axis=1)
    return arrive


def _dp_sync(
    job: config.JobSpec,
    gpu: IntArray,
    done: FloatArray,
    *,
    fab: fabric.FabricModel,
    slow: fabric.Slowdowns,
    out: JobFlows,
    rng: np.random.Generator,
) -> FloatArray:
    """Ring all-reduce of every DP group; returns each GPU's sync end [pp, dp, tp]."""
    pp, dp, tp = gpu.shape
    synced = np.repeat(done[:, :, None], tp, axis=2)
    if dp < 2:
        return synced
    link_share = 2.0 * (dp - 1) / dp
    for s in range(pp):
        src = gpu[s]  # [dp, tp]: link d -> d + 1 of group (s, t)
        dst = np.roll(gpu[s], -1, axis=0)
        t0 = np.full(tp, float(done[s].max())) + rng.uniform(0.0, LAUNCH_JITTER_S, tp)
        for share in job.buckets:
            nbytes = round(link_share * share * job.grad_bytes)
            start = np.broadcast_to(t0, (dp, tp))
            link = fab.transfer_s(src, dst, float(nbytes), start, slow=slow, rng=rng)
            bucket = link.max(axis=0)  # [tp]: the ring's pace is its slowest link's
            offset = rng.uniform(0.0, 20e-6, (dp, tp))
            paced = link if fab.cfg.ring_pacing == "link" else bucket[None, :]
            dur = paced * rng.uniform(0.97, 1.0, (dp, tp)) - offset
            out.add(src, dst, start + offset, np.maximum(dur, 1e-6), nb=nbytes, kind=DP)
            t0 = t0 + bucket + rng.uniform(*BUCKET_GAP_S, tp)
        synced[s] = t0[None, :]
    return synced
