"""Completion and communicator records of a ring (``ring.Ring.events_since``) as window rows.

Each ``OpEvent`` becomes one ``tables.OP_DTYPE`` row (docs/spec/bundle-v1.md ``op``: ``ts`` = end,
the end clamped to the start when NTP stepped the clock back between the two, peers mapped to
global ranks as ``records.op_records`` maps them); each communicator init becomes a
``comm`` record and teaches ``names`` its (comm hash, comm rank) -> rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np

from collscope.nodeagent.bundle import models, tables
from collscope.nodeagent.ring import eventlog, records, staterows

_NO_OPS: Final = np.zeros(0, tables.OP_DTYPE)
_NO_OPS.flags.writeable = False


def op_rows(
    rank: int,
    events: Sequence[eventlog.Event],
    names: staterows.Names,
    intern: Callable[[str], int],
) -> tuple[tables.Table, list[models.CommRecord]]:
    """``(op rows, comm records)`` of ``events`` read from the ring of ``rank``."""
    if not events:  # most ticks of most rings: no numpy call at all
        return _NO_OPS, []
    rows: list[tuple[Any, ...]] = []
    inits: list[models.CommRecord] = []
    for e in events:
        if isinstance(e, eventlog.OpEvent):
            end = max(e.end_ns, e.start_ns)
            peer = -1 if e.peer is None else names.peer(e.comm_hash, e.peer)
            rows.append(
                (
                    rank,
                    end,
                    names.comm(e.comm_hash),
                    e.seq,
                    intern(e.op),
                    e.bytes,
                    intern(e.dtype),
                    intern(e.algo),
                    intern(e.proto),
                    e.nchannels,
                    peer,
                    e.start_ns,
                    end,
                )
            )
        elif e.kind == "init":
            names.learn_peer(e.comm_hash, e.rank, rank)
            inits.append(
                models.CommRecord(
                    rank=rank,
                    ts=e.time_ns,
                    comm=records.comm_hex(e.comm_hash),
                    comm_rank=e.rank,
                    nranks=e.nranks,
                    nnodes=e.nnodes,
                    name=e.name,
                )
            )
    return np.array(rows, dtype=tables.OP_DTYPE), inits
