"""Which NIC stopped: the device that is an endpoint of the most blocked flows, on every
communicator, counted per NIC (shared NICs included); two NICs the flows cannot tell apart are
named together, with the link state that would settle it. Run through ``failure.analyze``, as
the engine does: the stuck operations of other communicators are its context."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import diagnosis, failure, groups, placement

S = 1_000_000_000
MS = 1_000_000
IV = 100 * MS  # state sampling period
HANG = 10 * S  # the stuck operations start here and freeze at once
HISTORY = 10  # completed seqs of each communicator before the hang
TOTAL = 16  # chunks per flow
Cat = diagnosis.Category
Flow = tables.FlowTuple


def _send(peer: int, sent: int, done: int, channel: int = 0) -> Flow:
    return (channel, peer, tables.SEND, TOTAL, sent, sent, -1, done, -1, 0)


def _recv(peer: int, posted: int, done: int, channel: int = 0) -> Flow:
    return (channel, peer, tables.RECV, TOTAL, -1, -1, posted, done, done, 0)


class _Job:
    """Ranks placed by ``places`` [(node, nic)], one GPU each; p2p communicators with a history
    of completed Send/Recv pairs, then in-flight states frozen since ``HANG``."""

    def __init__(self, places: Sequence[tuple[str, str]]) -> None:
        self.b = tables.BundleBuilder(
            models.Job(
                world_size=len(places),
                ranks=[
                    models.RankInfo(rank=r, node=n, gpu=r, nic=c) for r, (n, c) in enumerate(places)
                ],
            )
        )

    def path(self, cid: str, src: int, dst: int, *, sent: int = 12, done: int = 8) -> None:
        """``src`` sends to ``dst`` on its own communicator ``cid`` (a pipeline hop): ``sent``
        chunks transmitted on each of 2 channels, ``done`` acknowledged and arrived."""
        for i, r in enumerate((src, dst)):
            self.b.add_comm(rank=r, ts=0, comm=cid, comm_rank=i, nranks=2, nnodes=2)
        for seq in range(HISTORY):
            end = S + seq * IV + 10 * MS
            for r, op in ((src, "Send"), (dst, "Recv")):
                self.b.add_op(
                    rank=r,
                    ts=end,
                    comm=cid,
                    seq=seq,
                    op=op,
                    nbytes=1 << 20,
                    start=end - 10 * MS,
                    end=end,
                )
        for r, op, flows in (
            (src, "Send", [_send(dst, sent, done, ch) for ch in (0, 1)]),
            (dst, "Recv", [_recv(src, sent, done, ch) for ch in (0, 1)]),
        ):
            for k in range(1, 21):
                ts = HANG + k * IV
                self.b.add_state(
                    rank=r,
                    ts=ts,
                    comm=cid,
                    seq=HISTORY,
                    op=op,
                    nbytes=1 << 20,
                    start=HANG,
                    flows=[(*f[:-1], ts - HANG) for f in flows],
                )

    def analyze(self, origin: str) -> failure.Finding:
        b = self.b.build()
        ci = b.comm_index(origin)
        assert ci is not None
        f = failure.analyze(
            b,
            HANG + 2 * S,
            grp=groups.build(b),
            where=placement.Placement.of(b.job),
            interval_ns=IV,
            hint=(ci, HISTORY),  # the operation the trigger saw
        )
        assert f is not None and f.category is Cat.HANG_NETWORK
        return f


def _ranked(f: failure.Finding) -> list[tuple[int | None, float]]:
    return [(c.rank, c.score) for c in f.culprits]


def test_one_pipeline_hop_cannot_tell_its_two_nics_apart() -> None:
    j = _Job([("n0", "mlx5_0"), ("n1", "mlx5_0")])
    j.path("0xa", 0, 1)
    f = j.analyze("0xa")
    assert _ranked(f) == [(0, 1.0), (1, 1.0)]
    assert f.margin == 0.0
    tie = [e for e in f.evidence if "cannot tell which NIC stopped" in e]
    assert len(tie) == 1
    assert "the link state of mlx5_0 on n0 and the link state of mlx5_0 on n1" in tie[0]


@pytest.mark.parametrize("origin", ["0xa", "0xb"])
def test_a_dead_nic_stops_its_flows_on_every_communicator(origin: str) -> None:
    # Rank 1's NIC died while it received from rank 0 (0xa) and sent to rank 2 (0xb): each hop
    # alone is a tie; together only rank 1's NIC is an endpoint of both. Whichever operation
    # the trigger saw, the other one is read too.
    j = _Job([("n0", "mlx5_0"), ("n1", "mlx5_0"), ("n2", "mlx5_0")])
    j.path("0xa", 0, 1)
    j.path("0xb", 1, 2)
    f = j.analyze(origin)
    other = 2 if origin == "0xb" else 0
    assert _ranked(f)[:2] == [(1, 1.0), (other, 0.5)]
    assert f.margin == 0.5
    assert f.evidence[0].startswith(
        "4 of 4 blocked network flows have mlx5_0 on n1 (NIC of rank 1) as an endpoint "
        "(2 sent from it, 2 sent to it, 2 on other communicators)"
    )
    assert not any("cannot tell" in e for e in f.evidence)


@pytest.mark.parametrize("shared", [True, False])
def test_a_nic_shared_by_two_ranks_collects_both_ranks_flows(shared: bool) -> None:
    # Ranks 0 and 1 of n0 send to n1 and n2 on their own pipeline hops. When job.json says they
    # share mlx5_0, the one device common to both stuck hops is that NIC; when each has its
    # own NIC, the two hops are unrelated and each is a tie of its two ends.
    nic1 = "mlx5_0" if shared else "mlx5_1"
    j = _Job([("n0", "mlx5_0"), ("n0", nic1), ("n1", "mlx5_0"), ("n2", "mlx5_0")])
    j.path("0xa", 0, 2)
    j.path("0xb", 1, 3)
    f = j.analyze("0xa")
    if shared:
        assert _ranked(f) == [(0, 1.0), (1, 1.0), (2, 0.5)]
        assert f.margin == 0.5
        assert "the NIC carries ranks 0, 1, all of them blocked" in f.evidence[0]
        assert all(c.nic == "mlx5_0" and c.node == "n0" for c in f.culprits[:2])
    else:
        assert _ranked(f) == [(0, 1.0), (2, 1.0)]
        assert f.margin == 0.0
        assert any("mlx5_0 on n0 and the link state of mlx5_0 on n1" in e for e in f.evidence)


def test_the_rank_of_a_shared_nic_with_the_origin_flow_comes_first() -> None:
    # Culprits carry the flow they are blamed for: each sharing rank its own hop's channel/peer.
    j = _Job([("n0", "mlx5_0"), ("n0", "mlx5_0"), ("n1", "mlx5_0"), ("n2", "mlx5_0")])
    j.path("0xa", 0, 2)
    j.path("0xb", 1, 3)
    f = j.analyze("0xa")
    assert [(c.rank, c.comm, c.peer) for c in f.culprits[:2]] == [(0, "0xa", 2), (1, "0xb", 3)]
