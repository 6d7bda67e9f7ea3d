"""The job-wide hang check (analysis/jobwide.py): every rank's summary, each tick."""

from __future__ import annotations

from collscope.nodeagent import api
from collscope.operator.analysis import jobwide

NS = 1_000_000_000
MS = 1_000_000
FLOOR = 1_200 * MS  # the derived floor at 100 ms sampling


def _op(
    comm: str, seq: int, start: int, t: int, idle: int, *, op: str = "AllReduce"
) -> api.InFlightOp:
    sampled = t - 50 * MS  # the latest sample, half an interval old
    return api.InFlightOp(
        comm=comm, seq=seq, op=op, bytes=1 << 20, start_ns=start, sampled_ns=sampled,
        idle_ns=idle, stalled_ns=idle + (t - sampled), flows=2,
    )  # fmt: skip


def _row(
    rank: int, t: int, ops: list[api.InFlightOp], last: int | None, comms: tuple[str, ...] = ()
) -> api.TriggerSummary:
    return api.TriggerSummary(
        rank=rank, window_s=1.0, from_ns=t - NS, to_ns=t, health="live", completed_ops=0,
        completed_bytes=0, throughput_bytes_per_s=0.0, mean_op_interval_ns=None,
        last_completion_ns=last,
        comms=[api.CommActivity(comm=c, ops=1, bytes=0, mean_interval_ns=None) for c in comms],
        in_flight=ops,
    )  # fmt: skip


def _limits(known: dict[str, int], period_ns: int | None = NS // 2) -> jobwide.Limits:
    return jobwide.Limits(
        floor_ns=FLOOR, k=4.0, interval_ns=100 * MS, max_age_intervals=2.0,
        period_ns=period_ns, periods=2.0, min_ops=8, barrier_max_bytes=4,
        known=known.get,
    )  # fmt: skip


def test_an_unsampled_ranks_stall_fires_at_its_communicators_threshold() -> None:
    """Rank 5 (not sampled) stops inside an AllReduce of comm dp whose trigger threshold is
    1.25 s: nothing at a stall of 1.1 s, a hit once past 1.25 s, at stall start + threshold."""
    jw = jobwide.JobWide()
    lim = _limits({"dp": 1_250 * MS})
    t0 = 100 * NS
    for k in range(3):  # the comm is watched for two steps of 0.5 s first
        t = t0 + k * NS
        jw.update([_row(5, t, [], last=t - 10 * MS, comms=("dp",))], t, lim)
    start = t0 + 3 * NS  # it enters seq 7 and nothing moves from then on
    last = start - 5 * MS
    for stall_ms, fires in ((1_100, False), (2_100, True)):
        t = start + stall_ms * MS
        op = _op("dp", 7, start, t, idle=(t - 50 * MS) - start)
        hits = jw.update([_row(5, t, [op], last=last, comms=("dp",))], t, lim)
        assert bool(hits) is fires
    (hit,) = hits
    assert (hit.rank, hit.comm, hit.seq, hit.source) == (5, "dp", 7, "known")
    assert hit.since_ns == start and hit.at_ns == start + 1_250 * MS
    # a sampled rank is the trigger's: skipped; and a rank that completed work since is not hung
    assert jw.update([_row(5, t, [op], last=last)], t, lim, skip={5}) == []
    assert jw.update([_row(5, t, [op], last=start + MS)], t, lim) == []


def test_a_long_legit_wait_of_an_unknown_communicator_never_fires() -> None:
    """A pipeline receive of an unsampled stage (comm pp, no sampled member: no trigger
    threshold) waits 5 s of every 10 s step, then completes. While fewer than min_ops such
    waits were seen nothing is judged; after, the threshold is above the wait (k x the longest
    seen): 20 steps, ticks every second, never a hit. A receive that never completes fires
    once past that threshold."""
    jw = jobwide.JobWide()
    lim = _limits({}, period_ns=10 * NS)
    seq, hits = 0, []
    for step in range(20):
        s0 = step * 10 * NS
        start = s0 + 4 * NS  # posted at 4 s into the step, data arrives at 9 s
        for k in range(10):
            t = s0 + k * NS + 300 * MS  # ticks out of phase with the step
            if start < t < start + 5 * NS:
                op = _op("pp", seq, start, t, idle=(t - 50 * MS) - start, op="Recv")
                row = _row(3, t, [op], last=start - MS, comms=("pp",))
            else:
                done = start + 5 * NS if t >= start + 5 * NS else start - 10 * NS + 5 * NS
                row = _row(3, t, [], last=done, comms=("pp",))
            hits += jw.update([row], t, lim)
        seq += 1
    assert hits == []
    got = jw.threshold_ns(_op("pp", seq, 0, 0, 0, op="Recv"), 200 * NS, lim)
    assert got is not None and got[1] == "fallback" and got[0] >= 4 * 4 * NS
    start = 200 * NS + 300 * MS  # the next receive never completes
    for k in range(1, 31):
        t = start + k * NS
        op = _op("pp", seq, start, t, idle=(t - 50 * MS) - start, op="Recv")
        hits = jw.update([_row(3, t, [op], last=start - MS)], t, lim)
        if hits:
            break
    assert [h.rank for h in hits] == [3] and hits[0].threshold_ns == got[0]
    assert hits[0].stalled_ns > got[0] >= hits[0].stalled_ns - NS


def test_nothing_is_judged_before_the_step_is_known_or_from_a_stale_sample() -> None:
    jw = jobwide.JobWide()
    t, start = 50 * NS, 40 * NS
    op = _op("dp", 1, start, t, idle=(t - 50 * MS) - start)
    assert jw.update([_row(1, t, [op], last=None, comms=("dp",))], t, _limits({}, None)) == []
    lim = _limits({"dp": FLOOR})
    later = t + 5 * NS
    assert jw.update([_row(1, later, [op], last=None)], later, lim) == []  # 5 s old sample
