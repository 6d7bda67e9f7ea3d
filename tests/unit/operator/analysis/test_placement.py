"""Placement labels and Culprit records from job.json ranks."""

from __future__ import annotations

import pytest

from collscope.nodeagent.bundle import models
from collscope.operator.analysis import placement


def _where() -> placement.Placement:
    job = models.Job(
        world_size=5,
        ranks=[
            models.RankInfo(rank=0, node="gpu-node-01", pod="p0", gpu=4, nic="mlx5_4"),
            models.RankInfo(rank=3, node="gpu-node-01", gpu=0),
            models.RankInfo(rank=1, node="gpu-node-02"),
            models.RankInfo(rank=2, gpu=7),
            models.RankInfo(rank=4),
        ],
    )
    return placement.Placement.of(job)


@pytest.mark.parametrize(
    ("rank", "label"),
    [
        (0, "rank 0 (gpu-node-01, GPU 4)"),
        (1, "rank 1 (gpu-node-02)"),
        (2, "rank 2 (GPU 7)"),
        (4, "rank 4"),  # listed without placement
        (9, "rank 9"),  # not listed at all
    ],
)
def test_label_degrades_with_what_is_known(rank: int, label: str) -> None:
    assert _where().label(rank) == label


def test_gpu_zero_is_named() -> None:
    assert _where().label(3) == "rank 3 (gpu-node-01, GPU 0)"


def test_nodes_and_their_ranks() -> None:
    w = _where()
    assert w.node(3) == "gpu-node-01" and w.node(2) is None and w.node(42) is None
    assert w.ranks_on("gpu-node-01") == (0, 3)  # sorted, whatever job.json's order
    assert w.ranks_on("nowhere") == ()


def test_nic_of_a_rank_and_the_ranks_sharing_it() -> None:
    job = models.Job(
        world_size=4,
        ranks=[
            models.RankInfo(rank=0, node="n0", nic="mlx5_0"),
            models.RankInfo(rank=1, node="n0", nic="mlx5_0"),  # shares rank 0's NIC
            models.RankInfo(rank=2, node="n1", nic="mlx5_0"),  # same name, another node
            models.RankInfo(rank=3, node="n1"),  # NIC not named
        ],
    )
    w = placement.Placement.of(job)
    assert w.nic_of(0) == ("n0", "mlx5_0") and w.nic_of(3) is None and w.nic_of(9) is None
    assert w.nic_users(1) == (0, 1)
    assert w.nic_users(2) == (2,)
    assert w.nic_users(3) == (3,)  # taken to have a NIC of its own


def test_culprit_copies_placement_and_clamps_score() -> None:
    w = _where()
    c = w.culprit(0, component="nic", score=1.7, comm="0xa", channel=2, peer=3)
    assert (c.rank, c.node, c.pod, c.gpu, c.nic) == (0, "gpu-node-01", "p0", 4, "mlx5_4")
    assert (c.component, c.comm, c.channel, c.peer) == ("nic", "0xa", 2, 3)
    assert c.score == 1.0
    assert w.culprit(9, component="gpu", score=-3.0).score == 0.0
    unknown = w.culprit(9, component="gpu", score=0.12345)
    assert unknown.node is None and unknown.gpu is None and unknown.score == 0.123


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (2_100_000_000, "2.1 s"),
        (340_000_000, "340 ms"),
        (2_500_000, "2.5 ms"),
        (85_000, "85 us"),
        (-1_500_000_000, "-1.5 s"),
    ],
)
def test_seconds(ns: int, text: str) -> None:
    assert placement.seconds(ns) == text


def test_culprit_carries_the_gpu_uuid_only_when_known() -> None:
    job = models.Job(
        world_size=2,
        ranks=[
            models.RankInfo(rank=0, node="n", pod="p0", gpu=4, gpu_uuid="GPU-8c1f", nic="mlx5_2"),
            models.RankInfo(rank=1, node="n", gpu=5),
        ],
    )
    where = placement.Placement.of(job)
    named = where.culprit(0, component="gpu", score=1.0)
    assert (named.node, named.pod, named.gpu, named.gpu_uuid, named.nic) == (
        "n", "p0", 4, "GPU-8c1f", "mlx5_2",
    )  # fmt: skip
    assert named.model_dump()["gpu_uuid"] == "GPU-8c1f"
    assert "gpu_uuid" not in where.culprit(1, component="gpu", score=1.0).model_dump()


def test_culprit_says_why_its_gpu_or_nic_is_unknown() -> None:
    """job.json's ``unresolved`` (the device map's reason) rides on the culprit while a device
    it explains is still unknown, and is left out once both are known."""
    why = "gpu: no NVML; nic: GPU unknown, 4 NICs to choose from"
    where = placement.Placement.of(
        models.Job(
            world_size=2,
            ranks=[
                models.RankInfo(rank=0, node="n", pod="p0", unresolved=why),
                models.RankInfo(rank=1, node="n", pod="p1", gpu=1, nic="mlx5_1", unresolved=why),
            ],
        )
    )
    unknown = where.culprit(0, component="nic", score=1.0).model_dump()
    assert (unknown["gpu"], unknown["nic"], unknown["unresolved"]) == (None, None, why)
    assert "unresolved" not in where.culprit(1, component="nic", score=1.0).model_dump()
