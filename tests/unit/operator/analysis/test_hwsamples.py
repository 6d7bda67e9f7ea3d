"""Hardware samples read as evidence: last value per rank, link down, link slower than the job's
usual speed, throttle reasons."""

from __future__ import annotations

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import hwsamples, placement

S = 1_000_000_000


def _bundle(samples: list[tuple[int, int, str, float]]) -> tables.Bundle:
    job = models.Job(
        job="hw",
        world_size=4,
        ranks=[models.RankInfo(rank=r, node=f"n{r // 2}", gpu=r % 2) for r in range(4)],
    )
    b = tables.BundleBuilder(job)
    for rank, ts, metric, value in samples:
        device = "mlx5_0" if metric.startswith("nic") else "gpu0"
        b.add_hw(rank=rank, ts=ts, node=f"n{rank // 2}", device=device, metric=metric, value=value)
    return b.build()


def test_latest_takes_the_last_sample_of_each_rank() -> None:
    b = _bundle([(0, 2 * S, "nic_link_up", 0.0), (0, 1 * S, "nic_link_up", 1.0), (1, S, "x", 1)])
    got = hwsamples.latest(b, "nic_link_up", [0, 1])
    assert list(got) == [0] and got[0].value == 0.0 and got[0].ts == 2 * S
    assert got[0].device == "mlx5_0"
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
