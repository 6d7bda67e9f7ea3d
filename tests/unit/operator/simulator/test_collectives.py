"""Chunk-level timing of one phase: invariants and dependency propagation (Mycroft Fig. 2)."""

from __future__ import annotations

import numpy as np
import pytest

from collscope.nodeagent.bundle import tables
from collscope.operator.simulator import collectives, config, faults, program, topology

# 4 ranks, one per node, so every hop crosses nodes and has flows; a 32 MiB AllGather moves
# 8 MiB per step = 2 MiB per channel = 4 chunks per step; 3 steps = 12 chunks per flow.
CFG = config.SimConfig(ranks=4, gpus_per_node=1, tp=1, pp=1, dp=4, channels=4)
NBYTES = 32 * 1024 * 1024
CPS = 4


def _phase(
    cfg: config.SimConfig, kind: program.Kind = "ring", op: str = "AllGather"
) -> tuple[program.Phase, topology.Topology, faults.Effects]:
    topo = topology.build(cfg)
    algo = "Tree" if kind == "tree" else "Ring"
    phase = program.Phase(kind, op, topo.dp_groups, topo.dp_comm, NBYTES, algo, True)
    return phase, topo, faults.plan(cfg, topo).fx


def _time(
    entries: list[float],
    fx: faults.Effects | None = None,
    cfg: config.SimConfig = CFG,
    kind: program.Kind = "ring",
    op: str = "AllGather",
) -> collectives.Result:
    phase, topo, healthy = _phase(cfg, kind, op)
    return collectives.time_phase(
        phase, np.array([entries]), np.zeros(1, dtype=bool), topo=topo, cfg=cfg, fx=fx or healthy
    )


def _flow(
    res: collectives.Result, owner: int, peer: int, direction: int, channel: int = 0
) -> tuple[np.ndarray, ...]:
    f = res.flows
    (i,) = np.flatnonzero(
        (f.owner == owner) & (f.peer == peer) & (f.dir == direction) & (f.channel == channel)
    )
    return tuple(t[0] for t in f.times(np.array([i])))


def test_chunks_never_arrive_before_they_are_sent() -> None:
    res = _time([0.0, 0.001, 0.0005, 0.002])
    assert np.all(np.isfinite(res.end))
    for a in range(4):
        b = (a + 1) % 4
        for ch in range(4):
            ready, sent, done = _flow(res, a, b, tables.SEND, ch)
            posted, arrived, consumed = _flow(res, b, a, tables.RECV, ch)
            assert len(ready) == 3 * CPS
            assert np.all(ready <= sent) and np.all(sent < arrived) and np.all(arrived < done)
            assert np.all(posted <= sent) and np.all(arrived < consumed)
            assert np.all(np.diff(sent) >= 0) and np.all(np.diff(consumed) >= 0)


def test_op_ends_after_the_last_member_enters() -> None:
    res = _time([0.0, 0.0, 0.010, 0.0])
    assert np.all(res.end > 0.010)
    assert res.entry.tolist() == [0.0, 0.0, 0.010, 0.0]


def test_slow_rank_delays_its_successors_later_steps_only() -> None:
    healthy = _time([0.0] * 4)
    _, _, fx = _phase(CFG)
    fx.onset = 0.0
    fx.gpu_mult[1] = 50.0
    slow = _time([0.0] * 4, fx)
    ready_h = _flow(healthy, 2, 3, tables.SEND)[0]
    ready_s = _flow(slow, 2, 3, tables.SEND)[0]
    # step 0 needs only local data; later steps wait for what rank 1 forwards
    assert ready_s[0] == pytest.approx(ready_h[0])
    assert np.all(ready_s[CPS:] > ready_h[CPS:] + 1e-4)
    assert np.all(slow.end > healthy.end)


def test_stuck_rank_stalls_its_whole_group() -> None:
    res = _time([0.0, np.inf, 0.0, 0.0])
    assert np.all(np.isinf(res.end))
    # the predecessor fills its send buffer but cannot post: no receive buffer at rank 1
    ready, sent, _ = _flow(res, 0, 1, tables.SEND)
    assert np.isfinite(ready).sum() == CFG.fabric.recv_slots
    assert np.isinf(sent).all()
    # the successor gets nothing, so it can send only its own step-0 data
    _, _, done2 = _flow(res, 2, 3, tables.SEND)
    assert np.isfinite(done2).sum() == CPS
    posted, arrived, _ = _flow(res, 2, 1, tables.RECV)
    assert np.isfinite(posted).sum() == CFG.fabric.recv_slots and np.isinf(arrived).all()


def test_nic_down_loses_chunks_in_flight_both_ways() -> None:
    healthy = _time([0.0] * 4)
    _, _, fx = _phase(CFG)
    fx.nic_stop[1] = float(healthy.end[1]) / 2
    res = _time([0.0] * 4, fx)
    assert np.all(np.isinf(res.end))
    _, sent, done = _flow(res, 1, 2, tables.SEND)
    assert np.isfinite(sent).sum() > np.isfinite(done).sum()
    _, sent0, done0 = _flow(res, 0, 1, tables.SEND)
    assert np.isfinite(sent0).sum() > np.isfinite(done0).sum()


def test_gpu_hang_freezes_ready_but_network_delivers() -> None:
    healthy = _time([0.0] * 4)
    _, _, fx = _phase(CFG)
    stop = float(healthy.end[1]) / 2
    fx.gpu_stop[1] = stop
    res = _time([0.0] * 4, fx)
    # rank 1 and whoever needs its data never finish (with 12 chunks and 8 receive slots
    # the ranks before it may still get all they need)
    assert np.isinf(res.end[1]) and np.isinf(res.end[2])
    ready, _, done = _flow(res, 1, 2, tables.SEND)
    assert np.all(ready[np.isfinite(ready)] <= stop)
    assert np.isfinite(done).sum() == np.isfinite(ready).sum()  # all it produced arrived
    posted, arrived, consumed = _flow(res, 1, 0, tables.RECV)
    assert np.isfinite(arrived).sum() == np.isfinite(posted).sum()  # peer's data delivered
    assert np.isfinite(consumed).sum() < np.isfinite(arrived).sum()


def test_proxy_stall_freezes_sent_not_ready() -> None:
    _, _, fx = _phase(CFG)
    fx.stall_rank = 1
    fx.stalls = (np.array([0.0]), np.array([0.5]))
    res = _time([0.0] * 4, fx)
    ready, sent, _ = _flow(res, 1, 2, tables.SEND)
    assert sent[0] >= 0.5 and ready[0] < 0.01
    assert np.all(res.end > 0.5)


def test_intra_node_hops_have_no_flows_but_kernel_progress() -> None:
    cfg = config.SimConfig(ranks=4, gpus_per_node=4, tp=1, pp=1, dp=4)
    res = _time([0.0] * 4, cfg=cfg)
    assert len(res.flows.owner) == 0
    assert np.all(np.isfinite(res.chan_end)) and not res.inter.any()
    # two nodes of two: only the two crossing hops (1->2, 3->0) have flows, one per side
    cfg2 = config.SimConfig(ranks=4, gpus_per_node=2, tp=1, pp=1, dp=4)
    res2 = _time([0.0] * 4, cfg=cfg2)
    pairs = set(zip(res2.flows.owner.tolist(), res2.flows.peer.tolist(), strict=True))
    assert pairs == {(1, 2), (2, 1), (3, 0), (0, 3)}


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_tree_allreduce_completes_and_a_stuck_member_stalls_all(n: int) -> None:
    cfg = config.SimConfig(
        ranks=n, gpus_per_node=1, tp=1, pp=1, dp=n, algo="tree", dp_mode="allreduce"
    )
    res = _time([0.0] * n, cfg=cfg, kind="tree", op="AllReduce")
    assert np.all(np.isfinite(res.end))
    f = res.flows
    # per channel every member talks to 1..3 tree neighbours; up + down = 2 (n-1) edges
    assert len(f.owner) == 2 * 2 * (n - 1) * cfg.channels
    for i in range(len(f.owner)):
        if f.dir[i] == tables.SEND:
            (j,) = np.flatnonzero(
                (f.owner == f.peer[i])
                & (f.peer == f.owner[i])
                & (f.dir == tables.RECV)
                & (f.channel == f.channel[i])
            )
            sent, arrived = f.times(np.array([i]))[1], f.times(np.array([j]))[1]
            assert np.all(arrived > sent)
    stuck = _time([0.0] * (n - 1) + [np.inf], cfg=cfg, kind="tree", op="AllReduce")
    assert np.all(np.isinf(stuck.end))
