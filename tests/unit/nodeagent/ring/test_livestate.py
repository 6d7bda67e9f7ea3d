"""livestate.seqlock_copy: only live slots are copied, they decode as the whole region does, and
a writer caught mid-write is retried or flagged exactly as before."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from collscope.nodeagent import ring
from collscope.nodeagent.ring import layout, livestate

T0 = 1_732_001_234_000_000_000  # the conftest epoch
Builder = Any  # conftest.RingBuilder: conftest modules cannot be imported under importlib mode


def scattered(b: Builder) -> Builder:
    """Three live communicators among free slots (one finalized), flows at scattered slot
    indices (the plugin hashes them), channels above 127 (u1 arithmetic must not wrap)."""
    for slot, h in ((2, 0xA2), (7, 0xA7), (13, 0xAD)):
        b.comm(slot=slot, comm_hash=h, rank=1, nranks=300, name=f"c{slot}".encode())
        b.op(comm=slot, slot=3, serial=4, seq=40 + slot)
        b.op(comm=slot, slot=6, serial=5, seq=41 + slot, start_ns=T0 + 9)
    b.comms[7]["state"] = layout.COMM_FINALIZED
    b.comms[7]["finalize_ns"] = T0 + 7
    for slot, k, channel, peer, direction in (
        (2, 0, 0, 2, layout.DIR_SEND),
        (2, 77, 200, 299, layout.DIR_RECV),
        (2, 127, 130, 5, layout.DIR_SEND),
        (7, 64, 1, 3, layout.DIR_RECV),
        (13, 5, 255, 0, layout.DIR_SEND),
        (13, 6, 255, 0, layout.DIR_RECV),
    ):
        b.flow(comm=slot, slot=k, serial=4, channel=channel, peer=peer, dir=direction)
    b.flow(comm=13, slot=9, serial=3, state=layout.FLOW_DONE)  # an older op's flow
    return b


def expected(b: Builder) -> list[tuple[int, list[int], list[tuple[Any, ...]]]]:
    """What a copy of the whole region gives: per non-free comm slot, its op slots in use and
    its visible flows with their values, read straight from the builder's arrays."""
    out = []
    for i, c in enumerate(b.comms):
        if c["state"] == layout.COMM_FREE:
            continue
        ops = [j for j, o in enumerate(c["ops"]) if o["state"] >= layout.OP_ACTIVE]
        flows = [
            (k, int(f["channel"]), int(f["peer"]), int(f["serial"]), int(f["c_ready_posted"]))
            for k, f in enumerate(c["flows"])
            if f["dir"] != layout.DIR_NONE
        ]
        out.append((i, ops, flows))
    return out


def test_only_live_slots_are_copied(builder: Builder, tmp_path: pathlib.Path) -> None:
    b = scattered(builder)
    with ring.open(b.write(tmp_path / "r.ring")) as r:
        _, copies, _ = r.live_copies()
    assert copies.slots.tolist() == [2, 7, 13]
    assert copies.comms["comm_hash"].tolist() == [0xA2, 0xA7, 0xAD]
    assert copies.ops.shape == (3, layout.OPS_PER_COMM)
    assert list(zip(copies.flow_comm.tolist(), copies.flow_slot.tolist(), strict=True)) == [
        (0, 0), (0, 77), (0, 127), (1, 64), (2, 5), (2, 6), (2, 9),
    ]  # fmt: skip
    assert copies.flows["channel"].tolist() == [0, 200, 130, 1, 255, 255, 0]
    assert not copies.torn_comms.any() and not copies.torn_flows.any()
    assert copies.attempts == 1
    flow = copies.flow(2, 77)
    assert flow is not None and int(flow["peer"]) == 299
    assert copies.flow(2, 78) is None and copies.flow(3, 0) is None


def test_live_slots_decode_as_the_whole_region(builder: Builder, tmp_path: pathlib.Path) -> None:
    b = scattered(builder)
    with ring.open(b.write(tmp_path / "r.ring")) as r:
        snap = r.snapshot()
    got = [
        (
            c.slot,
            [o.slot for o in c.ops],
            [(f.slot, f.channel, f.peer, f.serial, f.ready_posted) for f in c.flows],
        )
        for c in snap.comms
    ]
    assert got == expected(b)
    assert [c.state for c in snap.comms] == ["active", "finalized", "active"]
    assert (snap.consistent, snap.attempts) == (True, 1)


def test_no_live_communicator_copies_nothing(builder: Builder, tmp_path: pathlib.Path) -> None:
    builder.comms[4]["flows"][3]["dir"] = layout.DIR_SEND  # under a free comm: not read
    with ring.open(builder.write(tmp_path / "r.ring")) as r:
        _, copies, _ = r.live_copies()
        snap = r.snapshot()
    assert (len(copies.slots), len(copies.flows), copies.attempts) == (0, 0, 1)
    assert snap.comms == () and snap.consistent


def test_slots_being_written_are_copied_and_flagged(
    builder: Builder, tmp_path: pathlib.Path
) -> None:
    # A comm slot being claimed (free, seqlock odd) and, in a live one, a flow slot being
    # claimed (dir still NONE, seqlock odd) are copied: they may be live by the time the
    # writer is done. A free slot with an even seqlock is not.
    builder.comm(slot=1)
    builder.comms[1]["flows"][40]["seqlock"] = 3
    builder.comms[1]["flows"][41]["seqlock"] = 4  # free, not being written
    builder.comms[9]["seqlock"] = 5
    with ring.open(builder.write(tmp_path / "r.ring")) as r:
        _, copies, _ = r.live_copies(retries=3)
        snap = r.snapshot(retries=3)
    assert copies.slots.tolist() == [1, 9]
    assert copies.torn_comms.tolist() == [False, True]
    assert copies.flow_slot.tolist() == [40]
    assert copies.torn_flows.tolist() == [True]
    assert copies.attempts == 3
    # A free slot and an invisible flow are not live state, torn or not (as before).
    assert [c.slot for c in snap.comms] == [1] and snap.comms[0].flows == ()
    assert snap.consistent


class _Reads:
    """A ``livestate.Read`` over the builder's arrays, written in place by the tests' "writer":
    ``script[n]`` is called after the ``n``-th read (0-based) returns, i.e. between it and the
    next one. An attempt is three reads: seqlocks before, the copy, seqlocks after."""

    def __init__(self, b: Builder, script: dict[int, Any]) -> None:
        self.comms, self.script, self.reads = b.comms, script, 0

    def __call__(self, lo: int, hi: int) -> livestate.Region:
        got = livestate.Region(self.comms[lo:hi].copy())
        step = self.script.get(self.reads)
        self.reads += 1
        if step is not None:
            step()
        return got


def test_a_flow_written_during_the_copy_is_retried(builder: Builder) -> None:
    builder.comm(slot=0)
    f = builder.flow(comm=0, slot=7, c_ready_posted=5, c_sent_done=4, c_done_consumed=3)

    def start() -> None:  # odd seqlock, one store of three done: the copy sees it half-done
        f["seqlock"] += 1
        f["c_ready_posted"] = 9

    def finish() -> None:
        f["c_sent_done"] = f["c_done_consumed"] = 9
        f["seqlock"] += 1

    # reads: 0 the seqlocks before, 1 the copy, 2 the seqlocks after, 3 to 5 the retry
    copies = livestate.seqlock_copy(_Reads(builder, {0: start, 1: finish}), 100)
    (got,) = copies.flows
    assert [int(got[n]) for n in ("c_ready_posted", "c_sent_done", "c_done_consumed")] == [9] * 3
    assert (copies.attempts, copies.torn_flows.tolist()) == (2, [False])


def test_a_whole_write_between_the_seqlock_reads_is_retried(builder: Builder) -> None:
    builder.comm(slot=0)
    f = builder.flow(comm=0, slot=7, c_ready_posted=5)

    def write() -> None:  # a complete write: even again, but not the value read before
        f["seqlock"] += 2
        f["c_ready_posted"] = 6

    copies = livestate.seqlock_copy(_Reads(builder, {0: write}), 100)
    assert int(copies.flows[0]["c_ready_posted"]) == 6
    assert (copies.attempts, copies.torn_flows.tolist()) == (2, [False])


def test_a_comm_identity_written_during_the_copy_is_retried(builder: Builder) -> None:
    c = builder.comm(slot=3, name=b"old", generation=1)
    builder.op(comm=3, slot=0)

    def start() -> None:
        c["seqlock"] += 1
        c["name"] = b"new"

    def finish() -> None:
        c["generation"] = 2
        c["seqlock"] += 1

    # reads: 0 the seqlocks before, 1 the copy, 2 the seqlocks after, 3 to 5 the retry
    copies = livestate.seqlock_copy(_Reads(builder, {0: start, 1: finish}), 100)
    assert (bytes(copies.comms["name"][0]), int(copies.comms["generation"][0])) == (b"new", 2)
    assert (copies.attempts, copies.torn_comms.tolist()) == (2, [False])
    assert not copies.torn_ops.any()
    assert int(copies.ops[0, 0]["state"]) == layout.OP_ACTIVE


def test_a_writer_that_never_finishes_leaves_the_slot_torn(builder: Builder) -> None:
    builder.comm(slot=0)
    f = builder.flow(comm=0, slot=2)
    o = builder.op(comm=0, slot=5)

    def freeze() -> None:  # both writers stop mid-write, after the first seqlock reads
        f["seqlock"] = 7
        o["seqlock"] = 9

    copies = livestate.seqlock_copy(_Reads(builder, {0: freeze}), 4)
    assert copies.attempts == 4
    assert copies.torn_flows.tolist() == [True]
    assert np.flatnonzero(copies.torn_ops[0]).tolist() == [5]
    assert copies.torn_comms.tolist() == [False]
