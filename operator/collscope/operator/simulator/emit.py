"""Turning simulated timings into the records a node agent exports (docs/spec/bundle-v1.md).

Times arrive as float64 seconds since job start in the job's reference clock (``inf`` =
never) and leave as int ns on the writing host's clock: ``start_ns + t + offset[node]``, each
node with a fixed seeded offset in ±``clock_skew_ms``. State records are sampled on a global
grid of host times ``start_ns + phase + j * state_interval`` (each node on its own clock; the
phase is 0, or per rank when ``SimConfig.sample_phase`` asks for it), for every
rank and every op it is in (entry <= tau < end), until the run is cut at ``duration_s``;
nothing is written at or after the cut, as an agent export would be.

Counters at a sample time tau are "chunks whose event time <= tau", computed for all (flow,
sample) pairs of a phase at once with one ``searchsorted`` per counter over row-offset keys
(each flow's event times are non-decreasing in k, so ``row * STRIDE + t`` is sorted).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import models, tables
from collscope.operator.simulator import collectives, config, faults, program, topology

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# "never" in ns (~9.8 hours): larger than any simulated time, small enough that
# row * STRIDE + t fits int64 for 2**17 flows per phase.
NEVER_NS = 1 << 45
STRIDE = 1 << 46


@dataclass(frozen=True)
class OpInfo:
    """What each member of a phase issued. Arrays ``[M]``."""

    ops: list[str]
    nbytes: IntArray
    seq: IntArray
    comm: IntArray
    peer: IntArray  # -1 for collectives


@dataclass(frozen=True)
class Clock:
    """Run-wide emission settings."""

    start_ns: int
    offset_ns: IntArray  # [ranks] host clock offset of each rank's node
    interval_ns: int
    duration_ns: int
    channels: int
    comm_ids: tuple[str, ...]
    phase_ns: IntArray | None = None  # [ranks] where each rank's sampling grid starts (0: all)

    def phase(self, ranks: IntArray) -> IntArray:
        return (
            np.zeros(len(ranks), dtype=np.int64) if self.phase_ns is None else self.phase_ns[ranks]
        )


def to_ns(t: FloatArray) -> IntArray:
    """Seconds (inf = never) to int ns capped at NEVER_NS."""
    out = np.where(np.isfinite(t), np.rint(np.minimum(t, NEVER_NS / 1e9) * 1e9), NEVER_NS)
    return out.astype(np.int64)


def _ceil_div(a: IntArray, b: int) -> IntArray:
    return -((-a) // b)


def job_model(cfg: config.SimConfig, topo: topology.Topology) -> models.Job:
    par = (
        models.Parallelism(tp=cfg.tp, pp=cfg.pp, dp=cfg.dp, order=cfg.order)
        if cfg.declare_parallelism
        else None
    )
    ranks = [
        models.RankInfo(
            rank=r,
            node=topology.node_name(int(topo.node_of[r])),
            pod=topology.pod_name(r),
            gpu=r % cfg.gpus_per_node,
            nic=topology.nic_name(r % cfg.gpus_per_node),
        )
        for r in range(cfg.ranks)
    ]
    return models.Job(
        job=f"collscope-sim-{cfg.fault.value.name}-seed{cfg.seed}",
        world_size=cfg.ranks,
        parallelism=par,
        ranks=ranks,
    )


def comms(b: tables.BundleBuilder, topo: topology.Topology, clk: Clock) -> None:
    """One ``comm`` record per (rank, communicator), at job start on the rank's clock."""
    for c in topo.comms:
        for pos, r in enumerate(c.members):
            b.add_comm(
                rank=r,
                ts=clk.start_ns + int(clk.offset_ns[r]),
                comm=c.cid,
                comm_rank=pos,
                nranks=len(c.members),
                nnodes=c.nnodes,
                name=c.name,
            )


def phase(
    b: tables.BundleBuilder,
    phase_: program.Phase,
    res: collectives.Result,
    info: OpInfo,
    clk: Clock,
) -> None:
    """Op completion records and state records of one timed phase."""
    off = clk.offset_ns[res.rank]
    entry = to_ns(res.entry)
    end = to_ns(res.end)
    started = entry < NEVER_NS
    cut = clk.duration_ns
    done = np.flatnonzero(started & (end < NEVER_NS) & (end + off < cut))
    if len(done):
        host_start = (clk.start_ns + entry[done] + off[done]).tolist()
        host_end = (clk.start_ns + end[done] + off[done]).tolist()
        rank, seq = res.rank[done].tolist(), info.seq[done].tolist()
        comm, nbytes = info.comm[done].tolist(), info.nbytes[done].tolist()
        peer = info.peer[done].tolist()
        for i, m in enumerate(done.tolist()):
            b.add_op(
                rank=rank[i],
                ts=host_end[i],
                comm=clk.comm_ids[comm[i]],
                seq=seq[i],
                op=info.ops[m],
                nbytes=nbytes[i],
                start=host_start[i],
                end=host_end[i],
                dtype="bf16",
                algo=phase_.algo,
                proto="Simple",
                channels=clk.channels,
                peer=None if peer[i] < 0 else peer[i],
            )
    _states(b, res, info, clk, entry=entry, end=end, off=off, started=started)


def _states(
    b: tables.BundleBuilder,
    res: collectives.Result,
    info: OpInfo,
    clk: Clock,
    *,
    entry: IntArray,
    end: IntArray,
    off: IntArray,
    started: npt.NDArray[np.bool_],
) -> None:
    iv = clk.interval_ns
    ph = clk.phase(res.rank)  # each rank's grid: start + phase + j * interval (host clock)
    j_lo = np.maximum(_ceil_div(entry + off - ph, iv), 0)
    j_hi = np.minimum(_ceil_div(end + off - ph, iv), _ceil_div(clk.duration_ns - ph, iv))
    n_s = np.where(started, np.maximum(j_hi - j_lo, 0), 0)
    total_s = int(n_s.sum())
    if total_s == 0:
        return
    s_mem = np.repeat(np.arange(len(n_s)), n_s)
    s_j = j_lo[s_mem] + np.arange(total_s) - np.repeat(np.cumsum(n_s) - n_s, n_s)
    tau = s_j * iv + ph[s_mem] - off[s_mem]  # reference-clock ns of each sample
    kdone = (to_ns(res.chan_end)[s_mem] <= tau[:, None]).sum(axis=1)

    fl = res.flows
    f_count = np.bincount(fl.owner, minlength=len(n_s))
    f_start = np.cumsum(f_count) - f_count
    nf = f_count[s_mem]
    n_pairs = int(nf.sum())
    cols: list[list[int]] = []
    if n_pairs:
        p_s = np.repeat(np.arange(total_s), nf)
        p_f = f_start[s_mem][p_s] + np.arange(n_pairs) - np.repeat(np.cumsum(nf) - nf, nf)
        cols = _flow_columns(fl, p_f, tau[p_s], entry[fl.owner[p_f]])
    flows = list(zip(*cols, strict=True)) if cols else []
    bounds = np.concatenate([[0], np.cumsum(nf)]).tolist()

    ts = (clk.start_ns + ph[s_mem] + s_j * iv).tolist()
    members = s_mem.tolist()
    kd = kdone.tolist()
    rank = res.rank.tolist()
    host_entry = (clk.start_ns + entry + off).tolist()
    comm_ids = [clk.comm_ids[c] for c in info.comm.tolist()]
    seq = info.seq.tolist()
    nbytes = info.nbytes.tolist()
    channels = clk.channels
    for i, m in enumerate(members):
        b.add_state(
            rank=rank[m],
            ts=ts[i],
            comm=comm_ids[m],
            seq=seq[m],
            op=info.ops[m],
            nbytes=nbytes[m],
            start=host_entry[m],
            flows=flows[bounds[i] : bounds[i + 1]],
            kernel=(channels, kd[i]),
        )


def _flow_columns(
    fl: collectives.Flows, p_f: IntArray, tau: IntArray, entry: IntArray
) -> list[list[int]]:
    """FlowTuple columns for (flow, sample) pairs: counts and idle time at each sample."""
    used, inverse = np.unique(p_f, return_inverse=True)
    rows = inverse.astype(np.int64)
    times = fl.times(used)
    k = times[0].shape[1]
    base = np.arange(len(used), dtype=np.int64)[:, None] * STRIDE
    counts: list[IntArray] = []
    last = entry.copy()
    for t in times:
        t_ns = np.maximum.accumulate(to_ns(t), axis=1)
        keys = (base + t_ns).ravel()
        c = np.searchsorted(keys, rows * STRIDE + tau, side="right") - rows * k
        counts.append(c)
        prev = t_ns[rows, np.maximum(c - 1, 0)]
        last = np.maximum(last, np.where(c > 0, prev, -1))
    idle = tau - last
    send = fl.dir[p_f] == tables.SEND
    neg = np.full(len(p_f), -1, dtype=np.int64)
    c1, c2, c3 = counts
    return [
        fl.channel[p_f].tolist(),
        fl.peer[p_f].tolist(),
        fl.dir[p_f].tolist(),
        fl.total[p_f].tolist(),
        np.where(send, c1, neg).tolist(),
        np.where(send, c2, neg).tolist(),
        np.where(send, neg, c1).tolist(),
        np.where(send, c3, c2).tolist(),
        np.where(send, neg, c3).tolist(),
        idle.tolist(),
    ]


HW_INTERVAL_NS = 1_000_000_000  # the agent's NVML / netlink sampling period
NIC_GBPS = 400.0  # ConnectX-7
NCCL_NIC_BYTES_PER_S = 5e9  # a rank's collective traffic through its NIC, on average
FOREIGN_BYTES_PER_S = 30e9  # background traffic competing for a node's NICs
SM_CLOCK_MHZ = 1980.0  # H100 SXM boost clock
PCIE_GEN = 5
SW_POWER_CAP = 0x4  # NVML clocks-event reason bit: software power cap


def hardware(
    b: tables.BundleBuilder,
    cfg: config.SimConfig,
    topo: topology.Topology,
    fx: faults.Effects,
    clk: Clock,
) -> None:
    """Hardware samples a node agent would take through NVML and netlink, one per second.

    Per rank: its NIC's link state (``nic_link_up``: 0 from the moment a NIC goes down) and
    speed (``nic_link_speed_gbps``: lower when the culprit's link is limited, not when a
    node's NICs are merely shared with background traffic) and transmit rate
    (``nic_tx_bytes_per_second``: background traffic adds to it), its
    GPU's SM clock, clocks-event reasons and PCIe generation. A power cap shows as a lower
    clock with the software-power-cap reason; a PCIe downgrade as a lower link generation.
    Faults with no hardware symptom (a hung GPU, background load, a slow proxy) leave these
    samples healthy, as they would on a real node.
    """
    jitter = np.random.default_rng([cfg.seed, 17])
    n = -(-clk.duration_ns // HW_INTERVAL_NS)
    for j in range(n):
        t_s = j * HW_INTERVAL_NS / 1e9
        after = t_s >= fx.onset
        clock_mhz = SM_CLOCK_MHZ - jitter.uniform(0.0, 30.0, cfg.ranks)
        capped = after & fx.power_capped
        clock_mhz = np.where(capped, clock_mhz / np.maximum(fx.compute_mult, 1.0), clock_mhz)
        gen = np.where(after & fx.pcie_downgraded, 1, PCIE_GEN)
        link = (t_s < fx.nic_stop).astype(np.float64)
        # Collective traffic is alike on the NICs of a symmetric job; background traffic adds
        # bytes NCCL never sent (Mycroft #6 runs perftest beside the job).
        tx = NCCL_NIC_BYTES_PER_S * jitter.uniform(0.9, 1.1, cfg.ranks)
        tx = np.where(after & fx.foreign_traffic, tx + FOREIGN_BYTES_PER_S, tx)
        speed = np.where(after & fx.link_limited, NIC_GBPS / np.maximum(fx.nic_div, 1.0), NIC_GBPS)
        for r in range(cfg.ranks):
            ts = clk.start_ns + int(clk.offset_ns[r]) + j * HW_INTERVAL_NS
            node = topology.node_name(int(topo.node_of[r]))
            gpu = f"gpu{r % cfg.gpus_per_node}"
            nic = topology.nic_name(r % cfg.gpus_per_node)
            mhz = round(float(clock_mhz[r]), 1)
            reasons = float(SW_POWER_CAP if capped[r] else 0)
            for device, metric, value in (
                (nic, "nic_link_up", float(link[r])),
                (nic, "nic_link_speed_gbps", round(float(speed[r]), 1)),
                (nic, "nic_tx_bytes_per_second", round(float(tx[r]))),
                (gpu, "sm_clock_mhz", mhz),
                (gpu, "clocks_event_reasons", reasons),
                (gpu, "pcie_link_gen", float(gen[r])),
            ):
                b.add_hw(rank=r, ts=ts, node=node, device=device, metric=metric, value=value)
