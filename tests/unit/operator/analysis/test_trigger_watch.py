"""``TriggerState.watch``: a sample that changes between ticks (``rotation``).

Two pairs of ranks on their own communicators, an AllReduce of 1 MiB every 100 ms each;
``0xb`` (ranks 2, 3) slows from 10 ms to 100 ms per operation, or to one every 400 ms, at 6 s.
Thresholds are set explicitly (``SETTINGS``), so the tests check the rules, not the defaults.
"""

from __future__ import annotations

import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import trigger

S = 1_000_000_000
MS = 1_000_000
SETTINGS = trigger.TriggerSettings(
    window_s=2.0,
    throughput_drop=0.5,
    interval_growth=2.0,
    repeat_ticks=3,
    normal_min_ticks=3,
    slow_theta=3.0,
    slow_min_excess_s=0.01,
    base_span_s=3.0,
)
SLOW_FROM_S = 6.0


def _job(*, slow: str, end_s: float = 16.0) -> tables.Bundle:
    """``slow``: "duration" (ops of 0xb last 100 ms), "pace" (0xb runs one op per 400 ms) or
    "none"."""
    b = tables.BundleBuilder(models.Job(world_size=4))
    for comm, members in (("0xa", (0, 1)), ("0xb", (2, 3))):
        t, seq = 0, 0
        while t < end_s * S:
            late = comm == "0xb" and t >= SLOW_FROM_S * S
            dur = (100 if late and slow == "duration" else 10) * MS
            for r in members:
                # "pace": rank 3 is the late one; rank 2 waits 300 ms inside each operation
                # for it (a pause of both outside operations would be no slowdown at all).
                start = t - (300 * MS if late and slow == "pace" and r == 2 else 0)
                b.add_op(rank=r, ts=t + dur, comm=comm, seq=seq, op="AllReduce", nbytes=1 << 20,
                         start=start, end=t + dur)  # fmt: skip
            t += (400 if late and slow == "pace" else 100) * MS
            seq += 1
    return b.build()


def _run(
    bundle: tables.Bundle, plan: dict[int, tuple[int, ...]], *, history: bool = True
) -> trigger.TriggerResult | None:
    """Ticks at 1, 2, ... s; ``plan`` maps a tick (s) to the sample from that tick on."""
    state = trigger.TriggerState(plan[1], SETTINGS, interval_ns=100 * MS)
    for sec in range(1, 16):
        if sec in plan:
            state.watch(plan[sec], bundle if history else None)
        hit = state.update(bundle, sec * S)
        if hit is not None:
            return hit
    return None


def test_a_rank_that_joins_is_judged_against_its_own_history() -> None:
    # Ranks 2, 3 are first watched at 9 s, three seconds into their slowdown; their
    # communicator's Tbase comes from their records before 6 s, so the ratio rule fires on the
    # third tick of their visit (CCL-D's repetition counter), naming 0xb.
    bundle = _job(slow="duration")
    hit = _run(bundle, {1: (0,), 9: (0, 2)})
    assert hit is not None and hit.kind == "slow"
    assert hit.tick_ns == 11 * S and hit.ranks == (2,)
    assert hit.comm == bundle.comm_index("0xb")
    assert "R = 9.0" in hit.reason  # (100 ms - 10 ms) / 10 ms


def test_without_its_history_a_joining_rank_learns_the_slowdown_as_normal() -> None:
    # The same visit when nothing before it is learned: Tbase is taken from slow rounds.
    assert _run(_job(slow="duration"), {1: (0,), 9: (0, 2)}, history=False) is None


def test_a_rank_that_left_is_no_longer_judged() -> None:
    # Rank 2 has had normals (throughput, interval) since 5 s (a full window from 3 s, three
    # healthy ticks) when it leaves at 7 s; its records stop being fed, which must not read as
    # its throughput dropping to zero.
    assert _run(_job(slow="none"), {1: (0, 2), 7: (0,)}) is None


def test_a_rank_that_returns_keeps_what_was_learned_from_it() -> None:
    # Rank 2 is watched 1-5 s (healthy: its normal throughput is learned), away 6-8 s, back at
    # 9 s with a quarter of its throughput: the throughput rule judges it at once (its first
    # record is restored, so its window counts as full) and fires on the third tick.
    hit = _run(_job(slow="pace"), {1: (0, 2), 6: (0,), 9: (0, 2)})
    assert hit is not None and hit.kind == "slow" and hit.tick_ns == 11 * S
    assert 2 in hit.ranks and "rank 2 throughput" in hit.reason


@pytest.mark.parametrize("sample", [(3, 1, 2), (1, 2, 3, 3)])
def test_watch_keeps_the_sample_sorted_and_unique(sample: tuple[int, ...]) -> None:
    state = trigger.TriggerState((0,), SETTINGS)
    state.watch(sample)
    assert state.sampled.tolist() == [1, 2, 3]
