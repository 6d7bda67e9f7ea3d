"""The device map on fake trees: a sysfs with two PCIe switches (a GPU and an HCA under each)
and a second root complex with a third HCA, a /proc with the processes' environments and the
driver's GPU files, and NVML's view as a small fake of ``devicemap.Gpus``."""

from __future__ import annotations

import os
import pathlib

import pytest

from collscope.nodeagent.hardware import devicemap, pci, source

GPU0, GPU1 = "0000:03:00.0", "0000:07:00.0"
UUID0, UUID1 = "GPU-00000000-aaaa", "GPU-11111111-bbbb"
# PCI chains from the root complex down (bridges, then the function itself).
SWITCH_A = ("pci0000:00", "0000:00:01.0", "0000:01:00.0")
SWITCH_B = ("pci0000:00", "0000:00:02.0", "0000:05:00.0")
CHAINS = {
    GPU0: (*SWITCH_A, "0000:02:00.0", GPU0),
    "0000:04:00.0": (*SWITCH_A, "0000:02:01.0", "0000:04:00.0"),  # mlx5_0
    GPU1: (*SWITCH_B, "0000:06:00.0", GPU1),
    "0000:08:00.0": (*SWITCH_B, "0000:06:01.0", "0000:08:00.0"),  # mlx5_1
    "0000:81:00.0": ("pci0000:80", "0000:80:01.0", "0000:81:00.0"),  # mlx5_2, far from both
}
HCAS = {"mlx5_0": "0000:04:00.0", "mlx5_1": "0000:08:00.0", "mlx5_2": "0000:81:00.0"}
PID = 4242


def build_sys(root: pathlib.Path, hcas: dict[str, str] = HCAS) -> pathlib.Path:
    for bdf, chain in CHAINS.items():
        where = root.joinpath("devices", *chain)
        where.mkdir(parents=True, exist_ok=True)
        link = root / "bus" / "pci" / "devices" / bdf
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(where, link.parent))
    for name, bdf in hcas.items():
        d = root / "class" / "infiniband" / name
        d.mkdir(parents=True)
        (d / "device").symlink_to(os.path.relpath(root / "bus" / "pci" / "devices" / bdf, d))
    return root


def build_proc(root: pathlib.Path, env: dict[str, str] | None, *, driver: bool = False) -> None:
    if env is not None:
        (root / str(PID)).mkdir(parents=True, exist_ok=True)
        (root / str(PID) / "environ").write_bytes(
            b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
        )
    if driver:
        for minor, (bdf, uuid) in enumerate(((GPU0, UUID0), (GPU1, UUID1))):
            d = root / "driver" / "nvidia" / "gpus" / bdf
            d.mkdir(parents=True)
            (d / "information").write_text(
                f"Model: \t NVIDIA H100\nGPU UUID: \t {uuid}\nBus Location: \t {bdf}\n"
                f"Device Minor: \t {minor}\n"
            )


class FakeGpus:
    def __init__(self, processes: dict[int, int]) -> None:
        self.processes = processes

    def gpu_inventory(self) -> list[source.GpuInfo]:
        return [source.GpuInfo(0, UUID0, GPU0, 0), source.GpuInfo(1, UUID1, GPU1, 1)]

    def gpu_processes(self) -> dict[int, int]:
        return dict(self.processes)


def resolve(
    tmp_path: pathlib.Path,
    env: dict[str, str] | None,
    *,
    nvml: FakeGpus | None = None,
    driver: bool = False,
    local_rank: int | None = None,
) -> devicemap.Placement:
    sys_root, proc_root = build_sys(tmp_path / "sys"), tmp_path / "proc"
    proc_root.mkdir(exist_ok=True)
    build_proc(proc_root, env, driver=driver)
    m = devicemap.DeviceMap(nvml, sys_root=sys_root, proc_root=proc_root)
    return m.resolve(PID, local_rank=local_rank, key=PID)


def test_pci_paths_and_nearness(tmp_path: pathlib.Path) -> None:
    sys_root = build_sys(tmp_path)
    assert pci.normalise("00000000:07:00.0") == GPU1
    assert pci.normalise(b"00000000:AB:1F.3") == "0000:ab:1f.3"
    assert pci.normalise("not a bus id") is None
    gpu = pci.device_path("00000000:03:00.0", sys_root)
    assert gpu == CHAINS[GPU0]
    nics = pci.nics(sys_root)
    assert [(n.name, n.kind) for n in nics] == [
        ("mlx5_0", "ib"),
        ("mlx5_1", "ib"),
        ("mlx5_2", "ib"),
    ]
    depth = {n.name: pci.shared_depth(gpu, n.path) for n in nics}
    assert depth == {"mlx5_0": 3, "mlx5_1": 1, "mlx5_2": 0}  # switch, root complex, nothing
    assert [n.name for n in pci.nearest(gpu, nics)] == ["mlx5_0"]


def test_nvml_process_list_gives_gpu_and_the_nearest_nic(tmp_path: pathlib.Path) -> None:
    p = resolve(tmp_path, {"PATH": "/bin"}, nvml=FakeGpus({PID: 1}))
    assert p.gpu == source.GpuInfo(1, UUID1, GPU1, 1)
    assert (p.gpu_source, p.nic, p.nic_source, p.unresolved) == ("nvml", "mlx5_1", "pci", "")


def test_cuda_visible_devices_with_the_driver_files_and_no_nvml(tmp_path: pathlib.Path) -> None:
    p = resolve(tmp_path, {"CUDA_VISIBLE_DEVICES": "1"}, driver=True)
    assert p.gpu is not None and (p.gpu.index, p.gpu.uuid, p.gpu.pci_bus_id) == (1, UUID1, GPU1)
    assert (p.gpu_source, p.nic, p.unresolved) == ("CUDA_VISIBLE_DEVICES", "mlx5_1", "")


def test_cuda_visible_devices_indexes_the_containers_gpus(tmp_path: pathlib.Path) -> None:
    # The container got host GPU 1 only; inside it, that is CUDA device 0.
    env = {"NVIDIA_VISIBLE_DEVICES": UUID1, "CUDA_VISIBLE_DEVICES": "0"}
    p = resolve(tmp_path, env, nvml=FakeGpus({}))
    assert p.gpu is not None and p.gpu.index == 1 and p.gpu_source == "CUDA_VISIBLE_DEVICES"
    # A UUID prefix selects as well; an invalid entry ends the list (CUDA's rule).
    p = resolve(tmp_path / "b", {"CUDA_VISIBLE_DEVICES": "GPU-0000,7,1"}, driver=True)
    assert p.gpu is not None and p.gpu.index == 0


def test_device_nodes_in_the_process_root_are_its_containers_gpus(
    tmp_path: pathlib.Path,
) -> None:
    dev = tmp_path / "proc" / str(PID) / "root" / "dev"
    dev.mkdir(parents=True)
    (dev / "nvidia1").touch()
    (dev / "nvidiactl").touch()
    p = resolve(tmp_path, {"PATH": "/bin"}, driver=True)
    assert p.gpu is not None and p.gpu.index == 1 and p.gpu_source == "container"


def test_several_visible_gpus_use_the_local_rank_convention(tmp_path: pathlib.Path) -> None:
    p = resolve(tmp_path, {"CUDA_VISIBLE_DEVICES": "0,1"}, driver=True, local_rank=1)
    assert p.gpu is not None and p.gpu.index == 1 and p.gpu_source == "local_rank"
    p = resolve(tmp_path / "b", {"CUDA_VISIBLE_DEVICES": "0,1"}, driver=True)
    assert p.gpu is None
    assert p.unresolved.startswith("gpu: no NVML; 2 GPUs visible to the process")
    assert "nic: GPU unknown, 3 NICs to choose from" in p.unresolved


def test_nccl_ib_hca_names_the_nic(tmp_path: pathlib.Path) -> None:
    p = resolve(tmp_path, {"NCCL_IB_HCA": "=mlx5_2:1"}, nvml=FakeGpus({PID: 0}))
    assert (p.nic, p.nics, p.nic_source) == ("mlx5_2:1", ("mlx5_2:1",), "NCCL_IB_HCA")
    # An exclusion list leaves two: the one nearer GPU 0 wins.
    p = resolve(tmp_path / "b", {"NCCL_IB_HCA": "^mlx5_0"}, nvml=FakeGpus({PID: 0}))
    assert (p.nic, p.nic_source) == ("mlx5_1", "NCCL_IB_HCA+pci")
    p = resolve(tmp_path / "c", {"NCCL_IB_HCA": "mlx4"}, nvml=FakeGpus({PID: 0}))
    assert p.nic is None and "NCCL_IB_HCA=mlx4 matches no NIC" in p.unresolved


def test_equally_near_nics_are_not_guessed(tmp_path: pathlib.Path) -> None:
    sys_root = build_sys(tmp_path / "sys")
    # A fourth HCA under GPU 0's switch, at the same depth as mlx5_0.
    chain = (*SWITCH_A, "0000:02:02.0", "0000:09:00.0")
    sys_root.joinpath("devices", *chain).mkdir(parents=True)
    d = sys_root / "class" / "infiniband" / "mlx5_3"
    d.mkdir(parents=True)
    (d / "device").symlink_to(os.path.relpath(sys_root.joinpath("devices", *chain), d))
    proc = tmp_path / "proc"
    build_proc(proc, {"PATH": "/bin"})
    p = devicemap.DeviceMap(FakeGpus({PID: 0}), sys_root=sys_root, proc_root=proc).resolve(
        PID, local_rank=None, key=1
    )
    assert p.gpu is not None and p.nic is None and p.nics == ("mlx5_0", "mlx5_3")
    assert p.unresolved == "nic: 2 NICs equally near the GPU: mlx5_0, mlx5_3"


@pytest.mark.parametrize(
    ("env", "nvml", "driver", "why"),
    [
        ({}, None, False, "gpu: no NVML, no GPU in "),
        ({}, FakeGpus({}), False, "gpu: pid 4242 not in NVML's process list; 2 GPUs visible"),
        (None, FakeGpus({}), False, "gpu: pid 4242 not in NVML's process list; environment of"),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, None, True, "gpu: no NVML; NVIDIA_VISIBLE_DEVICES"),
        ({"CUDA_VISIBLE_DEVICES": "MIG-1"}, None, True, "gpu: no NVML; CUDA_VISIBLE_DEVICES=MIG"),
    ],
)
def test_unresolved_says_why(
    tmp_path: pathlib.Path,
    env: dict[str, str] | None,
    nvml: FakeGpus | None,
    driver: bool,
    why: str,
) -> None:
    p = resolve(tmp_path, env, nvml=nvml, driver=driver)
    assert p.gpu is None and p.unresolved.startswith(why), p.unresolved


def test_no_host_pid_and_no_nic_in_sysfs(tmp_path: pathlib.Path) -> None:
    m = devicemap.DeviceMap(None, sys_root=tmp_path, proc_root=tmp_path)
    p = m.resolve(None, local_rank=0, key=0)
    assert (
        p.unresolved
        == "gpu: process not visible on this host; nic: process not visible on this host"
    )
    (tmp_path / str(PID)).mkdir()
    (tmp_path / str(PID) / "environ").write_bytes(b"NCCL_IB_HCA=mlx5_7:1\0")
    p = m.resolve(PID, local_rank=0, key=1)
    assert p.nic == "mlx5_7:1" and p.nic_source == "NCCL_IB_HCA"  # what NCCL was told


def test_provisional_answers_are_asked_again(tmp_path: pathlib.Path) -> None:
    now = [0.0]
    sys_root = build_sys(tmp_path / "sys")
    proc = tmp_path / "proc"
    build_proc(proc, {"PATH": "/bin"})
    gpus = FakeGpus({})
    m = devicemap.DeviceMap(gpus, sys_root=sys_root, proc_root=proc, clock_s=lambda: now[0])
    assert m.resolve(PID, local_rank=None, key="r").gpu is None
    gpus.processes = {PID: 0}  # NVML's next sample lists the process
    assert m.resolve(PID, local_rank=None, key="r").gpu is None  # cached for RETRY_S
    now[0] = devicemap.RETRY_S
    assert m.resolve(PID, local_rank=None, key="r").gpu_source == "nvml"
    gpus.processes = {}
    now[0] = 1e9
    assert m.resolve(PID, local_rank=None, key="r").gpu_source == "nvml"  # final: kept


@pytest.mark.parametrize(
    ("numa", "expected"),
    [
        ({GPU0: 0, "0000:81:00.0": 0, "0000:c1:00.0": 1}, ["mlx5_2"]),  # NODE before SYS
        ({GPU0: 1, "0000:81:00.0": 0, "0000:c1:00.0": 1}, ["mlx5_3"]),
        ({GPU0: -1, "0000:81:00.0": 0, "0000:c1:00.0": 1}, ["mlx5_2", "mlx5_3"]),  # unknown
        ({GPU0: 0, "0000:81:00.0": 1, "0000:c1:00.0": 1}, ["mlx5_2", "mlx5_3"]),  # none local
    ],
)
def test_nics_under_other_root_complexes_prefer_the_gpus_numa_node(
    tmp_path: pathlib.Path, numa: dict[str, int], expected: list[str]
) -> None:
    """Two NICs, neither under GPU0's root complex: the one on GPU0's NUMA node is NCCL's NODE
    path, the other SYS; without NUMA information they stay tied."""
    chains = {
        GPU0: CHAINS[GPU0],
        "0000:81:00.0": ("pci0000:80", "0000:80:01.0", "0000:81:00.0"),
        "0000:c1:00.0": ("pci0000:c0", "0000:c0:01.0", "0000:c1:00.0"),
    }
    for bdf, chain in chains.items():
        where = tmp_path.joinpath("devices", *chain)
        where.mkdir(parents=True, exist_ok=True)
        (where / "numa_node").write_text(f"{numa[bdf]}\n")
        link = tmp_path / "bus" / "pci" / "devices" / bdf
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(where, link.parent))
    for name, bdf in (("mlx5_2", "0000:81:00.0"), ("mlx5_3", "0000:c1:00.0")):
        d = tmp_path / "class" / "infiniband" / name
        d.mkdir(parents=True)
        (d / "device").symlink_to(os.path.relpath(tmp_path / "bus" / "pci" / "devices" / bdf, d))
    gpu = pci.device_path(GPU0, tmp_path)
    assert gpu is not None
    got = pci.nearest(gpu, pci.nics(tmp_path), tmp_path)
    assert [n.name for n in got] == expected
