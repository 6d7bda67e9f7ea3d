"""Where every rank runs and which communicators it belongs to.

Rank ``r`` runs on node ``r // gpus_per_node``, GPU ``r % gpus_per_node``, NIC ``mlx5_<gpu>``
(one NIC per GPU). Parallel coordinates follow Megatron's ``order`` (fastest-varying first; cp
and ep are 1 here), so with the default ``tp-cp-ep-dp-pp``:
``rank = tp_i + tp * (dp_i + dp * pp_i)``.

Communicators, one per group, each listing its members in ring order (= comm_rank order):

- ``tp<g>``: the ``tp`` ranks sharing (pp_i, dp_i), ordered by tp_i;
- ``dp<g>``: the ``dp`` ranks sharing (pp_i, tp_i), ordered by dp_i;
- ``pp<s>-<s+1>.<j>``: the 2-rank send/recv communicator PyTorch creates for pipeline ``j``
  between stages ``s`` and ``s+1`` (member 0 on stage s);
- ``world``: every rank, only when the workload checkpoints (``dist.barrier()`` runs on the
  default process group).

Group arrays are ``[groups, members]`` of global ranks; a group's communicator index is in the
matching ``*_comm`` array and its stage in ``*_stage``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.operator.simulator import config

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Comm:
    """One communicator: id as the plugin prints commHash, human name, members in ring order."""

    cid: str
    name: str
    kind: str  # "tp", "dp", "pp" or "world"
    members: tuple[int, ...]
    nnodes: int


@dataclass(frozen=True)
class Topology:
    """Placement and groups of one job; built once per simulation by ``build``."""

    ranks: int
    gpus_per_node: int
    nodes: int
    node_of: IntArray  # [ranks] node index
    tp_i: IntArray  # [ranks] coordinates
    dp_i: IntArray
    pp_i: IntArray
    comms: tuple[Comm, ...]
    tp_groups: IntArray  # [pp*dp, tp]
    tp_comm: IntArray  # [pp*dp]
    tp_stage: IntArray  # [pp*dp]
    dp_groups: IntArray  # [pp*tp, dp]
    dp_comm: IntArray  # [pp*tp]
    dp_stage: IntArray  # [pp*tp]
    pp_pairs: tuple[IntArray, ...]  # per stage boundary s: [dp*tp, 2] (stage s, stage s+1)
    pp_comm: tuple[IntArray, ...]  # per stage boundary s: [dp*tp]
    world_comm: int = -1  # the default process group's communicator; -1: none

    def node_name(self, node: int) -> str:
        return node_name(node)

    def stage_ranks(self, stage: int) -> IntArray:
        """Global ranks of one pipeline stage, ascending."""
        return np.flatnonzero(self.pp_i == stage).astype(np.int64)


def node_name(node: int) -> str:
    return f"gpu-node-{node:02d}"


def pod_name(rank: int) -> str:
    return f"train-{rank}"


def nic_name(gpu: int) -> str:
    return f"mlx5_{gpu}"


def comm_id(seed: int, name: str, members: tuple[int, ...]) -> str:
    """``0x`` + 16 lowercase hex digits, a hash of seed, name and members (stable per seed)."""
    text = f"{seed}/{name}/{','.join(map(str, members))}"
    return "0x" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def build(cfg: config.SimConfig) -> Topology:
    """Place ranks and create every communicator of ``cfg`` (assumed validated)."""
    sizes = {"tp": cfg.tp, "cp": 1, "ep": 1, "dp": cfg.dp, "pp": cfg.pp}
    strides: dict[str, int] = {}
    stride = 1
    for dim in cfg.order.split("-"):
        strides[dim] = stride
        stride *= sizes[dim]
    # rank_of[p, d, t]: the global rank at pipeline stage p, DP index d, TP index t.
    p_ix, d_ix, t_ix = np.meshgrid(
        np.arange(cfg.pp), np.arange(cfg.dp), np.arange(cfg.tp), indexing="ij"
    )
    rank_of = (t_ix * strides["tp"] + d_ix * strides["dp"] + p_ix * strides["pp"]).astype(np.int64)
    ranks = np.arange(cfg.ranks, dtype=np.int64)
    node_of = ranks // cfg.gpus_per_node
    tp_i = (ranks // strides["tp"]) % cfg.tp
    dp_i = (ranks // strides["dp"]) % cfg.dp
    pp_i = (ranks // strides["pp"]) % cfg.pp

    comms: list[Comm] = []
    seen: set[str] = set()

    def add(name: str, kind: str, members: IntArray) -> int:
        mem = tuple(int(m) for m in members)
        cid = comm_id(cfg.seed, name, mem)
        salt = 0
        while cid in seen:  # astronomically rare; keeps ids unique and still deterministic
            salt += 1
            cid = comm_id(cfg.seed, f"{name}#{salt}", mem)
        seen.add(cid)
        nnodes = len({int(node_of[m]) for m in mem})
        comms.append(Comm(cid=cid, name=name, kind=kind, members=mem, nnodes=nnodes))
        return len(comms) - 1

    tp_groups = rank_of.reshape(cfg.pp * cfg.dp, cfg.tp)
    tp_stage = np.repeat(np.arange(cfg.pp, dtype=np.int64), cfg.dp)
    dp_groups = rank_of.transpose(0, 2, 1).reshape(cfg.pp * cfg.tp, cfg.dp)
    tp_comm = np.full(len(tp_groups), -1, dtype=np.int64)
    dp_comm = np.full(len(dp_groups), -1, dtype=np.int64)
    if cfg.tp > 1:
        for g, members in enumerate(tp_groups):
            tp_comm[g] = add(f"tp{g}", "tp", members)
    if cfg.dp > 1:
        for g, members in enumerate(dp_groups):
            dp_comm[g] = add(f"dp{g}", "dp", members)
    pairs: list[IntArray] = []
    pair_comms: list[IntArray] = []
    for s in range(cfg.pp - 1):
        pair = np.stack([rank_of[s].reshape(-1), rank_of[s + 1].reshape(-1)], axis=1)
        ids = np.array(
            [add(f"pp{s}-{s + 1}.{j}", "pp", members) for j, members in enumerate(pair)],
            dtype=np.int64,
        )
        pairs.append(pair)
        pair_comms.append(ids)
    world = (
        add("world", "world", ranks) if any(ev.kind == "checkpoint" for ev in cfg.benign) else -1
    )
    return Topology(
        ranks=cfg.ranks,
        gpus_per_node=cfg.gpus_per_node,
        nodes=cfg.nodes,
        node_of=node_of,
        tp_i=tp_i,
        dp_i=dp_i,
        pp_i=pp_i,
        comms=tuple(comms),
        tp_groups=tp_groups,
        tp_comm=tp_comm,
        tp_stage=tp_stage,
        dp_groups=dp_groups,
        dp_comm=dp_comm,
        dp_stage=np.repeat(np.arange(cfg.pp, dtype=np.int64), cfg.tp),
        pp_pairs=tuple(pairs),
        pp_comm=tuple(pair_comms),
        world_comm=world,
    )
