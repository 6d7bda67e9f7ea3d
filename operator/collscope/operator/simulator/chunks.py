"""Chunk-level timing of data flows: the recurrence of Mycroft §3.1 / Fig. 2, vectorised.

An *edge* is one flow: a (sender, receiver, channel) hop that moves ``K`` chunks. For chunk
``k`` of edge ``e`` (times in float64 seconds since job start, ``inf`` = never):

    posted[k]   = max(entry_dst, consumed[k - slots])               receiver posts buffers ahead
    ready[k]    = max(start, ready[k-1], done[k - slots],           sender GPU produces into a
                      consumed of its dependencies at k - lag) + gpu   free send slot
    sent[k]     = max(ready[k], posted[k], sent[k-1]) + proxy       proxy posts to the network
    arrived[k]  = max(sent[k], arrived[k-1]) + xfer                 per-channel link queue
    done[k]     = arrived[k] + latency                              remote write acknowledged
    consumed[k] = max(arrived[k], consumed[k-1]) + gpu_dst          receiver GPU consumes

Dependencies are what make a stuck or slow rank propagate: in a ring, chunk k of a step > 0
needs the chunk received at the previous step (``lag`` = chunks per step); in a tree, a parent
needs chunk k of all its children (lag 0). Edges are grouped into *levels* so that lag-0
dependencies always point at an earlier level; the loop is ``for k: for level:`` with numpy
over all edges of a level (every group and channel of a phase at once).

Faults enter as per-edge parameters: slower GPU/link after ``onset`` (chosen per chunk by the
time the action starts), a GPU that stops (actions ending after ``gpu_stop`` never finish), a
NIC that stops (chunks arriving after ``lost_after`` never arrive) and proxy stalls (posting a
send or a receive buffer inside a stall waits for its end).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

INF = float("inf")


@dataclass(frozen=True)
class Params:
    """Per-edge inputs, every array ``[E]`` (seconds unless named otherwise)."""

    start: FloatArray  # earliest time the sender may produce chunk 0
    entry_dst: FloatArray  # when the receiver entered (posts its first buffers)
    gpu_src: tuple[FloatArray, FloatArray]  # (before, after onset) per chunk
    gpu_dst: tuple[FloatArray, FloatArray]
    xfer: tuple[FloatArray, FloatArray]  # link time of one chunk
    latency: FloatArray
    proxy: float
    gpu_stop_src: FloatArray
    gpu_stop_dst: FloatArray
    lost_after: FloatArray  # chunks arriving later never arrive (NIC down)
    stall_src: BoolArray  # the sender's proxy is the stalling one
    stall_dst: BoolArray
    stalls: tuple[FloatArray, FloatArray]  # (starts, ends), sorted, non-overlapping
    onset: float


@dataclass(frozen=True)
class Graph:
    """Edges of one phase: dependencies and levels. ``deps`` index edges, ``-1`` = none."""

    deps: IntArray  # [E, D]
    lag: int
    levels: tuple[tuple[int, int], ...]  # contiguous [lo, hi) edge ranges, in order
    chunks: int  # K


@dataclass(frozen=True)
class Times:
    """Event times ``[K, E]`` of every chunk of every edge."""

    ready: FloatArray
    sent: FloatArray
    done: FloatArray
    posted: FloatArray
    arrived: FloatArray
    consumed: FloatArray


def _pick(
    pair: tuple[FloatArray, FloatArray], sl: slice, t: FloatArray, onset: float
) -> FloatArray:
    if pair[0] is pair[1]:
        return pair[0][sl]
    late = t >= onset
    if not late.any():
        return pair[0][sl]
    return np.where(late, pair[1][sl], pair[0][sl])


def _unstall(t: FloatArray, mask: BoolArray, stalls: tuple[FloatArray, FloatArray]) -> None:
    """Push times of masked edges that fall inside a stall to the stall's end (in place)."""
    starts, ends = stalls
    sel = np.flatnonzero(mask)
    vals = t[sel]
    idx = np.searchsorted(starts, vals, side="right") - 1
    ok = idx >= 0
    inside = np.zeros(len(sel), dtype=bool)
    inside[ok] = vals[ok] < ends[idx[ok]]
    t[sel[inside]] = ends[idx[inside]]


def run(graph: Graph, p: Params, slots: int) -> Times:
    """Time every chunk of every edge; see the module docstring for the recurrence."""
    k_total, e_total = graph.chunks, len(p.start)
    shape = (k_total, e_total)
    ready = np.empty(shape)
    sent = np.empty(shape)
    done = np.empty(shape)
    posted = np.empty(shape)
    arrived = np.empty(shape)
    # one spare column of -inf: the value of a missing dependency
    consumed = np.empty((k_total, e_total + 1))
    consumed[:, -1] = -INF
    deps = np.where(graph.deps < 0, e_total, graph.deps)
    has_deps = deps.shape[1] > 0 and bool(np.any(graph.deps >= 0))
    stall_src = bool(p.stall_src.any())
    stall_dst = bool(p.stall_dst.any())
    for k in range(k_total):
        for lo, hi in graph.levels:
            sl = slice(lo, hi)
            t = p.start[sl]
            if k > 0:
                t = np.maximum(t, ready[k - 1, sl])
            if k >= slots:
                t = np.maximum(t, done[k - slots, sl])
            if has_deps and k >= graph.lag:
                t = np.maximum(t, consumed[k - graph.lag][deps[sl]].max(axis=1))
            r = t + _pick(p.gpu_src, sl, t, p.onset)
            r[r > p.gpu_stop_src[sl]] = INF
            ready[k, sl] = r

            q = p.entry_dst[sl]
            if k >= slots:
                q = np.maximum(q, consumed[k - slots, sl])
            if stall_dst:
                q = q.copy()
                _unstall(q, p.stall_dst[sl], p.stalls)
            posted[k, sl] = q

            s = np.maximum(r, q)
            if k > 0:
                s = np.maximum(s, sent[k - 1, sl])
            if stall_src:
                _unstall(s, p.stall_src[sl], p.stalls)
            s = s + p.proxy
            sent[k, sl] = s

            a = s if k == 0 else np.maximum(s, arrived[k - 1, sl])
            a = a + _pick(p.xfer, sl, a, p.onset)
            a[a > p.lost_after[sl]] = INF
            arrived[k, sl] = a
            done[k, sl] = a + p.latency[sl]

            c = a if k == 0 else np.maximum(a, consumed[k - 1, sl])
            c = c + _pick(p.gpu_dst, sl, c, p.onset)
            c[c > p.gpu_stop_dst[sl]] = INF
            consumed[k, sl] = c
    return Times(
        ready=ready, sent=sent, done=done, posted=posted, arrived=arrived, consumed=consumed[:, :-1]
    )
