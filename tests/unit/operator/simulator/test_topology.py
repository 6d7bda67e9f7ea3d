"""Placement, coordinates and communicators of the simulated job."""

from __future__ import annotations

import re

from collscope.operator.simulator import config, topology


def test_default_order_places_tp_fastest_then_dp_then_pp() -> None:
    cfg = config.SimConfig(ranks=64, tp=8, pp=2, dp=4)
    topo = topology.build(cfg)
    for r in range(64):
        assert r == topo.tp_i[r] + 8 * (topo.dp_i[r] + 4 * topo.pp_i[r])
        assert topo.node_of[r] == r // 8
    assert topo.tp_groups[0].tolist() == list(range(8))
    assert topo.dp_groups[0].tolist() == [0, 8, 16, 24]
    assert topo.pp_pairs[0][0].tolist() == [0, 32]


def test_other_order_changes_groups() -> None:
    cfg = config.SimConfig(ranks=16, gpus_per_node=4, tp=2, pp=2, dp=4, order="dp-tp-cp-ep-pp")
    topo = topology.build(cfg)
    assert topo.dp_groups[0].tolist() == [0, 1, 2, 3]
    assert topo.tp_groups[0].tolist() == [0, 4]


def test_one_comm_per_group_with_unique_hex_ids() -> None:
    cfg = config.SimConfig(ranks=64, tp=8, pp=2, dp=4, seed=5)
    topo = topology.build(cfg)
    kinds = [c.kind for c in topo.comms]
    assert kinds.count("tp") == 8 and kinds.count("dp") == 16 and kinds.count("pp") == 32
    ids = [c.cid for c in topo.comms]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"0x[0-9a-f]{16}", i) for i in ids)
    names = {c.name: c for c in topo.comms}
    assert names["tp0"].nnodes == 1 and names["dp0"].nnodes == 4
    assert names["pp0-1.0"].members == (0, 32)
    # ids depend on the seed, and only on it
    again = topology.build(cfg)
    other = topology.build(config.SimConfig(ranks=64, tp=8, pp=2, dp=4, seed=6))
    assert [c.cid for c in again.comms] == ids
    assert not set(ids) & {c.cid for c in other.comms}


def test_trivial_dimensions_have_no_comms() -> None:
    topo = topology.build(config.SimConfig(ranks=8, tp=8, pp=1, dp=1))
    assert [c.kind for c in topo.comms] == ["tp"]
    assert topo.pp_pairs == ()
