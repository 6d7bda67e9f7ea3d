"""What a flow collector makes of the traffic: records, with their defects.

Whatever the source (switch mirroring, sFlow/IPFIX export, NIC telemetry; see
``analysis.flows.engine`` for how each maps to ``flows.jsonl``) a collector loses some records
(mirror or export drops), cuts some in two (an export interval or timeout ending mid-flow),
stamps times with some error, and sees traffic that is not training at all (GPU NICs reading
from storage). Here, from the jobs' true flows:

- storage reads: Poisson, ``storage_flows_per_server_s`` per busy server, from a random GPU NIC
  to one of ``STORAGE_ENDPOINTS`` non-GPU addresses (absent from job.json);
- each record lost with probability ``drop_rate``; split with ``split_rate`` at a uniform
  30-70 % point (bytes in proportion); start times off by N(0, ``ts_noise_us``);
- flows that start at or after ``duration_s`` are cut; times become int ns from ``start_ns``;
- the path's switches as CSR (``sw_ptr``, ``sw_idx``) from ``fabric.path``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from collscope.operator.simulator.flows import config, fabric, pipeline

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

OTHER = 2  # flow kind of non-training traffic (truth only)
STORAGE_ENDPOINTS = tuple(f"10.250.0.{i}" for i in range(1, 5))


@dataclass(frozen=True)
class Collected:
    src: IntArray
    dst: IntArray
    ts: IntArray
    nbytes: IntArray
    duration: IntArray
    sw_ptr: IntArray
    sw_idx: IntArray
    kind: IntArray
    extra_endpoints: tuple[str, ...]  # endpoint ids after the GPUs' (index n_gpus + i)


def collect(
    cfg: config.FlowSimConfig, fab: fabric.FabricModel, parts: list[pipeline.JobFlows]
) -> Collected:
    rng = np.random.default_rng([cfg.seed, 9])
    col = cfg.collector

    def cat(name: str) -> npt.NDArray[np.generic]:
        chunks = [c for p in parts for c in getattr(p, name)]
        return np.concatenate(chunks) if chunks else np.zeros(0)

    c: dict[str, npt.NDArray[Any]] = {
        "src": cat("src").astype(np.int64),
        "dst": cat("dst").astype(np.int64),
        "start": cat("start").astype(np.float64),
        "dur": cat("dur").astype(np.float64),
        "nbytes": cat("nbytes").astype(np.int64),
        "kind": cat("kind").astype(np.int64),
    }
    # storage reads: GPU NIC <- storage; the storage side is not a GPU of the fabric
    n_gpu, gps = cfg.fabric.gpus, cfg.fabric.gpus_per_server
    busy = np.array(sorted({v for j in cfg.jobs for v in j.servers}), dtype=np.int64)
    n_st = int(rng.poisson(col.storage_flows_per_server_s * cfg.duration_s * len(busy)))
    st_bytes = rng.integers(1 << 20, 64 << 20, n_st)
    storage = {
        "src": n_gpu + rng.integers(0, len(STORAGE_ENDPOINTS), n_st),
        "dst": rng.choice(busy, n_st) * gps + rng.integers(0, gps, n_st),
        "start": rng.uniform(0.0, cfg.duration_s, n_st),
        "dur": st_bytes / (cfg.fabric.nic_gbytes_s * 0.5e9),
        "nbytes": st_bytes,
        "kind": np.full(n_st, OTHER),
    }
    c = {k: np.concatenate((v, storage[k])) for k, v in c.items()}
    # lost records
    keep = rng.random(len(c["src"])) >= col.drop_rate
    c = {k: v[keep] for k, v in c.items()}
    # records cut in two by an export interval: the second part follows the first
    cut = np.flatnonzero(rng.random(len(c["src"])) < col.split_rate)
    frac = rng.uniform(0.3, 0.7, len(cut))
    tail = {k: v[cut] for k, v in c.items()}
    first_bytes = np.rint(c["nbytes"][cut] * frac).astype(np.int64)
    tail["start"] = c["start"][cut] + c["dur"][cut] * frac
    tail["dur"] = c["dur"][cut] * (1 - frac)
    tail["nbytes"] = c["nbytes"][cut] - first_bytes
    c["dur"][cut] *= frac
    c["nbytes"][cut] = first_bytes
    c = {k: np.concatenate((v, tail[k])) for k, v in c.items()}
    # timestamp noise, the cut at the end of the run, ns
    c["start"] = c["start"] + rng.normal(0.0, col.ts_noise_us * 1e-6, len(c["start"]))
    inside = (c["start"] >= 0.0) & (c["start"] < cfg.duration_s)
    order = np.flatnonzero(inside)[np.argsort(c["start"][inside], kind="stable")]
    c = {k: v[order] for k, v in c.items()}
    src, dst = c["src"], c["dst"]
    ts = cfg.start_ns + np.rint(c["start"] * 1e9).astype(np.int64)
    duration = np.maximum(np.rint(c["dur"] * 1e9).astype(np.int64), 1)
    sw_ptr, sw_idx = _paths(fab, src, dst, n_gpu)
    return Collected(
        src=src,
        dst=dst,
        ts=ts,
        nbytes=c["nbytes"],
        duration=duration,
        sw_ptr=sw_ptr,
        sw_idx=sw_idx,
        kind=c["kind"],
        extra_endpoints=STORAGE_ENDPOINTS,
    )


def _paths(
    fab: fabric.FabricModel, src: IntArray, dst: IntArray, n_gpu: int
) -> tuple[IntArray, IntArray]:
    """CSR of every flow's switches. Storage hangs off the spines: ``[spine, leaf(gpu)]``."""
    s_ok, d_ok = src < n_gpu, dst < n_gpu
    gpu = np.where(s_ok, src, dst)
    la, spine, lb = fab.path(np.where(s_ok, src, 0), np.where(d_ok, dst, 0))
    leaf = (gpu // fab.cfg.gpus_per_server) // fab.cfg.servers_per_leaf
    via = (gpu // fab.cfg.gpus_per_server) % fab.cfg.spines + fab.cfg.leaves
    both = s_ok & d_ok
    first = np.where(both, la, np.where(s_ok, leaf, -1))
    middle = np.where(both, spine, via)
    last = np.where(both, lb, np.where(d_ok, leaf, -1))
    sw = np.stack((first, middle, last), axis=1)
    mask = sw >= 0
    ptr = np.concatenate(([0], np.cumsum(mask.sum(axis=1)))).astype(np.int64)
    return ptr, sw[mask].astype(np.int64)
