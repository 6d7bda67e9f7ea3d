"""The service's device map and hardware in the window: two rings whose writer is this
process (its pid in their headers), NVML's view from a fake GPU source, a sysfs tree with one
HCA beside each GPU."""

from __future__ import annotations

import json
import os
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from collscope.nodeagent import discovery, service, settings, window
from collscope.nodeagent import sampler as ringsampler
from collscope.nodeagent.bundle import columnar, models, tables
from collscope.nodeagent.hardware import devicemap, sampler, source

NODE = "gpu-node-1"
T0 = 1_732_001_234_000_000_000  # the rings' init time (tests/unit/nodeagent/conftest.py)
BUS = {0: "0000:03:00.0", 1: "0000:07:00.0"}
NICS = {"mlx5_0": "0000:04:00.0", "mlx5_1": "0000:08:00.0"}
SWITCH = {0: ("pci0000:00", "0000:00:01.0"), 1: ("pci0000:00", "0000:00:02.0")}


class NvmlView(source.Source):
    """NVML's side: two GPUs, this process on GPU 1; samples of both GPUs and both HCAs."""

    name = "fake-nvml"

    def sample(self, now_ns: int) -> list[source.Reading]:
        return [
            source.Reading("gpu0", "xid_events_total", 0.0),
            source.Reading("gpu1", "clocks_event_reasons", 0x8),
            source.Reading("mlx5_0/1", "nic_link_up", 1.0),
            source.Reading("mlx5_1/1", "nic_link_up", 0.0),
        ]

    def gpu_processes(self) -> dict[int, int]:
        return {os.getpid(): 1}

    def gpu_inventory(self) -> list[source.GpuInfo]:
        return [source.GpuInfo(i, f"GPU-{i}", BUS[i], i) for i in (0, 1)]


def sys_tree(root: pathlib.Path) -> pathlib.Path:
    for i in (0, 1):
        for bdf in (BUS[i], NICS[f"mlx5_{i}"]):
            where = root.joinpath("devices", *SWITCH[i], bdf)
            where.mkdir(parents=True)
            link = root / "bus" / "pci" / "devices" / bdf
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(where)
        hca = root / "class" / "infiniband" / f"mlx5_{i}"
        hca.mkdir(parents=True)
        (hca / "device").symlink_to(root / "bus" / "pci" / "devices" / NICS[f"mlx5_{i}"])
    return root


@pytest.fixture
def svc(tmp_path: pathlib.Path, scenario: Any) -> Iterator[service.Service]:
    trace = tmp_path / "trace"
    trace.mkdir()
    for rank in (0, 1):
        h = scenario.header[0]
        h["pid"], h["rank"], h["local_rank"], h["world_size"] = os.getpid(), rank, rank, 4
        h["node_name"] = NODE.encode()
        scenario.write(trace / f"rank-{rank}.ring")
    # Samples at the rings' time (conftest's T0), as a bundle's records must be close in time.
    hw = sampler.Sampler([NvmlView()], node=NODE, history_s=30, clock_ns=lambda: T0 + 10**9)
    hw.sample_once()
    config = settings.Settings(
        node_name=NODE,
        discovery=settings.DiscoverySettings(
            mode="directory", trace_root=str(trace), rescan_interval_s=0.1
        ),
        sampling=settings.SamplingSettings(sample_interval_s=0.02),
    )
    win = window.Window(window_s=30, memory_cap_bytes=32 << 20)
    loop = ringsampler.Sampler(discovery.Discovery(config.discovery), win, config.sampling)
    devices = devicemap.DeviceMap(hw, sys_root=sys_tree(tmp_path / "sys"))
    svc = service.Service(NODE, loop, hardware=hw, devices=devices)
    loop.start()
    deadline = time.monotonic() + 5
    while loop.stats.ticks < 3 or len(svc.ranks().ranks) < 2:
        assert time.monotonic() < deadline, "the sampler never ticked"
        time.sleep(0.02)
    yield svc
    loop.stop()


def test_ranks_carry_gpu_and_nic(svc: service.Service) -> None:
    ranks = svc.ranks().ranks
    assert [(r.rank, r.gpu_index, r.gpu_uuid, r.gpu_pci_bus_id) for r in ranks] == [
        (0, 1, "GPU-1", BUS[1]),
        (1, 1, "GPU-1", BUS[1]),
    ]
    assert {(r.gpu_source, r.nic, r.nic_source, r.unresolved) for r in ranks} == {
        ("nvml", "mlx5_1", "pci", "")
    }
    job = svc.job()
    assert [(i.rank, i.node, i.gpu, i.gpu_uuid, i.nic) for i in job.ranks] == [
        (0, NODE, 1, "GPU-1", "mlx5_1"),
        (1, NODE, 1, "GPU-1", "mlx5_1"),
    ]


def hw_rows(b: tables.Bundle) -> set[tuple[int, str, str]]:
    return {(int(r["rank"]), b.string(int(r["device"])), b.string(int(r["metric"]))) for r in b.hw}


def test_window_carries_the_ranks_devices_with_their_rank(svc: service.Service) -> None:
    now = time.time_ns()
    # GPU 1 and mlx5_1 are rank 1's (it is asked alone); GPU 0 and mlx5_0 no rank's.
    want = {(1, "gpu1", "clocks_event_reasons"), (1, "mlx5_1/1", "nic_link_up")}
    lines = [json.loads(x) for b in svc.window_lines([1], 0, now) for x in b.splitlines()]
    assert {(x["rank"], x["device"], x["metric"]) for x in lines if x["type"] == "hw"} == want
    part = columnar.decode(svc.window_columns([1], 0, now), where="test")
    strings = part.strings
    got = {(int(r["rank"]), strings[r["device"]], strings[r["metric"]]) for r in part.hw}
    assert got == want
    # Both ranks asked: the lowest user's rank. All ranks (the export): every device.
    assert {r for r, _, _ in hw_rows(svc.bundle([0, 1], 0, now))} == {0}
    everything = hw_rows(svc.bundle(None, 0, now))
    assert (0, "gpu0", "xid_events_total") in everything and len(everything) == 4


def test_hw_owners_join_like_analysis() -> None:
    job = models.Job(
        world_size=4,
        ranks=[
            models.RankInfo(rank=3, gpu=2, nic="mlx5_2:1"),
            models.RankInfo(rank=2, gpu=1, nic="mlx5_1"),
            models.RankInfo(rank=1, gpu=0, nic="mlx5_1"),
            models.RankInfo(rank=0, nic="eth2"),
        ],
    )
    devices = {"gpu0", "gpu1", "gpu2", "mlx5_1/1", "mlx5_1/2", "mlx5_2/1", "mlx5_2/2", "eth2"}
    assert service.hw_owners(job, devices, None) == {
        "gpu0": 1, "gpu1": 2, "gpu2": 3, "mlx5_1/1": 1, "mlx5_1/2": 1, "mlx5_2/1": 3, "eth2": 0,
    }  # fmt: skip
    assert service.hw_owners(job, devices, [2]) == {"gpu1": 2, "mlx5_1/1": 2, "mlx5_1/2": 2}
