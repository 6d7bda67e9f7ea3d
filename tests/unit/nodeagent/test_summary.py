"""Trigger summaries: completions, throughput, intervals and the op in flight with its idle."""

from __future__ import annotations

import numpy as np

from collscope.nodeagent import summary, window
from collscope.nodeagent.bundle import models, tables

S = 1_000_000_000
MS = 1_000_000
T0 = 1_732_001_234_000_000_000
JOB = models.Job(world_size=2)


def op(w: window.Window, rank: int, end: int, comm: str, nbytes: int) -> None:
    rows = np.zeros(1, tables.OP_DTYPE)
    rows[0] = (rank, end, w.comm_ids(comm), 1, w.strings("AllReduce"), nbytes, 0, 0, 0, 1, -1,
               end - MS, end)  # fmt: skip
    w.add(rank, ops=rows)


def state(w: window.Window, rank: int, ts: int, start: int, idles: list[int]) -> None:
    st = np.zeros(1, tables.STATE_DTYPE)
    st[0] = (rank, ts, w.comm_ids("0xc1"), 42, w.strings("AllGather"), 4096, start, -1, -1, 0,
             len(idles))  # fmt: skip
    fl = np.zeros(len(idles), tables.FLOW_DTYPE)
    fl["idle_ns"] = idles
    w.add(rank, states=st, flows=fl)


def test_completions_throughput_and_intervals() -> None:
    w = window.Window(window_s=60, memory_cap_bytes=1 << 30)
    now = T0 + 10 * S
    for k in range(5):  # comm a: every 100 ms; comm b: every 300 ms
        op(w, 0, now - S + k * 100 * MS, "0xa", 1000)
    for k in range(3):
        op(w, 0, now - S + k * 300 * MS, "0xb", 10)
    op(w, 0, now - 3 * S, "0xa", 10**6)  # before the window: not counted
    op(w, 1, now - S, "0xa", 7)
    s = summary.summarize(w.bundle(JOB), 0, now_ns=now, window_s=2.0, sampled_ns=now, health="live")
    assert s.completed_ops == 8 and s.completed_bytes == 5030
    assert s.throughput_bytes_per_s == 5030 / 2.0
    assert [(c.comm, c.ops, c.mean_interval_ns) for c in s.comms] == [
        ("0xa", 5, 100 * MS),
        ("0xb", 3, 300 * MS),
    ]
    assert s.mean_op_interval_ns == 200 * MS
    assert s.last_completion_ns == now - S + 600 * MS  # comm b, third op
    assert s.in_flight == []


def test_in_flight_idle_is_the_least_idle_flow_plus_the_sample_age() -> None:
    w = window.Window(window_s=60, memory_cap_bytes=1 << 30)
    state(w, 1, T0, T0 - 5 * S, [3 * S, 2 * S])
    state(w, 1, T0 + S, T0 - 5 * S, [4 * S, 2 * S + 500 * MS])
    s = summary.summarize(
        w.bundle(JOB), 1, now_ns=T0 + S + 200 * MS, window_s=2.0, sampled_ns=T0 + S, health="stale"
    )
    (f,) = s.in_flight
    assert (f.comm, f.seq, f.op, f.bytes, f.flows) == ("0xc1", 42, "AllGather", 4096, 2)
    assert f.sampled_ns == T0 + S and f.idle_ns == 2 * S + 500 * MS
    assert f.stalled_ns == 2 * S + 700 * MS
    assert s.completed_ops == 0 and s.mean_op_interval_ns is None and s.health == "stale"


def test_op_without_flows_is_idle_since_its_start() -> None:
    w = window.Window(window_s=60, memory_cap_bytes=1 << 30)
    state(w, 0, T0, T0 - 3 * S, [])
    (f,) = summary.summarize(
        w.bundle(JOB), 0, now_ns=T0, window_s=1.0, sampled_ns=T0, health="live"
    ).in_flight
    assert f.idle_ns == 3 * S and f.flows == 0


def test_an_op_no_longer_in_the_latest_sample_is_not_in_flight() -> None:
    w = window.Window(window_s=60, memory_cap_bytes=1 << 30)
    state(w, 0, T0, T0 - S, [MS])
    s = summary.summarize(
        w.bundle(JOB), 0, now_ns=T0 + S, window_s=1.0, sampled_ns=T0 + S // 2, health="live"
    )
    assert s.in_flight == []
