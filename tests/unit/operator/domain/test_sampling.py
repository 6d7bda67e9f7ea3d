"""Sampling of a live job: >= 1 rank per DP group, <= the budget, spread over nodes, present
ranks only, chosen again exactly when the placement or the groups change."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from collscope.operator.domain import groups, ids, sampling

R = ids.Rank


def placement(world: int, per_node: int, *, gen: int = 0) -> dict[ids.Rank, sampling.Placement]:
    return {
        R(r): sampling.Placement(ids.PodUID(f"uid-{r}-{gen}"), ids.NodeName(f"n{r // per_node}"))
        for r in range(world)
    }


def test_one_per_dp_group_spread_over_nodes() -> None:
    # 64 ranks, 8 per node, tp=8 inside a node: 8 DP groups of 8 ranks, each across 8 nodes.
    jg = groups.declared(groups.parse("tp=8,pp=1,dp=8"), 64)
    where = placement(64, 8)
    chosen = sampling.choose(where, jg, max_ranks=8)
    assert len(chosen) == 8
    for g in jg.dp:
        assert any(r in g for r in chosen)
    assert len({where[r].node for r in chosen}) == 8  # one per node: spread


def test_budget_caps_and_more_groups_than_budget() -> None:
    jg = groups.declared(groups.parse("tp=1,pp=1,dp=4"), 4)  # one DP group of 4
    assert len(sampling.choose(placement(4, 1), jg, max_ranks=10)) == 4
    many = groups.declared(groups.parse("tp=32,dp=2"), 64)  # 32 DP groups
    chosen = sampling.choose(placement(64, 8), many, max_ranks=10)
    assert len(chosen) == 10
    assert max(Counter(r // 8 for r in chosen).values()) <= 2  # spread over the 8 nodes


def test_absent_ranks_are_never_sampled() -> None:
    jg = groups.declared(groups.parse("tp=2,dp=4"), 8)
    where = placement(8, 2)
    gone = {R(0), R(2), R(4)}
    present = {r: p for r, p in where.items() if r not in gone}
    chosen = sampling.choose(present, jg, max_ranks=10)
    assert gone.isdisjoint(chosen)
    assert set(chosen) == set(present)


def test_no_groups_spreads_over_present_ranks() -> None:
    jg = groups.JobGroups("inferred", (), (), (), ())
    where = placement(32, 8)
    chosen = sampling.choose(where, jg, max_ranks=4)
    assert len(chosen) == 4 and len({where[r].node for r in chosen}) == 4


def test_nothing_present_or_no_budget() -> None:
    jg = groups.declared(groups.parse("dp=2"), 2)
    assert sampling.choose({}, jg) == ()
    assert sampling.choose(placement(2, 1), jg, max_ranks=0) == ()


def test_sampler_keeps_its_choice_until_pods_change() -> None:
    jg = groups.declared(groups.parse("tp=4,dp=4"), 16)
    sampler = sampling.Sampler(max_ranks=4)
    first, fresh = sampler.update(placement(16, 4), jg)
    assert fresh
    again, fresh = sampler.update(placement(16, 4), jg)
    assert not fresh and again == first
    moved = placement(16, 4)
    moved[first.ranks[0]] = sampling.Placement(ids.PodUID("new"), ids.NodeName("n9"))
    third, fresh = sampler.update(moved, jg)
    assert fresh and third.fingerprint != first.fingerprint
    fewer = {r: p for r, p in placement(16, 4).items() if r != first.ranks[0]}
    fourth, fresh = sampler.update(fewer, jg)
    assert fresh and first.ranks[0] not in fourth.ranks


def test_groups_change_resamples() -> None:
    sampler = sampling.Sampler()
    where = placement(8, 4)
    sampler.update(where, groups.declared(groups.parse("tp=4,dp=2"), 8))
    _, fresh = sampler.update(where, groups.declared(groups.parse("tp=2,dp=4"), 8))
    assert fresh


@settings(max_examples=60, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    dp=st.integers(1, 12),
    pp=st.integers(1, 3),
    per_node=st.sampled_from([1, 4, 8]),
    budget=st.integers(1, 12),
    missing=st.sets(st.integers(0, 300), max_size=20),
)
def test_sample_invariants(
    *, tp: int, dp: int, pp: int, per_node: int, budget: int, missing: set[int]
) -> None:
    world = tp * dp * pp
    jg = groups.declared(groups.parse(f"tp={tp},pp={pp},dp={dp}"), world)
    where = {r: p for r, p in placement(world, per_node).items() if r not in missing}
    chosen = sampling.choose(where, jg, max_ranks=budget)
    assert len(chosen) <= budget
    assert len(set(chosen)) == len(chosen) and set(chosen) <= set(where)
    live_groups = [g for g in jg.dp if any(r in where for r in g)]
    if len(live_groups) <= budget:
        assert all(any(r in g for r in chosen) for g in live_groups)


@settings(max_examples=60, deadline=None)
@given(
    world=st.integers(1, 64),
    per_node=st.sampled_from([1, 2, 4, 8]),
    budget=st.integers(1, 12),
    missing=st.sets(st.integers(0, 63), max_size=20),
)
def test_spread_without_groups_uses_distinct_nodes_first(
    world: int, per_node: int, budget: int, missing: set[int]
) -> None:
    where = {r: p for r, p in placement(world, per_node).items() if r not in missing}
    jg = groups.JobGroups("inferred", (), (), (), ())
    chosen = sampling.choose(where, jg, max_ranks=budget)
    assert len(chosen) == min(budget, len(where))
    nodes = {p.node for p in where.values()}
    assert len({where[r].node for r in chosen}) == min(len(chosen), len(nodes))


def test_more_dp_groups_than_the_budget_rotate() -> None:
    # 32 DP groups of 2 (tp=32, dp=2) on 8 nodes, budget 10: 2 anchors and 8 slots visiting
    # the other 30 groups, 3 ticks each: every group watched within ceil(32 / 10) * 3 = 12
    # ticks; choose() is the set of the first tick.
    jg = groups.declared(groups.parse("tp=32,dp=2"), 64)
    where = placement(64, 8)
    plan = sampling.plan(where, jg, max_ranks=10)
    assert len(plan.anchors) == 2 and plan.slots == 8 and plan.period_ticks == 12
    assert sampling.choose(where, jg, max_ranks=10) == plan.at(0)
    seen: set[int] = set()
    for t in range(12):
        watched = plan.at(t)
        assert len(watched) == 10 and set(plan.anchors) <= set(watched)
        seen |= {i for i, g in enumerate(jg.dp) if set(g) & set(watched)}
    assert seen == set(range(32))
    sample, fresh = sampling.Sampler(max_ranks=10).update(where, jg)
    assert fresh and sample.plan == plan and sample.at(3) == plan.at(3)
