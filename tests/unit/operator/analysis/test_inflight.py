"""Operations in flight at a time t, completions, and when progress last happened."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import inflight

S = 1_000_000_000
MS = 1_000_000
IV = 100 * MS


def _builder(world: int = 2) -> tables.BundleBuilder:
    b = tables.BundleBuilder(models.Job(world_size=world))
    for r in range(world):
        b.add_comm(rank=r, ts=0, comm="0xa", comm_rank=r, nranks=world)
    return b


def _op(b: tables.BundleBuilder, rank: int, seq: int, end: int, comm: str = "0xa") -> None:
    b.add_op(
        rank=rank, ts=end, comm=comm, seq=seq, op="AllReduce", nbytes=64, start=end - MS, end=end
    )


def _state(
    b: tables.BundleBuilder,
    rank: int,
    seq: int,
    ts: int,
    *,
    start: int,
    flows: Sequence[tables.FlowTuple] = (),
    kernel: tuple[int, int] | None = None,
) -> None:
    b.add_state(
        rank=rank,
        ts=ts,
        comm="0xa",
        seq=seq,
        op="AllReduce",
        nbytes=64,
        start=start,
        flows=flows,
        kernel=kernel,
    )


def _idle(ns: int) -> tables.FlowTuple:
    return (0, 1, tables.SEND, 8, 4, 4, -1, 2, -1, ns)


def test_completed_takes_the_highest_seq_up_to_t() -> None:
    b = _builder()
    for seq in range(3):
        _op(b, 0, seq, (seq + 1) * S)
    _op(b, 1, 0, 5 * S)
    bundle = b.build()
    done = inflight.completed(bundle, 2 * S)
    got = done.lookup(np.asarray([0, 1], dtype=np.int64), np.asarray([0, 0], dtype=np.int64))
    assert got.tolist() == [1, -1]  # rank 0's seq 2 and rank 1's seq 0 end after t
    later = inflight.completed(bundle, 10 * S)
    assert later.lookup(np.asarray([0, 1]), np.asarray([0, 0])).tolist() == [2, 0]
    assert sorted(later.last_end.tolist()) == [3 * S, 5 * S]
    assert inflight.completed(bundle, 0).lookup(np.asarray([0]), np.asarray([0])).tolist() == [-1]


def test_ring_hang_every_entered_rank_in_flight_since_the_freeze(ring: Any) -> None:
    bundle = ring.build("network")
    now = inflight.at(bundle, ring.end, interval_ns=IV)
    assert sorted(now.rank.tolist()) == [0, 1, 2, 3] and len(now) == 4
    assert set(now.seq.tolist()) == {30}
    assert set(now.start.tolist()) == {ring.hang_start}
    assert set(now.stall_start.tolist()) == {ring.stall_start}
    assert set(now.stalled_ns.tolist()) == {ring.end - ring.stall_start}
    assert now.has_flows.all()
    assert {bundle.string(int(o)) for o in now.op} == {"AllReduce"}
    assert all(bundle.states["seq"][i] == 30 for i in now.state_row)


def test_not_entered_rank_is_not_in_flight(ring: Any) -> None:
    now = inflight.at(ring.build("not-entered"), ring.end, interval_ns=IV)
    assert sorted(now.rank.tolist()) == [0, 1, 2]


def test_before_any_state_nothing_is_in_flight(ring: Any) -> None:
    now = inflight.at(ring.build("network"), ring.hang_start, interval_ns=IV)
    assert len(now) == 0 and now.t_ns == ring.hang_start


def test_completed_operation_is_no_longer_in_flight() -> None:
    b = _builder()
    _state(b, 0, 5, S, start=S - 50 * MS, flows=[_idle(0)])
    _op(b, 0, 5, S + 50 * MS)
    bundle = b.build()
    assert inflight.at(bundle, S + 10 * MS, interval_ns=IV).seq.tolist() == [5]
    assert len(inflight.at(bundle, S + 60 * MS, interval_ns=IV)) == 0


def test_stale_state_of_a_rank_that_moved_on_is_dropped() -> None:
    b = _builder()
    _state(b, 0, 5, S, start=S - 50 * MS, flows=[_idle(0)])
    _op(b, 0, 0, 2 * S, comm="0xb")  # alive: it completed something elsewhere since
    _state(b, 1, 5, S, start=S - 50 * MS, flows=[_idle(0)])  # rank 1: silent ever since
    now = inflight.at(b.build(), 3 * S, interval_ns=IV)
    assert now.rank.tolist() == [1]
    fresh = inflight.at(b.build(), 3 * S, interval_ns=IV, max_age_intervals=100)
    assert sorted(fresh.rank.tolist()) == [0, 1]


def test_stall_start_from_flows_is_time_since_anything_moved() -> None:
    b = _builder()
    start = S - 500 * MS
    _state(b, 0, 1, S, start=start, flows=[_idle(300 * MS), _idle(200 * MS)])
    _state(b, 1, 1, S, start=start, flows=[_idle(900 * MS)])  # idle longer than the op: start
    now = inflight.at(b.build(), S, interval_ns=IV)
    assert dict(zip(now.rank.tolist(), now.stall_start.tolist(), strict=True)) == {
        0: S - 200 * MS,
        1: start,
    }


def test_stall_start_from_kernel_progress() -> None:
    b = _builder()
    start = S - 50 * MS
    for k, done in enumerate([0, 1, 2, 2, 2]):
        _state(b, 0, 1, S + k * IV, start=start, kernel=(4, done))
    for k in range(5):
        _state(b, 1, 1, S + k * IV, start=start, kernel=(4, 0))  # never moved: since start
    now = inflight.at(b.build(), S + 4 * IV, interval_ns=IV)
    got = dict(zip(now.rank.tolist(), now.stall_start.tolist(), strict=True))
    assert got == {0: S + 2 * IV, 1: start}
    assert not now.has_flows.any()


def test_stall_start_without_flows_or_kernel_is_the_op_start() -> None:
    b = _builder()
    _state(b, 0, 1, S, start=S - 300 * MS)
    now = inflight.at(b.build(), S, interval_ns=IV)
    assert now.stall_start.tolist() == [S - 300 * MS]


def test_infer_interval_is_the_median_state_gap(ring: Any) -> None:
    assert inflight.infer_interval_ns(ring.build("gpu"), 7) == 100 * MS
    assert inflight.infer_interval_ns(ring.build("healthy"), 7) == 7  # no states: the default


def test_segment_min() -> None:
    v = np.asarray([5, 3, 9, 1, 7, 2], dtype=np.int64)
    lo = np.asarray([0, 2, 5], dtype=np.int64)
    hi = np.asarray([2, 5, 6], dtype=np.int64)
    assert inflight.segment_min(v, lo, hi).tolist() == [3, 1, 2]
