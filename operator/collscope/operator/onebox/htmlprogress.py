"""Sequence numbers on the HTML report (``htmlreport``): one definition for every part of it.

Sequence numbers count per communicator, so every seq on the page is read by one definition
(``progress``) on one communicator (``focus_comm``): the top culprit's, else the one it last
worked on. The verdict, the rank grid, the timeline (``htmltimeline``) and the flows
(``htmlflows``) all read them from here, so that the grid's "last done" and the culprit's "last
operation" cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import diagnosis


@dataclass(frozen=True)
class Progress:
    """Where a rank stands on one communicator at its last record.

    ``last_done``: the highest seq it completed there; ``in_flight``: the seq of its last state
    sample there when above ``last_done`` (an operation it started and had not finished), with
    that sample's row in ``bundle.states``. A sample below ``last_done`` is of an operation that
    completed since: short operations are caught by the 10 Hz samples only now and then.
    """

    comm: int | None
    last_done: int | None
    in_flight: int | None
    state_row: int | None


def focus_comm(result: diagnosis.Diagnosis, bundle: tables.Bundle) -> int | None:
    """The communicator the page counts sequence numbers on: the top culprit's."""
    top = result.culprits[0] if result.culprits else None
    if top is None or top.rank is None:
        return None
    if top.comm is not None:
        index = bundle.comm_index(top.comm)
        if index is not None:
            return index
    return _latest_comm(bundle, top.rank)


def progress(bundle: tables.Bundle, rank: int, comm: int | None) -> Progress:
    """``rank``'s progress on ``comm``, else (no records there) on its latest communicator."""
    ops = bundle.ops[bundle.ops["rank"] == rank]
    state_rows = np.flatnonzero(bundle.states["rank"] == rank)
    if comm is None or not (
        (ops["comm"] == comm).any() or (bundle.states["comm"][state_rows] == comm).any()
    ):
        comm = _latest_comm(bundle, rank)
    if comm is None:
        return Progress(None, None, None, None)
    done = ops["seq"][ops["comm"] == comm]
    last_done = int(done.max()) if len(done) else None
    rows = state_rows[bundle.states["comm"][state_rows] == comm]
    if len(rows):
        last = int(rows[np.argmax(bundle.states["ts"][rows])])
        seq = int(bundle.states["seq"][last])
        if last_done is None or seq > last_done:
            return Progress(comm, last_done, seq, last)
    return Progress(comm, last_done, None, None)


def _latest_comm(bundle: tables.Bundle, rank: int) -> int | None:
    best: tuple[int, int] | None = None
    for table, ts in ((bundle.ops, "end"), (bundle.states, "ts")):
        mine = table[table["rank"] == rank]
        if len(mine):
            row = mine[np.argmax(mine[ts])]
            if best is None or int(row[ts]) > best[0]:
                best = (int(row[ts]), int(row["comm"]))
    return None if best is None else best[1]


def seq_text(p: Progress) -> str:
    done = "-" if p.last_done is None else f"seq {p.last_done}"
    return f"last done {done}" + ("" if p.in_flight is None else f", seq {p.in_flight} in flight")
