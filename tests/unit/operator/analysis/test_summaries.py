"""``analysis.summaries.Summaries``: every rank's ``/v1/summaries`` row at a tick, as the agent's
own ``summary.summarize`` makes it from the records its node holds then."""

from __future__ import annotations

import pytest

from collscope.nodeagent import summary
from collscope.operator.analysis import summaries, view

from .conftest import DURATION_NS, HISTORY, PERIOD_NS, RANKS, STATE_NS, T0, Ring

S = 1_000_000_000


def test_rows_are_the_agents_summaries_of_every_rank_tick_by_tick(ring: Ring) -> None:
    bundle = ring.build("network")
    rows_of = summaries.Summaries()
    rows_of(bundle, T0)
    assert rows_of.interval_ns == STATE_NS  # measured in the bundle
    ticks = [*range(T0 + S // 2, ring.end, S // 2), ring.end]
    for t in ticks:
        got = rows_of(bundle, t)
        # Grouped by node (n0: ranks 0, 1; n1: 2, 3), each rank once, in rank order here.
        assert [r.rank for r in got] == list(range(RANKS))
        # The agent's window plus two sampling periods (the ring samples every 100 ms).
        cut = view.select(bundle, since_ns=t - S - 2 * STATE_NS, until_ns=t)
        for row in got:
            done = bundle.ops[(bundle.ops["rank"] == row.rank) & (bundle.ops["ts"] <= t)]
            want = summary.summarize(
                cut,
                row.rank,
                now_ns=t,
                window_s=summaries.WINDOW_S,
                sampled_ns=None,
                health="live",
                last_completion_ns=int(done["end"].max()) if len(done) else None,
            )
            assert row == want


def test_the_latest_completion_is_held_past_the_window(ring: Ring) -> None:
    # 3 s into the hang nothing completed within the 1 s window; the row still says when the
    # rank last completed (the agent's Window.last_completion), and what it has in flight.
    bundle = ring.build("network")
    rows_of = summaries.Summaries()
    for t in range(T0 + S, ring.end, S):
        rows_of(bundle, t)
    row = rows_of(bundle, ring.end)[0]
    assert row.completed_ops == 0
    assert row.last_completion_ns == T0 + (HISTORY - 1) * PERIOD_NS + DURATION_NS
    assert [op.seq for op in row.in_flight] == [HISTORY]
    assert row.in_flight[0].stalled_ns >= ring.end - ring.stall_start - PERIOD_NS


def test_the_state_slack_is_two_sampling_periods(ring: Ring) -> None:
    # 1.5 s after the last state sample: past 1 s + 2 x 100 ms, within 1 s + 2 x 1 s.
    bundle = ring.build("network")
    t = ring.end + 3 * S // 2
    assert summaries.Summaries()(bundle, t)[0].in_flight == []
    slow = summaries.Summaries(interval_ns=S)(bundle, t)[0].in_flight
    assert [op.seq for op in slow] == [HISTORY]


def test_ticks_must_come_in_order(ring: Ring) -> None:
    bundle = ring.build("healthy")
    rows_of = summaries.Summaries()
    rows_of(bundle, T0 + 2 * S)
    rows_of(bundle, T0 + 2 * S)  # the same tick again is fine (the replay's last tick)
    with pytest.raises(ValueError, match="before the previous one"):
        rows_of(bundle, T0 + S)
