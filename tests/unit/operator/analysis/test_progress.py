"""A rank that keeps completing operations or moving chunks is not stuck (CCL-D H1)."""

from __future__ import annotations

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import progress

S = 1_000_000_000
MS = 1_000_000


def _bundle() -> tables.Bundle:
    """The wait is (10 s, 12 s]. Rank 0 completes an op at 11.5 s (second half); rank 1 only at
    10.2 s (first half, then stuck); rank 2's flow last moved at 11.8 s; rank 3's flow has been
    idle since 10.3 s although sampled at 11.9 s."""
    b = tables.BundleBuilder(models.Job(world_size=4))
    for r, end in ((0, 11_500 * MS), (1, 10_200 * MS)):
        b.add_op(
            rank=r, ts=end, comm="0xb", seq=1, op="Send", nbytes=8, start=end - 5 * MS, end=end
        )
    for r, idle in ((2, 100 * MS), (3, 1_600 * MS)):
        flow = (0, 0, tables.SEND, 16, 8, 8, -1, 4, -1, idle)
        b.add_state(
            rank=r,
            ts=11_900 * MS,
            comm="0xc",
            seq=3,
            op="AllReduce",
            nbytes=8,
            start=10 * S,
            flows=[flow],
        )
    return b.build()


def test_moving_counts_only_progress_in_the_second_half_of_the_wait() -> None:
    got = progress.moving(_bundle(), [0, 1, 2, 3], since_ns=10 * S, t_ns=12 * S)
    assert got == {0, 2}


def test_progress_after_the_instant_judged_does_not_count() -> None:
    # At 11.4 s rank 0's completion (11.5 s) has not happened yet.
    got = progress.moving(_bundle(), [0, 1, 2, 3], since_ns=10 * S, t_ns=11_400 * MS)
    assert got == set()


def test_only_the_asked_ranks_are_answered() -> None:
    assert progress.moving(_bundle(), [1, 3], since_ns=10 * S, t_ns=12 * S) == set()
    assert progress.moving(_bundle(), [], since_ns=10 * S, t_ns=12 * S) == set()


def _steps(compute_ms: int, steps: int = 8) -> tables.Bundle:
    """Rank 0: one 10 ms AllReduce after each ``compute_ms`` of compute, from 1 s on."""
    b = tables.BundleBuilder(models.Job(world_size=1))
    t = S
    for k in range(steps):
        t += compute_ms * MS
        b.add_op(
            rank=0,
            ts=t + 10 * MS,
            comm="0xa",
            seq=k,
            op="AllReduce",
            nbytes=8,
            start=t,
            end=t + 10 * MS,
        )
        t += 10 * MS
    return b.build()


def test_silence_within_k_times_its_own_compute_phases_is_not_yet_stuck() -> None:
    b = _steps(500)  # last op ends at 1 s + 8 x 510 ms = 5.08 s; compute phases of 500 ms
    last = S + 8 * 510 * MS
    assert progress.within_usual_gaps(b, [0], t_ns=last + 1_900 * MS, k=4.0) == {0}
    assert progress.within_usual_gaps(b, [0], t_ns=last + 2_100 * MS, k=4.0) == set()


def test_a_rank_with_too_little_history_is_never_excused() -> None:
    b = _steps(500, steps=3)
    assert progress.within_usual_gaps(b, [0], t_ns=S + 1_600 * MS, k=4.0) == set()
