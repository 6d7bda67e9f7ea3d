"""Circuit breaker on cordons: caps per window and per cluster share, trips and stays open until
a human resets it, survives serialisation; checked on fixed cases and on random sequences."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collscope.operator import errors
from collscope.operator.domain import breaker, ids

HOUR = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def status_of(b: breaker.Breaker) -> breaker.State:
    """Through a call, so the type checker does not narrow ``status`` across actions."""
    return b.status


def node(i: int) -> ids.NodeName:
    return ids.NodeName(f"n{i}")


def test_third_cordon_in_an_hour_trips() -> None:
    clock = Clock()
    b = breaker.Breaker(breaker.BreakerSettings(), clock)
    assert b.acquire(node(1), 100).allowed
    clock.now += 60
    assert b.acquire(node(2), 100).allowed
    clock.now += 60
    third = b.acquire(node(3), 100)
    assert not third.allowed and "2 cordons within 3600 s" in third.reason
    assert status_of(b) == "Open" and "n3" in b.state.reason
    clock.now += 2 * HOUR  # time alone does not close it
    assert not b.acquire(node(3), 100).allowed
    b.reset("alice")
    assert status_of(b) == "Closed" and b.state.reset_by == "alice"
    assert b.acquire(node(3), 100).allowed


def test_history_survives_a_reset() -> None:
    clock = Clock()
    b = breaker.Breaker(breaker.BreakerSettings(), clock)
    b.acquire(node(1), 100)
    b.acquire(node(2), 100)
    b.acquire(node(3), 100)
    b.reset("bob")
    assert not b.acquire(node(3), 100).allowed  # still 2 in this hour
    assert status_of(b) == "Open"


def test_fraction_cap() -> None:
    clock = Clock()
    b = breaker.Breaker(breaker.BreakerSettings(max_cordons=100), clock)
    assert breaker.BreakerSettings().node_cap(100) == 5
    assert breaker.BreakerSettings().node_cap(10) == 1  # min_cap_nodes
    assert breaker.BreakerSettings(min_cap_nodes=0).node_cap(10) == 0
    for i in range(5):
        assert b.acquire(node(i), 100).allowed
    v = b.acquire(node(9), 100)
    assert not v.allowed and "5 of 100 nodes already held (cap 5)" in v.reason
    b.reset("carol")
    b.release(node(0))
    assert b.acquire(node(9), 100).allowed


def test_already_held_node_is_not_a_new_cordon() -> None:
    b = breaker.Breaker(breaker.BreakerSettings(max_cordons=1), Clock())
    assert b.acquire(node(1), 100).allowed
    again = b.acquire(node(1), 100)
    assert again.allowed and "already held" in again.reason
    assert len(b.state.cordons) == 1


def test_check_changes_nothing() -> None:
    b = breaker.Breaker(breaker.BreakerSettings(max_cordons=0), Clock())
    assert not b.check(node(1), 100).allowed
    assert status_of(b) == "Closed" and b.state.cordons == []


def test_state_round_trips_through_json() -> None:
    clock = Clock()
    b = breaker.Breaker(breaker.BreakerSettings(), clock)
    for i in range(3):
        b.acquire(node(i), 100)
    text = json.dumps(b.state.to_dict())
    restored = breaker.BreakerState.from_dict(json.loads(text))
    assert restored == b.state
    b2 = breaker.Breaker(breaker.BreakerSettings(), clock, restored)
    assert b2.status == "Open" and not b2.acquire(node(7), 100).allowed


def test_unreadable_state_and_bad_settings() -> None:
    with pytest.raises(errors.PolicyError, match="unreadable breaker state"):
        breaker.BreakerState.from_dict({"cordons": [{"node": "a"}], "held": []})
    with pytest.raises(errors.PolicyError):
        breaker.BreakerSettings(max_fraction=1.5)
    with pytest.raises(errors.PolicyError):
        breaker.BreakerSettings(window_s=0)


Step = tuple[str, int]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("advance"), st.integers(0, 4000)),
        st.tuples(st.just("acquire"), st.integers(0, 30)),
        st.tuples(st.just("release"), st.integers(0, 30)),
        st.tuples(st.just("reset"), st.just(0)),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(
    seq=steps,
    max_cordons=st.integers(0, 4),
    total=st.integers(1, 200),
    fraction=st.sampled_from([0.0, 0.05, 0.2, 0.5]),
)
def test_caps_hold_under_any_sequence(
    seq: list[Step], max_cordons: int, total: int, fraction: float
) -> None:
    cfg = breaker.BreakerSettings(max_cordons=max_cordons, max_fraction=fraction)
    clock = Clock()
    b = breaker.Breaker(cfg, clock)
    granted: list[float] = []  # times of new cordons the breaker allowed
    for action, arg in seq:
        if action == "advance":
            clock.now += arg
        elif action == "acquire":
            was_held = node(arg) in b.state.held
            was_open = status_of(b) == "Open"
            verdict = b.acquire(node(arg), total)
            if was_open:
                assert not verdict.allowed
            if verdict.allowed and not was_held:
                granted.append(clock.now)
            if not verdict.allowed:
                assert status_of(b) == "Open"
        elif action == "release":
            b.release(node(arg))
        else:
            b.reset("human")
        in_window = [t for t in granted if t > clock.now - cfg.window_s]
        assert len(in_window) <= max_cordons
        assert len(b.state.held) <= cfg.node_cap(total)
        assert breaker.BreakerState.from_dict(json.loads(json.dumps(b.state.to_dict()))) == b.state


def test_summary_is_the_visible_state() -> None:
    clock = Clock()
    b = breaker.Breaker(breaker.BreakerSettings(), clock)
    b.acquire(node(1), 40)
    assert b.summary(40) == {
        "state": "Closed", "reason": "", "trippedAtS": None, "recentCordons": 1,
        "maxCordons": 2, "windowS": 3600.0, "held": ["n1"], "nodeCap": 2,
    }  # fmt: skip
    b.acquire(node(2), 40)
    b.acquire(node(3), 40)
    s = b.summary(40)
    assert s["state"] == "Open" and s["trippedAtS"] == clock.now and "n3" in s["reason"]
    json.dumps(s)


def test_held_follows_the_nodes_marks() -> None:
    """Issue 14: a node released by hand no longer counts, and a node still marked after a
    restart (a breaker state that lost it) counts again; the cordon history stays."""
    clock = Clock()
    cfg = breaker.BreakerSettings(max_cordons=10, max_fraction=0.0, min_cap_nodes=1)
    b = breaker.Breaker(cfg, clock)
    assert b.acquire(node(1), 100).allowed
    assert not b.check(node(2), 100).allowed  # one node held at a time
    b.sync_held(set())  # someone removed n1's marks by hand
    assert b.check(node(2), 100).allowed
    assert len(b.recent()) == 1
    fresh = breaker.Breaker(cfg, clock)  # a restart with no state: the marks say n1 is held
    fresh.sync_held({node(1)})
    assert fresh.summary(100)["held"] == ["n1"]
    assert not fresh.check(node(2), 100).allowed
