"""Sub-bundles: the rows of some ranks inside a time range, as a ``Bundle`` of the same shape.

Why: the live operator never holds a whole run. Each second it pulls the trigger summaries of the
sampled ranks (Mycroft §4.3), and on a trigger the window around it from every rank (Mycroft §5.1:
logs within (t - Δ, t]). Replaying a recorded bundle through exactly those cuts keeps offline
analysis honest: no function downstream can look ahead of the tick, because the rows are not there.

``comm`` records are kept whatever their time (a communicator is created once, long before the
window, and analysis needs its membership). Flow rows are laid out again so that each kept state
still owns a contiguous ``flows[flow_lo:flow_hi]`` slice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import tables

BoolMask = npt.NDArray[np.bool_]


def _mask(
    table: tables.Table,
    ranks: npt.NDArray[np.int32] | None,
    since_ns: int | None,
    until_ns: int | None,
) -> BoolMask:
    keep = np.ones(len(table), dtype=bool)
    if ranks is not None:
        keep &= np.isin(table["rank"], ranks)
    if since_ns is not None:
        keep &= table["ts"] > since_ns
    if until_ns is not None:
        keep &= table["ts"] <= until_ns
    return keep


def gather_ranges(lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    """Indices ``concat(arange(l, h) for l, h in zip(lo, hi))`` without a Python loop."""
    lengths = (hi - lo).astype(np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.intp)
    offsets = np.cumsum(lengths) - lengths
    idx = np.arange(total, dtype=np.int64) - np.repeat(offsets - lo, lengths)
    return idx.astype(np.intp)


def select(
    bundle: tables.Bundle,
    *,
    ranks: Sequence[int] | npt.NDArray[np.int32] | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
) -> tables.Bundle:
    """Rows of ``ranks`` (None: all) with ``since_ns < ts <= until_ns`` (None: unbounded).

    ``comm`` records are filtered by rank only. Interned string and communicator tables are
    shared unchanged, so indices stay valid across the cut.
    """
    rank_arr = None if ranks is None else np.asarray(ranks, dtype=np.int32)
    comms = bundle.comms[_mask(bundle.comms, rank_arr, None, None)]
    ops = bundle.ops[_mask(bundle.ops, rank_arr, since_ns, until_ns)]
    hw = bundle.hw[_mask(bundle.hw, rank_arr, since_ns, until_ns)]
    states = bundle.states[_mask(bundle.states, rank_arr, since_ns, until_ns)]
    take = gather_ranges(states["flow_lo"], states["flow_hi"])
    flows = bundle.flows[take]
    if len(states):
        states = states.copy()
        lengths = states["flow_hi"] - states["flow_lo"]
        hi = np.cumsum(lengths)
        states["flow_lo"] = hi - lengths
        states["flow_hi"] = hi
    return tables.Bundle(
        job=bundle.job,
        comm_ids=bundle.comm_ids,
        strings=bundle.strings,
        comms=comms,
        ops=ops,
        states=states,
        flows=flows,
        hw=hw,
        source=bundle.source,
    )
