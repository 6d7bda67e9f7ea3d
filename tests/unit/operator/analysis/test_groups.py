"""Communicators and their kinds from comm records; Mycroft §4.3 rank sampling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import groups

S = 1_000_000_000


def _job(world: int, *, per_node: int | None, par: models.Parallelism | None) -> models.Job:
    ranks = [
        models.RankInfo(rank=r, node=None if per_node is None else f"n{r // per_node}")
        for r in range(world)
    ]
    return models.Job(world_size=world, parallelism=par, ranks=ranks)


def _bundle(
    job: models.Job,
    comms: Mapping[str, Sequence[int]],
    ops: Mapping[str, Sequence[str]] | None = None,
) -> tables.Bundle:
    """``comms``: id -> members in comm_rank order; ``ops``: id -> op names issued on it."""
    b = tables.BundleBuilder(job)
    for cid, members in comms.items():
        for i, r in enumerate(members):
            b.add_comm(rank=r, ts=S, comm=cid, comm_rank=i, nranks=len(members), name=cid)
    for cid, names in (ops or {}).items():
        for seq, name in enumerate(names):
            r = comms[cid][seq % len(comms[cid])]
            b.add_op(
                rank=r, ts=2 * S + seq, comm=cid, seq=seq, op=name, nbytes=8, start=2 * S, end=2 * S
            )
    return b.build()


def _declared(tp: int, pp: int, dp: int, per_node: int | None = 4) -> models.Job:
    par = models.Parallelism(tp=tp, pp=pp, dp=dp)
    return _job(tp * pp * dp, per_node=per_node, par=par)


def _megatron_comms(tp: int, pp: int, dp: int) -> dict[str, list[int]]:
    """TP, DP and PP communicators of the declared layout tp-cp-ep-dp-pp."""
    world = tp * pp * dp

    def rank(t: int, d: int, p: int) -> int:
        return t + tp * (d + dp * p)

    out: dict[str, list[int]] = {}
    for p in range(pp):
        for d in range(dp):
            out[f"0x1{p}{d}"] = [rank(t, d, p) for t in range(tp)]
        for t in range(tp):
            out[f"0x2{p}{t}"] = [rank(t, d, p) for d in range(dp)]
    for d in range(dp):
        for t in range(tp):
            out[f"0x3{d}{t}"] = [rank(t, d, p) for p in range(pp)]
    out["0xf"] = list(range(world))
    return out


def test_coordinates_fastest_varying_first() -> None:
    par = models.Parallelism(tp=2, pp=2, dp=2)
    c = groups.coordinates(par, [0, 1, 2, 5, 7])
    assert c["tp"].tolist() == [0, 1, 0, 1, 1]
    assert c["dp"].tolist() == [0, 0, 1, 0, 1]
    assert c["pp"].tolist() == [0, 0, 0, 1, 1]
    assert c["cp"].tolist() == [0] * 5


def test_declared_layout_gives_each_communicator_its_kind() -> None:
    b = _bundle(_declared(2, 2, 2), _megatron_comms(2, 2, 2))
    g = groups.build(b)
    kinds = {c.comm_id: c.kind for c in g.comms}
    assert {k for cid, k in kinds.items() if cid.startswith("0x1")} == {"tp"}
    assert {k for cid, k in kinds.items() if cid.startswith("0x2")} == {"dp"}
    assert {k for cid, k in kinds.items() if cid.startswith("0x3")} == {"pp"}
    assert kinds["0xf"] == "other"  # every dimension varies
    assert len(g.of_kind("tp")) == len(g.of_kind("dp")) == len(g.of_kind("pp")) == 4


def test_members_in_comm_rank_order_and_lookups() -> None:
    b = _bundle(_job(4, per_node=2, par=None), {"0xa": [3, 1, 2, 0]})
    g = groups.build(b)
    (c,) = g.comms
    assert c.members == (3, 1, 2, 0) and c.comm_id == "0xa" and c.name == "0xa"
    assert c.nodes == ("n0", "n1")
    assert g.members(c.index) == (3, 1, 2, 0)
    assert g.members(99) == ()
    assert g.by_index[c.index] is c
    assert all(g.of_rank[r] == (c.index,) for r in range(4))


def test_inferred_kinds_without_declared_layout() -> None:
    comms = {
        "0xa": [0, 1, 2, 3],  # one node, collectives: tp
        "0xb": [0, 4],  # Send/Recv only: pp
        "0xc": [1, 5],  # two nodes, collectives: dp
        "0xd": list(range(8)),  # the whole job, beside smaller ones: other
        "0xe": [6],  # alone: other
    }
    ops = {"0xa": ["AllReduce"], "0xb": ["Send", "Recv"], "0xc": ["AllReduce"], "0xd": ["Barrier"]}
    g = groups.build(_bundle(_job(8, per_node=4, par=None), comms, ops))
    kinds = {c.comm_id: c.kind for c in g.comms}
    assert kinds == {"0xa": "tp", "0xb": "pp", "0xc": "dp", "0xd": "other", "0xe": "other"}
    p2p = {c.comm_id for c in g.comms if c.p2p}
    assert p2p == {"0xb"}


def test_unknown_placement_never_makes_tp() -> None:
    g = groups.build(_bundle(_job(4, per_node=None, par=None), {"0xa": [0, 1]}))
    assert [c.kind for c in g.comms] == ["dp"]
    assert g.comms[0].nodes == ()


def test_single_world_communicator_is_dp() -> None:
    g = groups.build(_bundle(_job(4, per_node=2, par=None), {"0xa": [0, 1, 2, 3]}))
    assert [c.kind for c in g.comms] == ["dp"]


def test_ranks_seen_only_in_operations_join_the_communicator() -> None:
    job = _job(4, per_node=2, par=None)
    b = tables.BundleBuilder(job)
    b.add_comm(rank=0, ts=S, comm="0xa", comm_rank=0, nranks=3)
    b.add_comm(rank=2, ts=S, comm="0xa", comm_rank=2, nranks=3)
    for r in (1, 2):
        b.add_op(rank=r, ts=2 * S, comm="0xa", seq=0, op="AllReduce", nbytes=8, start=S, end=S)
    b.add_op(rank=3, ts=2 * S, comm="0xb", seq=0, op="AllReduce", nbytes=8, start=S, end=S)
    g = groups.build(b.build())
    by_id = {c.comm_id: c for c in g.comms}
    assert by_id["0xa"].members == (0, 2, 1)  # known comm_rank order first, then the rest
    assert by_id["0xb"].members == (3,)


def test_dp_groups_fall_back_to_layout_then_to_single_ranks() -> None:
    tp_only = {k: v for k, v in _megatron_comms(2, 1, 2).items() if k.startswith("0x1")}
    declared = groups.build(_bundle(_declared(2, 1, 2), tp_only))
    assert groups.dp_groups(declared, _declared(2, 1, 2)) == [(0, 2), (1, 3)]
    bare = _job(3, per_node=None, par=None)
    assert groups.dp_groups(groups.build(_bundle(bare, {})), bare) == [(0,), (1,), (2,)]


def test_pp_stage_declared_and_inferred() -> None:
    job = _declared(2, 2, 1)
    st = groups.pp_stage(groups.build(_bundle(job, {})), job)
    assert st == {0: 0, 1: 0, 2: 1, 3: 1}
    bare = _job(4, per_node=2, par=None)
    g = groups.build(_bundle(bare, {"0xa": [1, 3]}, {"0xa": ["Send", "Recv"]}))
    assert groups.pp_stage(g, bare) == {1: 0, 3: 1}


@pytest.mark.parametrize("max_ranks", [1, 3, 4, 8, 10])
def test_sampling_covers_every_dp_group_within_budget(max_ranks: int) -> None:
    job = _declared(4, 2, 4, per_node=4)  # 32 ranks on 8 nodes, 8 DP groups of 4
    g = groups.build(_bundle(job, _megatron_comms(4, 2, 4)))
    dpg = groups.dp_groups(g, job)
    assert len(dpg) == 8
    picked = groups.sample_ranks(g, job, max_ranks)
    assert len(picked) == max_ranks == len(set(picked))
    assert list(picked) == sorted(picked)
    covered = sum(any(r in grp for r in picked) for grp in dpg)
    assert covered == min(len(dpg), max_ranks)
    assert groups.sample_ranks(g, job, max_ranks) == picked  # deterministic


def test_sampling_spreads_across_nodes_and_stages() -> None:
    job = _declared(4, 2, 4, per_node=4)
    g = groups.build(_bundle(job, _megatron_comms(4, 2, 4)))
    picked = groups.sample_ranks(g, job, 8)
    nodes = {r // 4 for r in picked}
    assert len(nodes) == 8  # one per node when the budget allows
    stages = groups.pp_stage(g, job)
    assert {stages[r] for r in picked} == {0, 1}


def test_sampling_never_exceeds_the_ranks_there_are() -> None:
    job = _job(3, per_node=1, par=None)
    g = groups.build(_bundle(job, {"0xa": [0, 1, 2]}))
    assert groups.sample_ranks(g, job, 10) == (0, 1, 2)
    assert groups.sample_ranks(g, job, 0) == ()


def test_sampling_without_any_communicator_still_picks_ranks() -> None:
    job = _job(4, per_node=2, par=None)
    picked = groups.sample_ranks(groups.build(_bundle(job, {})), job, 2)
    assert len(picked) == 2 and {r // 2 for r in picked} == {0, 1}
