"""The window keeps the last window_s per rank under a memory cap, oldest evicted first."""

from __future__ import annotations

import numpy as np

from collscope.nodeagent import window
from collscope.nodeagent.bundle import models, tables

S = 1_000_000_000
T0 = 1_732_001_234_000_000_000
JOB = models.Job(world_size=4)


def tick(w: window.Window, rank: int, ts: int, nflows: int = 2, comm: str = "0xab") -> None:
    """One state (``nflows`` send flows, idle_ns = flow index) and one op at ``ts``."""
    c, op = w.comm_ids(comm), w.strings("AllReduce")
    states = np.zeros(1, tables.STATE_DTYPE)
    states[0] = (rank, ts, c, 7, op, 1024, ts - 5, -1, -1, 0, nflows)
    flows = np.zeros(nflows, tables.FLOW_DTYPE)
    flows["channel"] = np.arange(nflows)
    flows["peer"] = rank
    flows["total"], flows["ready"], flows["sent"], flows["done"] = 8, 4, 3, 2
    flows["posted"] = flows["consumed"] = -1
    flows["idle_ns"] = np.arange(nflows) + ts % 1000
    ops = np.zeros(1, tables.OP_DTYPE)
    ops[0] = (rank, ts, c, 6, op, 512, 0, 0, 0, 2, -1, ts - 10, ts)
    w.add(rank, states=states, flows=flows, ops=ops)


def test_bundle_is_sorted_and_flows_follow_their_states() -> None:
    w = window.Window(window_s=60, memory_cap_bytes=1 << 30)
    tick(w, 1, T0 + 2 * S, nflows=3)
    tick(w, 0, T0 + 1 * S, nflows=1)
    tick(w, 1, T0 + 1 * S, nflows=2)
    b = w.bundle(JOB)
    assert b.states["rank"].tolist() == [0, 1, 1]
    assert b.states["ts"].tolist() == [T0 + S, T0 + S, T0 + 2 * S]
    sizes = (b.states["flow_hi"] - b.states["flow_lo"]).tolist()
    assert sizes == [1, 2, 3] and b.states["flow_lo"].tolist() == [0, 1, 3]
    assert b.flows["channel"].tolist() == [0, 0, 1, 0, 1, 2]
    recs = [r for r in b.iter_records() if isinstance(r, models.StateRecord)]
    assert recs[2].flows[2].idle_ns == 2 + (T0 + 2 * S) % 1000
    assert b.ops["rank"].tolist() == [0, 1, 1]


def test_filters_by_rank_and_time_inclusive() -> None:
    w = window.Window(window_s=60, memory_cap_bytes=1 << 30)
    for k in range(5):
        tick(w, k % 2, T0 + k * S)
    w.add_comms([models.CommRecord(rank=1, ts=T0 - S, comm="0xab", comm_rank=1, nranks=2)])
    b = w.bundle(JOB, ranks=[1], since_ns=T0 + S, until_ns=T0 + 3 * S)
    assert b.states["ts"].tolist() == [T0 + S, T0 + 3 * S]
    assert len(b.comms) == 1 and b.comm_id(int(b.comms["comm"][0])) == "0xab"  # any age


def test_time_bound_evicts_and_counts() -> None:
    w = window.Window(window_s=10, memory_cap_bytes=1 << 30)
    for k in range(20):
        tick(w, 0, T0 + k * S)
    w.evict(T0 + 19 * S)
    assert w.span(0) == (T0 + 9 * S, T0 + 19 * S)
    assert w.counters.evicted_records == 9 * 2 and w.counters.evicted_for_memory == 0
    assert w.counters.states == 20 and w.counters.flows == 40 and w.counters.ops == 20


def test_memory_cap_evicts_the_oldest_of_any_rank() -> None:
    w = window.Window(window_s=1000, memory_cap_bytes=1 << 20)
    for k in range(100):
        tick(w, k % 3, T0 + k * S, nflows=64)  # ~5 KB a chunk
    per = w.nbytes / sum(len(w._chunks[("", r)]) for r in range(3))
    assert w.nbytes <= w.memory_cap_bytes
    assert w.counters.evicted_for_memory == 0
    for k in range(100, 400):
        tick(w, k % 3, T0 + k * S, nflows=64)
    assert w.nbytes <= w.memory_cap_bytes < w.nbytes + 2 * per
    assert w.counters.evicted_for_memory > 0
    spans = [w.span(r) for r in range(3)]
    oldest = min(s[0] for s in spans if s)
    # Oldest first across ranks: every rank lost its early chunks, none kept much older ones.
    assert all(s is not None and s[0] - oldest <= 3 * S for s in spans)
    assert w.counters.evicted_records == 2 * w.counters.evicted_for_memory


def test_empty_window_gives_an_empty_bundle() -> None:
    w = window.Window(window_s=10, memory_cap_bytes=1 << 20)
    w.add(0)  # nothing in it: ignored
    b = w.bundle(JOB)
    assert len(b.states) == len(b.flows) == len(b.ops) == 0 and w.held() == []


def test_last_completion_outlives_eviction() -> None:
    w = window.Window(window_s=5, memory_cap_bytes=1 << 30)
    tick(w, 2, T0)
    w.evict(T0 + 60 * S)
    assert w.span(2) is None and w.last_completion(2) == T0 and w.last_completion(0) is None
