"""Fixtures for analysis tests: a hand-built 4-rank ring whose last operation hangs in a chosen
way, and cached 16-rank simulations.

The ring: ranks 0, 1 on node ``n0`` and 2, 3 on ``n1``, one communicator ``0xa`` of all four
(no declared parallelism). ``HISTORY`` AllReduces of 1 MiB complete every 100 ms, each taking
10 ms; then every rank that enters it starts seq ``HISTORY`` at ``hang_start``, moves chunks for
20 ms and freezes. State records come every 100 ms for 3 s, with flows on channel 0 of the ring
(r sends to r + 1) whose counts say how it froze:

- ``network``: rank 2's NIC stopped: hops 1 -> 2 and 2 -> 3 hold chunks sent but not done;
- ``gpu``: rank 2's GPU stopped: it delivered all it produced, chunks for it sit unconsumed and
  rank 1 finds it not ready to receive;
- ``not-entered``: rank 3 never enters seq ``HISTORY`` (no state, no completion);
- ``inconsistent``: rank 3 enters seq ``HISTORY`` with twice the bytes of the others;
- ``healthy``: the history only, nothing hangs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator.simulator import config, engine, truth

S = 1_000_000_000
MS = 1_000_000
T0 = 100 * S  # any positive epoch: analysis only compares times
HISTORY = 30  # completed rounds before the hang: 3 s, more than the trigger's 2 s window
PERIOD_NS = 100 * MS  # one round every 100 ms ...
DURATION_NS = 10 * MS  # ... taking 10 ms
STATE_NS = 100 * MS  # the agent's state sampling period
MOVING_NS = 20 * MS  # the hung op moves chunks this long before it freezes
HANG_FOR_NS = 3 * S  # state records of the frozen op span this long (trigger floor: 1.5 s)
TOTAL = 16  # chunks per flow
NBYTES = 1 << 20
COMM = "0xa"
RANKS = 4
KINDS = ("healthy", "network", "gpu", "not-entered", "inconsistent")

Flow = tables.FlowTuple


def job() -> models.Job:
    return models.Job(
        job="ring",
        world_size=RANKS,
        ranks=[
            models.RankInfo(rank=r, node=f"n{r // 2}", pod=f"p{r}", gpu=r % 2, nic=f"mlx5_{r % 2}")
            for r in range(RANKS)
        ],
    )


def send(peer: int, ready: int, sent: int, done: int, idle: int) -> Flow:
    return (0, peer, tables.SEND, TOTAL, ready, sent, -1, done, -1, idle)


def recv(peer: int, posted: int, done: int, consumed: int, idle: int) -> Flow:
    return (0, peer, tables.RECV, TOTAL, -1, -1, posted, done, consumed, idle)


def _hop_counts(kind: str, src: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(ready, sent, done) of src's send and (posted, done, consumed) of its receiver's recv."""
    dst = (src + 1) % RANKS
    if kind == "network" and 2 in (src, dst):
        return (10, 10, 6), (14, 6, 6)  # sent, never acknowledged
    if kind == "gpu" and dst == 2:
        return (10, 8, 8), (8, 8, 6)  # receiver full, what arrived is not consumed
    if kind == "gpu" and src == 2:
        return (6, 6, 6), (14, 6, 6)  # delivered all it produced, then stopped
    return (8, 8, 8), (16, 8, 8)  # waiting for upstream data


@dataclass(frozen=True)
class Ring:
    """Times of the scenario, for assertions."""

    hang_start: int = T0 + HISTORY * PERIOD_NS
    stall_start: int = T0 + HISTORY * PERIOD_NS + MOVING_NS
    end: int = T0 + HISTORY * PERIOD_NS + HANG_FOR_NS

    def build(self, kind: str, *, history_ranks: tuple[int, ...] = (0, 1, 2, 3)) -> tables.Bundle:
        if kind not in KINDS:
            raise ValueError(kind)
        b = tables.BundleBuilder(job())
        for r in range(RANKS):
            b.add_comm(rank=r, ts=T0 - S, comm=COMM, comm_rank=r, nranks=RANKS, nnodes=2)
        for seq in range(HISTORY):
            start = T0 + seq * PERIOD_NS
            for r in history_ranks:
                end = start + DURATION_NS
                b.add_op(
                    rank=r,
                    ts=end,
                    comm=COMM,
                    seq=seq,
                    op="AllReduce",
                    nbytes=NBYTES,
                    start=start + r * 100_000,  # arrivals 0.1 ms apart
                    end=end,
                    algo="Ring",
                    proto="Simple",
                    channels=1,
                )
        if kind == "healthy":
            return b.build()
        entered = [r for r in range(RANKS) if not (kind == "not-entered" and r == 3)]
        for r in entered:
            nbytes = 2 * NBYTES if kind == "inconsistent" and r == 3 else NBYTES
            ts = self.hang_start + STATE_NS
            while ts <= self.end:
                idle = ts - self.stall_start
                (rd, sn, dn), _ = _hop_counts(kind, r)
                _, (po, dr, co) = _hop_counts(kind, (r - 1) % RANKS)
                flows = [send((r + 1) % RANKS, rd, sn, dn, idle)]
                flows.append(recv((r - 1) % RANKS, po, dr, co, idle))
                b.add_state(
                    rank=r,
                    ts=ts,
                    comm=COMM,
                    seq=HISTORY,
                    op="AllReduce",
                    nbytes=nbytes,
                    start=self.hang_start,
                    flows=flows,
                )
                ts += STATE_NS
        return b.build()


@pytest.fixture
def ring() -> Ring:
    """``ring.build(kind)``: the 4-rank hang scenario of the module docstring."""
    return Ring()


@functools.lru_cache(maxsize=64)
def _simulate(fault: str, algo: config.Algo, seed: int, declared: bool = True) -> engine.SimResult:
    # 16 ranks (tp 8 x dp 2, two nodes) simulate in well under a second. 8 s with onset at 4 s
    # leaves 4 s of baseline before it and 4 s after it for the 1.5 s hang floor (or three slow
    # ticks) to pass.
    return engine.simulate(
        config.SimConfig(
            ranks=16,
            tp=8,
            pp=1,
            dp=2,
            duration_s=8.0,
            onset_s=4.0,
            algo=algo,
            dp_mode="allreduce" if algo == "tree" else "rs-ag",
            fault=truth.Fault.from_name(fault),
            seed=seed,
            declare_parallelism=declared,
        )
    )


@pytest.fixture
def sim16() -> Callable[..., engine.SimResult]:
    """``sim16(fault, algo, seed, declared=True)``: a cached 16-rank simulation, as
    bench/accuracy.py runs it (``declared``: job.json declares the parallel layout)."""
    return _simulate
