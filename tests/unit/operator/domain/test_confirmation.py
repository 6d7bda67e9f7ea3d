"""Confirmation before a node mark: hardware corroboration of the culprit's device, persistence on
the re-check, and load (another tenant) told apart from a fault."""

from __future__ import annotations

import functools

import pytest

from collscope.nodeagent.bundle import models
from collscope.operator.analysis import diagnosis
from collscope.operator.domain import confirmation

NODE = "gpu-node-2"
S = 1_000_000_000


def hw(device: str, metric: str, *values: float, start_s: int = 10) -> list[models.HwRecord]:
    """One sample per second of ``metric`` on ``device``, from ``start_s`` (faults come after
    the healthy baseline's samples at 1 and 2 s)."""
    return [
        models.HwRecord(
            rank=0, ts=(start_s + i) * S, node=NODE, device=device, metric=metric, value=v
        )
        for i, v in enumerate(values)
    ]


def healthy() -> list[models.HwRecord]:
    """Two GPUs and two RDMA ports, all well, sampled at 1 and 2 s."""
    early = functools.partial(hw, start_s=1)
    out: list[models.HwRecord] = []
    for g in ("gpu0", "gpu1"):
        out += early(g, "clocks_event_reasons", 0, 0)
        out += early(g, "pcie_link_gen", 5, 5) + early(g, "pcie_link_gen_max", 5, 5)
        out += early(g, "pcie_link_width", 16, 16) + early(g, "pcie_link_width_max", 16, 16)
        out += early(g, "ecc_uncorrected_errors_total", 0, 0) + early(g, "xid_events_total", 0, 0)
    for n in ("mlx5_0/1", "mlx5_1/1"):
        out += early(n, "nic_link_up", 1, 1) + early(n, "nic_link_speed_gbps", 400, 400)
        out += early(n, "rdma_symbol_error", 3, 3) + early(n, "nic_tx_bytes_per_second", 2e10, 2e10)
    return out


def gpu(index: int | None = 1) -> diagnosis.Culprit:
    return diagnosis.Culprit(rank=5, node=NODE, gpu=index, component="gpu", score=1.0)


def nic(name: str | None = "mlx5_1") -> diagnosis.Culprit:
    return diagnosis.Culprit(rank=5, node=NODE, nic=name, component="nic", score=1.0)


@pytest.mark.parametrize(
    ("culprit", "fault", "key"),
    [
        (nic(), hw("mlx5_1/1", "nic_link_up", 1, 0), "link_down"),
        (nic("mlx5_1:1"), hw("mlx5_1/1", "nic_link_speed_gbps", 400, 200), "link_speed"),
        (nic(), hw("mlx5_1/1", "rdma_link_downed", 0, 1), "rdma_link_downed"),
        (nic(), hw("mlx5_1/1", "rdma_symbol_error", 3, 500), "rdma_symbol_error"),
        (gpu(), hw("gpu1", "xid", 79), "xid_sticky"),
        (gpu(), hw("gpu1", "xid", 92), "xid"),
        (gpu(), hw("gpu1", "gpu_lost", 0), "gpu_lost"),
        (gpu(), hw("gpu1", "ecc_uncorrected_errors_total", 0, 2), "ecc"),
        (gpu(), hw("gpu1", "clocks_event_reasons", 0, 0x40), "hw_slowdown"),
        (gpu(), hw("gpu1", "pcie_link_width", 16, 8), "pcie_width"),
        (gpu(), hw("gpu1", "pcie_link_gen", 5, 3), "pcie_gen"),
    ],
)
def test_a_fault_on_the_culprits_device_corroborates(
    culprit: diagnosis.Culprit, fault: list[models.HwRecord], key: str
) -> None:
    found = confirmation.judge(culprit, healthy() + fault)
    assert found.reason == "Corroborated" and found.holds
    assert [s.key for s in found.faults] == [key]


def test_the_same_fault_on_another_device_is_not_evidence() -> None:
    records = healthy() + hw("mlx5_0/1", "nic_link_up", 0) + hw("gpu0", "xid", 79)
    assert confirmation.judge(nic("mlx5_1"), records).reason == "NotCorroborated"
    assert confirmation.judge(gpu(1), records).reason == "NotCorroborated"


def test_healthy_hardware_does_not_corroborate() -> None:
    found = confirmation.judge(gpu(), healthy())
    assert found.reason == "NotCorroborated" and not found.holds
    assert found.devices == ("gpu1",) and "no fault" in found.message


@pytest.mark.parametrize("xid", [13, 31, 43, 45])
def test_application_xids_are_not_hardware(xid: int) -> None:
    """XID 45 is what killing a CUDA process leaves: a dead process is not a faulty GPU."""
    assert confirmation.judge(gpu(), healthy() + hw("gpu1", "xid", xid)).reason == (
        "NotCorroborated"
    )


def test_another_tenants_traffic_is_contention_not_a_fault() -> None:
    records = healthy() + hw("mlx5_1/1", "nic_tx_bytes_per_second", 2e10, 9e10)
    found = confirmation.judge(nic(), records)
    assert found.reason == "TenantContention" and not found.holds
    assert "traffic that is not this job's" in found.message


def test_a_power_cap_holding_the_clock_below_its_peers_is_a_fault() -> None:
    clocks = hw("gpu0", "sm_clock_mhz", 1980) + hw("gpu1", "sm_clock_mhz", 1100)
    capped = healthy() + clocks + hw("gpu1", "clocks_event_reasons", 0x4)
    found = confirmation.judge(gpu(), capped)
    assert found.reason == "Corroborated" and [s.key for s in found.faults] == ["power_capped"]
    busy = healthy() + hw("gpu0", "sm_clock_mhz", 1980) + hw("gpu1", "sm_clock_mhz", 1900)
    busy += hw("gpu1", "clocks_event_reasons", 0x4)
    assert confirmation.judge(gpu(), busy).reason == "TenantContention"


def test_power_cap_is_load_and_a_node_wide_slowdown_is_contention() -> None:
    capped = healthy() + hw("gpu1", "clocks_event_reasons", 0x4)
    assert confirmation.judge(gpu(), capped).reason == "TenantContention"
    found = confirmation.judge(gpu(), healthy(), node_wide=True)
    assert found.reason == "TenantContention" and "several ranks of the node" in found.message


def test_no_samples_or_no_known_device() -> None:
    assert confirmation.judge(gpu(), []).reason == "NoHardwareSamples"
    # Two NICs, and the device map does not say which one the rank uses.
    unresolved = confirmation.judge(nic(None), healthy() + hw("mlx5_1/1", "nic_link_up", 0))
    assert unresolved.reason == "DeviceUnresolved" and "2 NICs" in unresolved.message
    # The node's only NIC is the rank's, whatever the map says.
    one = hw("ib0", "nic_link_up", 1, 0)
    assert confirmation.judge(nic(None), one).reason == "Corroborated"
    assert confirmation.judge(gpu(7), healthy()).reason == "DeviceUnresolved"


def test_persistence_holds_while_the_state_lasts() -> None:
    first = confirmation.judge(nic(), healthy() + hw("mlx5_1/1", "nic_link_up", 0))
    later = hw("mlx5_1/1", "nic_link_up", 0, 0) + hw("mlx5_0/1", "nic_link_up", 1, 1)
    again = confirmation.recheck(first.symptoms, later)
    assert again.reason == "Persistent" and again.holds and "link down" in again.message


def test_persistence_lost_when_the_link_came_back() -> None:
    first = confirmation.judge(nic(), healthy() + hw("mlx5_1/1", "nic_link_up", 0))
    again = confirmation.recheck(first.symptoms, hw("mlx5_1/1", "nic_link_up", 1, 1))
    assert again.reason == "NotPersistent" and not again.holds
    assert "no longer seen" in again.message
    assert confirmation.recheck(first.symptoms, []).reason == "NotPersistent"


def test_an_event_holds_only_when_it_happens_again() -> None:
    first = confirmation.judge(gpu(), healthy() + hw("gpu1", "xid", 92))
    assert confirmation.recheck(first.symptoms, hw("gpu1", "xid_events_total", 1, 1)).reason == (
        "NotPersistent"
    )
    assert confirmation.recheck(first.symptoms, hw("gpu1", "xid", 92)).reason == "Persistent"


def test_an_xid_that_needs_a_reset_holds_until_one() -> None:
    """XID 119 (GSP timeout) is cleared by a GPU reset only: it holds while the agent still
    counts it; a count back at 0 (reset, or the agent restarted) does not."""
    first = confirmation.judge(gpu(), healthy() + hw("gpu1", "xid", 119))
    again = confirmation.recheck(first.symptoms, hw("gpu1", "xid_events_total", 1, 1))
    assert again.reason == "Persistent" and "not cleared since" in again.message
    assert confirmation.recheck(first.symptoms, hw("gpu1", "xid_events_total", 0)).reason == (
        "NotPersistent"
    )
    # A different fault at the re-check is not the same symptom persisting.
    other = hw("gpu1", "pcie_link_width", 8) + hw("gpu1", "pcie_link_width_max", 16)
    assert confirmation.recheck(first.symptoms, other).reason == "NotPersistent"
