"""How each injected fault changes the simulated job, and when it takes effect.

Slow faults are parameters from ``onset_s`` on (work that *starts* at or after onset is slowed):

| fault | effect (severity default) |
| --- | --- |
| nic-slow | the culprit's NIC bandwidth / s (8), both directions |
| background-traffic | every NIC of the node / s (6) |
| pcie-downgrade | the culprit's per-chunk GPU time x s (12), compute x 1.6 |
| gpu-power-limit | compute x s (2.5), per-chunk GPU time x 2 |
| background-compute | compute of every rank of the node x s (2.0), per-chunk GPU time x 1.5 |
| mixed-slow | compute x 2.0, NIC bandwidth / s (6) |
| proxy-delay | the culprit's proxy stalls s seconds (1.0) at seeded moments, one per ~1.5 s |

Hang faults fire inside the phase loop (``Injector``), at the culprit's first suitable op whose
entry is at or after onset: not-entered (never enters it), inconsistent (first DP op: enters a
different op or twice the bytes; the op makes no progress for anyone), nic-down and gpu-hang
(first inter-node op: the NIC / GPU stops halfway between the last member's entry and the
culprit's healthy end, so the op is caught mid-transfer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from collscope.operator import errors
from collscope.operator.simulator import config, program, topology, truth

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
Fault = truth.Fault

DEFAULT_SEVERITY: dict[Fault, float] = {
    Fault.NIC_SLOW: 8.0,
    Fault.BACKGROUND_TRAFFIC: 6.0,
    Fault.PCIE_DOWNGRADE: 12.0,
    Fault.GPU_POWER_LIMIT: 2.5,
    Fault.BACKGROUND_COMPUTE: 2.0,
    Fault.MIXED_SLOW: 6.0,
    Fault.PROXY_DELAY: 1.0,  # stall length in seconds (Mycroft #7 sleeps 1 s)
}
PROXY_STALL_EVERY_S = 1.5  # mean time between stall starts (stall + exponential gap)
NETWORK_FAULTS = (Fault.NIC_DOWN, Fault.NIC_SLOW, Fault.BACKGROUND_TRAFFIC)
NEEDS_INTER_NODE = (Fault.NIC_DOWN, Fault.NIC_SLOW, Fault.GPU_HANG, Fault.MIXED_SLOW)
INCONSISTENT_OP = {
    "ReduceScatter": "AllGather",
    "AllGather": "ReduceScatter",
    "AllReduce": "Broadcast",
}


@dataclass
class Effects:
    """Per-rank modifiers ``[ranks]``; hang times are filled in when a hang fault fires."""

    onset: float  # seconds; slow modifiers apply to work starting at or after it
    compute_mult: FloatArray
    gpu_mult: FloatArray
    nic_div: FloatArray
    gpu_stop: FloatArray  # GPU actions ending later never finish (inf: healthy)
    nic_stop: FloatArray  # chunks through this NIC arriving later never arrive
    power_capped: BoolArray  # hardware symptom from onset: clock capped by a power limit
    pcie_downgraded: BoolArray  # hardware symptom from onset: PCIe link trained down
    link_limited: BoolArray  # hardware symptom from onset: NIC link speed reduced
    foreign_traffic: BoolArray  # hardware symptom from onset: NIC busy with others' bytes
    stall_rank: int = -1
    stalls: tuple[FloatArray, FloatArray] = field(
        default_factory=lambda: (np.zeros(0), np.zeros(0))
    )


@dataclass
class Injector:
    """The fault of one run: culprits, effects, and the hang trigger state."""

    cfg: config.SimConfig
    topo: topology.Topology
    fault: Fault
    target: int  # culprit rank, or node index for node faults
    culprits: list[int]
    node: int
    fx: Effects
    onset_s: float | None = None  # when it actually took effect
    detail: str = ""
    bytes_factor_member: int = -1  # inconsistent x2 bytes: this member's flow totals double

    @property
    def pending(self) -> bool:
        return self.onset_s is None

    def _where(self, phase: program.Phase, entries: FloatArray) -> tuple[int, int] | None:
        """(group, member) of the culprit in ``phase`` when it enters at/after onset."""
        hit = np.argwhere(phase.groups == self.target)
        if not len(hit):
            return None
        g, m = int(hit[0][0]), int(hit[0][1])
        if not entries[g, m] >= self.cfg.onset_s or not np.isfinite(entries[g, m]):
            return None
        return g, m

    def _label(self, phase: program.Phase, g: int, m: int, seq: int) -> str:
        name = self.topo.comms[int(phase.comms[g])].name
        return f"{phase.member_ops()[m]} seq {seq} of {name}"

    def before(
        self,
        phase: program.Phase,
        entries: FloatArray,
        *,
        stuck: BoolArray,
        seqs: npt.NDArray[np.int64],
        ops: list[str],
        nbytes: npt.NDArray[np.int64],
    ) -> None:
        """Not-entered and inconsistent: change entries / op / bytes before timing (in place)."""
        if not self.pending or self.fault not in (Fault.NOT_ENTERED, Fault.INCONSISTENT):
            return
        where = self._where(phase, entries)
        if where is None:
            return
        g, m = where
        n = phase.groups.shape[1]
        label = self._label(phase, g, m, int(seqs[g]))
        if self.fault is Fault.NOT_ENTERED:
            self.onset_s = float(entries[g, m])
            entries[g, m] = np.inf
            self.detail = f"rank {self.target} never entered {label}"
            return
        wanted = phase.dp if self.cfg.dp > 1 else phase.kind != "p2p"
        if not wanted:
            return
        self.onset_s = float(entries[g, m])
        stuck[g] = True
        rng = np.random.default_rng([self.cfg.seed, 13])
        if rng.random() < 0.5:
            ops[g * n + m] = INCONSISTENT_OP.get(phase.op, "AllGather")
            self.detail = f"rank {self.target} entered {ops[g * n + m]} instead of {label}"
        else:
            nbytes[g * n + m] *= 2
            self.bytes_factor_member = g * n + m
            self.detail = f"rank {self.target} entered {label} with twice the bytes"

    def after(
        self,
        phase: program.Phase,
        entries: FloatArray,
        end: FloatArray,
        inter: BoolArray,
        seqs: npt.NDArray[np.int64],
    ) -> bool:
        """NIC-down / GPU-hang: fire mid-op; True when the phase must be timed again."""
        if not self.pending or self.fault not in (Fault.NIC_DOWN, Fault.GPU_HANG):
            return False
        where = self._where(phase, entries)
        if where is None:
            return False
        g, m = where
        n = phase.groups.shape[1]
        x_end = float(end[g * n + m])
        if not inter[g * n + m] or not np.isfinite(x_end):
            return False
        t = 0.5 * (float(np.max(entries[g])) + x_end)
        self.onset_s = t
        label = self._label(phase, g, m, int(seqs[g]))
        if self.fault is Fault.NIC_DOWN:
            self.fx.nic_stop[self.target] = t
            nic = topology.nic_name(self._gpu)
            self.detail = f"rank {self.target} NIC {nic} down during {label}"
        else:
            self.fx.gpu_stop[self.target] = t
            self.detail = f"rank {self.target} GPU {self._gpu} hung during {label}"
        return True

    @property
    def _gpu(self) -> int:
        return self.target % self.cfg.gpus_per_node

    def truth(self) -> truth.Truth:
        info = self.fault.value
        onset = None if self.onset_s is None else self.cfg.start_ns + round(self.onset_s * 1e9)
        detail = self.detail
        if self.fault is not Fault.NONE and self.onset_s is None:
            detail = f"{info.name} on rank {self.target} did not take effect before the run ended"
        return truth.Truth(
            fault=info.name,
            onset=onset,
            culprit_ranks=self.culprits,
            culprit_node=(topology.node_name(self.node) if self.fault is not Fault.NONE else None),
            expected_category=info.category,
            seed=self.cfg.seed,
            detail=detail,
        )


def _crossing_ranks(topo: topology.Topology) -> set[int]:
    """Ranks with at least one ring/p2p hop to another node."""
    out: set[int] = set()
    for c in topo.comms:
        if c.kind == "world":  # only barriers run on it (``benign``): no data crosses there
            continue
        mem = c.members
        hops = (
            [(mem[0], mem[1])] if len(mem) == 2 else list(zip(mem, mem[1:] + mem[:1], strict=True))
        )
        for a, b in hops:
            if topo.node_of[a] != topo.node_of[b]:
                out.update((a, b))
    return out


def plan(cfg: config.SimConfig, topo: topology.Topology) -> Injector:
    """Pick culprits (seeded when ``cfg.target`` is None) and set the slow modifiers."""
    fault = cfg.fault
    r = cfg.ranks
    fx = Effects(
        onset=np.inf,
        compute_mult=np.ones(r),
        gpu_mult=np.ones(r),
        nic_div=np.ones(r),
        gpu_stop=np.full(r, np.inf),
        nic_stop=np.full(r, np.inf),
        power_capped=np.zeros(r, dtype=bool),
        pcie_downgraded=np.zeros(r, dtype=bool),
        link_limited=np.zeros(r, dtype=bool),
        foreign_traffic=np.zeros(r, dtype=bool),
    )
    rng = np.random.default_rng([cfg.seed, 7])
    if fault in NETWORK_FAULTS and topo.nodes < 2:
        raise errors.SimulationError(f"fault {fault.value.name} needs a job on more than one node")
    if fault.value.target == "node":
        node = cfg.target if cfg.target is not None else int(rng.integers(topo.nodes))
        culprits = [int(x) for x in np.flatnonzero(topo.node_of == node)]
        target = node
    else:
        candidates = list(range(r))
        if fault in NEEDS_INTER_NODE:
            candidates = sorted(_crossing_ranks(topo)) or candidates
        elif fault is Fault.INCONSISTENT and cfg.dp > 1:
            candidates = sorted(c for x in topo.comms if x.kind == "dp" for c in x.members)
        target = cfg.target if cfg.target is not None else int(rng.choice(candidates))
        culprits = [target]
        node = int(topo.node_of[target])
    if fault is Fault.NONE:
        culprits = []
    inj = Injector(
        cfg=cfg, topo=topo, fault=fault, target=target, culprits=culprits, node=node, fx=fx
    )
    sev = cfg.severity if cfg.severity is not None else DEFAULT_SEVERITY.get(fault, 1.0)
    idx = np.array(culprits, dtype=np.int64)
    if fault in (Fault.NONE, Fault.NIC_DOWN, Fault.GPU_HANG, Fault.NOT_ENTERED, Fault.INCONSISTENT):
        return inj
    fx.onset = cfg.onset_s
    inj.onset_s = cfg.onset_s
    where = f"rank {target}" if fault.value.target == "rank" else topology.node_name(node)
    if fault in (Fault.NIC_SLOW, Fault.BACKGROUND_TRAFFIC):
        fx.nic_div[idx] = sev
        fx.link_limited[idx] = fault is Fault.NIC_SLOW
        fx.foreign_traffic[idx] = fault is Fault.BACKGROUND_TRAFFIC
        inj.detail = f"{where} NIC bandwidth / {sev:g} from {cfg.onset_s:g} s"
    elif fault is Fault.PCIE_DOWNGRADE:
        fx.gpu_mult[idx], fx.compute_mult[idx] = sev, 1.6
        fx.pcie_downgraded[idx] = True
        inj.detail = f"{where} PCIe downgraded: chunk copies x {sev:g}, compute x 1.6"
    elif fault is Fault.GPU_POWER_LIMIT:
        fx.compute_mult[idx], fx.gpu_mult[idx] = sev, 2.0
        fx.power_capped[idx] = True
        inj.detail = f"{where} GPU power-capped: compute x {sev:g}, chunk copies x 2"
    elif fault is Fault.BACKGROUND_COMPUTE:
        fx.compute_mult[idx], fx.gpu_mult[idx] = sev, 1.5
        inj.detail = f"{where} background GPU load: compute x {sev:g}, chunk copies x 1.5"
    elif fault is Fault.MIXED_SLOW:
        fx.compute_mult[idx], fx.nic_div[idx] = 2.0, sev
        inj.detail = f"{where} compute x 2 and NIC bandwidth / {sev:g}"
    elif fault is Fault.PROXY_DELAY:
        starts, ends = _stalls(cfg, sev)
        fx.stall_rank, fx.stalls = target, (starts, ends)
        inj.onset_s = float(starts[0]) if len(starts) else None
        inj.detail = f"{where} proxy thread stalls {sev:g} s, {len(starts)} times"
    return inj


def _stalls(cfg: config.SimConfig, length_s: float) -> tuple[FloatArray, FloatArray]:
    """Stall intervals from onset: stall starts ~PROXY_STALL_EVERY_S apart on average."""
    rng = np.random.default_rng([cfg.seed, 11])
    gap = max(PROXY_STALL_EVERY_S - length_s, 0.1)
    starts: list[float] = []
    t = cfg.onset_s + float(rng.exponential(gap))
    while t < cfg.duration_s:
        starts.append(t)
        t += length_s + float(rng.exponential(gap))
    s = np.array(starts, dtype=np.float64)
    return s, s + length_s
