"""The one-box's simulated hardware through the agent's real sources and device map."""

from __future__ import annotations

import os
import pathlib

from collscope.nodeagent.hardware import devicemap
from collscope.operator.onebox import hardware

T0 = 1_732_001_234_000_000_000


def values(hw: hardware.NodeHardware) -> dict[tuple[str, str], float]:
    s = hw.sampler("node-1", interval_s=1.0, history_s=30.0)
    return {(r.device, r.metric): r.value for r in s.sample_once()}


def test_healthy_node_samples_and_maps_each_rank_to_its_gpu_and_hca(
    tmp_path: pathlib.Path,
) -> None:
    hw = hardware.NodeHardware.build(tmp_path, 4, seed=7)
    hw.set_pids(2, [os.getpid()])
    s = hw.sampler("node-1", interval_s=1.0, history_s=30.0)
    got = {(r.device, r.metric): r.value for r in s.sample_once()}
    assert got[("gpu3", "sm_clock_mhz")] == hardware.SM_CLOCK_MHZ
    assert got[("gpu0", "clocks_event_reasons")] == 0 and got[("gpu1", "xid_events_total")] == 0
    assert got[("mlx5_3/1", "nic_link_up")] == 1 and got[("mlx5_0/1", "nic_link_speed_gbps")] == 400
    assert {st.name: st.available for st in s.statuses()} == {"nvml": True, "rdma": True}
    place = devicemap.DeviceMap(s, sys_root=hw.sys_root).resolve(
        os.getpid(), local_rank=None, key=1
    )
    assert place.gpu is not None and place.gpu.index == 2
    assert (
        place.gpu.pci_bus_id == hardware.gpu_bus(2) and place.gpu.uuid == s.gpu_inventory()[2].uuid
    )
    assert (place.gpu_source, place.nic, place.nic_source, place.unresolved) == (
        "nvml", "mlx5_2", "pci", "",
    )  # fmt: skip


def test_faults_show_in_the_samples(tmp_path: pathlib.Path) -> None:
    hw = hardware.NodeHardware.build(tmp_path, 2)
    s = hw.sampler("node-1", interval_s=1.0, history_s=30.0)
    s.sample_once()
    hw.apply("nic-down", 1)
    hw.apply("gpu-hang", 0)
    hw.apply("gpu-power-limit", 1)
    hw.apply("process-killed", 0)  # no hardware side
    got = {(r.device, r.metric): r.value for r in s.sample_once()}
    assert got[("mlx5_1/1", "nic_link_up")] == 0 and got[("mlx5_0/1", "nic_link_up")] == 1
    assert (
        got[("gpu0", "xid")] == hardware.XID_GSP_TIMEOUT and got[("gpu0", "xid_events_total")] == 1
    )
    assert got[("gpu1", "clocks_event_reasons")] == 0x4
    assert got[("gpu1", "sm_clock_mhz")] == hardware.CAPPED_SM_CLOCK_MHZ
    again = {(r.device, r.metric): r.value for r in s.sample_once()}
    assert ("gpu0", "xid") not in again and again[("gpu0", "xid_events_total")] == 1
    hw.apply("nic-slow", 0)
    assert values(hw)[("mlx5_0/1", "nic_link_speed_gbps")] == 100
