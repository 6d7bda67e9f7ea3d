"""GPU check of the agent's device map against ``nvidia-smi`` (not collected by pytest).

Run on any machine, from the repository root::

    .venv/bin/python tests/gpu/devicemap_check.py

Without ``nvidia-smi`` or a GPU it prints ``no GPU: <reason>`` and exits 0. With them it checks
what ``hardware.devicemap.DeviceMap`` (the agent's) says against what ``nvidia-smi`` says:

1. the GPU inventory (NVML's, and the driver's ``/proc/driver/nvidia/gpus`` that the map falls
   back to without NVML): index, UUID and PCI bus id as ``--query-gpu=index,uuid,pci.bus_id``;
2. one process per GPU k: a child that opens a CUDA context on it through the driver API
   (``libcuda.so.1`` by ctypes, no toolkit or torch needed; ``CUDA_VISIBLE_DEVICES=<UUID of
   k>``) and is resolved by the map as a ring's writer is: same UUID and bus id as nvidia-smi
   gives for GPU k, and, where ``--query-compute-apps=pid,gpu_uuid,gpu_bus_id,process_name``
   lists the child's pid, the same UUID and bus id as that line and ``gpu_source`` ``nvml``.
   Where CUDA cannot start, the processes already running (that same query) are resolved
   instead. In a container without the host's PID namespace NVML lists host pids, so the map
   resolves through ``CUDA_VISIBLE_DEVICES`` and the script says so;
3. each GPU's nearest NIC, found from sysfs as the map finds it (``pci.nearest``), against
   ``nvidia-smi topo -m`` where it names NICs: when a GPU's nearest NICs are PIX, PXB or PHB
   the map's choice must be among them (and be it when there is one); when they are only NODE
   or SYS the map cannot tell NUMA-local from remote by PCI paths and reports them tied, which
   is said, not failed.

Exits 1 on any mismatch, printing each.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import pathlib
import re
import select
import shutil
import socket
import subprocess
import sys
import time

from collscope.nodeagent import hardware
from collscope.nodeagent.hardware import devicemap, gpu, pci

SMI_TIMEOUT_S = 30.0  # nvidia-smi on a node with 8 GPUs answers in ~1 s; a hung driver never
CHILD_READY_S = 60.0  # a first CUDA context on an 8-GPU node takes a few seconds
LISTED_S = 10.0  # NVML lists a new process within a second; give it ten
# nvidia-smi topo -m's PCIe levels, nearest first (nvmlGpuTopologyLevel_t: SINGLE, MULTIPLE,
# HOSTBRIDGE, NODE, SYSTEM).
LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")
# The child: a CUDA context and 1 MiB on device 0 of what CUDA_VISIBLE_DEVICES leaves, then
# wait for stdin to close. Driver API only (cuDevicePrimaryCtxRetain is stable since CUDA 7).
CHILD = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    if rc != 0:
        sys.stderr.write(f"{what}: CUresult {rc}\\n"); sys.exit(3)
ok(cuda.cuInit(0), "cuInit")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)), "cuMemAlloc")
print("ready", flush=True)
sys.stdin.read()
"""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CELLS = re.compile(r"\s*\t\s*|\s{2,}")


@dataclasses.dataclass(frozen=True)
class SmiGpu:
    index: int
    uuid: str
    bus: str  # as sysfs spells it


@dataclasses.dataclass(frozen=True)
class SmiApp:
    pid: int
    uuid: str
    bus: str
    name: str


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(text)) if row]


def parse_gpus(text: str) -> list[SmiGpu]:
    """``--query-gpu=index,uuid,pci.bus_id --format=csv,noheader``:
    ``0, GPU-8c1f0e5a-..., 00000000:18:00.0``."""
    return [SmiGpu(int(i), u, pci.normalise(b) or b) for i, u, b, *_ in _rows(text)]


def parse_apps(text: str) -> list[SmiApp]:
    """``--query-compute-apps=pid,gpu_uuid,gpu_bus_id,process_name --format=csv,noheader``:
    ``4242, GPU-8c1f..., 00000000:18:00.0, /usr/bin/python3``."""
    out = []
    for row in _rows(text):
        if len(row) >= 4 and row[0].isdigit():
            out.append(SmiApp(int(row[0]), row[1], pci.normalise(row[2]) or row[2], row[3]))
    return out


def _split(line: str) -> list[str]:
    """The cells of a ``topo -m`` line: tab-separated, or by runs of spaces if it has none."""
    cells = _CELLS.split(line.strip())
    return cells if len(cells) > 1 or "\t" in line else line.split()


def parse_topo(text: str) -> dict[int, dict[str, str]]:
    """``nvidia-smi topo -m`` -> GPU index -> NIC name -> level (``PIX`` ... ``SYS``). A sample
    (tab-separated; newer drivers name NICs ``NIC<k>`` and list them under ``NIC Legend``,
    older ones put the HCA's name in the header)::

        \tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
        GPU0\t X \tNV18\tPXB\tSYS\t0-47\t0\t\tN/A
        GPU1\tNV18\t X \tSYS\tPXB\t48-95\t1\t\tN/A
        ...
        NIC Legend:

          NIC0: mlx5_0
          NIC1: mlx5_1
    """
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", "\n".join(lines), re.MULTILINE))
    header: list[str] | None = None
    out: dict[int, dict[str, str]] = {}
    for line in lines:
        if header is None:
            if re.match(r"^\s+GPU0\b", line):
                header = _split(line)
            continue
        cells = _split(line)
        m = re.fullmatch(r"GPU(\d+)", cells[0]) if cells else None
        if not line.strip() or cells[0].startswith("Legend"):
            break
        if m is None:
            continue
        row: dict[str, str] = {}
        for column, cell in zip(header, cells[1:], strict=False):
            if column.startswith("GPU") or column in ("CPU Affinity", "NUMA Affinity"):
                continue
            if cell in LEVELS:
                row[legend.get(column, column)] = cell
        out[int(m.group(1))] = row
    return out


def judge_nics(
    index: int, near: set[str], pool: set[str], topo: dict[str, str]
) -> tuple[list[str], list[str]]:
    """(problems, notes) for GPU ``index``: the map's nearest NICs ``near`` (of its candidates
    ``pool``) against nvidia-smi's row ``topo`` (NIC -> level)."""
    problems: list[str] = []
    notes: list[str] = []
    if not topo:
        return problems, [f"gpu{index}: nvidia-smi topo -m names no NIC"]
    unknown = sorted(set(topo) - pool)
    if unknown:
        problems.append(f"gpu{index}: nvidia-smi names NICs {unknown}; sysfs gives {sorted(pool)}")
    ranked = {n: LEVELS.index(level) for n, level in topo.items() if n in pool}
    if not ranked:
        return problems, notes
    best_rank = min(ranked.values())
    best = {n for n, r in ranked.items() if r == best_rank}
    level = LEVELS[best_rank]
    if level in ("PIX", "PXB", "PHB"):
        if not near or not near <= best:
            problems.append(
                f"gpu{index}: the map's nearest {sorted(near)}, nvidia-smi's {level} {sorted(best)}"
            )
        elif len(best) == 1 and near != best:
            problems.append(f"gpu{index}: the map's nearest {sorted(near)}, not {sorted(best)}")
    elif not best <= near:
        problems.append(
            f"gpu{index}: nvidia-smi's nearest ({level}) {sorted(best)} missing from the map's "
            f"tie {sorted(near)}"
        )
    elif near != best:
        notes.append(
            f"gpu{index}: no NIC under its host bridge; the map ties {sorted(near)} (PCI paths "
            f"do not tell NODE from SYS), nvidia-smi's {level}: {sorted(best)}"
        )
    return problems, notes


def _smi(*args: str) -> str:
    return subprocess.run(
        ["nvidia-smi", *args], capture_output=True, text=True, check=True, timeout=SMI_TIMEOUT_S
    ).stdout


def _apps() -> list[SmiApp]:
    return parse_apps(
        _smi("--query-compute-apps=pid,gpu_uuid,gpu_bus_id,process_name", "--format=csv,noheader")
    )


def _start(gpus: list[SmiGpu]) -> tuple[dict[int, SmiGpu], list[subprocess.Popen[str]], str]:
    """One CUDA child per GPU; (pid -> its GPU, the children, why none started)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    children: list[subprocess.Popen[str]] = []
    mine: dict[int, SmiGpu] = {}
    for g in gpus:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD],
            env={**env, "CUDA_VISIBLE_DEVICES": g.uuid, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        children.append(child)
        mine[child.pid] = g
    why = ""
    deadline = time.monotonic() + CHILD_READY_S
    for child in children:
        assert child.stdout is not None
        left = deadline - time.monotonic()
        ready, _, _ = select.select([child.stdout], [], [], max(left, 0.0))
        line = child.stdout.readline() if ready else ""
        if line.strip() != "ready":
            err = child.stderr.read() if child.poll() is not None and child.stderr else ""
            last = (err.strip().splitlines() or ["no answer"])[-1]  # the exception, not its trace
            why = why or f"CUDA child {child.pid} did not start: {last}"
            mine.pop(child.pid, None)
    return mine, children, why


def _stop(children: list[subprocess.Popen[str]]) -> None:
    for child in children:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _same_program(pid: int, name: str) -> bool:
    """Whether /proc/<pid> is the process nvidia-smi named (not a namesake pid of another
    PID namespace)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return os.path.basename(exe) == os.path.basename(name)


def main() -> int:
    if shutil.which("nvidia-smi") is None:
        print("no GPU: nvidia-smi not found")
        return 0
    try:
        smi = parse_gpus(_smi("--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"))
    except (subprocess.SubprocessError, OSError, ValueError) as e:
        print(f"no GPU: nvidia-smi --query-gpu failed: {e}")
        return 0
    if not smi:
        print("no GPU: nvidia-smi lists none")
        return 0
    problems: list[str] = []
    notes: list[str] = []
    by_index = {g.index: g for g in smi}
    sampler = hardware.Sampler([gpu.GpuSource()], node=socket.gethostname(), interval_s=1.0)
    mine, children, why = _start(smi)
    try:
        # 1. inventories
        deadline = time.monotonic() + LISTED_S
        listed: dict[int, SmiApp] = {}
        while mine and time.monotonic() < deadline:
            listed = {a.pid: a for a in _apps()}
            if set(mine) <= set(listed):
                break
            time.sleep(0.5)
        sampler.sample_once()
        (status,) = sampler.statuses()
        inventory = sampler.gpu_inventory()
        if not status.available:
            notes.append(f"NVML unavailable ({status.reason}): the map uses the driver's /proc")
        for info in inventory:
            want = by_index.get(info.index)
            if want is None or (info.uuid, info.pci_bus_id) != (want.uuid, want.bus):
                problems.append(f"NVML gpu{info.index} {info.uuid} {info.pci_bus_id}: smi {want}")
        if status.available and len(inventory) != len(smi):
            problems.append(f"NVML lists {len(inventory)} GPUs, nvidia-smi {len(smi)}")
        driver = devicemap.driver_gpus(pathlib.Path("/proc"))
        by_uuid = {g.uuid: g for g in smi}
        for info in driver:
            want_g = by_uuid.get(info.uuid or "")
            if want_g is not None and info.pci_bus_id != want_g.bus:
                problems.append(f"/proc gives {info.uuid} at {info.pci_bus_id}, smi {want_g.bus}")
        if not driver:
            notes.append("no /proc/driver/nvidia/gpus here (the map's fallback without NVML)")
        elif not any(i.uuid in by_uuid for i in driver):
            problems.append("/proc/driver/nvidia/gpus names none of nvidia-smi's GPUs")
        if not inventory and not driver:
            problems.append("neither NVML nor /proc/driver/nvidia/gpus gives the map a GPU")
        # 2. processes
        dmap = devicemap.DeviceMap(sampler)
        targets: dict[int, SmiGpu] = dict(mine)
        if not mine:
            notes.append(f"{why}; resolving the processes nvidia-smi lists instead")
            for app in _apps():
                g = next((x for x in smi if x.uuid == app.uuid), None)
                if g is not None and _same_program(app.pid, app.name):
                    targets[app.pid] = g
                    listed[app.pid] = app
        if not targets:
            notes.append("no process on any GPU to resolve: the process check did not run")
        for pid, g in sorted(targets.items()):
            place = dmap.resolve(pid, local_rank=None, key=pid)
            got = None if place.gpu is None else (place.gpu.uuid, place.gpu.pci_bus_id)
            nics = f"nic {place.nic} {list(place.nics)} via {place.nic_source or '-'}"
            print(f"pid {pid}: {got} via {place.gpu_source or '-'}; {nics}; {place.unresolved!r}")
            if got != (g.uuid, g.bus):
                problems.append(f"pid {pid}: the map says {got}, nvidia-smi gpu{g.index} {g}")
            line = listed.get(pid)
            if line is not None and (line.uuid, line.bus) != (g.uuid, g.bus):
                problems.append(f"pid {pid}: --query-compute-apps says {line}, expected {g}")
            if line is not None and status.available and place.gpu_source != "nvml":
                problems.append(f"pid {pid}: NVML lists it, the map used {place.gpu_source!r}")
            if line is None and pid in mine:
                notes.append(f"pid {pid} not in NVML's process list (a PID namespace?)")
        # 3. NICs
        every = pci.nics(pathlib.Path("/sys"))
        pool = [n for n in every if n.kind == "ib"] or [n for n in every if n.kind == "net"]
        try:
            topo = parse_topo(_smi("topo", "-m"))
        except (subprocess.SubprocessError, OSError) as e:
            topo = {}
            notes.append(f"nvidia-smi topo -m failed ({e}): NICs checked against sysfs only")
        for g in smi:
            where = pci.device_path(g.bus, pathlib.Path("/sys"))
            if where is None:
                problems.append(f"gpu{g.index}: {g.bus} not under /sys/bus/pci/devices")
                continue
            near = {n.name for n in pci.nearest(where, pool)}
            print(f"gpu{g.index} {g.bus}: nearest NICs {sorted(near)}; smi {topo.get(g.index)}")
            p, n = judge_nics(g.index, near, {x.name for x in pool}, topo.get(g.index, {}))
            problems += p
            notes += n
            for pid, pg in targets.items():
                if pg.index == g.index and pid in mine:
                    place = dmap.resolve(pid, local_rank=None, key=pid)
                    if set(place.nics) != near and pool:
                        problems.append(f"pid {pid}: the map's NICs {place.nics}, sysfs {near}")
    finally:
        _stop(children)
        sampler.stop()
    for note in notes:
        print(f"note: {note}")
    if problems:
        for problem in problems:
            print(f"FAIL: {problem}")
        return 1
    print(f"OK: {len(smi)} GPU(s), {len(targets)} process(es) resolved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
