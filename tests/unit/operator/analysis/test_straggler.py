"""Root cause of a slowdown on hand-built op histories: compute, network, node, host."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import diagnosis, failure, placement, straggler

S = 1_000_000_000
MS = 1_000_000
BASE = 10  # rounds 0..9 before the slowdown
WINDOW = 6  # rounds 10..15 in it
SINCE = BASE * 100 * MS
Cat = diagnosis.Category
SETTINGS = straggler.StragglerSettings(
    late_min_s=0.002,
    late_factor=3.0,
    explained_share=0.5,
    min_late_rounds=2,
    net_slowdown=1.5,
    net_min_excess_s=0.001,
    host_stall_s=0.3,
    host_min_samples=2,
    node_share=0.75,
    node_score=0.5,
)

# (round k, rank) -> (ms late to enter, ms the transfer takes)
Shape = Callable[[int, int], tuple[float, float]]


def _job(world: int, per_node: int) -> models.Job:
    return models.Job(
        world_size=world,
        ranks=[models.RankInfo(rank=r, node=f"n{r // per_node}") for r in range(world)],
    )


def _build(
    world: int, comms: dict[str, tuple[int, ...]], shape: Shape, *, per_node: int = 1
) -> tables.BundleBuilder:
    """Every communicator runs one AllReduce per 100 ms round; a member enters ``late`` ms
    after the round starts (having computed that much longer) and every member ends together
    ``xfer`` ms after the last one entered."""
    b = tables.BundleBuilder(_job(world, per_node))
    for cid, members in comms.items():
        for i, r in enumerate(members):
            b.add_comm(rank=r, ts=0, comm=cid, comm_rank=i, nranks=len(members))
    for k in range(BASE + WINDOW):
        for ci, (cid, members) in enumerate(comms.items()):
            t = k * 100 * MS + ci * 40 * MS
            starts = {r: t + r * 100_000 + int(shape(k, r)[0] * MS) for r in members}
            end = max(starts.values()) + int(max(shape(k, r)[1] for r in members) * MS)
            for r in members:
                b.add_op(
                    rank=r,
                    ts=end,
                    comm=cid,
                    seq=k,
                    op="AllReduce",
                    nbytes=1 << 20,
                    start=starts[r],
                    end=end,
                )
    return b


def _analyze(b: tables.BundleBuilder) -> failure.Finding | None:
    bundle = b.build()
    span = bundle.time_span()
    assert span is not None
    return straggler.analyze(
        bundle,
        since_ns=SINCE,
        t_ns=span[1],
        base_from_ns=-1,
        where=placement.Placement.of(bundle.job),
        interval_ns=100 * MS,
        settings=SETTINGS,
    )


def _healthy(k: int, r: int) -> tuple[float, float]:
    return 0.0, 10.0


def test_healthy_history_has_no_straggler() -> None:
    assert _analyze(_build(3, {"0xa": (0, 1, 2)}, _healthy)) is None


def test_constant_late_starter_is_slow_compute() -> None:
    def shape(k: int, r: int) -> tuple[float, float]:
        return (30.0 if k >= BASE and r == 2 else 0.0), 10.0

    f = _analyze(_build(3, {"0xa": (0, 1, 2)}, shape))
    assert f is not None and f.category is Cat.SLOW_COMPUTE
    assert f.culprits[0].rank == 2 and f.culprits[0].component == "gpu"
    assert f.culprits[0].score == 1.0 and f.margin == 1.0
    assert any(e.startswith("rank 2 (n2) entered") and "last" in e for e in f.evidence)
    assert any("CCL-D P" in e for e in f.evidence)


def test_shared_member_of_slowed_communicators_is_slow_network() -> None:
    def shape(k: int, r: int) -> tuple[float, float]:
        return 0.0, (40.0 if k >= BASE else 10.0)

    f = _analyze(_build(3, {"0xa": (0, 1), "0xb": (1, 2)}, shape))
    assert f is not None and f.category is Cat.SLOW_NETWORK
    assert f.culprits[0].rank == 1 and f.culprits[0].component == "nic"
    assert {c.rank for c in f.culprits[1:]} == {0, 2}
    assert f.culprits[1].score < 1.0
    assert any("transfer time" in e for e in f.evidence)


def test_whole_node_late_is_a_node_fault() -> None:
    def shape(k: int, r: int) -> tuple[float, float]:
        if k < BASE or r < 2:
            return 0.0, 10.0
        last = 2 + k % 2  # ranks 2 and 3 (node n1) take turns arriving last
        return (30.0 if r == last else 29.0), 10.0

    f = _analyze(_build(4, {"0xa": (0, 1, 2, 3)}, shape, per_node=2))
    assert f is not None and f.category is Cat.SLOW_COMPUTE
    assert {c.rank for c in f.culprits} == {2, 3}
    assert all(c.node == "n1" for c in f.culprits)
    assert any("node n1" in e for e in f.evidence)


def test_bursty_proxy_stalls_are_slow_host() -> None:
    b = _build(3, {"0xa": (0, 1, 2)}, _healthy)
    for k in (BASE + 1, BASE + 3):
        ts = k * 100 * MS + 50 * MS
        # rank 1 holds chunks ready, rank 2 has buffers posted, nothing moved for 0.4 s
        stuck = (0, 2, tables.SEND, 16, 6, 2, -1, 2, -1, 400 * MS)
        posted = (0, 1, tables.RECV, 16, -1, -1, 8, 2, 2, 400 * MS)
        for rank, flow in ((1, stuck), (2, posted)):
            b.add_state(
                rank=rank,
                ts=ts,
                comm="0xa",
                seq=k,
                op="AllReduce",
                nbytes=1 << 20,
                start=ts - 10 * MS,
                flows=[flow],
            )
    f = _analyze(b)
    assert f is not None and f.category is Cat.SLOW_HOST
    assert f.culprits[0].rank == 1 and f.culprits[0].component == "host"
    assert any("proxy" in e for e in f.evidence)


def test_empty_window_has_no_finding() -> None:
    bundle = _build(3, {"0xa": (0, 1, 2)}, _healthy).build()
    f = straggler.analyze(
        bundle,
        since_ns=100 * S,
        t_ns=200 * S,
        base_from_ns=0,
        where=placement.Placement.of(bundle.job),
        settings=SETTINGS,
    )
    assert f is None


def test_alternatives_name_the_weighed_categories_and_the_runner_up() -> None:
    # Verdict slow.network on rank 5 (node n1); rank 1 (node n0) scored 0.9 of it; rank 2 had
    # one unexplained late start (the compute rule needs 2); no proxy stalls.
    where = placement.Placement.of(
        models.Job(
            world_size=6,
            ranks=[models.RankInfo(rank=r, node=f"n{r // 3}", gpu=r % 3) for r in range(6)],
        )
    )
    ranks = np.arange(6, dtype=np.int64)
    ev = straggler._Evidence(
        ranks=ranks,
        late=np.asarray([0.0, 0.0, 1.0, 0.0, 0.0, 0.0]),
        net=np.asarray([0.0, 0.9, 0.0, 0.0, 0.0, 1.0]),
        host=np.zeros(6),
        p=0.2,
    )
    found = failure.Finding(
        category=diagnosis.Category.SLOW_NETWORK,
        culprits=[
            diagnosis.Culprit(rank=5, node="n1", component="nic", score=1.0),
            diagnosis.Culprit(rank=1, node="n0", component="nic", score=0.9),
        ],
        evidence=[],
        margin=0.1,
        coverage=1.0,
    )
    alts = straggler._alternatives(found, ev, where, straggler.StragglerSettings())
    assert [(a.category, a.rank, a.node, a.score) for a in alts] == [
        ("slow.network", 1, "n0", 0.9),
        ("slow.compute", 2, "n0", 0.25),
    ]
    assert alts[1].why == (
        "rank 2 (n0, GPU 2): 1 unexplained late starts, below the rule's threshold of 2"
    )
