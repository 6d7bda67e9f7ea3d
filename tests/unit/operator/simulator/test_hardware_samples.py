"""The simulator's hardware samples (what the node agent reads from NVML and netlink) show a
fault's hardware symptom on the culprit only, and only from onset; faults without one (a hung
GPU, background traffic, a slow proxy) leave them healthy."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from collscope.nodeagent.bundle import tables
from collscope.operator.simulator import emit, engine, truth

Sim = Callable[..., engine.SimResult]
F = truth.Fault
JOB = {"ranks": 16, "tp": 8, "pp": 1, "dp": 2, "target": 12}


def _series(b: tables.Bundle, metric: str, rank: int) -> tuple[np.ndarray, np.ndarray]:
    idx = b.string_index(metric)
    assert idx is not None, f"no {metric} samples"
    rows = b.hw[(b.hw["metric"] == idx) & (b.hw["rank"] == rank)]
    rows = rows[np.argsort(rows["ts"])]
    return rows["ts"], rows["value"]


def test_every_rank_is_sampled_once_a_second(sim: Sim) -> None:
    b = sim(**JOB).bundle
    ts, _ = _series(b, "sm_clock_mhz", 3)
    assert len(ts) == 6  # a 6 s run
    assert set(np.diff(ts).tolist()) == {emit.HW_INTERVAL_NS}
    assert set(b.hw["rank"].tolist()) == set(range(16))


def test_nic_down_takes_the_culprits_link_down_and_nobody_elses(sim: Sim) -> None:
    res = sim(**JOB, fault=F.NIC_DOWN)
    b, onset = res.bundle, res.truth.onset
    assert onset is not None
    ts, up = _series(b, "nic_link_up", 12)
    assert (up[ts < onset] == 1).all() and (up[ts > onset] == 0).all() and (ts > onset).any()
    for other in (4, 11, 13):
        assert (_series(b, "nic_link_up", other)[1] == 1).all()


def test_power_limit_lowers_the_clock_with_the_power_cap_reason(sim: Sim) -> None:
    res = sim(**JOB, fault=F.GPU_POWER_LIMIT)
    b, onset = res.bundle, res.truth.onset
    assert onset is not None
    ts, reasons = _series(b, "clocks_event_reasons", 12)
    _, clock = _series(b, "sm_clock_mhz", 12)
    after = ts >= onset
    assert (reasons[after] == emit.SW_POWER_CAP).all() and (reasons[~after] == 0).all()
    assert clock[after].max() < 0.5 * clock[~after].min()
    assert (_series(b, "clocks_event_reasons", 4)[1] == 0).all()


@pytest.mark.parametrize(
    ("fault", "metric", "healthy"),
    [
        (F.PCIE_DOWNGRADE, "pcie_link_gen", emit.PCIE_GEN),
        (F.NIC_SLOW, "nic_link_speed_gbps", emit.NIC_GBPS),
    ],
)
def test_degraded_links_report_less_from_onset(
    sim: Sim, fault: F, metric: str, healthy: float
) -> None:
    res = sim(**JOB, fault=fault)
    onset = res.truth.onset
    assert onset is not None
    ts, value = _series(res.bundle, metric, 12)
    assert (value[ts < onset] == healthy).all() and (value[ts >= onset] < healthy).all()
    assert (_series(res.bundle, metric, 4)[1] == healthy).all()


def test_background_traffic_shows_as_bytes_the_job_did_not_send(sim: Sim) -> None:
    res = sim(**dict(JOB, target=1), fault=F.BACKGROUND_TRAFFIC)
    onset = res.truth.onset
    assert onset is not None
    ts, busy = _series(res.bundle, "nic_tx_bytes_per_second", 8)  # a rank of node 1
    _, calm = _series(res.bundle, "nic_tx_bytes_per_second", 0)
    after = ts >= onset
    assert busy[after].min() > 3 * calm.max() and busy[~after].max() < 2 * calm.min()


@pytest.mark.parametrize("fault", [F.GPU_HANG, F.BACKGROUND_TRAFFIC, F.PROXY_DELAY])
def test_faults_without_a_hardware_symptom_leave_samples_healthy(sim: Sim, fault: F) -> None:
    kw = dict(JOB, target=1) if fault is F.BACKGROUND_TRAFFIC else JOB
    b = sim(**kw, fault=fault).bundle
    for metric, healthy in (
        ("nic_link_up", 1.0),
        ("nic_link_speed_gbps", emit.NIC_GBPS),
        ("pcie_link_gen", emit.PCIE_GEN),
        ("clocks_event_reasons", 0.0),
    ):
        idx = b.string_index(metric)
        assert (b.hw["value"][b.hw["metric"] == idx] == healthy).all(), metric
