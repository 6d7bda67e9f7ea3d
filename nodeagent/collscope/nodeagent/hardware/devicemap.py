"""The device map: which GPU a ring's process computes on and which NIC NCCL sends through.

A culprit is worth acting on when it names hardware: "GPU 4 (GPU-8c1f...) and mlx5_2 of node
X", not "rank 12 on node X". For each ring's writer (its host pid; ``procs`` checked that it
is in the cgroup of the pod whose volume holds the ring), ``DeviceMap.resolve`` finds:

GPU, first answer wins:

1. ``nvml``: the pid is in a GPU's ``nvmlDeviceGetComputeRunningProcesses`` (host pids: the
   agent runs with ``hostPID``). Authoritative: it is the device the CUDA context is on.
2. the process's environment (``<proc_root>/<pid>/environ``, as it was at exec: a script that
   sets ``os.environ`` before CUDA starts is not seen) and its container's GPUs: the
   container's GPUs are those ``NVIDIA_VISIBLE_DEVICES`` names (UUIDs or host indices), else
   those whose ``/dev/nvidia<minor>`` exists under ``<proc_root>/<pid>/root/dev``, else all the
   node's, in PCI bus order (CUDA's order for identical GPUs); ``CUDA_VISIBLE_DEVICES``
   (indices into that list or UUID prefixes; CUDA stops at the first invalid entry) selects
   from them. One GPU left: ``CUDA_VISIBLE_DEVICES`` (or ``container`` when it is unset). More
   left: the ring's ``local_rank``-th, the ``torch.cuda.set_device(local_rank)`` convention,
   reported as ``local_rank`` so that a reader knows it is a convention, not an observation.

   The node's GPUs come from NVML when it is there (``gpu_inventory``: index, UUID, bus id,
   minor), else from the driver's ``<proc_root>/driver/nvidia/gpus/<bus id>/information``.

NICs: the candidates are the node's RDMA HCAs (``<sys_root>/class/infiniband``), narrowed by
the process's ``NCCL_IB_HCA`` (``[^][=]name[:port],...``: prefixes unless ``=``, ``^``
excludes); without any HCA, NCCL's socket transport uses the PCI-backed interfaces
(``class/net``), narrowed by ``NCCL_SOCKET_IFNAME`` alike. One candidate is the NIC; among
several, the one sharing the deepest PCI bridge with the GPU (``pci.nearest``, as NCCL's
topology search does). Ties are not guessed.

Whatever cannot be resolved is None with the reason in ``unresolved`` (``"gpu: no NVML; ..."``).
Answers from NVML, or with no NVML on the node, are kept for the ring's life; the others are
tried again after ``retry_s`` (NVML lists a process at its next sample, a second later).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time
from collections.abc import Callable, Hashable
from typing import Protocol

from collscope.nodeagent.hardware import pci, source

RETRY_S = 5.0  # a provisional answer is asked again after this long (NVML samples at 1 Hz)


class Gpus(Protocol):
    """The part of ``hardware.Sampler`` the map reads: NVML's view of the node."""

    def gpu_inventory(self) -> list[source.GpuInfo]: ...
    def gpu_processes(self) -> dict[int, int]: ...


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one ring's process runs. ``gpu_source``: ``nvml``, ``CUDA_VISIBLE_DEVICES``,
    ``container`` or ``local_rank``; ``nic_source``: ``NCCL_IB_HCA``, ``NCCL_SOCKET_IFNAME`` or
    ``pci`` (nearest), ``+pci`` when the variable left several. ``nics``: the NIC, or the
    equally near candidates when ``nic`` is None; names as NCCL spells them (``mlx5_0``,
    ``mlx5_0:1``, ``eth2``)."""

    gpu: source.GpuInfo | None = None
    gpu_source: str = ""
    nic: str | None = None
    nics: tuple[str, ...] = ()
    nic_source: str = ""
    unresolved: str = ""


class DeviceMap:
    def __init__(
        self,
        nvml: Gpus | None = None,
        *,
        sys_root: pathlib.Path = pathlib.Path("/sys"),
        proc_root: pathlib.Path = pathlib.Path("/proc"),
        retry_s: float = RETRY_S,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._sys = sys_root
        self._proc = proc_root
        self._retry_s = retry_s
        self._clock_s = clock_s
        # key -> (answer, expires at (monotonic s), inf when final)
        self._cache: dict[Hashable, tuple[Placement, float]] = {}

    def resolve(self, host_pid: int | None, *, local_rank: int | None, key: Hashable) -> Placement:
        """The placement of the process ``host_pid`` (``key``: the ring's writer, e.g. (pid,
        init time); answers are cached by it)."""
        now = self._clock_s()
        hit = self._cache.get(key)
        if hit is not None and now < hit[1]:
            return hit[0]
        answer, final = self._resolve(host_pid, local_rank)
        if len(self._cache) > 4096:  # rings come and go; keep the cache bounded
            self._cache = {k: v for k, v in self._cache.items() if now < v[1]}
        self._cache[key] = (answer, float("inf") if final else now + self._retry_s)
        return answer

    def _resolve(self, pid: int | None, local_rank: int | None) -> tuple[Placement, bool]:
        if pid is None:
            why = "process not visible on this host"
            return Placement(unresolved=f"gpu: {why}; nic: {why}"), False
        env = _environ(self._proc / str(pid) / "environ")
        gpu, gpu_source, gpu_why, final = self._gpu(pid, env, local_rank)
        nic, nics, nic_source, nic_why = self._nics(env or {}, gpu)
        why = "; ".join(f"{what}: {w}" for what, w in (("gpu", gpu_why), ("nic", nic_why)) if w)
        place = Placement(gpu, gpu_source, nic, nics, nic_source, why)
        return place, final and env is not None

    # -- GPU ------------------------------------------------------------------------------
    def _gpu(
        self, pid: int, env: dict[str, str] | None, local_rank: int | None
    ) -> tuple[source.GpuInfo | None, str, str, bool]:
        """(GPU, how, why not, final)."""
        inventory = self._nvml.gpu_inventory() if self._nvml is not None else []
        if inventory:
            index = self._nvml.gpu_processes().get(pid) if self._nvml is not None else None
            found = [g for g in inventory if g.index == index]
            if found:
                return found[0], "nvml", "", True
            why = f"pid {pid} not in NVML's process list"
        else:
            why = "no NVML"
            inventory = driver_gpus(self._proc)
            if not inventory:
                return None, "", f"{why}, no GPU in {self._proc}/driver/nvidia/gpus", True
        final = why == "no NVML"  # with NVML, it may list the process at its next sample
        if env is None:
            return None, "", f"{why}; environment of pid {pid} unreadable", False
        container = self._container(pid, env, inventory)
        if isinstance(container, str):
            return None, "", f"{why}; {container}", final
        visible, cvd_why = _cuda_visible(env.get("CUDA_VISIBLE_DEVICES"), container)
        if cvd_why:
            return None, "", f"{why}; {cvd_why}", final
        if len(visible) == 1:
            how = "CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in env else "container"
            return visible[0], how, "", final
        if local_rank is not None and 0 <= local_rank < len(visible):
            return visible[local_rank], "local_rank", "", final
        return None, "", f"{why}; {len(visible)} GPUs visible to the process", final

    def _container(
        self, pid: int, env: dict[str, str], inventory: list[source.GpuInfo]
    ) -> list[source.GpuInfo] | str:
        """The GPUs the process's container has, in PCI bus order; a str says why none."""
        nvd = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
        if nvd in ("none", "void"):
            return f"NVIDIA_VISIBLE_DEVICES={nvd}"
        if nvd and nvd != "all":
            out = []
            for token in (t.strip() for t in nvd.split(",")):
                match = [
                    g
                    for g in inventory
                    if (token.isdigit() and g.index == int(token)) or (token and g.uuid == token)
                ]
                if not match:
                    return f"NVIDIA_VISIBLE_DEVICES names {token!r}, not a GPU of this node"
                out += match
            return sorted(out, key=_bus_order)
        minors = _device_minors(self._proc / str(pid) / "root" / "dev")
        if minors is not None and all(g.minor is not None for g in inventory):
            out = [g for g in inventory if g.minor in minors]
            if not out:
                return "no /dev/nvidia<N> in the process's root"
            return sorted(out, key=_bus_order)
        return sorted(inventory, key=_bus_order)

    # -- NICs -----------------------------------------------------------------------------
    def _nics(
        self, env: dict[str, str], gpu: source.GpuInfo | None
    ) -> tuple[str | None, tuple[str, ...], str, str]:
        """(the NIC, candidates left, how, why not)."""
        every = pci.nics(self._sys)
        ib = [n for n in every if n.kind == "ib"]
        if ib:
            var, spec, pool = "NCCL_IB_HCA", env.get("NCCL_IB_HCA", "").strip(), ib
        else:
            pool = [n for n in every if n.kind == "net"]
            var, spec = "NCCL_SOCKET_IFNAME", env.get("NCCL_SOCKET_IFNAME", "").strip()
        if not pool:
            # No sysfs to check against: what NCCL_IB_HCA names is what NCCL was told.
            exclude, given = _names(env.get("NCCL_IB_HCA", ""))
            if len(given) == 1 and not exclude:
                return given[0], given, "NCCL_IB_HCA", ""
            return None, (), "", f"no NIC in {self._sys}/class/infiniband or class/net"
        named = _select(spec, pool) if spec else [(n, n.name) for n in pool]
        how = var if spec else "pci"
        if not named:
            return None, (), how, f"{var}={spec} matches no NIC of this node"
        if len(named) == 1:
            return named[0][1], (named[0][1],), how, ""
        how = f"{var}+pci" if spec else "pci"
        every_name = tuple(name for _, name in named)
        if gpu is None or gpu.pci_bus_id is None:
            return None, every_name, how, f"GPU unknown, {len(named)} NICs to choose from"
        where = pci.device_path(gpu.pci_bus_id, self._sys)
        if where is None:
            return None, every_name, how, f"GPU {gpu.pci_bus_id} not in {self._sys}/bus/pci"
        near = {n.name for n in pci.nearest(where, [n for n, _ in named], self._sys)}
        best = tuple(name for n, name in named if n.name in near)
        if len(best) == 1:
            return best[0], best, how, ""
        return None, best, how, f"{len(best)} NICs equally near the GPU: {', '.join(best)}"


def _bus_order(g: source.GpuInfo) -> tuple[str, int]:
    return (g.pci_bus_id or "", g.index)


def _cuda_visible(
    cvd: str | None, container: list[source.GpuInfo]
) -> tuple[list[source.GpuInfo], str]:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` leaves of ``container`` (None: all), or why none."""
    if cvd is None:
        return container, ""
    out: list[source.GpuInfo] = []
    for token in (t.strip() for t in cvd.split(",")):
        if token.startswith("MIG-"):
            return [], f"CUDA_VISIBLE_DEVICES={cvd}: MIG instances are not mapped"
        if token.isdigit() and int(token) < len(container):
            out.append(container[int(token)])
            continue
        match = [g for g in container if token and g.uuid and g.uuid.startswith(token)]
        if len(match) != 1:
            break  # CUDA ignores the list from its first invalid entry on
        out.append(match[0])
    if not out:
        return [], f"CUDA_VISIBLE_DEVICES={cvd!r} selects none of the container's GPUs"
    return out, ""


def _names(spec: str) -> tuple[bool, tuple[str, ...]]:
    """``NCCL_IB_HCA``-style ``[^][=]a,b`` -> (exclude?, names); ``=`` read by ``_select``."""
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    body = body[1:] if body.startswith("=") else body
    return exclude, tuple(t.strip() for t in body.split(",") if t.strip())


def _select(spec: str, pool: list[pci.Nic]) -> list[tuple[pci.Nic, str]]:
    """The NICs of ``pool`` that an NCCL device list selects, each with the name as the list
    gives it (``mlx5_0:1`` keeps its port)."""
    exclude, tokens = _names(spec)
    exact = spec.lstrip("^").startswith("=")

    def hits(nic: pci.Nic, token: str) -> bool:
        name = token.split(":", 1)[0]
        return nic.name == name if exact else nic.name.startswith(name)

    if exclude:
        return [(n, n.name) for n in pool if not any(hits(n, t) for t in tokens)]
    out: list[tuple[pci.Nic, str]] = []
    for n in pool:
        for t in tokens:
            if hits(n, t):
                port = t.split(":", 1)[1] if ":" in t else None
                out.append((n, n.name if port is None else f"{n.name}:{port}"))
                break
    return out


def _environ(path: pathlib.Path) -> dict[str, str] | None:
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    text = raw.decode(errors="replace")
    return dict(kv.split("=", 1) for kv in text.split("\0") if "=" in kv)


def _device_minors(dev: pathlib.Path) -> set[int] | None:
    """Minors of the ``nvidia<N>`` nodes in ``dev``; None when ``dev`` is unreadable."""
    try:
        names = os.listdir(dev)
    except OSError:
        return None
    return {int(n[6:]) for n in names if n.startswith("nvidia") and n[6:].isdigit()}


def driver_gpus(proc_root: pathlib.Path) -> list[source.GpuInfo]:
    """The node's GPUs from the driver's ``/proc`` files, indexed in PCI bus order (NVML's
    order). Sample of ``<proc_root>/driver/nvidia/gpus/0000:18:00.0/information``::

        Model:           NVIDIA H100 80GB HBM3
        GPU UUID:        GPU-8c1f0e5a-...
        Bus Location:    0000:18:00.0
        Device Minor:    0
    """
    root = proc_root / "driver" / "nvidia" / "gpus"
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return []
    found: list[tuple[str, str | None, int | None]] = []
    for entry in entries:
        try:
            text = (root / entry / "information").read_text()
        except OSError:
            continue
        pairs = (line.partition(":") for line in text.splitlines())
        fields = {k.strip(): v.strip() for k, _, v in pairs}
        bus = pci.normalise(fields.get("Bus Location", entry)) or pci.normalise(entry)
        if bus is None:
            continue
        minor = fields.get("Device Minor", "")
        found.append((bus, fields.get("GPU UUID") or None, int(minor) if minor.isdigit() else None))
    return [source.GpuInfo(i, u, b, m) for i, (b, u, m) in enumerate(sorted(found))]
