"""One numbering of communicators and strings for every window a job's trigger is fed.

A pulled window (``agents.pull_window``) numbers communicator ids and strings (operation names,
dtypes, hardware names) in the order its records came. The trigger keys what it learns by those
numbers (``analysis.baseline``: per comm index, per (comm, op string, bytes)), so one
communicator must keep its number from tick to tick. With a fixed sample the order happened to
repeat; with a rotating one (``analysis.rotation``) the ranks pulled change every few ticks and
the numbers with them. ``StableNumbering.apply`` renumbers a window onto the job's running
tables: an id seen before keeps its number, a new one is appended. The tables only grow with
the job's distinct communicators and strings (a few per rank).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import tables


class StableNumbering:
    """The running tables of one job (one per trigger state)."""

    def __init__(self) -> None:
        self.comm_ids: list[str] = []
        self.strings: list[str] = [""]  # index 0 is the empty string, as BundleBuilder's
        self._comm: dict[str, int] = {}
        self._str: dict[str, int] = {"": 0}

    def apply(self, bundle: tables.Bundle) -> tables.Bundle:
        """``bundle`` with its comm and string columns renumbered onto the running tables."""
        cmap = _intern(bundle.comm_ids, self.comm_ids, self._comm)
        smap = _intern(bundle.strings, self.strings, self._str)
        comms, ops, states, hw = (
            t.copy() for t in (bundle.comms, bundle.ops, bundle.states, bundle.hw)
        )
        for t in (comms, ops, states):
            t["comm"] = _mapped(cmap, t["comm"])
        for t, cols in ((comms, ("name",)), (ops, ("op", "dtype", "algo", "proto")),
                        (states, ("op",)), (hw, ("node", "device", "metric"))):  # fmt: skip
            for col in cols:
                t[col] = _mapped(smap, t[col])
        return dataclasses.replace(
            bundle,
            comm_ids=tuple(self.comm_ids),
            strings=tuple(self.strings),
            comms=comms,
            ops=ops,
            states=states,
            hw=hw,
        )


def _intern(
    values: tuple[str, ...], known: list[str], index: dict[str, int]
) -> npt.NDArray[np.int64]:
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        j = index.get(v)
        if j is None:
            j = index[v] = len(known)
            known.append(v)
        out[i] = j
    return out


def _mapped(table: npt.NDArray[np.int64], column: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """``table[column]``, keeping negative entries (an absent name) as they are."""
    if len(table) == 0:
        return column
    keep = column < 0
    out = table[np.where(keep, 0, column)].astype(column.dtype)
    out[keep] = column[keep]
    return out
