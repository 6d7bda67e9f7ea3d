"""Hardware verdict on a stuck operation every member entered: network, GPU, MinData, kernel."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import diagnosis, hardware, inflight, placement

S = 1_000_000_000
MS = 1_000_000
IV = 100 * MS
HANG = 10 * S
Ring = Any  # conftest.Ring: conftest modules cannot be imported under --import-mode=importlib
Cat = diagnosis.Category


def _judge(bundle: tables.Bundle, t_ns: int, comm: str = "0xa") -> hardware.Verdict:
    now = inflight.at(bundle, t_ns, interval_ns=IV)
    ci = bundle.comm_index(comm)
    rows = np.flatnonzero(now.comm == ci)
    members = tuple(sorted(int(r) for r in now.rank[rows]))
    return hardware.judge(
        bundle,
        now,
        rows,
        placement.Placement.of(bundle.job),
        t_ns=t_ns,
        members=members,
        comm_id=comm,
    )


def test_network_verdict_from_the_ring(ring: Ring) -> None:
    # Rank 2's NIC stopped: its own send (2 -> 3) and the send towards it (1 -> 2) are
    # transmitted and never acknowledged; each neighbour has one stuck direction only.
    v = _judge(ring.build("network"), ring.end)
    assert v.category is Cat.HANG_NETWORK and v.precision == "rank"
    assert [(c.rank, c.component, c.score) for c in v.culprits] == [
        (2, "nic", 1.0),
        (1, "nic", 0.5),
        (3, "nic", 0.5),
    ]
    assert v.culprits[0].channel == 0 and v.culprits[0].peer == 3  # its own blocked send
    assert v.margin == pytest.approx(0.5)  # 2 blocked hops against 1 for its neighbours
    assert v.coverage == 1.0
    assert v.evidence[0].startswith(
        "2 of 2 blocked network flows have mlx5_0 on n1 (NIC of rank 2) as an endpoint "
        "(1 sent from it, 1 sent to it)"
    )
    assert not any("cannot tell" in e for e in v.evidence)


def test_gpu_verdict_from_the_ring(ring: Ring) -> None:
    v = _judge(ring.build("gpu"), ring.end)
    assert v.category is Cat.HANG_GPU
    assert [c.rank for c in v.culprits] == [2] and v.culprits[0].component == "gpu"
    assert v.margin == 1.0


class _Pair:
    """Hand-built stuck operation of ranks on nodes n0 (0, 1, 2) and n1 (3); rank r uses GPU r
    and NIC mlx5_<r>."""

    def __init__(self) -> None:
        job = models.Job(
            world_size=4,
            ranks=[
                models.RankInfo(rank=r, node=_node(r), gpu=r, nic=f"mlx5_{r}") for r in range(4)
            ],
        )
        self.b = tables.BundleBuilder(job)

    def state(
        self,
        rank: int,
        flows: Sequence[tables.FlowTuple] = (),
        *,
        op: str = "AllReduce",
        kernel: tuple[int, int] | None = None,
    ) -> None:
        for k in range(1, 21):
            ts = HANG + k * IV
            frozen = [(*f[:-1], ts - HANG) for f in flows]
            self.b.add_state(
                rank=rank,
                ts=ts,
                comm="0xa",
                seq=3,
                op=op,
                nbytes=1 << 20,
                start=HANG,
                flows=frozen,
                kernel=kernel,
            )

    def nic(self, node: str, device: str, up: bool) -> None:
        """A ``nic_link_up`` sample as the agent writes it: by node and device, rank 0."""
        self.b.add_hw(rank=0, ts=HANG, node=node, device=device, metric="nic_link_up", value=up)


def _node(rank: int) -> str:
    return "n0" if rank < 3 else "n1"


def _send(peer: int, ready: int, sent: int, done: int) -> tables.FlowTuple:
    return (0, peer, tables.SEND, 16, ready, sent, -1, done, -1, 0)


def _recv(peer: int, posted: int, done: int, consumed: int) -> tables.FlowTuple:
    return (0, peer, tables.RECV, 16, -1, -1, posted, done, consumed, 0)


@pytest.mark.parametrize("down", [0, 3])
def test_two_endpoint_path_is_settled_by_the_port_state(down: int) -> None:
    p = _Pair()
    p.state(0, [_send(3, 10, 10, 6)])  # 0 -> 3 sent, never acknowledged
    p.state(3, [_recv(0, 14, 6, 6)])
    p.nic(_node(down), f"mlx5_{down}", up=False)
    p.nic(_node(3 - down), f"mlx5_{3 - down}", up=True)
    v = _judge(p.b.build(), HANG + 2 * S)
    assert v.category is Cat.HANG_NETWORK
    assert [(c.rank, c.score) for c in v.culprits] == [(down, 1.0), (3 - down, 0.5)]
    assert v.margin == 0.5
    assert any(
        f"last sample of mlx5_{down} on {_node(down)} reports its link down, which settles it" in e
        for e in v.evidence
    )


def test_two_endpoint_path_without_port_state_names_both_and_what_settles_it() -> None:
    # Every blocked flow runs between rank 0's NIC and rank 3's: from NCCL's side a dead NIC
    # at either end looks the same (sent, never acknowledged; posted, never arrived).
    p = _Pair()
    p.state(0, [_send(3, 10, 10, 6)])
    p.state(3, [_recv(0, 14, 6, 6)])
    p.nic("n1", "mlx5_7", up=False)  # a spare NIC of rank 3's node, used by no rank: no evidence
    v = _judge(p.b.build(), HANG + 2 * S)
    assert v.category is Cat.HANG_NETWORK
    assert [(c.rank, c.score) for c in v.culprits] == [(0, 1.0), (3, 1.0)]
    assert v.margin == 0.0  # confidence = coverage x 0.5 at most
    tie = [e for e in v.evidence if "cannot tell which NIC stopped" in e]
    assert len(tie) == 1
    assert "the link state of mlx5_0 on n0 and the link state of mlx5_3 on n1" in tie[0]
    assert not any("mlx5_7" in e or "link down" in e for e in v.evidence)


def test_port_state_is_joined_by_device_not_by_the_record_rank() -> None:
    p = _Pair()
    p.state(0, [_send(3, 10, 10, 6)])
    p.state(3, [_recv(0, 14, 6, 6)])
    # Written with rank 3 on the record, but the device is rank 0's NIC on rank 0's node.
    p.b.add_hw(rank=3, ts=HANG, node="n0", device="mlx5_0", metric="nic_link_up", value=0.0)
    v = _judge(p.b.build(), HANG + 2 * S)
    assert [(c.rank, c.score) for c in v.culprits] == [(0, 1.0), (3, 0.5)]


def test_pure_sender_that_stopped_producing_is_a_gpu_hang() -> None:
    p = _Pair()
    p.state(0, [_send(3, 4, 4, 4)], op="Send")  # delivered all it produced, 4 of 16
    p.state(3, [_recv(0, 8, 4, 4)], op="Recv")  # buffers posted, waiting
    v = _judge(p.b.build(), HANG + 2 * S)
    assert v.category is Cat.HANG_GPU and v.culprits[0].rank == 0
    assert any("only sends" in e for e in v.evidence)


def test_min_data_when_nothing_stands_out() -> None:
    p = _Pair()
    p.state(0, [_send(3, 8, 8, 8), _recv(3, 16, 8, 8)])
    p.state(3, [_send(0, 4, 4, 4), _recv(0, 16, 4, 4)])  # least chunk progress
    v = _judge(p.b.build(), HANG + 2 * S)
    assert v.category is Cat.HANG_GPU
    assert [c.rank for c in v.culprits] == [3, 0]
    assert v.culprits[0].score > v.culprits[1].score
    assert 0.0 < v.margin <= 0.5 and v.coverage <= 0.5  # a weak verdict
    assert any("MinData" in e for e in v.evidence)


def test_intra_node_operation_has_node_precision_from_kernel_progress() -> None:
    p = _Pair()
    p.state(0, kernel=(4, 3))
    p.state(1, kernel=(4, 1))  # least kernel progress
    v = _judge(p.b.build(), HANG + 2 * S)
    assert v.category is Cat.HANG_GPU and v.precision == "node"
    assert [c.rank for c in v.culprits] == [1, 0, 2]  # then the node's other ranks
    assert all(c.node == "n0" for c in v.culprits)
    assert v.culprits[0].score >= v.culprits[1].score >= v.culprits[2].score
    assert any("node n0" in e for e in v.evidence)


@pytest.mark.parametrize("reported", [True, False])
def test_a_down_link_on_the_blocked_path_does_not_need_the_unseen_members(reported: bool) -> None:
    # Ranks 1 and 2 are in the operation with no flow in flight in any sample: from flows alone
    # half the group is unseen and the verdict's coverage is 1/2. Rank 0's own link sample
    # reporting down observes the fault on the device itself: coverage 1. A link sample that
    # reports up changes nothing.
    p = _Pair()
    p.state(0, [_send(3, 10, 10, 6)])
    p.state(1)
    p.state(2)
    p.state(3, [_recv(0, 14, 6, 6)])
    p.nic("n0", "mlx5_0", up=not reported)
    v = _judge(p.b.build(), HANG + 2 * S)
    assert v.category is Cat.HANG_NETWORK
    if reported:
        assert [(c.rank, c.score) for c in v.culprits] == [(0, 1.0), (3, 0.5)]
        assert (v.margin, v.coverage) == (0.5, 1.0)
    else:
        assert [(c.rank, c.score) for c in v.culprits] == [(0, 1.0), (3, 1.0)]
        assert (v.margin, v.coverage) == (0.0, 0.5)
