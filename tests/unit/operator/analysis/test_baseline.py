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
