"""Per-rank slowdown signals: unexplained late starts, transfer slowdown, flow-level signals.

Thresholds are passed explicitly so the tests follow the rules, not the tuned defaults.
"""

from __future__ import annotations

import numpy as np
import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import rounds, signals

S = 1_000_000_000
MS = 1_000_000
RANKS = np.arange(3, dtype=np.int64)
BASE_ROUNDS = 10  # rounds 0..9: baseline; 10..12: window


class _Ops:
    def __init__(self, world: int = 3) -> None:
        self.b = tables.BundleBuilder(models.Job(world_size=world))

    def add(
        self, rank: int, comm: str, seq: int, start: int, end: int, *, op: str = "AllReduce"
    ) -> None:
        self.b.add_op(
            rank=rank, ts=end, comm=comm, seq=seq, op=op, nbytes=1 << 20, start=start, end=end
        )

    def split(self) -> tuple[rounds.Rounds, rounds.Rounds]:
        """(window, base) rounds: base ends before BASE_ROUNDS x 100 ms, window after."""
        ops = self.b.build().ops
        cut = BASE_ROUNDS * 100 * MS
        return rounds.build(ops[ops["end"] > cut]), rounds.build(ops[ops["end"] <= cut])


def _late_job(*, explained: bool = False, op: str = "AllReduce", skew: int = 0) -> _Ops:
    """Rank 2 enters the window's rounds 30 ms after the others (if ``explained``, because it
    was busy 30 ms in another communicator; otherwise because it computed longer). Rank 1's
    clock runs ``skew`` ns ahead (every time it writes is shifted)."""
    o = _Ops()
    for k in range(BASE_ROUNDS + 3):
        t = k * 100 * MS
        late = 30 * MS if k >= BASE_ROUNDS else 0
        end = t + late + 10 * MS
        for r in range(3):
            start = t + r * 100_000 + (late if r == 2 else 0)
            if explained and r == 2 and late:
                o.add(2, "0xb", k, t, t + late)
            shift = skew if r == 1 else 0
            o.add(r, "0xa", k, start + shift, end + shift, op=op)
    return o


def _late(o: _Ops) -> list[float]:
    win, base = o.split()
    p2p = {i for i in (o.b.build().string_index(n) for n in ("Send", "Recv")) if i is not None}
    out = signals.late_starts(
        win,
        base,
        RANKS,
        p2p_ops=p2p,
        late_min_ns=2 * MS,
        late_factor=3.0,
        explained_share=0.5,
    )
    return list(out.tolist())


def test_constant_late_starter_is_counted_every_round() -> None:
    # three late rounds; the window's first has no previous round inside the window, so its
    # own time is unknown and it cannot be judged
    assert _late(_late_job()) == [0.0, 0.0, 2.0]


def test_a_node_clock_offset_neither_hides_nor_fakes_a_late_start() -> None:
    # Issue 12 (background-compute at 50 ms steps): ``clocks`` left one node 32 ms off; read
    # from start times, every round's baseline arrival spread was that offset (35 ms), the
    # threshold 3x it, and the node that computed 46 ms longer each step was never late
    # enough. Durations are read on each rank's own clock: the others waited 30 ms for rank 2
    # whatever rank 1's clock says, and rank 1, punctual, is not late.
    assert _late(_late_job(skew=35 * MS)) == [0.0, 0.0, 2.0]
    assert _late(_late_job(skew=-35 * MS)) == [0.0, 0.0, 2.0]


def test_lateness_explained_by_waiting_elsewhere_is_not_counted() -> None:
    assert _late(_late_job(explained=True)) == [0.0, 0.0, 0.0]


def test_point_to_point_rounds_are_skipped() -> None:
    assert _late(_late_job(op="Send")) == [0.0, 0.0, 0.0]


def test_by_key_is_the_median_per_comm_op_bytes() -> None:
    win, base = _late_job().split()
    spread = signals.by_key(base, base.r_start_max - base.r_start_min)
    assert list(spread.values()) == [pytest.approx(200_000)]
    assert signals.by_key(rounds.build(_Ops().b.build().ops), base.r_tmax) == {}
    assert signals.key_of(win).shape == (len(win), 3)


def _transfer_job(slow_ms: int, *, rounds_in_window: int = 3, slow_from: int = 0) -> _Ops:
    """Communicators a = (0, 1), b = (1, 2); every op takes 10 ms, then ``slow_ms`` from the
    window's round ``slow_from`` on."""
    o = _Ops()
    for k in range(BASE_ROUNDS + rounds_in_window):
        t = k * 100 * MS
        d = (slow_ms if k >= BASE_ROUNDS + slow_from else 10) * MS
        for comm, members in (("0xa", (0, 1)), ("0xb", (1, 2))):
            for r in members:
                o.add(r, comm, k, t + 50 * MS * (comm == "0xb"), t + 50 * MS * (comm == "0xb") + d)
    return o


def test_transfer_slowdown_scores_the_member_shared_by_slowed_communicators() -> None:
    win, base = _transfer_job(40).split()
    score, notes = signals.transfer(win, base, RANKS, slowdown=1.5, min_excess_ns=1 * MS)
    assert score.tolist() == [2.0, 4.0, 2.0]  # log2(40 / 10) per slowed communicator
    assert len(notes) == 2 and all("4.0x" in n for n in notes)


def test_transfer_is_judged_on_the_windows_recent_rounds() -> None:
    # Issue 12 (nic-slow at 50 ms and 160 ms steps): a rank that rotated into the sample
    # stretches the window back to its last visit, before the onset; 4 of the window's 7
    # rounds are healthy, and their median is the healthy transfer time. The trigger saw the
    # slowdown at the window's end: the median of the rounds ending in its second half is it.
    win, base = _transfer_job(40, rounds_in_window=7, slow_from=4).split()
    score, _ = signals.transfer(win, base, RANKS, slowdown=1.5, min_excess_ns=1 * MS)
    assert not score.any()
    mid = (BASE_ROUNDS + 3) * 100 * MS + 60 * MS  # after window round 3 ended, before 4's
    score, notes = signals.transfer(
        win, base, RANKS, slowdown=1.5, min_excess_ns=1 * MS, recent_ns=mid
    )
    assert score.tolist() == [2.0, 4.0, 2.0] and all("4.0x" in n for n in notes)


def test_transfer_below_the_ratio_or_excess_is_ignored() -> None:
    win, base = _transfer_job(12).split()
    score, notes = signals.transfer(win, base, RANKS, slowdown=1.5, min_excess_ns=1 * MS)
    assert score.tolist() == [0.0, 0.0, 0.0] and notes == []
    win, base = _transfer_job(40).split()
    score, _ = signals.transfer(win, base, RANKS, slowdown=1.5, min_excess_ns=100 * MS)
    assert not score.any()


def _flow_bundle() -> tables.Bundle:
    b = tables.BundleBuilder(models.Job(world_size=4))
    backlog = {0: 0, 1: 0, 2: 1, 3: 9}  # sent - done of each rank's send to rank + 1
    for r, extra in backlog.items():
        flow = (0, (r + 1) % 4, tables.SEND, 16, 12, 12, -1, 12 - extra, -1, 0)
        b.add_state(
            rank=r, ts=S, comm="0xa", seq=1, op="AllReduce", nbytes=8, start=S, flows=[flow]
        )
    # seq 2: rank 1 has chunks ready the receiver could take and sent nothing for 0.5 s
    stuck = (0, 2, tables.SEND, 16, 6, 2, -1, 2, -1, 500 * MS)
    posted = (0, 1, tables.RECV, 16, -1, -1, 8, 2, 2, 500 * MS)
    b.add_state(
        rank=1, ts=2 * S, comm="0xa", seq=2, op="AllReduce", nbytes=8, start=S, flows=[stuck]
    )
    b.add_state(
        rank=2, ts=2 * S, comm="0xa", seq=2, op="AllReduce", nbytes=8, start=S, flows=[posted]
    )
    return b.build()


def test_flow_signals_slow_path_and_proxy_stall() -> None:
    bundle = _flow_bundle()
    ranks = np.arange(4, dtype=np.int64)
    fl = signals.flows(
        bundle,
        np.arange(len(bundle.states)),
        ranks,
        interval_ns=100 * MS,
        host_stall_ns=0.3 * S,
        min_chunks=4.0,
    )
    assert fl.slow_path.tolist() == [1.0, 0.0, 0.0, 1.0]  # hop 3 -> 0: both endpoints
    assert fl.host.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert fl.samples.tolist() == [1.0, 2.0, 2.0, 1.0]
    shorter = signals.flows(
        bundle,
        np.arange(len(bundle.states)),
        ranks,
        interval_ns=100 * MS,
        host_stall_ns=1.0 * S,
        min_chunks=10.0,
    )
    assert not shorter.host.any() and not shorter.slow_path.any()


def test_flow_signals_of_no_rows_are_zero() -> None:
    fl = signals.flows(
        _flow_bundle(),
        np.zeros(0, dtype=np.intp),
        RANKS,
        interval_ns=100 * MS,
        host_stall_ns=0.3 * S,
        min_chunks=4.0,
    )
    assert not fl.slow_path.any() and not fl.host.any() and not fl.samples.any()


def test_proxy_stall_still_counts_when_the_operation_is_sampled_again() -> None:
    b = tables.BundleBuilder(models.Job(world_size=3))
    samples = [
        (2 * S, (0, 2, tables.SEND, 16, 6, 2, -1, 2, -1, 500 * MS), (8, 2, 2, 500 * MS)),
        (2 * S + 100 * MS, (0, 2, tables.SEND, 16, 16, 16, -1, 16, -1, 0), (16, 16, 14, 0)),
    ]
    for ts, snd, (posted, done, consumed, idle) in samples:
        rcv = (0, 1, tables.RECV, 16, -1, -1, posted, done, consumed, idle)
        for rank, flow in ((1, snd), (2, rcv)):
            b.add_state(
                rank=rank, ts=ts, comm="0xa", seq=2, op="AllReduce", nbytes=8, start=S, flows=[flow]
            )
    bundle = b.build()
    ranks = np.arange(3, dtype=np.int64)

    def host(rows: np.ndarray) -> list[float]:
        fl = signals.flows(
            bundle, rows, ranks, interval_ns=100 * MS, host_stall_ns=0.3 * S, min_chunks=4.0
        )
        return list(fl.host.tolist())

    assert host(np.flatnonzero(bundle.states["ts"] == 2 * S)) == [0.0, 1.0, 0.0]
    assert host(np.arange(len(bundle.states))) == [0.0, 1.0, 0.0]


def test_proxy_stall_of_the_receiver_is_charged_to_the_receiver() -> None:
    # Rank 1 delivered 3 chunks to rank 2 (done = 3) and holds the 4th ready; rank 2's counters
    # froze at 2 arrived with a buffer posted: rank 2's proxy has not polled since, so its
    # "free buffer" is stale and rank 1 is only waiting for it (the one-box's proxy-delay).
    b = tables.BundleBuilder(models.Job(world_size=3))
    snd = (0, 2, tables.SEND, 16, 4, 3, -1, 3, -1, 500 * MS)
    rcv = (0, 1, tables.RECV, 16, -1, -1, 3, 2, 2, 500 * MS)
    for rank, flow in ((1, snd), (2, rcv)):
        b.add_state(
            rank=rank, ts=2 * S, comm="0xa", seq=2, op="AllReduce", nbytes=8, start=S, flows=[flow]
        )
    bundle = b.build()
    fl = signals.flows(
        bundle,
        np.arange(len(bundle.states)),
        np.arange(3, dtype=np.int64),
        interval_ns=100 * MS,
        host_stall_ns=0.3 * S,
        min_chunks=4.0,
    )
    assert fl.host.tolist() == [0.0, 0.0, 1.0]


def test_transfer_is_read_from_complete_rounds_and_charged_to_every_member() -> None:
    # Comm 0xa = (0, 1, 2); every op took 10 ms, then 40 ms (rounds 10 and 11). Round 12 is cut
    # by the instant judged: ranks 0 and 1 completed it after waiting 300 ms, rank 2 (the last
    # arriver, whose duration is the transfer) has not yet. That round says nothing about the
    # transfer; the slowed ring is charged to all three members.
    o = _Ops()
    for k in range(BASE_ROUNDS + 3):
        t = k * 100 * MS
        d = (40 if k >= BASE_ROUNDS else 10) * MS
        for r in (0, 1, 2):
            if k == BASE_ROUNDS + 2:
                if r < 2:
                    o.add(r, "0xa", k, t, t + 300 * MS)
                continue
            o.add(r, "0xa", k, t, t + d)
    win, base = o.split()
    score, notes = signals.transfer(win, base, RANKS, slowdown=1.5, min_excess_ns=1 * MS)
    assert score.tolist() == [2.0, 2.0, 2.0]
    assert notes == ["comm #0: transfer time (Tmin) 40.0 ms vs 10.0 ms before (4.0x)"]


def test_slow_hop_not_transmitted_with_buffers_posted_weighs_on_the_sender() -> None:
    # Ring 0 -> 1 -> 2 -> 3 -> 0. Hop 1 -> 2 holds 8 chunks sent-not-done and 6 ready-not-sent
    # while rank 2 has buffers posted: Mycroft Table 4 "not transmitted, receiver ready" is a
    # local (sender) cause; the receiver keeps half the weight.
    b = tables.BundleBuilder(models.Job(world_size=4))
    for r in range(4):
        peer = (r + 1) % 4
        snd = (
            (0, peer, tables.SEND, 64, 30, 24, -1, 16, -1, 0)
            if r == 1
            else (0, peer, tables.SEND, 64, 20, 20, -1, 20, -1, 0)
        )
        rcv = (0, (r - 1) % 4, tables.RECV, 64, -1, -1, 24, 16, 16, 0)
        b.add_state(
            rank=r,
            ts=S,
            comm="0xa",
            seq=1,
            op="AllReduce",
            nbytes=8,
            start=S // 2,
            flows=[snd, rcv],
        )
    bundle = b.build()
    fl = signals.flows(
        bundle,
        np.arange(len(bundle.states)),
        np.arange(4, dtype=np.int64),
        interval_ns=100 * MS,
        host_stall_ns=0.3 * S,
        min_chunks=4.0,
    )
    assert fl.slow_path.tolist() == [0.0, 1.0, 0.5, 0.0]


def _stall_caught_early(*, idle_ns: int, end_ns: int, sampled_again: bool = False) -> tables.Bundle:
    """Rank 1 holds 8 ready chunks for rank 2, which has buffers posted (a local stall of rank
    1's proxy); one sample at 2 s sees it frozen for ``idle_ns``; the Send completes at
    ``end_ns`` (its usual transfer: 1 ms). ``sampled_again``: a later sample (frozen no more)."""
    b = tables.BundleBuilder(models.Job(world_size=3))
    samples = [(2 * S, (0, 2, tables.SEND, 16, 8, 0, -1, 0, -1, idle_ns), (8, 0, 0, idle_ns))]
    if sampled_again:
        samples.append(
            (2 * S + 150 * MS, (0, 2, tables.SEND, 16, 16, 12, -1, 12, -1, 0), (16, 12, 12, 0))
        )
    for ts, snd, (posted, done, consumed, idle) in samples:
        rcv = (0, 1, tables.RECV, 16, -1, -1, posted, done, consumed, idle)
        for rank, flow in ((1, snd), (2, rcv)):
            b.add_state(
                rank=rank, ts=ts, comm="0xa", seq=2, op="Send", nbytes=8, start=S, flows=[flow]
            )
    b.add_op(rank=1, ts=end_ns, comm="0xa", seq=2, op="Send", nbytes=8, start=S, end=end_ns)
    return b.build()


def _host_with_catch_up(bundle: tables.Bundle, usual_ms: float = 1.0) -> list[float]:
    rows = np.arange(len(bundle.states))
    op = bundle.string_index("Send")
    assert op is not None
    usual = {(0, op, 8): usual_ms * MS}
    fl = signals.flows(
        bundle,
        rows,
        np.arange(3, dtype=np.int64),
        interval_ns=200 * MS,
        host_stall_ns=0.3 * S,
        min_chunks=4.0,
        catch_up_ns=signals.catch_up(bundle, rows, usual),
        usual_ns=usual,
    )
    return list(fl.host.tolist())


def test_a_proxy_stall_is_measured_to_its_catching_up_not_to_the_sample() -> None:
    # At 200 ms sampling one sample catches a 0.37 s stall 0.21 s in (the sampling phase); the
    # Send then completes 0.16 s later, 1 ms (its usual transfer) after the proxy resumed: the
    # stall lasted 0.21 + 0.16 - 0.001 s >= host_stall (0.3 s), whatever the interval.
    caught = _stall_caught_early(idle_ns=210 * MS, end_ns=2 * S + 160 * MS)
    assert _host_with_catch_up(caught) == [0.0, 1.0, 0.0]
    # The sample alone (no catch-up) saw 0.21 s: below host_stall, the stall went uncounted.
    fl = signals.flows(
        caught,
        np.arange(len(caught.states)),
        np.arange(3, dtype=np.int64),
        interval_ns=200 * MS,
        host_stall_ns=0.3 * S,
        min_chunks=4.0,
    )
    assert not fl.host.any()
    # A stall that ends at once is short whatever the sample: 0.21 s + 0.05 s - 1 ms.
    assert _host_with_catch_up(_stall_caught_early(idle_ns=210 * MS, end_ns=2 * S + 50 * MS)) == [
        0.0,
        0.0,
        0.0,
    ]


def test_catch_up_needs_the_last_sample_and_a_frozen_flow() -> None:
    # A later sample of the operation speaks for itself (it moved again): no catch-up from
    # the 2 s one; the later one's flow moved (idle 0), so its catch-up is not applied.
    again = _stall_caught_early(idle_ns=210 * MS, end_ns=2 * S + 300 * MS, sampled_again=True)
    op = again.string_index("Send")
    assert op is not None
    extra = signals.catch_up(again, np.arange(len(again.states)), {(0, op, 8): MS})
    assert extra[again.states["ts"] == 2 * S].tolist() == [0, 0]
    assert _host_with_catch_up(again) == [0.0, 0.0, 0.0]
    # A flow that last moved 20 ms ago, in an operation that usually takes 50 ms, is moving
    # slowly (a slow NIC), not stalled: its late completion is slow transfer, not a catch-up.
    slow = _stall_caught_early(idle_ns=20 * MS, end_ns=2 * S + 400 * MS)
    assert _host_with_catch_up(slow, usual_ms=50.0) == [0.0, 0.0, 0.0]
