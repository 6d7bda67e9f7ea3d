"""The per-iteration schedule of a Megatron-style job, as phases in dependency order.

One iteration, per rank on pipeline stage ``s`` of ``P`` (TP ops skipped when tp == 1, DP ops
when dp == 1, PP ops when pp == 1):

    DP AllGather (dp_mode "rs-ag")
    forward:  [Recv from s-1]  layers x (compute fwd, TP AllReduce)  [Send to s+1]
    backward: [Recv from s+1]  layers x (compute bwd, TP AllReduce)  [Send to s-1]
    DP ReduceScatter (or one DP AllReduce for dp_mode "allreduce")

The job as a whole is the same work batched by kind, in an order every rank's own program
respects: AllGather of every DP group; then for s ascending the (s-1 -> s) send/recv pairs and
the layers of stage s; then for s descending the (s+1 -> s) pairs and the backward layers; then
the DP reduction. A ``Compute`` step advances the clocks of its ranks; a ``Phase`` is one
operation of every group of one kind, timed together (see ``collectives``). An evaluation
iteration (``train=False``) is the forward half alone: no DP AllGather, no backward, no DP
reduction. A ``Delay`` holds ranks off communication for given times (``benign``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from collscope.operator.simulator import config, topology

Kind = Literal["ring", "tree", "p2p"]


@dataclass(frozen=True)
class Compute:
    """Every rank in ``ranks`` computes ``base_s`` seconds (before jitter and faults)."""

    ranks: topology.IntArray
    base_s: float


@dataclass(frozen=True)
class Phase:
    """One operation in each of ``groups`` (``[G, n]`` global ranks in ring order).

    For ``p2p`` each group is ``[sender, receiver]``; member 0 runs ``Send``, member 1 ``Recv``.
    """

    kind: Kind
    op: str  # AllReduce, AllGather, ReduceScatter, or SendRecv for p2p
    groups: topology.IntArray
    comms: topology.IntArray  # [G] communicator index
    nbytes: int
    algo: str  # as op records spell it: "Ring", "Tree" or "" (p2p)
    dp: bool  # a data-parallel op (the inconsistent fault picks one)

    def member_ops(self) -> tuple[str, ...]:
        """Op name of each member position."""
        if self.kind == "p2p":
            return ("Send", "Recv")
        return (self.op,) * int(self.groups.shape[1])


@dataclass(frozen=True)
class Delay:
    """Rank ``ranks[i]`` does no communication for ``seconds[i]`` (no jitter: a given pause)."""

    ranks: topology.IntArray
    seconds: npt.NDArray[np.float64]


Step = Compute | Phase | Delay


def _allreduce(
    cfg: config.SimConfig,
    groups: topology.IntArray,
    comms: topology.IntArray,
    nbytes: int,
    dp: bool,
) -> Phase:
    if cfg.algo == "tree":
        return Phase("tree", "AllReduce", groups, comms, nbytes, "Tree", dp)
    return Phase("ring", "AllReduce", groups, comms, nbytes, "Ring", dp)


def iteration(
    cfg: config.SimConfig, topo: topology.Topology, *, train: bool = True
) -> Iterator[Step]:
    """The steps of one training iteration (``train=False``: one evaluation iteration, the
    forward pass alone), in an order consistent with every rank's program."""
    w = cfg.workload
    dp_groups, dp_comm = topo.dp_groups, topo.dp_comm
    stages = range(cfg.pp)
    if not train:
        for s in stages:
            if s > 0:
                pairs, comms = topo.pp_pairs[s - 1], topo.pp_comm[s - 1]
                yield Phase("p2p", "SendRecv", pairs, comms, w.pp_bytes, "", False)
            yield from _layers(cfg, topo, s, w.fwd_compute_ms)
        return
    if cfg.dp > 1 and cfg.dp_mode == "rs-ag":
        yield Phase("ring", "AllGather", dp_groups, dp_comm, w.dp_bytes, "Ring", True)
    for s in stages:
        if s > 0:
            yield Phase(
                "p2p", "SendRecv", topo.pp_pairs[s - 1], topo.pp_comm[s - 1], w.pp_bytes, "", False
            )
        yield from _layers(cfg, topo, s, w.fwd_compute_ms)
    for s in reversed(stages):
        if s < cfg.pp - 1:
            yield Phase(
                "p2p", "SendRecv", topo.pp_pairs[s][:, ::-1], topo.pp_comm[s], w.pp_bytes, "", False
            )
        yield from _layers(cfg, topo, s, w.bwd_compute_ms)
    if cfg.dp > 1:
        if cfg.dp_mode == "rs-ag":
            yield Phase("ring", "ReduceScatter", dp_groups, dp_comm, w.dp_bytes, "Ring", True)
        else:
            yield _allreduce(cfg, dp_groups, dp_comm, w.dp_bytes, True)


def _layers(
    cfg: config.SimConfig, topo: topology.Topology, stage: int, compute_ms: float
) -> Iterator[Step]:
    ranks = topo.stage_ranks(stage)
    sel = topo.tp_stage == stage
    groups, comms = topo.tp_groups[sel], topo.tp_comm[sel]
    for _ in range(cfg.workload.layers):
        yield Compute(ranks, compute_ms / 1e3)
        if cfg.tp > 1:
            yield _allreduce(cfg, groups, comms, cfg.workload.tp_bytes, False)
