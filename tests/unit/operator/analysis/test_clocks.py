"""Node clock offsets estimated from near-simultaneous completions, and the aligned bundle."""

from __future__ import annotations

import numpy as np
import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import clocks, placement

S = 1_000_000_000
MS = 1_000_000
NODES = 4
PER_NODE = 2
# Each node's clock runs this far ahead of true time (ns).
SKEW = {0: 40 * MS, 1: -25 * MS, 2: 0, 3: 12 * MS}


def _job() -> models.Job:
    return models.Job(
        world_size=NODES * PER_NODE,
        ranks=[
            models.RankInfo(rank=r, node=f"n{r // PER_NODE}", gpu=r % PER_NODE)
            for r in range(NODES * PER_NODE)
        ],
    )


def _bundle(skew: dict[int, int], *, rounds: int = 40, seed: int = 0) -> tables.Bundle:
    """A ring AllReduce over every rank each 100 ms (true time); each member's end lies within
    0.5 ms of the others' (one chunk transfer), its start up to 20 ms apart (arrival spread)."""
    rng = np.random.default_rng(seed)
    b = tables.BundleBuilder(_job())
    n = NODES * PER_NODE
    for r in range(n):
        b.add_comm(rank=r, ts=S, comm="0xa", comm_rank=r, nranks=n, nnodes=NODES)
    for seq in range(rounds):
        end = 2 * S + seq * 100 * MS
        for r in range(n):
            off = skew[r // PER_NODE]
            e = end + int(rng.uniform(0, 0.5 * MS)) + off
            st = end - 10 * MS - int(rng.uniform(0, 20 * MS)) + off
            b.add_op(
                rank=r, ts=e, comm="0xa", seq=seq, op="AllReduce", nbytes=1 << 20, start=st, end=e
            )
            b.add_state(
                rank=r,
                ts=st + 5 * MS,
                comm="0xa",
                seq=seq,
                op="AllReduce",
                nbytes=1 << 20,
                start=st,
                flows=[],
            )
    return b.build()


def test_offsets_recovered_relative_to_the_median_node() -> None:
    bundle = _bundle(SKEW)
    off = clocks.estimate(bundle, placement.Placement.of(bundle.job))
    truth = np.asarray([SKEW[r // PER_NODE] for r in range(NODES * PER_NODE)], dtype=np.float64)
    truth -= np.median(np.asarray(list(SKEW.values()), dtype=np.float64))
    assert off.rounds == 40
    assert np.abs(off.offset_ns - truth).max() < 1 * MS
    assert off.of(0) == off.of(1) and off.of(99) == 0


def test_aligned_bundle_has_ends_of_one_round_within_a_chunk_transfer() -> None:
    bundle = _bundle(SKEW)
    fixed = clocks.aligned(bundle, clocks.estimate(bundle, placement.Placement.of(bundle.job)))
    for seq in range(40):
        ends = fixed.ops["end"][fixed.ops["seq"] == seq]
        assert int(ends.max() - ends.min()) < 2 * MS
    # Durations and order are untouched; start/ts move with end.
    assert np.array_equal(
        fixed.ops["end"] - fixed.ops["start"], bundle.ops["end"] - bundle.ops["start"]
    )
    assert np.array_equal(fixed.ops["rank"], bundle.ops["rank"])
    shift = bundle.ops["end"] - fixed.ops["end"]
    assert np.array_equal(bundle.ops["ts"] - fixed.ops["ts"], shift)
    st_shift = bundle.states["ts"] - fixed.states["ts"]
    assert np.array_equal(bundle.states["start"] - fixed.states["start"], st_shift)


@pytest.mark.parametrize("skew", [{0: 0, 1: 0, 2: 0, 3: 0}])
def test_agreeing_clocks_are_left_alone(skew: dict[int, int]) -> None:
    bundle = _bundle(skew)
    off = clocks.estimate(bundle, placement.Placement.of(bundle.job))
    assert np.abs(off.offset_ns).max() < 1 * MS


def test_without_placement_nothing_is_corrected() -> None:
    bundle = _bundle(SKEW)
    bare = tables.BundleBuilder(models.Job(world_size=NODES * PER_NODE))
    bare.add_tables(bundle)
    b2 = bare.build()
    off = clocks.estimate(b2, placement.Placement.of(b2.job))
    assert off.rounds == 0 and not off.offset_ns.any()
    assert clocks.aligned(b2, off) is b2
