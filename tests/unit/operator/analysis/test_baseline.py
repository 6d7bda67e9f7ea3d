"""Online baselines: per-communicator stall threshold, CCL-D Tbase, Mycroft normals."""

from __future__ import annotations

import numpy as np
import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import baseline

S = 1_000_000_000
MS = 1_000_000


def _base(*, base_rounds: int = 100, base_span_s: float = 100.0) -> baseline.Baselines:
    return baseline.Baselines(
        history=8, base_rounds=base_rounds, base_span_ns=int(base_span_s * S), normal_history=4
    )


def _ops(rounds: list[list[int]], *, period_ns: int = 100 * MS) -> tables.Table:
    """One round per list, one op per duration (ms), ranks 0.., comm 0xa, in completion order."""
    b = tables.BundleBuilder(models.Job(world_size=8))
    for seq, durations in enumerate(rounds):
        for rank, d in enumerate(durations):
            end = S + seq * period_ns + d * MS
            b.add_op(
                rank=rank,
                ts=end,
                comm="0xa",
                seq=seq,
                op="AllReduce",
                nbytes=64,
                start=end - d * MS,
                end=end,
            )
    ops = b.build().ops
    return ops[np.argsort(ops["end"], kind="stable")]


def test_stall_threshold_is_the_floor_until_durations_say_more() -> None:
    b = _base()
    assert b.stall_threshold_ns(0, floor_ns=S, k=4.0) == S
    b.learn_ops(_ops([[10, 12]] * 4))
    assert b.stall_threshold_ns(0, floor_ns=S, k=4.0) == S  # 4 x 12 ms < 1 s
    b.learn_ops(_ops([[800, 800]]))
    assert b.stall_threshold_ns(0, floor_ns=S, k=4.0) > 3 * S  # long ops lift it
    assert b.stall_threshold_ns(1, floor_ns=S, k=4.0) == S  # per communicator


def test_median_duration_ignores_a_rare_outlier() -> None:
    b = _base()
    assert b.median_duration_ns(0) is None
    b.learn_ops(_ops([[10, 10], [10, 10], [10, 900]]))
    assert b.median_duration_ns(0) == 10 * MS


def test_duration_history_is_bounded() -> None:
    b = _base()  # history=8 durations per communicator
    b.learn_ops(_ops([[900, 900]] * 4))
    b.learn_ops(_ops([[10, 10]] * 4))
    assert b.stall_threshold_ns(0, floor_ns=0, k=1.0) == 10 * MS  # the 900 ms ones fell out


def test_tbase_is_the_mean_round_maximum_of_the_first_m_rounds() -> None:
    b = _base(base_rounds=3)
    key = (0, 1, 64)  # comm index, "AllReduce" string index, bytes
    b.learn_ops(_ops([[10, 20], [10, 40], [30, 10]]))
    assert b.tbase_ns(key) is None  # m rounds seen, not yet past them
    b.learn_ops(_ops([[10, 20], [10, 40], [30, 10], [500, 500]])[6:])
    assert b.tbase_ns(key) == pytest.approx(30 * MS)  # mean(20, 40, 30); the 4th not in it
    b.learn_ops(_ops([[900, 900]] * 6)[2:])
    assert b.tbase_ns(key) == pytest.approx(30 * MS)  # frozen
    assert b.tbase_ns((9, 9, 9)) is None


def test_tbase_freezes_after_the_learning_span() -> None:
    b = _base(base_rounds=100, base_span_s=0.25)
    b.learn_ops(_ops([[10, 20]] * 5))  # rounds 100 ms apart: the 4th ends past the span
    assert b.tbase_ns((0, 1, 64)) == pytest.approx(20 * MS)


def test_normals_need_enough_healthy_ticks() -> None:
    b = _base()
    for v in (1.0, 3.0):
        b.learn_tick({0: v}, {(0, 0): 10 * v})
    assert b.normal_throughput(0, 3) is None and b.normal_interval(0, 0, 3) is None
    b.learn_tick({0: 100.0}, {(0, 0): 1000.0})
    assert b.normal_throughput(0, 3) == 3.0  # median: one odd tick does not move it
    assert b.normal_interval(0, 0, 3) == 30.0
    assert b.normal_throughput(5, 1) is None


def test_tbase_waits_for_the_minimum_rounds_past_the_span() -> None:
    # Rounds 100 ms apart and a 0.05 s span: the span alone would freeze on 1 round; one round's
    # maximum is one draw of the arrival spread, so at least base_min_rounds are averaged.
    b = baseline.Baselines(
        history=8, base_rounds=100, base_span_ns=50 * MS, normal_history=4, base_min_rounds=3
    )
    b.learn_ops(_ops([[10, 20], [10, 40]]))
    assert b.tbase_ns((0, 1, 64)) is None
    b.learn_ops(_ops([[10, 20], [10, 40], [30, 10], [5, 5]])[4:])
    assert b.tbase_ns((0, 1, 64)) == pytest.approx(30 * MS)  # mean(20, 40, 30)


def _two_ops_per_step(steps: int, step_ms: int) -> tables.Table:
    """Each step: a ReduceScatter and, 1 ms later, an AllGather on one comm (ranks 0, 1), and a
    4-byte barrier every step; steps ``step_ms`` apart."""
    b = tables.BundleBuilder(models.Job(world_size=2))
    for k in range(steps):
        t = S + k * step_ms * MS
        for r in range(2):
            for seq, op, nbytes, at in (
                (2 * k, "ReduceScatter", 1 << 20, t),
                (2 * k + 1, "AllGather", 1 << 20, t + MS),
            ):
                b.add_op(
                    rank=r,
                    ts=at + MS,
                    comm="0xa",
                    seq=seq,
                    op=op,
                    nbytes=nbytes,
                    start=at,
                    end=at + MS,
                )
            b.add_op(
                rank=r,
                ts=t + 2 * MS,
                comm="0xb",
                seq=k,
                op="AllReduce",
                nbytes=4,
                start=t + MS,
                end=t + 2 * MS,
            )
    ops = b.build().ops
    return ops[np.argsort(ops["end"], kind="stable")]


def test_period_is_the_step_of_the_op_done_once_per_step() -> None:
    # Keyed by (comm, op, bytes): the RS -> AG gap (1 ms) does not halve the 3 s step, and the
    # barrier does not count.
    b = _base()
    assert b.period_ns() is None
    b.learn_ops(_two_ops_per_step(3, 3000))
    assert b.period_ns() is None  # 2 ranks x 2 gaps of each key: fewer than min_gaps (5)
    b2 = baseline.Baselines(
        history=64, base_rounds=100, base_span_ns=S, normal_history=4, barrier_max_bytes=4
    )
    b2.learn_ops(_two_ops_per_step(8, 3000))
    assert b2.period_ns() == 3000 * MS


def test_duration_quantile_and_count() -> None:
    b = _base()
    assert b.durations_seen(0) == 0 and b.duration_quantile_ns(0, 0.9) is None
    b.learn_ops(_ops([[10, 10], [10, 10], [10, 10], [10, 900]]))
    assert b.durations_seen(0) == 8
    assert b.duration_quantile_ns(0, 0.5) == 10 * MS


def test_period_pools_one_operation_over_the_communicators_that_run_it() -> None:
    # Two DP groups (comms 0xa and 0xc, one sampled rank each), a ReduceScatter every 3 s: 4
    # steps give each rank 3 gaps, 6 pooled: the step is known before either group alone has 5.
    b = tables.BundleBuilder(models.Job(world_size=2))
    for k in range(4):
        for r, comm in ((0, "0xa"), (1, "0xc")):
            t = S + k * 3 * S
            b.add_op(rank=r, ts=t + MS, comm=comm, seq=k, op="ReduceScatter", nbytes=1 << 20,
                     start=t, end=t + MS)  # fmt: skip
    ops = b.build().ops
    base = _base()
    base.learn_ops(ops[np.argsort(ops["end"], kind="stable")])
    assert base.period_ns() == 3 * S


def test_derived_threshold_adds_the_usual_stall_not_the_duration() -> None:
    # The floor (a proxy sleep) comes on top of how long the communicator's operations usually
    # go without progress. Ops of 300 ms that move data all along stall for 5 ms: their
    # stalls, not their 300 ms duration, lift the threshold.
    b = _base()
    b.learn_ops(_ops([[300, 300]] * 4))
    floor = 2 * S
    # nothing known of their stalls: the duration, an upper bound of them
    assert b.stall_threshold_ns(0, floor_ns=floor, k=4.0, add_p99=True) == floor + 300 * MS
    for _ in range(8):
        b.learn_stall(0, 5 * MS)
    assert b.stall_threshold_ns(0, floor_ns=floor, k=4.0, add_p99=True) == floor + 5 * MS


def test_long_operations_allowance_applies_to_the_stall() -> None:
    # CCL-D's k x "such long operations" scales what the rule measures: an op that moves data
    # for 600 ms and stalls 5 ms is not allowed 4 x 600 ms without progress; one whose usual
    # stall is 600 ms (a pipeline receive waiting for its sender) is.
    b = _base()
    b.learn_ops(_ops([[600, 600]] * 4))
    for _ in range(8):
        b.learn_stall(0, 5 * MS)
    assert b.stall_threshold_ns(0, floor_ns=S, k=4.0, add_p99=True) == S + 5 * MS
    w = _base()
    w.learn_ops(_ops([[600, 600]] * 4))
    for _ in range(8):
        w.learn_stall(0, 600 * MS)
    assert w.stall_threshold_ns(0, floor_ns=S, k=4.0, add_p99=True) == 2400 * MS
    # hang_floor_s set: max(floor, k x p99 of durations), as CCL-D
    assert w.stall_threshold_ns(0, floor_ns=S, k=4.0) == 2400 * MS
