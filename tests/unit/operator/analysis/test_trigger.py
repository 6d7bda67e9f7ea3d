"""The real-time trigger on sampled ranks: hang (stall past threshold) and slow (Algorithm 1).

Thresholds the assertions depend on are set explicitly, so the tests check the rules rather
than the tuned defaults.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import inflight, trigger

S = 1_000_000_000
MS = 1_000_000
HANG_FLOOR_NS = 1_500_000_000  # the floor these tests set (the default is derived)
Ring = Any  # conftest.Ring: conftest modules cannot be imported under --import-mode=importlib
SETTINGS = trigger.TriggerSettings(
    window_s=2.0,
    hang_floor_s=HANG_FLOOR_NS / S,
    hang_k=4.0,
    barrier_max_bytes=4,
    throughput_drop=0.5,
    interval_growth=2.0,
    repeat_ticks=3,
    normal_min_ticks=3,
)


def _replay(
    bundle: tables.Bundle, sampled: tuple[int, ...], *, step_ns: int = S
) -> list[tuple[int, trigger.TriggerResult | None]]:
    span = bundle.time_span()
    assert span is not None
    state = trigger.TriggerState(sampled, SETTINGS, interval_ns=100 * MS)
    out: list[tuple[int, trigger.TriggerResult | None]] = []
    for t in [*range(span[0] + step_ns, span[1], step_ns), span[1]]:
        hit = state.update(bundle, t)
        out.append((t, hit))
        if hit is not None:
            break
    return out


def _first(bundle: tables.Bundle, sampled: tuple[int, ...]) -> trigger.TriggerResult | None:
    return _replay(bundle, sampled)[-1][1]


def test_ring_hang_fires_once_the_stall_passes_the_threshold(ring: Ring) -> None:
    bundle = ring.build("network")
    ticks = _replay(bundle, (0, 1, 2, 3))
    t, hit = ticks[-1]
    assert hit is not None and hit.kind == "hang"
    assert all(h is None for _, h in ticks[:-1])
    assert hit.since_ns == ring.stall_start
    assert hit.at_ns == ring.stall_start + HANG_FLOOR_NS  # 10 ms ops: the floor
    assert hit.at_ns <= hit.tick_ns == t
    assert hit.comm == bundle.comm_index("0xa") and hit.seq == 30
    assert set(hit.ranks) == {0, 1, 2, 3}
    assert "AllReduce seq 30" in hit.reason and "0xa" in hit.reason


def test_hang_only_on_the_sampled_ranks(ring: Ring) -> None:
    hit = _first(ring.build("not-entered"), (1, 3))
    assert hit is not None and hit.kind == "hang" and hit.ranks == (1,)


def test_trigger_never_looks_ahead(ring: Ring) -> None:
    bundle = ring.build("network")
    state = trigger.TriggerState((0, 1, 2, 3), SETTINGS, interval_ns=100 * MS)
    early = ring.stall_start + HANG_FLOOR_NS - 50 * MS
    # the bundle already holds 3 s of stall, but not before ``early``
    assert state.update(bundle, early) is None


def test_healthy_ring_never_fires(ring: Ring) -> None:
    assert all(hit is None for _, hit in _replay(ring.build("healthy"), (0, 1, 2, 3)))


def _stuck_pair(nbytes: int, *, busy_elsewhere: bool = False) -> tables.Bundle:
    """Ranks 0, 1 complete 30 AllReduces, then sit 3 s in seq 30 with no progress."""
    b = tables.BundleBuilder(models.Job(world_size=2))
    for r in range(2):
        b.add_comm(rank=r, ts=0, comm="0xa", comm_rank=r, nranks=2)
        for seq in range(30):
            end = S + seq * 100 * MS + 10 * MS
            b.add_op(
                rank=r,
                ts=end,
                comm="0xa",
                seq=seq,
                op="AllReduce",
                nbytes=nbytes,
                start=end - 10 * MS,
                end=end,
            )
        hang = S + 3 * S
        for k in range(1, 31):
            ts = hang + k * 100 * MS
            flow = (0, 1 - r, tables.SEND, 4, 2, 2, -1, 2, -1, ts - hang)
            b.add_state(
                rank=r,
                ts=ts,
                comm="0xa",
                seq=30,
                op="AllReduce",
                nbytes=nbytes,
                start=hang,
                flows=[flow],
            )
            if busy_elsewhere:  # completes an op on another communicator every 100 ms
                b.add_op(
                    rank=r,
                    ts=ts,
                    comm="0xb",
                    seq=k,
                    op="AllGather",
                    nbytes=64,
                    start=ts - MS,
                    end=ts,
                )
    return b.build()


@pytest.mark.parametrize(("nbytes", "fires"), [(4, False), (8, True)])
def test_tiny_allreduce_is_a_barrier_not_a_hang(nbytes: int, fires: bool) -> None:
    hit = _first(_stuck_pair(nbytes), (0, 1))
    assert (hit is not None and hit.kind == "hang") is fires


def test_rank_completing_work_elsewhere_is_not_hung() -> None:
    hit = _first(_stuck_pair(8, busy_elsewhere=True), (0, 1))
    assert hit is None or hit.kind != "hang"


def _slowing(slow_from_s: float, end_s: float, *, waits: bool = True) -> tables.Bundle:
    """Two ranks, an AllReduce every 100 ms taking 10 ms; from ``slow_from_s`` on one every
    400 ms. With ``waits`` rank 1 is the cause: it enters 300 ms late and rank 0 waits inside
    the operation for it; without, both pause outside operations alike (a checkpoint)."""
    b = tables.BundleBuilder(models.Job(world_size=2))
    t, seq = S, 0
    while t < end_s * S:
        slow = t >= slow_from_s * S
        for r in range(2):
            start = t - (300 * MS if slow and waits and r == 0 else 0)
            end = t + 10 * MS
            b.add_op(
                rank=r,
                ts=end,
                comm="0xa",
                seq=seq,
                op="AllReduce",
                nbytes=1 << 20,
                start=start,
                end=end,
            )
        t += (400 if slow else 100) * MS
        seq += 1
    return b.build()


def test_slowdown_fires_after_repeated_slow_ticks() -> None:
    ticks = _replay(_slowing(7.0, 14.0), (0, 1))
    t, hit = ticks[-1]
    assert hit is not None and hit.kind == "slow"
    assert t >= 7 * S + (SETTINGS.repeat_ticks - 1) * S  # not on the first slow tick
    assert 5 * S <= hit.since_ns <= t and hit.at_ns == t
    assert set(hit.ranks) <= {0, 1} and hit.reason


def test_every_rank_pausing_outside_collectives_is_not_a_slowdown() -> None:
    # Throughput quarters and intervals quadruple, but nobody waits inside an operation.
    assert all(hit is None for _, hit in _replay(_slowing(7.0, 14.0, waits=False), (0, 1)))


def test_steady_pace_never_fires_slow() -> None:
    assert all(hit is None for _, hit in _replay(_slowing(99.0, 14.0), (0, 1)))


def test_sampled_ranks_are_kept_sorted() -> None:
    state = trigger.TriggerState((3, 1, 2), SETTINGS)
    assert state.sampled.tolist() == [1, 2, 3] and state.sampled.dtype == np.int32


def _wide_rounds(wide: set[int], *, rounds: int = 24, step_ms: int = 500) -> tables.Bundle:
    """Two ranks, an AllReduce every ``step_ms``: rank 1 enters 5 ms after rank 0 (rank 0's
    duration, Tmax, 10 ms), except in the ``wide`` rounds where it enters 200 ms late."""
    b = tables.BundleBuilder(models.Job(world_size=2))
    for seq in range(rounds):
        t = S + seq * step_ms * MS
        late = (200 if seq in wide else 5) * MS
        end = t + late + 5 * MS
        for r, start in ((0, t), (1, t + late)):
            b.add_op(
                rank=r,
                ts=end,
                comm="0xa",
                seq=seq,
                op="AllReduce",
                nbytes=1 << 20,
                start=start,
                end=end,
            )
    return b.build()


def test_one_wide_round_is_jitter_however_long_it_stays_in_the_window() -> None:
    # R = (205 - 10) / 10 = 19.5 for round 12, and it sits in the window for several ticks;
    # CCL-D's repetition counter counts rounds, and the rounds after it are ordinary.
    assert all(hit is None for _, hit in _replay(_wide_rounds({12}), (0, 1)))


def test_consecutive_wide_rounds_are_a_slowdown() -> None:
    ticks = _replay(_wide_rounds(set(range(12, 24))), (0, 1))
    hit = ticks[-1][1]
    assert hit is not None and hit.kind == "slow" and hit.comm == 0
    # Rounds 12..14 are complete by 8.2 s; then three slow ticks in a row: rounds 12..19.
    assert ticks[-1][0] == 11 * S + 10 * MS  # ticks every second from the first record
    assert hit.reason == (
        "comm #0 seq 19: R = 19.5 (Tmax 205.0 ms, Tbase 10.0 ms), its last 8 rounds above theta"
    )
    assert hit.since_ns == S + 12 * 500 * MS  # the first slow round of the run


def test_window_stretches_to_whole_steps_of_the_job() -> None:
    state = trigger.TriggerState((0, 1), SETTINGS, interval_ns=100 * MS)
    assert state.window_ns() == 2 * S  # nothing learned: window_s
    bundle = _wide_rounds(set(), rounds=10, step_ms=3000)
    state.update(bundle, bundle.ops["ts"].max())
    assert state.window_ns() == int(SETTINGS.window_periods * 3 * S)


def test_a_wait_within_its_communicators_usual_durations_does_not_pause_the_slow_checks() -> None:
    # A pipeline receive that always waits ~2 s (the previous stage's forward pass): 1 s into
    # its next wait it is not "stalled" (its hang threshold is 4 x 2 s); on a communicator
    # with no such history the same second is half the 1.5 s floor and pauses the checks.
    def job(history_ms: int) -> tables.Bundle:
        b = tables.BundleBuilder(models.Job(world_size=2))
        for seq in range(10):
            t = S + seq * 3 * S
            b.add_op(rank=0, ts=t + history_ms * MS, comm="0xa", seq=seq, op="Recv",
                     nbytes=1 << 20, start=t, end=t + history_ms * MS, peer=1)  # fmt: skip
        t = S + 10 * 3 * S
        flow = (0, 1, tables.RECV, 8, -1, -1, 8, 0, 0, 1 * S)  # nothing arrived for 1 s
        b.add_state(rank=0, ts=t + S, comm="0xa", seq=10, op="Recv", nbytes=1 << 20,
                    start=t, flows=[flow])  # fmt: skip
        return b.build()

    for history_ms, paused in ((2000, False), (10, True)):
        bundle = job(history_ms)
        state = trigger.TriggerState((0,), SETTINGS, interval_ns=100 * MS)
        t = S + 10 * 3 * S + S
        state.update(bundle, t - S)  # learn the history
        now = inflight.at(bundle, t, interval_ns=100 * MS)
        hit, stalled = state._hang(bundle, now, bundle.ops[bundle.ops["ts"] <= t], t)
        assert hit is None and stalled is paused


@pytest.mark.parametrize("interval_ms", [50, 100, 200])
def test_hang_floor_is_a_proxy_sleep_seen_through_stale_samples(interval_ms: int) -> None:
    # The longest stall that is not a hang is a proxy that sleeps and resumes (Mycroft §7.1
    # #7: 1 s). Until the next state sample shows it moving again it looks longer by the age
    # of the latest sample, at most ``state_max_age_intervals`` intervals: the floor is both.
    state = trigger.TriggerState((0,), trigger.TriggerSettings(), interval_ns=interval_ms * MS)
    assert state.hang_floor_ns() == (S + 2 * interval_ms * MS, True)
    custom = trigger.TriggerSettings(hang_floor_s=3.0)  # a TrainingJob's hangFloorSeconds
    assert trigger.TriggerState((0,), custom).hang_floor_ns() == (3 * S, False)


def test_derived_threshold_adds_the_usual_longest_duration(ring: Ring) -> None:
    # A rank waiting on a sleeping proxy waits its own longest usual duration on top of the
    # sleep: the ring's ops take 10 ms, so the threshold is 1 s + 2 x 100 ms + 10 ms.
    bundle = ring.build("network")
    state = trigger.TriggerState((0, 1, 2, 3), trigger.TriggerSettings(), interval_ns=100 * MS)
    thr = S + 200 * MS + 10 * MS
    assert state.update(bundle, ring.stall_start + thr - 50 * MS) is None
    hit = state.update(bundle, ring.stall_start + thr + 50 * MS)
    assert hit is not None and hit.kind == "hang" and hit.at_ns == ring.stall_start + thr


def _bandwidth_bound(stall_ms: int) -> tables.Bundle:
    """Rank 0 runs 20 AllReduces of 300 ms on comm 0xa, one every 500 ms, each sampled every
    100 ms with flows that last moved ``stall_ms`` before the sample; then seq 20 starts at
    11 s and its flows stop moving at once (samples every 100 ms, idle growing)."""
    b = tables.BundleBuilder(models.Job(world_size=2))
    for seq in range(20):
        t = S + seq * 500 * MS
        for k in (1, 2):
            flow = (0, 1, tables.RECV, 8, -1, -1, 8, k, 0, stall_ms * MS)
            b.add_state(rank=0, ts=t + k * 100 * MS, comm="0xa", seq=seq, op="AllReduce",
                        nbytes=1 << 26, start=t, flows=[flow])  # fmt: skip
        b.add_op(rank=0, ts=t + 300 * MS, comm="0xa", seq=seq, op="AllReduce",
                 nbytes=1 << 26, start=t, end=t + 300 * MS)  # fmt: skip
    t0 = 11 * S
    for k in range(1, 40):
        flow = (0, 1, tables.RECV, 8, -1, -1, 8, 0, 0, k * 100 * MS)
        b.add_state(rank=0, ts=t0 + k * 100 * MS, comm="0xa", seq=20, op="AllReduce",
                    nbytes=1 << 26, start=t0, flows=[flow])  # fmt: skip
    return b.build()


@pytest.mark.parametrize("stall_ms", [5, 150])
def test_hang_threshold_adds_the_usual_stall_not_the_usual_duration(stall_ms: int) -> None:
    # A bandwidth-bound operation lasts 300 ms but moves data all along: a rank waiting on a
    # sleeping proxy waits the sleep plus what such an operation usually spends without
    # progress (its samples' longest stall, 5 ms), not plus its whole duration. Where the
    # operations do wait without progress (150 ms before their sender comes), that wait is
    # added in full.
    bundle = _bandwidth_bound(stall_ms)
    state = trigger.TriggerState((0,), trigger.TriggerSettings(), interval_ns=100 * MS)
    for t in range(2 * S, 11 * S, S):
        assert state.update(bundle, t) is None
    hit = None
    t = 11 * S
    while hit is None and t < 15 * S:
        t += 100 * MS
        hit = state.update(bundle, t)
    assert hit is not None and hit.kind == "hang"
    assert hit.at_ns == 11 * S + S + 200 * MS + stall_ms * MS


def test_episode_window_holds_two_steps_of_a_long_step_job() -> None:
    # A proxy that stalls once per step shows one episode per step: with 6 s steps, two of
    # them are never within a fixed 8 s, so the window stretches to two measured steps.
    state = trigger.TriggerState((0,), trigger.TriggerSettings(), interval_ns=100 * MS)
    assert state.episode_window_ns() == 8 * S  # step unknown: episode_window_s
    b = tables.BundleBuilder(models.Job(world_size=1))
    for seq in range(8):
        t = S + seq * 6 * S
        b.add_op(rank=0, ts=t + 100 * MS, comm="0xa", seq=seq, op="ReduceScatter",
                 nbytes=1 << 20, start=t, end=t + 100 * MS)  # fmt: skip
    state.base.learn_ops(b.build().ops)
    assert state.episode_window_ns() == 12 * S
