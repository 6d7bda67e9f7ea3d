"""The shared leaf-spine fabric: names, paths and the rate each flow achieves.

GPU ``g`` of server ``v`` has global index ``v * gpus_per_server + g`` and one NIC whose address
is the endpoint id the collector reports, ``10.<v // 256>.<v % 256>.<g + 1>``; server ``v`` is
``gpu-node-<v:04d>`` under leaf ``v // servers_per_leaf``. A flow between servers under one
leaf crosses only that leaf; otherwise ``[leaf(src), spine, leaf(dst)]``, the spine picked by an
ECMP hash of the (source, destination) NIC pair: RoCE keeps one UDP source port per queue pair,
so a pair keeps its spine for the whole run, as on a real fabric.

Rate of a flow = line rate x efficiency x lognormal jitter / slowdown, where the slowdown is the
largest of the faults on its way (a congested switch on its path, a degraded NIC at either end)
that is active when the flow starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.operator.simulator.flows import config

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def server_name(v: int) -> str:
    return f"gpu-node-{v:04d}"


def endpoint(gpu: int, gpus_per_server: int) -> str:
    v, g = divmod(gpu, gpus_per_server)
    return f"10.{v >> 8}.{v & 255}.{g + 1}"


@dataclass(frozen=True)
class Slowdowns:
    """Network faults as multipliers of transfer time, each from its onset (s)."""

    switch_mult: FloatArray  # [switches]
    switch_onset: FloatArray  # [switches] (inf: never)
    nic_mult: FloatArray  # [gpus]
    nic_onset: FloatArray  # [gpus]


@dataclass(frozen=True)
class FabricModel:
    cfg: config.Fabric

    @property
    def switch_names(self) -> tuple[str, ...]:
        width = max(2, len(str(self.cfg.leaves - 1)))
        leaves = [f"leaf-{i:0{width}d}" for i in range(self.cfg.leaves)]
        return (*leaves, *(f"spine-{j:02d}" for j in range(self.cfg.spines)))

    def spine_index(self, j: int) -> int:
        return self.cfg.leaves + j

    def path(self, src: IntArray, dst: IntArray) -> tuple[IntArray, IntArray, IntArray]:
        """Switch indices ``(first leaf, spine or -1, last leaf or -1)`` of each flow."""
        gps, per_leaf = self.cfg.gpus_per_server, self.cfg.servers_per_leaf
        la, lb = (src // gps) // per_leaf, (dst // gps) // per_leaf
        h = (src.astype(np.uint64) * np.uint64(0x9E3779B1)) ^ (
            dst.astype(np.uint64) * np.uint64(0x85EBCA77)
        )
        h ^= h >> np.uint64(15)
        spine = (h % np.uint64(self.cfg.spines)).astype(np.int64) + self.cfg.leaves
        cross = la != lb
        return la, np.where(cross, spine, -1), np.where(cross, lb, -1)

    def transfer_s(
        self,
        src: IntArray,
        dst: IntArray,
        nbytes: FloatArray | float,
        start_s: FloatArray,
        *,
        slow: Slowdowns,
        rng: np.random.Generator,
    ) -> FloatArray:
        """Seconds each flow takes (``[n]``; inputs broadcast to ``src``'s shape)."""
        c = self.cfg
        line = c.nic_gbytes_s * 1e9 * c.efficiency
        rate = line * np.exp(c.rate_jitter * rng.standard_normal(src.shape))
        mult = np.ones(src.shape)
        for sw in self.path(src, dst):
            ok = sw >= 0
            idx = np.where(ok, sw, 0)
            active = ok & (start_s >= slow.switch_onset[idx])
            mult = np.maximum(mult, np.where(active, slow.switch_mult[idx], 1.0))
        for end in (src, dst):
            active = start_s >= slow.nic_onset[end]
            mult = np.maximum(mult, np.where(active, slow.nic_mult[end], 1.0))
        out: FloatArray = c.latency_us * 1e-6 + np.asarray(nbytes) * mult / rate
        return out
