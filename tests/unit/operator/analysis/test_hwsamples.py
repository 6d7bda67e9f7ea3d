"""Hardware samples read as evidence: joined to ranks by device through job.json (never by the
record's rank), last value per device, link down, link slower than the job's usual speed,
throttle reasons; a device no rank uses is never evidence."""

from __future__ import annotations

import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import hwsamples, placement

S = 1_000_000_000


def _job(nics: dict[int, str] | None = None) -> models.Job:
    """Ranks 0, 1 on n0 and 2, 3 on n1, GPU r % 2, NIC mlx5_<r % 2> unless ``nics`` says."""
    nics = nics or {}
    return models.Job(
        job="hw",
        world_size=4,
        ranks=[
            models.RankInfo(rank=r, node=f"n{r // 2}", gpu=r % 2, nic=nics.get(r, f"mlx5_{r % 2}"))
            for r in range(4)
        ],
    )


def _bundle(
    samples: list[tuple[int, int, str, float]], job: models.Job | None = None
) -> tables.Bundle:
    """``samples``: (rank, ts, metric, value), written as the agent does: on the rank's node and
    device (``gpu<i>`` / ``mlx5_<i>``), with record rank 0 whatever the rank."""
    b = tables.BundleBuilder(job or _job())
    for rank, ts, metric, value in samples:
        device = f"mlx5_{rank % 2}" if metric.startswith("nic") else f"gpu{rank % 2}"
        b.add_hw(rank=0, ts=ts, node=f"n{rank // 2}", device=device, metric=metric, value=value)
    return b.build()


def test_latest_takes_the_last_sample_of_each_rank() -> None:
    b = _bundle([(0, 2 * S, "nic_link_up", 0.0), (0, 1 * S, "nic_link_up", 1.0), (1, S, "x", 1)])
    got = hwsamples.latest(b, "nic_link_up", [0, 1])
    assert list(got) == [0] and got[0].value == 0.0 and got[0].ts == 2 * S
    assert (got[0].node, got[0].device) == ("n0", "mlx5_0")
    assert hwsamples.latest(b, "no_such_metric", [0, 1]) == {}


def test_nic_down_only_where_the_last_sample_says_down() -> None:
    b = _bundle(
        [
            (0, S, "nic_link_up", 1.0),
            (0, 2 * S, "nic_link_up", 0.0),
            (1, S, "nic_link_up", 0.0),
            (1, 2 * S, "nic_link_up", 1.0),  # flapped back up
            (2, 2 * S, "nic_link_up", 0.0),
        ]
    )
    assert set(hwsamples.nic_down(b, [0, 1])) == {0}  # rank 2 is down but was not asked about


def test_nic_slow_is_relative_to_the_jobs_usual_speed() -> None:
    speeds = [400.0, 400.0, 50.0, 400.0]
    b = _bundle([(r, S, "nic_link_speed_gbps", v) for r, v in enumerate(speeds)])
    slow = hwsamples.nic_slow(b, [1, 2])
    assert set(slow) == {2}
    text = hwsamples.nic_slow_text(slow, placement.Placement.of(b.job))
    assert text == ["mlx5_0 of rank 2 (n1, GPU 0) reports a link speed of 50 Gb/s"]
    same = _bundle([(r, S, "nic_link_speed_gbps", 400.0) for r in range(4)])
    assert hwsamples.nic_slow(same, [0, 1, 2, 3]) == {}


def test_gpu_throttled_reads_power_and_hardware_slowdown_bits() -> None:
    b = _bundle(
        [
            (0, S, "clocks_event_reasons", float(hwsamples.SW_POWER_CAP)),
            (1, S, "clocks_event_reasons", 0.0),
            (2, S, "clocks_event_reasons", 1.0),  # GPU idle: not a throttle
            (3, S, "clocks_event_reasons", 0x40),  # thermal
        ]
    )
    assert set(hwsamples.gpu_throttled(b, [0, 1, 2, 3])) == {0, 3}


def test_nic_busy_flags_nics_carrying_several_times_the_usual_rate() -> None:
    rates = [5e9, 5.5e9, 35e9, 36e9]  # a two-node job: half the NICs carry background traffic
    b = _bundle([(r, S, "nic_tx_bytes_per_second", v) for r, v in enumerate(rates)])
    busy = hwsamples.nic_busy(b, [0, 1, 2, 3])
    assert set(busy) == {2, 3}
    assert "35.0 GB/s" in hwsamples.nic_busy_text(busy, placement.Placement.of(b.job))[0]
    calm = _bundle([(r, S, "nic_tx_bytes_per_second", 5e9 + r) for r in range(4)])
    assert hwsamples.nic_busy(calm, [0, 1, 2, 3]) == {}


def test_notes_name_every_symptom_of_the_rank_and_nothing_for_a_healthy_one() -> None:
    samples: list[tuple[int, int, str, float]] = []
    for r in range(4):
        samples += [
            (r, S, "nic_link_up", 0.0 if r == 1 else 1.0),
            (r, S, "clocks_event_reasons", float(hwsamples.SW_POWER_CAP) if r == 1 else 0.0),
            (r, S, "sm_clock_mhz", 790.0 if r == 1 else 1970.0),
            (r, S, "pcie_link_gen", 1.0 if r == 1 else 5.0),
        ]
    b = _bundle(samples)
    where = placement.Placement.of(b.job)
    sick = hwsamples.notes(b, 1, where)
    assert len(sick) == 3
    assert "link down" in sick[0]
    assert "throttled (clocks-event reasons 0x4, SM clock 790 MHz)" in sick[1]
    assert "PCIe link at generation 1" in sick[2]
    assert hwsamples.notes(b, 0, where) == []
    assert set(hwsamples.pcie_degraded(b, [0, 1, 2])) == {1}


def test_a_sample_belongs_to_the_rank_whose_device_it_is_not_to_its_record_rank() -> None:
    # The agent writes node-level records with rank 0; job.json says gpu1 of n1 is rank 3's.
    b = tables.BundleBuilder(_job())
    b.add_hw(rank=0, ts=S, node="n1", device="gpu1", metric="pcie_link_gen", value=1.0)
    b.add_hw(rank=0, ts=S, node="n1", device="mlx5_1", metric="nic_link_up", value=0.0)
    for r in (0, 1, 2):
        node, gpu = f"n{r // 2}", f"gpu{r % 2}"
        b.add_hw(rank=0, ts=S, node=node, device=gpu, metric="pcie_link_gen", value=5.0)
    bundle = b.build()
    assert list(hwsamples.latest(bundle, "pcie_link_gen", [3])) == [3]
    assert set(hwsamples.pcie_degraded(bundle, [0, 1, 2, 3])) == {3}
    assert set(hwsamples.nic_down(bundle, [0, 1, 2, 3])) == {3}


def test_a_down_spare_nic_on_the_node_is_not_evidence() -> None:
    # n0 has mlx5_7 down, a NIC no rank of the job uses; rank 0's own NIC is up.
    b = tables.BundleBuilder(_job())
    b.add_hw(rank=0, ts=S, node="n0", device="mlx5_7", metric="nic_link_up", value=0.0)
    b.add_hw(rank=0, ts=S, node="n0", device="mlx5_0", metric="nic_link_up", value=1.0)
    b.add_hw(rank=0, ts=S, node="n0", device="mlx5_7", metric="nic_link_speed_gbps", value=10.0)
    bundle = b.build()
    where = placement.Placement.of(bundle.job)
    assert hwsamples.nic_down(bundle, [0, 1, 2, 3]) == {}
    assert hwsamples.latest(bundle, "nic_link_speed_gbps", None) == {}
    assert hwsamples.notes(bundle, 0, where) == []
    assert hwsamples.notes(bundle, 1, where) == []


def test_a_shared_nic_is_every_sharing_ranks_nic() -> None:
    job = _job(nics={1: "mlx5_0"})  # ranks 0 and 1 of n0 share mlx5_0
    b = _bundle([(0, S, "nic_link_up", 0.0)], job)
    assert set(hwsamples.nic_down(b, [0, 1, 2, 3])) == {0, 1}


def test_usual_values_are_taken_over_the_devices_the_job_uses() -> None:
    # Three spare NICs at 50 Gb/s would make 50 the "usual" speed; only the job's count.
    b = tables.BundleBuilder(_job())
    for node, dev, gbps in [
        ("n0", "mlx5_0", 400.0),
        ("n0", "mlx5_1", 400.0),
        ("n1", "mlx5_0", 50.0),
        ("n1", "mlx5_1", 400.0),
        ("n0", "mlx5_5", 50.0),
        ("n0", "mlx5_6", 50.0),
        ("n1", "mlx5_7", 50.0),
    ]:
        b.add_hw(rank=0, ts=S, node=node, device=dev, metric="nic_link_speed_gbps", value=gbps)
    assert set(hwsamples.nic_slow(b.build(), [0, 1, 2, 3])) == {2}


@pytest.mark.parametrize(
    ("job_nic", "device", "joined"),
    [
        ("mlx5_0", "mlx5_0/1", True),  # job.json names the HCA: any of its ports
        ("mlx5_0:1", "mlx5_0/1", True),  # NCCL_IB_HCA spelling against the agent's
        ("mlx5_0:2", "mlx5_0/1", False),  # another port of the same HCA
        ("mlx5_0", "mlx5_1/1", False),
        ("ib0", "ib0", True),  # a netlink interface name
        ("mlx5_0", "ib0", False),
    ],
)
def test_nic_names_join_across_spellings(job_nic: str, device: str, joined: bool) -> None:
    others = {r: "mlx5_9" for r in (1, 2, 3)}
    dev = hwsamples.Devices.of(_job(nics={0: job_nic, **others}))
    assert dev.users("n0", device) == ((0,) if joined else ())
    assert dev.users("n1", device) == ()  # the same name on another node is another device


def test_gpu_devices_join_by_node_and_index() -> None:
    dev = hwsamples.Devices.of(_job())
    assert dev.users("n0", "gpu1") == (1,)
    assert dev.users("n1", "gpu0") == (2,)
    assert dev.users("n0", "gpu7") == ()
    unplaced = models.Job(world_size=2, ranks=[models.RankInfo(rank=0, gpu=0)])
    assert hwsamples.Devices.of(unplaced).users("n0", "gpu0") == ()  # no node: nothing joins
