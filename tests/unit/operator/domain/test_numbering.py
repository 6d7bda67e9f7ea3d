"""One numbering of communicators and strings across a job's pulled windows."""

from __future__ import annotations

from collscope.nodeagent.bundle import models, tables
from collscope.operator.domain import numbering

S = 1_000_000_000


def _window(order: list[tuple[int, str, str]]) -> tables.Bundle:
    """Ops of (rank, comm id, op name), in that order: the builder numbers by first sight."""
    b = tables.BundleBuilder(models.Job(world_size=4))
    for seq, (rank, comm, op) in enumerate(order):
        b.add_comm(rank=rank, ts=S, comm=comm, comm_rank=0, nranks=2, name=f"name-{comm}")
        b.add_op(rank=rank, ts=2 * S + seq, comm=comm, seq=seq, op=op, nbytes=8,
                 start=2 * S, end=2 * S + seq)  # fmt: skip
    b.add_hw(rank=0, ts=S, node="n0", device="gpu0", metric="sm_clock", value=1.0)
    return b.build()


def _named(bundle: tables.Bundle) -> list[tuple[int, str, str, str]]:
    """Every op row by names: (rank, comm id, op, its comm's record name)."""
    names = {int(c["comm"]): bundle.string(int(c["name"])) for c in bundle.comms}
    return sorted(
        (int(o["rank"]), bundle.comm_id(int(o["comm"])), bundle.string(int(o["op"])),
         names[int(o["comm"])])
        for o in bundle.ops
    )  # fmt: skip


def test_same_ids_keep_their_numbers_whatever_order_a_window_brings() -> None:
    first = _window([(0, "0xa", "AllReduce"), (2, "0xb", "AllGather")])
    second = _window([(2, "0xb", "AllGather"), (3, "0xc", "Send"), (0, "0xa", "AllReduce")])
    assert first.comm_index("0xa") == 0 and second.comm_index("0xa") == 2  # as pulled
    n = numbering.StableNumbering()
    a, b = n.apply(first), n.apply(second)
    assert a.comm_index("0xa") == b.comm_index("0xa") == 0
    assert a.comm_index("0xb") == b.comm_index("0xb") == 1
    assert b.comm_index("0xc") == 2 and b.comm_ids == ("0xa", "0xb", "0xc")
    assert a.string_index("AllReduce") == b.string_index("AllReduce")
    assert a.string_index("AllGather") == b.string_index("AllGather")
    assert b.string_index("") == 0
    # Every row still says what it said: only the numbers changed.
    assert _named(a) == _named(first) and _named(b) == _named(second)
    hw = b.hw[0]
    assert (b.string(int(hw["node"])), b.string(int(hw["metric"]))) == ("n0", "sm_clock")


def test_an_absent_name_stays_absent() -> None:
    w = _window([(0, "0xa", "AllReduce")])
    comms = w.comms.copy()
    comms["name"] = -1
    w = tables.Bundle(job=w.job, comm_ids=w.comm_ids, strings=w.strings, comms=comms, ops=w.ops,
                      states=w.states, flows=w.flows, hw=w.hw)  # fmt: skip
    assert numbering.StableNumbering().apply(w).comms["name"].tolist() == [-1]
