"""The rotating sample: every DP group watched within the stated bound, anchors fixed, and a
slowdown confined to a DP group outside Mycroft's fixed sample found by the replay."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import engine, groups, rotation
from collscope.operator.simulator import config, truth
from collscope.operator.simulator import engine as simulator


def _declared(tp: int, pp: int, dp: int, per_node: int = 8) -> tuple[groups.Groups, models.Job]:
    """A job with a declared layout and no records: groups come from the layout alone."""
    world = tp * pp * dp
    job = models.Job(
        world_size=world,
        parallelism=models.Parallelism(tp=tp, pp=pp, dp=dp),
        ranks=[models.RankInfo(rank=r, node=f"n{r // per_node}") for r in range(world)],
    )
    return groups.build(tables.BundleBuilder(job).build()), job


def test_few_groups_do_not_rotate() -> None:
    # 16 ranks TP8 x DP2: 8 DP groups fit the budget of 10; the plan is Mycroft's sample.
    grp, job = _declared(8, 1, 2)
    p = rotation.plan(grp, job, 10)
    assert p.rotation == () and p.anchors == groups.sample_ranks(grp, job, 10)
    assert p.period_ticks == 1 and all(p.at(t) == p.anchors for t in range(7))
    assert p.describe() == f"sampled ranks {list(p.anchors)}"


def test_sixteen_groups_rotate_around_four_anchors() -> None:
    # 64 ranks TP8 x PP2 x DP4 (bench/accuracy.py's 64-rank shape): 16 DP groups of 4.
    grp, job = _declared(8, 2, 4)
    dpg = groups.dp_groups(grp, job)
    p = rotation.plan(grp, job, 10, dwell_ticks=3)
    assert len(dpg) == 16 and p.dp_groups == 16
    assert p.anchors == (0, 9, 32, 41)  # the first four picks of the spread order
    assert p.slots == 6 and len(p.rotation) == 12 and p.period_ticks == 6
    assert p.at(0) == (0, 4, 9, 18, 27, 32, 36, 41, 50, 59)  # = Mycroft's fixed sample
    assert p.at(3) == (0, 9, 13, 22, 31, 32, 41, 45, 54, 63)
    assert p.at(0) == p.at(2) == p.at(6) and p.at(3) == p.at(5) == p.at(9)
    assert all(len(p.at(t)) == 10 for t in range(12))  # the budget, never more
    # One rank per DP group across anchors and rotation, spread: every group is covered.
    assert sorted(group_of(dpg, r) for r in p.ranks) == list(range(16))
    assert rotation.coverage_ticks(p, dpg) == 6
    assert groups.sample_ranks(grp, job, 10) == p.at(0)


def group_of(dpg: list[tuple[int, ...]], rank: int) -> int:
    return next(i for i, g in enumerate(dpg) if rank in g)


@pytest.mark.parametrize(
    ("ngroups", "anchors"), [(11, 9), (16, 4), (20, 0), (32, 2), (64, 1), (128, 0), (2048, 0)]
)
def test_most_anchors_that_keep_the_fewest_phases(ngroups: int, anchors: int) -> None:
    assert rotation.most_anchors(ngroups, 10) == anchors
    phases = math.ceil((ngroups - anchors) / (10 - anchors))
    assert phases == math.ceil(ngroups / 10)
    if anchors + 1 < 10:
        assert math.ceil((ngroups - anchors - 1) / (10 - anchors - 1)) > phases


@settings(max_examples=40, deadline=None)
@given(
    ngroups=st.integers(1, 80),
    budget=st.integers(1, 12),
    dwell=st.integers(1, 4),
)
def test_measured_coverage_is_the_stated_bound(ngroups: int, budget: int, dwell: int) -> None:
    # ngroups DP groups of 2 ranks (TP = ngroups, DP = 2), 4 ranks a node.
    grp, job = _declared(ngroups, 1, 2, per_node=4)
    dpg = groups.dp_groups(grp, job)
    p = rotation.plan(grp, job, budget, dwell_ticks=dwell)
    assert all(len(p.at(t)) <= budget for t in range(2 * p.period_ticks + 1))
    if ngroups <= budget:
        assert p.rotation == () and rotation.coverage_ticks(p, dpg) == 1
        return
    assert p.period_ticks == math.ceil(ngroups / budget) * dwell
    assert rotation.coverage_ticks(p, dpg) == p.period_ticks
    # ... and again from any tick: a window of period + dwell - 1 ticks holds a whole visit.
    start = p.period_ticks + 1
    runs = [0] * len(dpg)
    best = [0] * len(dpg)
    for t in range(start, start + p.period_ticks + dwell - 1):
        seen = {group_of(dpg, r) for r in p.at(t)}
        runs = [n + 1 if gi in seen else 0 for gi, n in enumerate(runs)]
        best = [max(b, n) for b, n in zip(best, runs, strict=True)]
    assert min(best) >= dwell


def test_last_seen_is_where_a_rotated_in_slowdown_may_have_begun() -> None:
    grp, job = _declared(8, 2, 4)
    p = rotation.plan(grp, job, 10, dwell_ticks=3)
    # Rank 54 is watched at ticks 3-5 and 9-11: at tick 10 it was last seen at tick 5.
    assert [t for t in range(12) if 54 in p.at(t)] == [3, 4, 5, 9, 10, 11]
    assert p.last_seen(10, (54,)) == 5
    assert p.last_seen(4, (54,)) == 3 - p.period_ticks  # never watched before: one period back
    assert p.last_seen(10, (0,)) is None  # an anchor: the trigger's own start stands
    assert p.last_seen(10, (0, 54)) is None
    assert p.last_seen(10, (54, 59)) == 5  # 59: ticks 6-8, and before that 0-2
    assert rotation.fixed((3, 1)).last_seen(5, (1,)) is None


def test_fixed_plan_never_rotates() -> None:
    p = rotation.fixed((5, 2, 2))
    assert p.anchors == (2, 5) and p.ranks == (2, 5) and p.at(0) == p.at(99) == (2, 5)


def test_a_slowdown_outside_the_fixed_sample_is_found() -> None:
    # bench/accuracy.py's "nic-slow 64 ring seed 4": the NIC of rank 54 at 1/8 bandwidth from
    # 5 s slows only its DP group (38, 46, 54, 62), which Mycroft's fixed sample of ten ranks
    # never watches (at(0) above): "no anomaly" in 10 s. Rotation watches rank 54 at ticks 3-5
    # (the onset) and 9-11: the trigger fires on tick 11 (12 s), 7 s after the onset, within
    # the bound period + dwell - 2 = 7 ticks after the first slow tick; the run lasts 15 s.
    tp, pp, dp = config.default_parallelism(64)
    cfg = config.SimConfig(
        ranks=64, tp=tp, pp=pp, dp=dp, algo="ring", dp_mode="rs-ag", duration_s=15.0,
        fault=truth.Fault.from_name("nic-slow"), seed=4,
    )  # fmt: skip
    sim = simulator.simulate(cfg)
    assert sim.truth.culprit_ranks == [54]
    d = engine.diagnose(sim.bundle)
    assert d.anomaly and d.category == "slow.network"
    assert d.culprits[0].rank == 54
    assert d.detected_at is not None and sim.truth.onset is not None
    assert (d.detected_at - sim.truth.onset) / 1e9 == pytest.approx(7.0, abs=0.01)
    fixed = engine.diagnose(
        sim.bundle, sampled=groups.sample_ranks(groups.build(sim.bundle), sim.bundle.job)
    )
    assert not fixed.anomaly
