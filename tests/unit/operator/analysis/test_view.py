"""Sub-bundles cut by rank and time: rows kept, comm records kept, flows laid out again."""

from __future__ import annotations

import numpy as np

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import view

S = 1_000_000_000


def _bundle() -> tables.Bundle:
    b = tables.BundleBuilder(models.Job(world_size=3))
    for r in range(3):
        b.add_comm(rank=r, ts=0, comm="0xa", comm_rank=r, nranks=3)
        for k in range(1, 5):
            ts = k * S
            b.add_op(rank=r, ts=ts, comm="0xa", seq=k, op="AllReduce", nbytes=8, start=ts, end=ts)
            # state k of rank r has k flows, so every state owns a different slice length
            flows = [(c, (r + 1) % 3, tables.SEND, 8, 4, 4 - c % 2, -1, 2, -1, r) for c in range(k)]
            b.add_state(
                rank=r, ts=ts, comm="0xa", seq=k, op="AllReduce", nbytes=8, start=ts, flows=flows
            )
        b.add_hw(rank=r, ts=2 * S, node="n", device="gpu0", metric="m", value=float(r))
    return b.build()


def test_gather_ranges_concatenates_aranges() -> None:
    lo = np.asarray([3, 0, 7, 7], dtype=np.int64)
    hi = np.asarray([5, 2, 7, 9], dtype=np.int64)
    assert view.gather_ranges(lo, hi).tolist() == [3, 4, 0, 1, 7, 8]
    empty = np.zeros(0, dtype=np.int64)
    assert len(view.gather_ranges(empty, empty)) == 0


def test_no_bounds_keeps_everything() -> None:
    b = _bundle()
    v = view.select(b)
    for name in ("comms", "ops", "states", "flows", "hw"):
        assert np.array_equal(getattr(v, name), getattr(b, name)), name


def test_rank_and_time_bounds() -> None:
    b = _bundle()
    v = view.select(b, ranks=[2, 0], since_ns=1 * S, until_ns=3 * S)
    assert set(v.ops["rank"].tolist()) == {0, 2}
    assert sorted(set(v.ops["ts"].tolist())) == [2 * S, 3 * S]  # since exclusive, until inclusive
    assert set(v.states["ts"].tolist()) == {2 * S, 3 * S}
    assert len(v.hw) == 2
    assert v.comm_ids == b.comm_ids and v.strings == b.strings and v.job == b.job


def test_comm_records_ignore_the_time_bounds() -> None:
    v = view.select(_bundle(), ranks=[1], since_ns=3 * S, until_ns=4 * S)
    assert v.comms["rank"].tolist() == [1]  # written at ts 0, long before the window
    assert len(view.select(_bundle(), since_ns=10 * S).comms) == 3


def test_kept_states_own_their_flows() -> None:
    b = _bundle()
    v = view.select(b, ranks=[1, 2], since_ns=2 * S)
    assert len(v.flows) == int((v.states["flow_hi"] - v.states["flow_lo"]).sum())
    assert v.states["flow_lo"][0] == 0
    assert np.array_equal(v.states["flow_lo"][1:], v.states["flow_hi"][:-1])
    for i, st in enumerate(v.states):
        orig = np.flatnonzero(
            (b.states["rank"] == st["rank"]) & (b.states["ts"] == st["ts"])
        ).item()
        assert np.array_equal(v.state_flows(i), b.state_flows(orig))
        assert len(v.state_flows(i)) == st["ts"] // S  # state k had k flows


def test_empty_window() -> None:
    v = view.select(_bundle(), since_ns=100 * S)
    assert len(v.ops) == len(v.states) == len(v.flows) == len(v.hw) == 0
    assert v.time_span() == (0, 0)  # only the comm records remain
