"""Ring events -> op rows and comm records, peers mapped, a stepped-back clock clamped."""

from __future__ import annotations

from collscope.nodeagent import window
from collscope.nodeagent.ring import eventlog, eventrows, staterows

T0 = 1_732_001_234_000_000_000
COMM = 0xABC


def op(index: int, **kw: object) -> eventlog.OpEvent:
    fields: dict[str, object] = dict(
        index=index, comm_hash=COMM, comm_slot=0, seq=index, op="Send", bytes=64,
        dtype="float32", algo="", proto="Simple", nchannels=1, flags=0,
        start_ns=T0 + index, end_ns=T0 + index + 5, peer=None, gpu_ns=0,
    )  # fmt: skip
    fields.update(kw)
    return eventlog.OpEvent(**fields)  # type: ignore[arg-type]


def test_ops_and_inits() -> None:
    w = window.Window(window_s=60, memory_cap_bytes=1 << 20)
    names = staterows.Names(w.comm_ids, w.strings)
    init = eventlog.CommEvent(
        index=0, kind="init", comm_hash=COMM, comm_slot=0, rank=1, nranks=2, nnodes=1,
        profiler_api=5, time_ns=T0, name="pp",
    )  # fmt: skip
    names.learn_peer(COMM, 0, 8)  # comm rank 0 is global rank 8 (learnt from its ring)
    rows, inits = eventrows.op_rows(
        9, [init, op(1, peer=0), op(2, peer=1, end_ns=T0)], names, w.strings
    )
    assert [(c.rank, c.comm, c.comm_rank, c.name) for c in inits] == [(9, "0xabc", 1, "pp")]
    assert rows["peer"].tolist() == [8, 9]  # comm rank 1 is this ring's rank: learnt from init
    assert rows["end"].tolist() == [T0 + 6, T0 + 2]  # end before start: clamped to the start
    assert rows["ts"].tolist() == rows["end"].tolist()
    assert [w.strings.values[i] for i in rows["op"].tolist()] == ["Send", "Send"]
    assert w.comm_ids.values[int(rows["comm"][0])] == "0xabc"
