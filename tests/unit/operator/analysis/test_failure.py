"""Root cause of a hang: CCL-D H1/H2/H3 on the origin group found by the cross-group walk."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import diagnosis, failure, groups, placement

S = 1_000_000_000
MS = 1_000_000
IV = 100 * MS
Ring = Any  # conftest.Ring: conftest modules cannot be imported under --import-mode=importlib
Cat = diagnosis.Category


def _analyze(
    bundle: tables.Bundle, t_ns: int, hint: failure.Trace | None = None
) -> failure.Finding | None:
    return failure.analyze(
        bundle,
        t_ns,
        grp=groups.build(bundle),
        where=placement.Placement.of(bundle.job),
        settings=failure.FailureSettings(stuck_min_s=0.5),
        interval_ns=IV,
        hint=hint,
    )


def test_not_entered_rank_is_the_culprit(ring: Ring) -> None:
    f = _analyze(ring.build("not-entered"), ring.end)
    assert f is not None and f.category is Cat.HANG_NOT_ENTERED
    assert [c.rank for c in f.culprits] == [3]
    c = f.culprits[0]
    assert c.component == "software" and c.comm == "0xa" and c.node == "n1"
    assert any("never entered AllReduce seq 30" in e and "29" in e for e in f.evidence)
    assert 0.0 < f.margin <= 1.0 and f.coverage == 1.0


def test_inconsistent_size_minority_is_the_culprit(ring: Ring) -> None:
    f = _analyze(ring.build("inconsistent"), ring.end)
    assert f is not None and f.category is Cat.HANG_INCONSISTENT
    assert [c.rank for c in f.culprits] == [3]
    assert any(str(2 << 20) in e and str(1 << 20) in e for e in f.evidence)
    assert f.margin == pytest.approx(0.75)  # 3 of 4 agree


def test_network_hang_blames_the_common_endpoint(ring: Ring) -> None:
    f = _analyze(ring.build("network"), ring.end)
    assert f is not None and f.category is Cat.HANG_NETWORK
    assert f.culprits[0].rank == 2 and f.culprits[0].component == "nic"
    assert {c.rank for c in f.culprits[1:]} == {1, 3}  # the other ends of its blocked hops
    assert f.culprits[0].score > f.culprits[1].score
    assert f.precision == "rank"


def test_gpu_hang_blames_the_rank_that_stopped_consuming(ring: Ring) -> None:
    f = _analyze(ring.build("gpu"), ring.end)
    assert f is not None and f.category is Cat.HANG_GPU
    assert [c.rank for c in f.culprits] == [2] and f.culprits[0].component == "gpu"
    assert any("unconsumed" in e for e in f.evidence)


@pytest.mark.parametrize("kind", ["network", "gpu", "not-entered", "inconsistent"])
def test_nothing_stuck_yet_means_no_finding(ring: Ring, kind: str) -> None:
    assert _analyze(ring.build(kind), ring.stall_start + 300 * MS) is None


def test_healthy_means_no_finding(ring: Ring) -> None:
    b = ring.build("healthy")
    span = b.time_span()
    assert span is not None and _analyze(b, span[1]) is None


class _Hang:
    """Small multi-communicator hangs: comm records, some history, frozen in-flight states."""

    def __init__(self, world: int) -> None:
        self.b = tables.BundleBuilder(
            models.Job(
                world_size=world,
                ranks=[models.RankInfo(rank=r, node=f"n{r}") for r in range(world)],
            )
        )
        self.hang = 10 * S

    def comm(self, cid: str, members: Sequence[int], ops: Sequence[str] = ("AllReduce",)) -> None:
        for i, r in enumerate(members):
            self.b.add_comm(rank=r, ts=0, comm=cid, comm_rank=i, nranks=len(members))
        for seq in range(10):
            op = ops[seq % len(ops)]
            for r in members:
                end = S + seq * IV + 10 * MS
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

    def stuck(self, rank: int, cid: str, seq: int, *, since: int, op: str = "AllReduce") -> None:
        """``rank`` in flight in ``cid`` seq ``seq``, no progress since ``since`` ns."""
        for k in range(1, 21):
            ts = self.hang + k * IV
            flow = (0, rank, tables.RECV, 8, -1, -1, 4, 2, 2, ts - since)
            self.b.add_state(
                rank=rank,
                ts=ts,
                comm=cid,
                seq=seq,
                op=op,
                nbytes=1 << 20,
                start=since,
                flows=[flow],
            )

    def build(self) -> tables.Bundle:
        return self.b.build()


def test_walk_follows_waiting_ranks_to_the_origin_group() -> None:
    h = _Hang(3)
    h.comm("0xa", [0, 1])  # rank 0 waits here for rank 1 ...
    h.comm("0xb", [1, 2])  # ... which waits here for rank 2, which never came
    h.stuck(1, "0xb", 10, since=h.hang)
    h.stuck(0, "0xa", 10, since=h.hang + 200 * MS)
    b = h.build()
    t = h.hang + 2 * S
    ci = b.comm_index("0xa")
    assert ci is not None
    hint = (ci, 10)
    f = _analyze(b, t, hint=hint)  # the trigger saw rank 0
    assert f is not None and f.category is Cat.HANG_NOT_ENTERED
    assert [c.rank for c in f.culprits] == [2] and f.culprits[0].comm == "0xb"
    assert any("wait in" in e and "itself stuck in" in e and "0xb" in e for e in f.evidence)
    unhinted = _analyze(b, t)  # oldest stall first: straight to the origin
    assert unhinted is not None and [c.rank for c in unhinted.culprits] == [2]


def test_cycle_of_waits_is_a_deadlock() -> None:
    h = _Hang(2)
    h.comm("0xa", [0, 1])
    h.comm("0xb", [0, 1])
    h.stuck(0, "0xa", 10, since=h.hang)  # rank 0 entered a before b ...
    h.stuck(1, "0xb", 10, since=h.hang)  # ... rank 1 entered b before a
    f = _analyze(h.build(), h.hang + 2 * S)
    assert f is not None and f.category is Cat.HANG_INCONSISTENT
    assert {c.rank for c in f.culprits} == {0, 1}
    assert any("cycle" in e for e in f.evidence)


def test_send_and_recv_of_one_hop_are_one_operation() -> None:
    h = _Hang(2)
    h.comm("0xa", [0, 1], ops=("Send", "Recv"))
    h.stuck(0, "0xa", 10, since=h.hang, op="Send")
    h.stuck(1, "0xa", 10, since=h.hang, op="Recv")
    f = _analyze(h.build(), h.hang + 2 * S)
    assert f is not None and f.category is not Cat.HANG_INCONSISTENT


@pytest.mark.parametrize("diverged", [0, 1])
def test_inconsistent_two_member_tie_is_settled_by_history(diverged: int) -> None:
    h = _Hang(2)
    h.comm("0xa", [0, 1], ops=("ReduceScatter", "AllGather"))  # seq 10 must be ReduceScatter
    for r in (0, 1):
        h.stuck(r, "0xa", 10, since=h.hang, op="AllGather" if r == diverged else "ReduceScatter")
    f = _analyze(h.build(), h.hang + 2 * S)
    assert f is not None and f.category is Cat.HANG_INCONSISTENT
    # a 1:1 split: neither side is a majority; the communicator's periodic history decides
    assert [c.rank for c in f.culprits] == [diverged]
    assert any("AllGather" in e for e in f.evidence)


def test_stuck_means_stalled_longer_than_a_sample_can_hide(ring: Ring) -> None:
    # 0.7 s without progress is stuck at 100 ms sampling (past stuck_min_s = 0.5 s), but not at
    # 400 ms: a state sample up to two intervals (0.8 s) old is current, and an operation
    # that moved just after it looks stalled that long.
    bundle, t = ring.build("network"), ring.stall_start + 700 * MS

    def at(interval_ns: int) -> failure.Finding | None:
        return failure.analyze(
            bundle,
            t,
            grp=groups.build(bundle),
            where=placement.Placement.of(bundle.job),
            settings=failure.FailureSettings(stuck_min_s=0.5, stuck_min_intervals=2.0),
            interval_ns=interval_ns,
        )

    found = at(100 * MS)
    assert found is not None and found.category is Cat.HANG_NETWORK
    assert at(400 * MS) is None


def _late_entry(entry_ns: int) -> tuple[tables.Bundle, int]:
    """Rank 0 waits in ReduceScatter seq 10 since ``hang`` (sampled every 100 ms up to
    hang + 2 s); ranks 1 and 2 entered with it; rank 3 enters at ``entry_ns`` and all three
    complete 10 ms later."""
    h = _Hang(4)
    h.comm("0xa", [0, 1, 2, 3], ops=("ReduceScatter",))
    h.stuck(0, "0xa", 10, since=h.hang, op="ReduceScatter")
    for r in (1, 2, 3):
        start = entry_ns if r == 3 else h.hang
        end = entry_ns + 10 * MS
        h.b.add_op(
            rank=r, ts=end, comm="0xa", seq=10, op="ReduceScatter", nbytes=1 << 20,
            start=start, end=end,
        )  # fmt: skip
    return h.build(), h.hang + 2 * S + 60 * MS


def test_a_member_entering_after_the_waiters_last_samples_is_waited_on_not_a_stuck_gpu() -> None:
    # Issue 12 (pcie-downgrade / gpu-power-limit at 10 s steps): rank 3 computes seconds
    # longer and enters 30 ms after rank 0's latest sample; the operation then completes on
    # its peers. Rank 0's "no progress for 2 s" is the wait on rank 3 (a ring collective moves
    # only once every member entered), not a stopped GPU: without the rule the chunk table's
    # MinData named rank 0 hang.gpu.
    bundle, t = _late_entry(10 * S + 2 * S + 30 * MS)
    f = _analyze(bundle, t)
    assert f is not None and f.category is Cat.HANG_NOT_ENTERED
    assert [c.rank for c in f.culprits] == [3]
    assert any("entered ReduceScatter seq 10" in e and "2.0 s after" in e for e in f.evidence)


def test_a_waiter_sampled_after_the_late_entry_is_judged_on_that_sample() -> None:
    # Rank 3 entered at 1.5 s, before rank 0's last five samples, which still show no
    # progress: those samples are newer evidence than the entry; the rule does not apply.
    bundle, t = _late_entry(10 * S + 1500 * MS)
    f = _analyze(bundle, t)
    assert f is not None and f.category is not Cat.HANG_NOT_ENTERED
