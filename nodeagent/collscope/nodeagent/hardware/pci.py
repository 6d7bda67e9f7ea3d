"""PCI topology from sysfs: where a GPU and the node's NICs sit, and which NIC is nearest.

sysfs links every PCI function to its place in the tree, bridges included::

    <sys_root>/bus/pci/devices/0000:18:00.0 -> ../../../devices/pci0000:16/0000:16:02.0/
                                                0000:17:00.0/0000:18:00.0
    <sys_root>/class/infiniband/mlx5_0/device -> ../../../0000:19:00.0   (resolved likewise)
    <sys_root>/class/net/eth2/device          -> ../../../0000:1a:00.0

so the resolved path of a device, from its root complex (``pci0000:16``) down, is the chain of
bridges above it. Two devices' nearness is the length of their paths' common prefix: the
deepest bridge they share (0: different root complexes, NCCL's SYS; 1: the same root complex,
PHB; more: a PCIe switch, PXB/PIX). NCCL gives a GPU the NIC nearest to it in that sense
(``ncclTopoGetLocalNet``). Between NICs under other root complexes than the GPU's, NCCL's path
types still differ: one on the GPU's NUMA node (NODE: across the socket's own interconnect) is
nearer than one on another socket (SYS: across the inter-socket link), so ``nearest`` prefers
the NICs whose ``numa_node`` (sysfs, on the PCI function) is the GPU's, when both are known.
When several are still equally near we do not guess which.

Bus ids are spelled as sysfs spells them, ``0000:18:00.0`` (``normalise`` turns NVML's
``00000000:18:00.0`` into that). ``sys_root`` is injected: tests and the one-box build trees.
"""

from __future__ import annotations

import os
import pathlib
import re
from dataclasses import dataclass
from typing import Literal

_BDF = re.compile(r"^([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def normalise(bus_id: str | bytes) -> str | None:
    """``"00000000:18:00.0"`` (NVML), ``"0000:18:00.0"`` -> ``"0000:18:00.0"``; None when not
    a bus id."""
    text = bus_id.decode(errors="replace") if isinstance(bus_id, bytes) else bus_id
    m = _BDF.match(text.strip())
    if m is None:
        return None
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def path_of(link: pathlib.Path, sys_root: pathlib.Path) -> tuple[str, ...] | None:
    """The chain of PCI nodes above and including the device ``link`` points to (from its root
    complex down); None when the link does not resolve under ``<sys_root>/devices``."""
    try:
        real = pathlib.Path(os.path.realpath(link, strict=True))
        devices = pathlib.Path(os.path.realpath(sys_root / "devices", strict=True))
    except OSError:
        return None
    try:
        parts = real.relative_to(devices).parts
    except ValueError:
        return None
    # Keep the PCI part: a root complex, then functions; virtual devices have neither.
    chain = [p for p in parts if p.startswith("pci") or normalise(p) is not None]
    return tuple(chain) if chain else None


def device_path(bus_id: str, sys_root: pathlib.Path) -> tuple[str, ...] | None:
    """The PCI chain of the function ``bus_id`` (``<sys_root>/bus/pci/devices/<bus id>``)."""
    bdf = normalise(bus_id)
    if bdf is None:
        return None
    return path_of(sys_root / "bus" / "pci" / "devices" / bdf, sys_root)


@dataclass(frozen=True)
class Nic:
    """A network device of the node with a PCI function: an RDMA HCA (``mlx5_0``) or a
    network interface (``eth2``)."""

    name: str
    kind: Literal["ib", "net"]
    path: tuple[str, ...]


def nics(sys_root: pathlib.Path) -> list[Nic]:
    """Every RDMA HCA (``class/infiniband``) and every network interface backed by a PCI
    function (``class/net/*/device``), sorted by kind then name."""
    out: list[Nic] = []
    for kind, sub in (("ib", ("class", "infiniband")), ("net", ("class", "net"))):
        directory = sys_root.joinpath(*sub)
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            path = path_of(directory / name / "device", sys_root)
            if path is not None:
                out.append(Nic(name, "ib" if kind == "ib" else "net", path))
    return out


def shared_depth(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """How many PCI nodes, from the root complex down, ``a`` and ``b`` have in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def numa_node(path: tuple[str, ...], sys_root: pathlib.Path) -> int | None:
    """The NUMA node of the PCI function at the end of ``path`` (sysfs ``numa_node``); None
    when unknown (absent, unreadable, or -1: a machine without NUMA information)."""
    bdf = path[-1] if path else ""
    if normalise(bdf) is None:
        return None
    try:
        text = (sys_root / "bus" / "pci" / "devices" / bdf / "numa_node").read_text()
        node = int(text.strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def nearest(
    gpu: tuple[str, ...], candidates: list[Nic], sys_root: pathlib.Path | None = None
) -> list[Nic]:
    """The candidates sharing the deepest bridge with ``gpu`` (several when tied); among
    candidates that share no root complex with it, those on its NUMA node when ``sys_root``
    says where each sits (NCCL's NODE before SYS)."""
    if not candidates:
        return []
    depth = {c.name: shared_depth(gpu, c.path) for c in candidates}
    best = max(depth.values())
    near = [c for c in candidates if depth[c.name] == best]
    if best > 0 or len(near) < 2 or sys_root is None:
        return near
    home = numa_node(gpu, sys_root)
    if home is None:
        return near
    local = [c for c in near if numa_node(c.path, sys_root) == home]
    return local or near
