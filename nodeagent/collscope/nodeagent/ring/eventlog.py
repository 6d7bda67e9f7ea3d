"""Completion and communicator records of a trace ring (ring header protocol §3).

The event region is a ring of 64-byte records: one per finished collective or point-to-point
operation (``struct collscope_op_record``: what a docs/spec/bundle-v1.md ``op`` record carries, with
the end taken from the op's true completion, notes/nccl-profiler.md §3) and one per
communicator init or finalize (``struct collscope_comm_record``). Record number ``i`` (its
write index) lives in slot ``i % count`` and is valid while that slot's ``idx`` equals ``i``;
``read`` copies a window of them and checks each value. ``ring.Ring.events_since`` is the entry
point and handles cursors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.ring import layout


@dataclasses.dataclass(frozen=True, slots=True)
class OpEvent:
    """One completed operation (``struct collscope_op_record``); ``index`` is its write index.

    ``end_ns`` is the true completion (last child stop, notes §3), see ``flags``. ``peer`` is a
    rank inside the communicator, set for point-to-point ops only.
    """

    index: int
    comm_hash: int
    comm_slot: int | None
    seq: int
    op: str
    bytes: int
    dtype: str
    algo: str
    proto: str
    nchannels: int
    flags: int
    start_ns: int
    end_ns: int
    peer: int | None
    gpu_ns: int


@dataclasses.dataclass(frozen=True, slots=True)
class CommEvent:
    """A communicator was initialised (``kind="init"``) or finalized (``"finalize"``).

    ``name`` is the communicator name truncated to 23 bytes; the comm slot holds it whole.
    """

    index: int
    kind: str
    comm_hash: int
    comm_slot: int | None
    rank: int
    nranks: int
    nnodes: int
    profiler_api: int
    time_ns: int
    name: str


Event = OpEvent | CommEvent


# Copies the records of write indices ``[first, first + count)`` now, in index order (slot
# ``index % slot count``), from the file (``ring.Ring`` preads them).
Fetch = Callable[[int, int], npt.NDArray[Any]]

# Records read per pass: the three copies of a pass are 3 x 1 MiB however large the ring
# (a 256 MiB ring holds 4 M records).
CHUNK: Final = 16384


def read(
    path: str,
    fetch: Fetch,
    start: int,
    written: int,
    *,
    region_offset: int,
    slot_count: int,
    skip_pending: bool = False,
    span: tuple[int, int] = (0, layout.INT64_MAX),
) -> tuple[list[Event], int, int]:
    """Records ``[start, written)`` of the ring: ``(records, stop, missed)``.

    ``start >= written - slot_count`` (the caller has skipped what was lapped). Copies every
    commit word, then the records, then the commit words again (three reads of the file: see
    ``livestate.seqlock_copy`` for why not two): a record is delivered when both readings equal
    its index, missed when a later lap overwrote it. The first record reserved but not
    committed yet (``idx`` busy or older) ends the read at ``stop``, so that the next call
    resumes there and records stay in write order; with ``skip_pending`` it counts as missed
    instead (a writer that died between reserving and committing never commits). Times
    outside ``span`` (ns, inclusive) are corrupt. Reads ``CHUNK`` records at a time.
    """
    out: list[Event] = []
    at = start
    while at < written:
        count = min(CHUNK, written - at)
        index = np.arange(at, at + count, dtype=np.uint64)
        before = fetch(at, count)["idx"]
        data = fetch(at, count)
        after = fetch(at, count)["idx"]
        slots = (index % np.uint64(slot_count)).astype(np.int64)
        pending = (before == np.uint64(layout.EVENT_IDX_BUSY)) | (before < index)
        stop = count if skip_pending or not pending.any() else int(np.argmax(pending))
        good = ((before == index) & (after == index))[:stop]
        out += _decode(path, region_offset, data[:stop][good], slots[:stop][good], span)
        at += stop
        if stop < count:
            break
    return out, at, at - start - len(out)


def _decode(
    path: str,
    region_offset: int,
    rows: npt.NDArray[Any],
    slots: npt.NDArray[np.int64],
    span: tuple[int, int],
) -> list[Event]:
    """Committed records -> ``OpEvent``/``CommEvent``, each value checked (protocol §3)."""
    out: list[Event] = []
    raw = rows["raw"]
    kinds = rows["type"].tolist()
    # One conversion of all rows to Python values, each in both record layouts: far cheaper
    # than reading numpy scalars field by field (a full 4 MiB ring holds 62,000 records).
    ops = raw.view(layout.OP_RECORD).reshape(-1).tolist()
    comms = raw.view(layout.COMM_RECORD).reshape(-1).tolist()
    op_names = layout.OP_RECORD.names or ()
    comm_names = layout.COMM_RECORD.names or ()
    for k, kind in enumerate(kinds):
        offset = region_offset + int(slots[k]) * layout.EVENT_BYTES
        check = layout.Checker(path, "events", offset, *span)
        if kind == layout.EV_OP:
            r = dict(zip(op_names, ops[k], strict=True))
            flags = r["flags"]
            p2p = bool(flags & layout.OPF_P2P)
            out.append(
                OpEvent(
                    index=r["idx"],
                    comm_hash=r["comm_hash"],
                    comm_slot=check.comm_slot(r["comm_slot"]),
                    seq=check.at_most("seq", r["seq"], layout.INT64_MAX),
                    op=check.func(r["func"]),
                    bytes=check.at_most("bytes", r["bytes"], layout.INT64_MAX),
                    dtype=check.name("dtype", r["dtype"], layout.DTYPE_NAMES),
                    algo=check.name("algo", r["algo"], layout.ALGO_NAMES),
                    proto=check.name("proto", r["proto"], layout.PROTO_NAMES),
                    nchannels=r["nchannels"],
                    flags=flags,
                    start_ns=check.time("start_ns", r["start_ns"]),
                    end_ns=check.time("end_ns", r["end_ns"]),
                    peer=check.peer("peer", r["peer"], None) if p2p else None,
                    gpu_ns=r["gpu_ns"],
                )
            )
        elif kind in (layout.EV_COMM_INIT, layout.EV_COMM_FINALIZE):
            r = dict(zip(comm_names, comms[k], strict=True))
            nranks, rank = check.comm_ranks(r["nranks"], r["rank"], r["nnodes"])
            out.append(
                CommEvent(
                    index=r["idx"],
                    kind="init" if kind == layout.EV_COMM_INIT else "finalize",
                    comm_hash=r["comm_hash"],
                    comm_slot=check.comm_slot(r["comm_slot"]),
                    rank=rank,
                    nranks=nranks,
                    nnodes=r["nnodes"],
                    profiler_api=r["profiler_api"],
                    time_ns=check.time("time_ns", r["time_ns"]),
                    name=check.text("name", r["name"], layout.COMM_RECORD_NAME_LEN),
                )
            )
        else:
            raise check.corrupt("type", f"record type {kind} is unknown (committed record)")
    return out
