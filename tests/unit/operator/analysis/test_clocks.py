"""Node clock offsets estimated from near-simultaneous completions, and the aligned bundle."""

from __future__ import annotations

import dataclasses

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


# Pipeline job (the 64-rank TP8xPP2xDP4 layout, two ranks a node): stage s is nodes 4s..4s+3,
# DP collectives tie the nodes of one stage, pipeline Send/Recv ties node i to node i + 4 only,
# as often as the DP collectives do. Nodes 1 and 5 are 30 ms ahead of their stages together:
# the pipeline rounds between them see no difference, the DP rounds of each do.
PP_SKEW = {0: 0, 1: 30 * MS, 2: -10 * MS, 3: 5 * MS, 4: -20 * MS, 5: 35 * MS, 6: 8 * MS, 7: 0}
PP_PER_NODE = 2


def _pp_job() -> models.Job:
    n = 8 * PP_PER_NODE
    return models.Job(
        world_size=n,
        ranks=[
            models.RankInfo(rank=r, node=f"n{r // PP_PER_NODE}", gpu=r % PP_PER_NODE)
            for r in range(n)
        ],
    )


def _pp_bundle(skew: dict[int, int], *, iterations: int = 60, seed: int = 0) -> tables.Bundle:
    """Per iteration (100 ms of true time): one Send/Recv per pipeline pair (rank r of stage 0
    with rank r + 8 of stage 1) and one AllReduce per DP communicator (stage x local rank: four
    ranks on four nodes), and one more Send/Recv at the end (the pipeline's flush): every node
    takes part in one pipeline round more than DP rounds, as rank 9 of the simulator's 64-rank
    job (166 and 165). Every member's end within 0.5 ms of its round's."""
    rng = np.random.default_rng(seed)
    b = tables.BundleBuilder(_pp_job())
    dp = {f"0xd{s}{g}": [8 * s + 2 * i + g for i in range(4)] for s in (0, 1) for g in (0, 1)}
    pp = {f"0xe{r}": [r, r + 8] for r in range(8)}
    for cid, members in (dp | pp).items():
        nodes = len({m // PP_PER_NODE for m in members})
        for pos, r in enumerate(members):
            b.add_comm(rank=r, ts=S, comm=cid, comm_rank=pos, nranks=len(members), nnodes=nodes)

    def op(rank: int, cid: str, seq: int, name: str, end: int) -> None:
        e = end + int(rng.uniform(0, 0.5 * MS)) + skew[rank // PP_PER_NODE]
        b.add_op(rank=rank, ts=e, comm=cid, seq=seq, op=name, nbytes=1 << 20, start=e - MS, end=e)

    for it in range(iterations + 1):
        t = 2 * S + it * 100 * MS
        for r in range(8):
            op(r, f"0xe{r}", it, "Send", t)
            op(r + 8, f"0xe{r}", it, "Recv", t)
        for cid, members in dp.items():
            for r in members if it < iterations else ():
                op(r, cid, it, "AllReduce", t + 50 * MS)
    return b.build()


def test_pipeline_pairs_do_not_pin_a_shared_offset() -> None:
    """Half of every node's multi-node rounds are Send/Recv with its pipeline peer; the solve
    over the offset graph still puts every node within a few ms of its true offset (a median
    of per-round deviations per node left nodes 1 and 5 together ~30 ms off)."""
    bundle = _pp_bundle(PP_SKEW)
    off = clocks.estimate(bundle, placement.Placement.of(bundle.job))
    assert off.rounds == 60 * 4 + 61 * 8
    est = np.asarray([off.of(PP_PER_NODE * n) for n in range(8)], dtype=np.float64)
    res = est - np.asarray([PP_SKEW[n] for n in range(8)], dtype=np.float64)
    assert np.abs(res - np.median(res)).max() < 2 * MS
    assert abs(float(np.median(est))) < 1  # relative to the median node


def test_node_sets_sharing_no_round_are_each_anchored_at_their_median() -> None:
    """Without the pipeline rounds the two stages share nothing: each is aligned within itself,
    relative to its own median node (their offset to each other is not in the data)."""
    full = _pp_bundle(PP_SKEW)
    dp_only = full.ops["comm"] != full.ops["comm"]  # all False, same shape
    for cid in ("0xd00", "0xd01", "0xd10", "0xd11"):
        dp_only |= full.ops["comm"] == full.comm_index(cid)
    bundle = dataclasses.replace(full, ops=full.ops[dp_only])
    off = clocks.estimate(bundle, placement.Placement.of(bundle.job))
    for stage in (0, 1):
        nodes = range(4 * stage, 4 * stage + 4)
        est = np.asarray([off.of(PP_PER_NODE * n) for n in nodes], dtype=np.float64)
        truth = np.asarray([PP_SKEW[n] for n in nodes], dtype=np.float64)
        assert np.abs(est - (truth - np.median(truth))).max() < 1 * MS


def test_a_window_of_one_round_per_communicator_is_still_aligned() -> None:
    """A 2 s trigger window holds a round or two of each DP communicator: one round, without a
    spread of its own, still counts (at the floor's weight)."""
    bundle = _pp_bundle(PP_SKEW, iterations=1)
    off = clocks.estimate(bundle, placement.Placement.of(bundle.job))
    est = np.asarray([off.of(PP_PER_NODE * n) for n in range(8)], dtype=np.float64)
    res = est - np.asarray([PP_SKEW[n] for n in range(8)], dtype=np.float64)
    assert np.abs(res - np.median(res)).max() < 2 * MS
