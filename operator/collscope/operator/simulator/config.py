"""What a simulation is asked to do: job shape, fabric, fault. One frozen, validated record.

Units are in the field names. Defaults describe a small healthy Megatron-style job whose
iteration takes a few hundred milliseconds, so that a 10 s run holds ~20 iterations: enough for
baselines to be learned before a fault at 5 s, and small enough to simulate 1,024 ranks quickly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from collscope.operator import errors
from collscope.operator.simulator import truth

Algo = Literal["ring", "tree"]
DpMode = Literal["rs-ag", "allreduce"]
BenignKind = Literal["checkpoint", "eval", "wide-round"]

# 2026-01-01T00:00:00Z in ns: a fixed epoch makes bundles byte-for-byte reproducible per seed.
DEFAULT_START_NS = 1_767_225_600_000_000_000


@dataclass(frozen=True)
class Fabric:
    """Link speeds and latencies. Defaults are an H100 node with 8x400G NICs (one per GPU)."""

    nic_gbytes_s: float = 50.0  # per NIC, each direction (400 Gb/s)
    nvlink_gbytes_s: float = 150.0  # per GPU, each direction, intra-node
    net_latency_us: float = 8.0  # one-way, through the network proxy and fabric
    nvlink_latency_us: float = 2.0
    chunk_bytes: int = 512 * 1024  # NCCL Simple: 4 MiB buffer / NCCL_STEPS (8)
    gpu_chunk_us: float = 4.0  # GPU time to produce or consume one chunk
    proxy_us: float = 2.0  # proxy thread time to post one chunk
    recv_slots: int = 8  # NCCL_STEPS: receive buffers a receiver posts ahead


@dataclass(frozen=True)
class Workload:
    """Per-iteration work. Message sizes per rank, compute per layer chunk."""

    layers: int = 2  # TP AllReduces per forward and per backward pass
    fwd_compute_ms: float = 25.0  # per layer chunk
    bwd_compute_ms: float = 50.0
    compute_jitter: float = 0.03  # relative std-dev of every compute span
    tp_bytes: int = 16 * 1024 * 1024  # activations all-reduced inside TP
    pp_bytes: int = 32 * 1024 * 1024  # activations / gradients between PP stages
    dp_bytes: int = 256 * 1024 * 1024  # gradients reduced across DP


@dataclass(frozen=True)
class Benign:
    """A pause that training jobs take on purpose: part of the workload, never a fault.

    A run with benign events is still fault-free (its truth names no culprit); the analysis
    must raise nothing for it (issue 12). ``simulator.benign`` says what each kind does:

    - ``checkpoint``: the job stops issuing training collectives for ``length_s`` (the writers
      save their shard, everyone else waits in ``dist.barrier()``, a 4-byte world AllReduce);
    - ``eval``: ``length_s`` of forward-only iterations (TP and PP continue, no backward, no DP);
    - ``wide-round``: one rank starts an iteration ``length_s`` late once (a data-loader hiccup).

    It happens at the first iteration boundary at which every rank has passed ``at_s``.
    """

    kind: BenignKind
    at_s: float
    length_s: float


@dataclass(frozen=True)
class SimConfig:
    """A whole simulation. ``ranks`` must equal tp*pp*dp; ``validate()`` says what is wrong."""

    ranks: int = 64
    gpus_per_node: int = 8
    tp: int = 8
    pp: int = 2
    dp: int = 4
    order: str = "tp-cp-ep-dp-pp"
    algo: Algo = "ring"
    channels: int = 4
    dp_mode: DpMode = "rs-ag"
    duration_s: float = 10.0
    fault: truth.Fault = truth.Fault.NONE
    # rank (rank faults) or node index (node faults); None: picked by the seed
    target: int | None = None
    onset_s: float = 5.0  # requested onset, seconds after the job starts
    # fault strength (slowdown factor); None: the fault's own default
    severity: float | None = None
    seed: int = 0
    start_ns: int = DEFAULT_START_NS
    state_interval_ms: float = 100.0  # the agent samples live state at 10 Hz
    clock_skew_ms: float = 5.0  # max |offset| of each host's clock (spec: tens of ms)
    # Each rank sampled on its own phase of the interval (agents that poll rings one after the
    # other, or independent samplers) instead of one grid per node clock.
    sample_phase: bool = False
    declare_parallelism: bool = True  # write parallelism into job.json (False: analysis infers)
    fabric: Fabric = field(default_factory=Fabric)
    workload: Workload = field(default_factory=Workload)
    benign: tuple[Benign, ...] = ()  # checkpoint / eval / wide-round events of the workload

    @property
    def nodes(self) -> int:
        return -(-self.ranks // self.gpus_per_node)

    def validate(self) -> None:
        """Raise ``SimulationError`` naming the first impossible setting."""
        if self.ranks < 2:
            raise errors.SimulationError(f"ranks must be >= 2 (got {self.ranks})")
        if self.tp * self.pp * self.dp != self.ranks:
            raise errors.SimulationError(
                f"tp*pp*dp = {self.tp}*{self.pp}*{self.dp} = {self.tp * self.pp * self.dp} "
                f"!= ranks {self.ranks}"
            )
        if not 2 <= self.channels <= 16:
            raise errors.SimulationError(f"channels must be 2..16 (got {self.channels})")
        if self.gpus_per_node < 1:
            raise errors.SimulationError(f"gpus_per_node must be >= 1 (got {self.gpus_per_node})")
        if not 0 < self.onset_s < self.duration_s:
            raise errors.SimulationError(
                f"onset_s must lie inside the run (0, {self.duration_s}) (got {self.onset_s})"
            )
        if self.target is not None:
            limit = self.nodes if self.fault.value.target == "node" else self.ranks
            if not 0 <= self.target < limit:
                raise errors.SimulationError(
                    f"target {self.target} out of range for fault {self.fault.value.name} "
                    f"(0..{limit - 1})"
                )
        if self.algo == "tree" and self.dp_mode != "allreduce":
            raise errors.SimulationError(
                "algo 'tree' needs dp_mode 'allreduce' "
                "(NCCL runs ReduceScatter/AllGather as rings only)"
            )
        if self.severity is not None and self.severity <= 1.0:
            raise errors.SimulationError(f"severity is a slowdown factor > 1 (got {self.severity})")
        for ev in self.benign:
            if not 0 < ev.at_s < self.duration_s or ev.length_s <= 0:
                raise errors.SimulationError(
                    f"benign {ev.kind} must start inside the run (0, {self.duration_s}) and "
                    f"last > 0 s (got at {ev.at_s}, length {ev.length_s})"
                )


def default_parallelism(ranks: int, gpus_per_node: int = 8) -> tuple[int, int, int]:
    """A sensible (tp, pp, dp) for a rank count: TP fills a node, PP=2 when it divides, rest DP."""
    tp = gpus_per_node if ranks % gpus_per_node == 0 and ranks >= 2 * gpus_per_node else 1
    while ranks % tp:
        tp //= 2
    rest = ranks // tp
    pp = 2 if rest % 2 == 0 and rest >= 4 else 1
    return tp, pp, rest // pp
