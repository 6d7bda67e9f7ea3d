"""Timing of one phase (an operation in many groups at once) from its members' entry times.

A phase's flows are laid out from a per-group *template* (ring, tree or p2p over ``n`` members
and ``C`` channels), repeated for every group: global edge ``e_t * G + g`` is template edge
``e_t`` of group ``g``, member ``g * n + m`` is position ``m`` of group ``g``. Then
``chunks.run`` times every chunk and this module turns edge times into what a rank sees:

- per member: entry, end (last chunk consumed / last send acknowledged), per-channel kernel end;
- per flow: only hops that cross nodes (NCCL's network proxy; NVLink hops have no flow entry),
  one send flow at the sender and one recv flow at the receiver, with ``[F, K]`` event times of
  the three counters of each side (send: ready, sent, done; recv: posted, done, consumed).

Chunking follows NCCL Simple: ring steps move ``bytes / n`` (AllReduce: 2(n-1) steps,
ReduceScatter/AllGather: n-1), split over channels and cut into chunks of at most
``fabric.chunk_bytes``; trees and p2p move ``bytes / C`` per channel and edge.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from collscope.nodeagent.bundle import tables
from collscope.operator.simulator import chunks, config, faults, program, topology

FloatArray = chunks.FloatArray
IntArray = chunks.IntArray
BoolArray = chunks.BoolArray


@dataclass(frozen=True)
class Template:
    """Edges of one group: endpoints (member positions), channel, deps (template edges)."""

    src: IntArray
    dst: IntArray
    chan: IntArray
    deps: IntArray  # [E_t, D], -1 = none
    levels: tuple[tuple[int, int], ...]
    lag: int
    chunks: int
    chunk_bytes: float


@dataclass(frozen=True)
class Flows:
    """Network flows of a phase, sorted by (owner, channel, dir, peer). Arrays ``[F]``."""

    owner: IntArray  # member index
    peer: IntArray  # global rank at the other end
    channel: IntArray
    dir: IntArray  # tables.SEND (0) / tables.RECV (1)
    total: IntArray
    edge: IntArray  # the edge of the chunk timing each flow reads
    chunk_times: chunks.Times

    def times(self, rows: IntArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """``[len(rows), K]`` event times of the three counters of the selected flows.

        Gathered on demand: only flows of members that are sampled are ever copied.
        """
        e = self.edge[rows]
        send = (self.dir[rows] == tables.SEND)[:, None]
        t = self.chunk_times
        a, b, c = (
            np.where(send, x[:, e].T, y[:, e].T)
            for x, y in ((t.ready, t.posted), (t.sent, t.arrived), (t.done, t.consumed))
        )
        return a, b, c


@dataclass(frozen=True)
class Result:
    """What every member of a phase experienced. Member arrays ``[M]``, ``M = G * n``."""

    rank: IntArray
    entry: FloatArray
    end: FloatArray
    chan_end: FloatArray  # [M, C] when each channel's kernel finished for the member
    inter: BoolArray  # member has at least one hop that crosses nodes
    flows: Flows


def _ring(n: int, channels: int) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """Member i sends to i+1 on every channel; its step-s data came in from i-1 at step s-1."""
    m = np.tile(np.arange(n), channels)
    chan = np.repeat(np.arange(channels), n)
    dst = (m + 1) % n
    deps = (chan * n + (m - 1) % n)[:, None]
    return m, dst, chan, deps


def _tree(n: int, channels: int) -> tuple[IntArray, IntArray, IntArray, IntArray, IntArray]:
    """Binary trees (one per channel, root rotated by channel) as edges sorted by level.

    Position q's parent is (q - 1) // 2. Levels make every dependency point backwards: reduce
    edges from the deepest children up to the root first, then broadcast edges root down.
    A reduce edge waits for its sender's children's chunk k; a broadcast edge waits for the
    chunk k its sender got from its parent (the root: for its children's reduce chunk k).
    """
    dmax = math.floor(math.log2(n))
    src: list[int] = []
    dst: list[int] = []
    chan: list[int] = []
    level: list[int] = []
    up: dict[tuple[int, int], int] = {}  # (channel, child position) -> edge
    down: dict[tuple[int, int], int] = {}

    def add(a: int, b: int, c: int, lvl: int) -> int:
        src.append(a)
        dst.append(b)
        chan.append(c)
        level.append(lvl)
        return len(src) - 1

    for c in range(channels):
        for q in range(1, n):
            depth, parent = math.floor(math.log2(q + 1)), (q - 1) // 2
            up[(c, q)] = add(q, parent, c, dmax - depth)
            down[(c, q)] = add(parent, q, c, dmax + depth - 1)
    deps: list[list[int]] = [[] for _ in src]
    for (c, q), e in up.items():
        deps[e] = [up[(c, ch)] for ch in (2 * q + 1, 2 * q + 2) if ch < n]
        parent = (q - 1) // 2
        deps[down[(c, q)]] = (
            [up[(c, ch)] for ch in (1, 2) if ch < n] if parent == 0 else [down[(c, parent)]]
        )
    order = np.argsort(np.array(level), kind="stable")
    remap = np.empty(len(order), dtype=np.int64)
    remap[order] = np.arange(len(order))
    dep_arr = np.full((len(src), 2), -1, dtype=np.int64)
    for e, ds in enumerate(deps):
        dep_arr[remap[e], : len(ds)] = remap[ds] if ds else []
    rot = np.array(chan)[order]
    return (
        (np.array(src)[order] + rot) % n,
        (np.array(dst)[order] + rot) % n,
        rot,
        dep_arr,
        np.array(level, dtype=np.int64)[order],
    )


@functools.lru_cache(maxsize=64)
def template(
    kind: program.Kind, op: str, n: int, *, channels: int, nbytes: int, chunk_bytes: int
) -> Template:
    """The edges of one group of ``n`` members (cached: phases repeat every iteration)."""
    if kind == "ring":
        steps = 2 * (n - 1) if op == "AllReduce" else n - 1
        per_chan = nbytes / n / channels
        cps = max(1, math.ceil(per_chan / chunk_bytes))
        src, dst, chan, deps = _ring(n, channels)
        return Template(src, dst, chan, deps, ((0, len(src)),), cps, steps * cps, per_chan / cps)
    per_chan = nbytes / channels
    k = max(1, math.ceil(per_chan / chunk_bytes))
    if kind == "p2p":
        zeros = np.zeros(channels, dtype=np.int64)
        return Template(
            zeros,
            zeros + 1,
            np.arange(channels),
            np.zeros((channels, 0), dtype=np.int64),
            ((0, channels),),
            0,
            k,
            per_chan / k,
        )
    src, dst, chan, deps, level = _tree(n, channels)
    bounds = np.flatnonzero(np.diff(level)) + 1
    cuts = [0, *bounds.tolist(), len(level)]
    levels = tuple((cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1))
    return Template(src, dst, chan, deps, levels, 0, k, per_chan / k)


def time_phase(
    phase: program.Phase,
    entries: FloatArray,
    stuck: BoolArray,
    *,
    topo: topology.Topology,
    cfg: config.SimConfig,
    fx: faults.Effects,
) -> Result:
    """Time ``phase`` given members' entry times ``[G, n]``; ``stuck`` groups make no progress."""
    fab = cfg.fabric
    n_groups, n = phase.groups.shape
    tpl = template(
        phase.kind,
        phase.op,
        n,
        channels=cfg.channels,
        nbytes=phase.nbytes,
        chunk_bytes=fab.chunk_bytes,
    )
    e_t = len(tpl.src)
    g = np.tile(np.arange(n_groups), e_t)
    et = np.repeat(np.arange(e_t), n_groups)
    src_m = g * n + tpl.src[et]
    dst_m = g * n + tpl.dst[et]
    ranks = np.ascontiguousarray(phase.groups).ravel()
    entry = entries.ravel()
    src, dst = ranks[src_m], ranks[dst_m]
    inter = topo.node_of[src] != topo.node_of[dst]

    start = entry[src_m]
    if phase.kind == "p2p":
        start = np.maximum(start, entry[dst_m])
    start = np.where(stuck[g], np.inf, start)
    params = _params(
        tpl, start=start, entry_dst=entry[dst_m], src=src, dst=dst, inter=inter, cfg=cfg, fx=fx
    )
    deps = np.where(tpl.deps[et] >= 0, tpl.deps[et] * n_groups + g[:, None], -1)
    graph = chunks.Graph(
        deps=deps,
        lag=tpl.lag,
        chunks=tpl.chunks,
        levels=tuple((lo * n_groups, hi * n_groups) for lo, hi in tpl.levels),
    )
    t = chunks.run(graph, params, fab.recv_slots)

    members = len(ranks)
    chan = tpl.chan[et]
    flat_end = np.full(members * cfg.channels, -np.inf)
    np.maximum.at(flat_end, src_m * cfg.channels + chan, t.done[-1])
    np.maximum.at(flat_end, dst_m * cfg.channels + chan, t.consumed[-1])
    chan_end = flat_end.reshape(members, cfg.channels)
    member_inter = np.zeros(members, dtype=bool)
    member_inter[src_m[inter]] = True
    member_inter[dst_m[inter]] = True
    return Result(
        rank=ranks,
        entry=entry,
        end=chan_end.max(axis=1),
        chan_end=chan_end,
        inter=member_inter,
        flows=_flows(t, inter, src_m=src_m, dst_m=dst_m, src=src, dst=dst, chan=chan),
    )


def _params(
    tpl: Template,
    *,
    start: FloatArray,
    entry_dst: FloatArray,
    src: IntArray,
    dst: IntArray,
    inter: BoolArray,
    cfg: config.SimConfig,
    fx: faults.Effects,
) -> chunks.Params:
    """The per-edge costs of one phase: GPU and transfer time per chunk (as the faults change
    them), latencies, and where the faults stop or stall an edge."""
    fab = cfg.fabric
    scale = tpl.chunk_bytes / fab.chunk_bytes
    gpu0 = np.full(len(src), fab.gpu_chunk_us * 1e-6 * scale)
    nic_s = fab.nic_gbytes_s * 1e9 / cfg.channels
    nv_s = fab.nvlink_gbytes_s * 1e9 / cfg.channels
    xfer0 = np.where(inter, tpl.chunk_bytes / nic_s, tpl.chunk_bytes / nv_s)
    div = np.where(inter, np.maximum(fx.nic_div[src], fx.nic_div[dst]), 1.0)
    stall_src = inter & (src == fx.stall_rank)
    stall_dst = inter & (dst == fx.stall_rank)

    def pair(base: FloatArray, mult: FloatArray) -> tuple[FloatArray, FloatArray]:
        return (base, base) if bool(np.all(mult == 1.0)) else (base, base * mult)

    return chunks.Params(
        start=start,
        entry_dst=entry_dst,
        gpu_src=pair(gpu0, fx.gpu_mult[src]),
        gpu_dst=pair(gpu0, fx.gpu_mult[dst]),
        xfer=pair(xfer0, div),
        latency=np.where(inter, fab.net_latency_us, fab.nvlink_latency_us) * 1e-6,
        proxy=fab.proxy_us * 1e-6,
        gpu_stop_src=fx.gpu_stop[src],
        gpu_stop_dst=fx.gpu_stop[dst],
        lost_after=np.where(inter, np.minimum(fx.nic_stop[src], fx.nic_stop[dst]), np.inf),
        stall_src=stall_src,
        stall_dst=stall_dst,
        stalls=fx.stalls,
        onset=fx.onset,
    )


def _flows(
    t: chunks.Times,
    inter: BoolArray,
    *,
    src_m: IntArray,
    dst_m: IntArray,
    src: IntArray,
    dst: IntArray,
    chan: IntArray,
) -> Flows:
    sel = np.flatnonzero(inter)
    n_sel = len(sel)
    owner = np.concatenate([src_m[sel], dst_m[sel]])
    peer = np.concatenate([dst[sel], src[sel]])
    channel = np.concatenate([chan[sel], chan[sel]])
    direction = np.concatenate([np.zeros(n_sel, dtype=np.int64), np.ones(n_sel, dtype=np.int64)])
    order = np.lexsort((peer, direction, channel, owner))
    k = t.ready.shape[0]
    return Flows(
        owner=owner[order],
        peer=peer[order],
        channel=channel[order],
        dir=direction[order],
        total=np.full(2 * n_sel, k, dtype=np.int64),
        edge=np.concatenate([sel, sel])[order],
        chunk_times=t,
    )
