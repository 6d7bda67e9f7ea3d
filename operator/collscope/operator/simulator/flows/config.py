"""What a flow simulation is asked to do: fabric, jobs, faults, collector. Frozen records.

The defaults describe an H100 platform: servers of 8 GPUs with one 400 Gb/s NIC each, tensor
parallelism inside a server (so invisible to the network), leaf-spine fabric. Job workloads
are Megatron-like: a step of ``micro_batches`` forward/backward passes in a 1F1B pipeline,
then a bucketed gradient all-reduce across DP, then the optimizer; a step takes a few seconds,
so one minute holds 8-20 steps (LLMPrism §V evaluates on one- to ten-minute windows).

``preset(gpus)`` fills a fabric of that size with a seeded mix of jobs (LLMPrism §V-A's cluster
has 2,880 GPUs and 19 jobs; ``preset(2880)`` makes 13-20 depending on the seed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from collscope.operator import errors
from collscope.operator.simulator import config as collective_config

FaultKind = Literal["congested-switch", "slow-group", "slow-job"]
RingPacing = Literal["ring", "link"]
FAULT_KINDS: tuple[FaultKind, ...] = ("congested-switch", "slow-group", "slow-job")
FAULT_SUMMARY: dict[FaultKind, str] = {
    "congested-switch": "every flow through one switch (leaf or spine) moves SEVERITY x slower",
    "slow-group": "one DP group's ring is throttled by a member NIC at 1/SEVERITY bandwidth",
    "slow-job": "one job's forward and backward compute take SEVERITY x longer",
}
DEFAULT_SEVERITY: dict[FaultKind, float] = {
    "congested-switch": 3.0,
    "slow-group": 2.5,
    "slow-job": 1.3,
}


@dataclass(frozen=True)
class Fabric:
    servers: int = 64
    gpus_per_server: int = 8  # = TP size of every job: TP stays inside a server
    servers_per_leaf: int = 16
    spines: int = 8
    nic_gbytes_s: float = 50.0  # 400 Gb/s per NIC, each direction
    efficiency: float = 0.9  # share of line rate a long RDMA flow achieves
    rate_jitter: float = 0.03  # lognormal sigma of each flow's achieved rate
    latency_us: float = 6.0  # one way through the fabric
    # How long each DP ring link's flow lasts. "ring": the bucket's time on every link. NCCL's
    # ring is pipelined and flow-controlled (a few slices in flight per link), so every link
    # moves at the slowest link's pace and a collector's flow records (first to last packet)
    # all last alike. "link": each link's own transfer time, the ring still waiting for the
    # slowest: how generators that time each hop alone model it (issue 17's independent
    # campaign), where a slow NIC shows as the two slow hops it carries.
    ring_pacing: RingPacing = "ring"

    @property
    def leaves(self) -> int:
        return -(-self.servers // self.servers_per_leaf)

    @property
    def gpus(self) -> int:
        return self.servers * self.gpus_per_server


@dataclass(frozen=True)
class JobSpec:
    """One job. Its servers are listed in rank order: server ``dp_i + dp * pp_i``."""

    name: str
    servers: tuple[int, ...]
    pp: int
    dp: int
    micro_batches: int = 8
    fwd_ms: float = 120.0  # per micro-batch per stage
    bwd_ms: float = 240.0
    act_bytes: int = 8 << 20  # activation (= its gradient) shard per GPU per micro-batch
    grad_bytes: int = 2 << 30  # gradient bytes per GPU reduced across DP each step
    # Shares of grad_bytes per bucket, all-reduced one after the other: distinct sizes, as
    # DDP/Megatron buckets are (the last one holds what is left).
    buckets: tuple[float, ...] = (0.3, 0.28, 0.25, 0.17)
    optimizer_ms: float = 60.0
    jitter: float = 0.02  # relative std-dev of every compute span
    start_s: float = 0.0  # phase of the job's first step


@dataclass(frozen=True)
class FlowFault:
    kind: FaultKind
    target: str | None = None  # switch, job name, or "JOB/STAGE/TP" group; None: seed picks
    onset_s: float = 60.0
    severity: float | None = None  # None: DEFAULT_SEVERITY[kind]

    @property
    def factor(self) -> float:
        return DEFAULT_SEVERITY[self.kind] if self.severity is None else self.severity


@dataclass(frozen=True)
class Collector:
    """What the flow collector adds: lost and split records, timing noise, non-GPU traffic."""

    drop_rate: float = 0.001  # flow records lost (mirror or export drops)
    split_rate: float = 0.001  # records cut in two (an export interval ending mid-flow)
    ts_noise_us: float = 5.0  # std-dev of timestamp error
    storage_flows_per_server_s: float = 0.05  # flows to storage endpoints (not GPUs)


@dataclass(frozen=True)
class FlowSimConfig:
    fabric: Fabric = field(default_factory=Fabric)
    jobs: tuple[JobSpec, ...] = ()
    duration_s: float = 120.0
    faults: tuple[FlowFault, ...] = ()
    collector: Collector = field(default_factory=Collector)
    seed: int = 0
    start_ns: int = collective_config.DEFAULT_START_NS

    def validate(self) -> None:
        """Raise ``SimulationError`` naming the first impossible setting."""
        used: set[int] = set()
        for job in self.jobs:
            if len(job.servers) != job.pp * job.dp:
                raise errors.SimulationError(
                    f"job {job.name}: {len(job.servers)} servers != pp*dp = {job.pp * job.dp}"
                )
            if job.pp * job.dp < 2:
                raise errors.SimulationError(f"job {job.name}: needs at least 2 servers")
            bad = [s for s in job.servers if not 0 <= s < self.fabric.servers or s in used]
            if bad:
                raise errors.SimulationError(f"job {job.name}: server {bad[0]} missing or taken")
            used.update(job.servers)
            if len(set(job.buckets)) != len(job.buckets):
                raise errors.SimulationError(f"job {job.name}: bucket shares must differ")
        if not self.jobs:
            raise errors.SimulationError("no jobs to simulate")
        for f in self.faults:
            if not 0 < f.onset_s < self.duration_s:
                raise errors.SimulationError(
                    f"fault {f.kind}: onset {f.onset_s} s outside the run (0, {self.duration_s})"
                )
            if f.factor <= 1.0:
                raise errors.SimulationError(f"fault {f.kind}: severity must be > 1")


def preset(
    gpus: int,
    *,
    seed: int = 0,
    duration_s: float = 120.0,
    faults: tuple[FlowFault, ...] = (),
    collector: Collector | None = None,
) -> FlowSimConfig:
    """A fabric of ``gpus`` GPUs about 90 % filled by a seeded mix of jobs."""
    servers = max(4, gpus // 8)
    # at least 4 leaves (with 2, every spine path crosses both leaves and no switch stands
    # out), at most 32 servers (256 NIC ports) per leaf
    per_leaf = min(32, max(2, servers // 4))
    fabric = Fabric(
        servers=servers,
        servers_per_leaf=per_leaf,
        spines=8 if servers <= 512 else 16,
    )
    rng = np.random.default_rng([seed, 71])
    # Servers are handed out in blocks of 4 in a shuffled order: a busy scheduler's fragments,
    # so DP rings and pipelines cross leaves and spines.
    blocks = rng.permutation(servers // 4)
    free = [int(b) * 4 + i for b in blocks for i in range(4)]
    jobs: list[JobSpec] = []
    largest = max(2, servers // 5)
    while len(free) >= 2 and sum(len(j.servers) for j in jobs) < 0.9 * servers:
        size = int(2 ** rng.integers(1, max(2, int(math.log2(largest)) + 1)))
        size = min(size, len(free))
        if size < 2:
            break
        pp = int(rng.choice([p for p in (1, 2, 4, 8) if size % p == 0 and size // p >= 2]))
        fwd = float(rng.uniform(100.0, 200.0))
        shares = rng.dirichlet(np.full(int(rng.integers(4, 7)), 4.0))
        jobs.append(
            JobSpec(
                name=f"train-{len(jobs):02d}",
                servers=tuple(free[:size]),
                pp=pp,
                dp=size // pp,
                fwd_ms=round(fwd, 1),
                bwd_ms=round(2 * fwd, 1),
                act_bytes=int(rng.choice([4, 8, 16])) << 20,
                grad_bytes=int(rng.uniform(1.0, 3.0) * (1 << 30)),
                buckets=tuple(round(float(s), 4) for s in shares),
                start_s=float(rng.uniform(0.0, 2.0)),
            )
        )
        free = free[size:]
    return FlowSimConfig(
        fabric=fabric,
        jobs=tuple(jobs),
        duration_s=duration_s,
        faults=faults,
        collector=collector or Collector(),
        seed=seed,
    )
