"""Group inference of a live job: the parallelism annotation, declared layouts, and kinds inferred
from communicator membership."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collscope.nodeagent.bundle import models
from collscope.operator import errors
from collscope.operator.domain import groups, ids

R = ids.Rank


def test_parse_annotation() -> None:
    par = groups.parse("tp=8,pp=2,dp=4")
    assert (par.tp, par.pp, par.dp, par.cp, par.ep) == (8, 2, 4, 1, 1)
    assert par.order == "tp-cp-ep-dp-pp"
    par = groups.parse(" tp = 2 , dp=2, cp=2, order=tp-dp-cp-ep-pp ")
    assert (par.tp, par.dp, par.cp, par.order) == (2, 2, 2, "tp-dp-cp-ep-pp")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("tp=8,pp", "'pp' is not key=value"),
        ("tp=8,tp=2", "'tp' given twice"),
        ("tp=8,xp=2", "unknown key 'xp'"),
        ("tp=0", "'tp' must be a positive integer (got '0')"),
        ("tp=-1", "'tp' must be a positive integer"),
        ("tp=two", "(got 'two')"),
        ("tp=2,order=tp-dp", "order must name"),
        ("=3", "is not key=value"),
    ],
)
def test_parse_errors_name_the_defect(text: str, needle: str) -> None:
    with pytest.raises(errors.ParallelismError) as info:
        groups.parse(text)
    assert needle in str(info.value)
    assert repr(text) in str(info.value)


@given(
    st.integers(1, 16), st.integers(1, 8), st.integers(1, 8), st.integers(1, 2), st.integers(1, 2)
)
def test_format_spec_round_trips(tp: int, pp: int, dp: int, cp: int, ep: int) -> None:
    par = models.Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep)
    assert groups.parse(groups.format_spec(par)) == par


def test_check_world() -> None:
    groups.check_world(groups.parse("tp=8,pp=2,dp=4"), 64)
    with pytest.raises(errors.ParallelismError, match="product 64 != 32 ranks"):
        groups.check_world(groups.parse("tp=8,pp=2,dp=4"), 32)


def test_declared_groups_follow_megatron_order() -> None:
    jg = groups.declared(groups.parse("tp=2,pp=2,dp=2"), 8)
    assert jg.source == "declared"
    assert jg.tp == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert jg.dp == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert jg.pp == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_declared_groups_partition_the_world() -> None:
    jg = groups.declared(groups.parse("tp=4,pp=2,dp=3"), 24)
    for dim in (jg.tp, jg.pp, jg.dp):
        flat = sorted(r for g in dim for r in g)
        assert flat == list(range(24))
    assert {len(g) for g in jg.tp} == {4} and {len(g) for g in jg.dp} == {3}


def members(comm: str, ranks: list[int], *, p2p: bool = False) -> list[groups.CommMember]:
    return [
        groups.CommMember(
            comm=ids.CommHash(comm),
            rank=R(r),
            comm_rank=ids.CommRank(i),
            nranks=len(ranks),
            p2p=p2p,
        )
        for i, r in enumerate(ranks)
    ]


def job_2x2x2() -> tuple[list[groups.CommMember], dict[ids.Rank, ids.NodeName]]:
    """8 ranks, 4 per node: TP pairs inside a node, DP pairs across nodes, PP point to point."""
    placement = {R(r): ids.NodeName(f"n{r // 4}") for r in range(8)}
    mem: list[groups.CommMember] = []
    mem += members("0xa0", [0, 1]) + members("0xa1", [2, 3])
    mem += members("0xa2", [4, 5]) + members("0xa3", [6, 7])
    mem += members("0xd0", [0, 4]) + members("0xd1", [1, 5])
    mem += members("0xd2", [2, 6]) + members("0xd3", [3, 7])
    mem += members("0xb0", [0, 2], p2p=True) + members("0xb1", [5, 7], p2p=True)
    mem += members("0xff", list(range(8)))
    return mem, placement


def test_inferred_kinds_from_membership() -> None:
    mem, placement = job_2x2x2()
    jg = groups.infer(mem, 8, placement)
    assert jg.source == "inferred"
    kinds = {c.comm_id: c.kind for c in jg.comms}
    assert kinds["0xa0"] == "tp" and kinds["0xd0"] == "dp" and kinds["0xb0"] == "pp"
    assert kinds["0xff"] == "other"  # the world communicator
    assert jg.tp == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert jg.dp == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert jg.pp == ((0, 2), (5, 7))
    world = next(c for c in jg.comms if c.comm_id == "0xff")
    assert world.nodes == ("n0", "n1")


def test_members_are_in_comm_rank_order_whatever_arrives_first() -> None:
    mem = list(reversed(members("0x1", [7, 3, 5])))
    (comm,) = groups.communicators(mem, 8, {})
    assert comm.members == (7, 3, 5)


def test_one_non_p2p_member_makes_a_comm_collective() -> None:
    mem = members("0x1", [0, 4], p2p=True)
    mem[1] = groups.CommMember(ids.CommHash("0x1"), R(4), ids.CommRank(1), 2, p2p=False)
    placement = {R(0): ids.NodeName("a"), R(4): ids.NodeName("b")}
    (comm,) = groups.communicators(mem, 8, placement)
    assert not comm.p2p and comm.kind == "dp"


def test_declared_layout_wins_over_inference() -> None:
    mem, placement = job_2x2x2()
    # Declared with DP fastest: what inference calls tp is dp under this layout.
    jg = groups.infer(mem, 8, placement, groups.parse("tp=2,pp=2,dp=2,order=dp-tp-cp-ep-pp"))
    assert jg.source == "declared"
    assert jg.dp == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert {c.comm_id: c.kind for c in jg.comms}["0xa0"] == "dp"


def test_unknown_placement_never_makes_tp() -> None:
    (comm,) = groups.communicators(members("0x1", [0, 1]), 4, {})
    assert comm.kind == "dp"


def test_as_status() -> None:
    jg = groups.declared(groups.parse("tp=2,dp=1"), 2)
    assert jg.as_status() == {
        "source": "declared",
        "tp": [[0, 1]],
        "pp": [[0], [1]],
        "dp": [[0], [1]],
    }
