"""Communicators and parallel groups of a job, and the ranks the trigger watches.

A communicator is known from its ``comm`` records (one per member: ``comm_rank`` of ``nranks``).
Its *kind* says which parallel dimension it spans:

- declared layout (``job.parallelism``): every global rank gets coordinates, dimensions listed
  fastest-varying first (``order``, Megatron convention), so with ``tp-cp-ep-dp-pp``
  ``rank = tp_i + tp * (cp_i + cp * (ep_i + ep * (dp_i + dp * pp_i)))``. A communicator whose
  members differ in exactly one of tp, pp, dp is of that kind; anything else is ``other``.
- no declared layout, inferred (a heuristic, documented here because it can be wrong):
  a communicator whose operations are all ``Send``/``Recv`` is pipeline (``pp``: only PP moves
  activations point to point); one whose members all sit on one node is tensor parallel
  (``tp``: TP is the bandwidth-hungry dimension placed on NVLink); other multi-node collective
  communicators are data parallel (``dp``), except one spanning the whole job when smaller
  collective communicators exist (a world communicator, ``other``). Unknown placement never
  makes a ``tp``.

``sample_ranks`` implements Mycroft §4.3: at least one rank per DP group, at most 10 ranks,
spread across nodes and pipeline stages. With more DP groups than the budget it picks that many
distinct groups spread across nodes. Mycroft counts on a fault propagating to every group that
depends on the faulty one (§4.1, "rapid anomaly spread"); a slowdown that only its own DP group
feels (a slow NIC carrying that group's gradient exchange, absorbed by the pipeline bubble)
does not, so with more groups than the budget the trigger rotates part of the sample over the
groups (``rotation``, built on ``pick_order``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import models, tables

Kind = Literal["tp", "pp", "dp", "other"]
P2P_OPS = frozenset({"Send", "Recv"})
DIMS = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True)
class Communicator:
    """One communicator: ``members`` are global ranks in ``comm_rank`` order (known ones only)."""

    index: int  # index into Bundle.comm_ids
    comm_id: str
    members: tuple[int, ...]
    nodes: tuple[str, ...]  # distinct node names of the members, sorted; () when unknown
    kind: Kind
    p2p: bool  # every operation seen on it is Send/Recv
    name: str = ""


@dataclass(frozen=True)
class Groups:
    """Every communicator of a bundle, by table index, and the communicators of each rank."""

    comms: tuple[Communicator, ...]
    by_index: Mapping[int, Communicator] = field(default_factory=dict)
    of_rank: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def of_kind(self, kind: Kind) -> list[Communicator]:
        return [c for c in self.comms if c.kind == kind]

    def members(self, comm_index: int) -> tuple[int, ...]:
        c = self.by_index.get(comm_index)
        return () if c is None else c.members


def node_map(job: models.Job) -> dict[int, str]:
    """Global rank -> node name, for the ranks job.json places."""
    return {r.rank: r.node for r in job.ranks if r.node is not None}


def coordinates(par: models.Parallelism, ranks: Sequence[int]) -> dict[str, npt.NDArray[np.int64]]:
    """Coordinates of global ranks along each dimension, ``order`` fastest-varying first."""
    left = np.asarray(ranks, dtype=np.int64)
    out: dict[str, npt.NDArray[np.int64]] = {}
    for dim in par.order.split("-"):
        size = int(getattr(par, dim))
        out[dim] = left % size
        left = left // size
    return out


def build(bundle: tables.Bundle) -> Groups:
    """Communicators from ``comm`` records (plus any id seen only in op/state records)."""
    slots: dict[int, dict[int, int]] = defaultdict(dict)
    names: dict[int, str] = {}
    for row in bundle.comms:
        ci = int(row["comm"])
        slots[ci][int(row["comm_rank"])] = int(row["rank"])
        names[ci] = bundle.string(int(row["name"]))
    seen: dict[int, set[int]] = defaultdict(set)
    for table in (bundle.ops, bundle.states):
        if len(table):
            pairs = np.unique(
                np.stack([table["comm"].astype(np.int64), table["rank"].astype(np.int64)], axis=1),
                axis=0,
            )
            for ci, r in pairs.tolist():
                seen[ci].add(r)
    op_kinds: dict[int, set[str]] = defaultdict(set)
    if len(bundle.ops):
        for ci, oi in np.unique(
            np.stack(
                [bundle.ops["comm"].astype(np.int64), bundle.ops["op"].astype(np.int64)], axis=1
            ),
            axis=0,
        ).tolist():
            op_kinds[ci].add(bundle.string(oi))
    nodes = node_map(bundle.job)
    members: dict[int, tuple[int, ...]] = {}
    for ci in sorted(set(slots) | set(seen)):
        if ci in slots:
            known = tuple(slots[ci][k] for k in sorted(slots[ci]))
            extra = tuple(sorted(seen.get(ci, set()) - set(known)))
            members[ci] = known + extra
        else:
            members[ci] = tuple(sorted(seen[ci]))
    world = max((len(m) for m in members.values()), default=0)
    comms = []
    for ci, mem in members.items():
        p2p = bool(op_kinds.get(ci)) and op_kinds[ci] <= P2P_OPS
        node_names = [nodes.get(r) for r in mem]
        known_nodes = tuple(sorted({n for n in node_names if n is not None}))
        kind = _kind(
            bundle.job, mem, p2p=p2p, node_names=node_names, world=world, ncomms=len(members)
        )
        comms.append(
            Communicator(
                index=ci,
                comm_id=bundle.comm_id(ci),
                members=mem,
                nodes=known_nodes,
                kind=kind,
                p2p=p2p,
                name=names.get(ci, ""),
            )
        )
    of_rank: dict[int, list[int]] = defaultdict(list)
    for c in comms:
        for r in c.members:
            of_rank[r].append(c.index)
    return Groups(
        comms=tuple(comms),
        by_index={c.index: c for c in comms},
        of_rank={r: tuple(v) for r, v in of_rank.items()},
    )


def _kind(
    job: models.Job,
    members: tuple[int, ...],
    *,
    p2p: bool,
    node_names: Sequence[str | None],
    world: int,
    ncomms: int,
) -> Kind:
    if len(members) < 2:
        return "other"
    if job.parallelism is not None:
        coords = coordinates(job.parallelism, members)
        varying = [d for d in DIMS if len(np.unique(coords[d])) > 1]
        if len(varying) == 1 and varying[0] in ("tp", "pp", "dp"):
            return varying[0]  # type: ignore[return-value]
        return "other"
    if p2p:
        return "pp"
    if node_names and all(n is not None for n in node_names) and len(set(node_names)) == 1:
        return "tp"
    if len(members) == world and len(members) == job.world_size and ncomms > 1:
        return "other"
    return "dp"


def dp_groups(groups: Groups, job: models.Job) -> list[tuple[int, ...]]:
    """DP groups: dp communicators, else the declared layout, else one group per rank."""
    found = sorted({c.members for c in groups.of_kind("dp")})
    if found:
        return found
    if job.parallelism is not None:
        ranks = list(range(job.world_size))
        coords = coordinates(job.parallelism, ranks)
        key: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for r in ranks:
            key[tuple(int(coords[d][r]) for d in DIMS if d != "dp")].append(r)
        return sorted(tuple(v) for v in key.values())
    ranks = sorted({r for c in groups.comms for r in c.members} or range(job.world_size))
    return [(r,) for r in ranks]


def pp_stage(groups: Groups, job: models.Job) -> dict[int, int]:
    """Rank -> pipeline stage: declared coordinate, else position in its pp communicator."""
    if job.parallelism is not None:
        ranks = list(range(job.world_size))
        return dict(zip(ranks, coordinates(job.parallelism, ranks)["pp"].tolist(), strict=True))
    stage: dict[int, int] = {}
    for c in groups.of_kind("pp"):
        for i, r in enumerate(c.members):
            stage.setdefault(r, i)
    return stage


def sample_ranks(groups: Groups, job: models.Job, max_ranks: int = 10) -> tuple[int, ...]:
    """Mycroft §4.3 sampling: >= 1 rank per DP group, <= ``max_ranks``, spread, deterministic.

    Greedy: each pick is the candidate whose node, then pipeline stage, is used least so far
    (ties: fewest picks in its group, then lowest rank). Every DP group gets one pick first; with
    budget left, more ranks are added the same way (more coverage at the same bounded cost).
    """
    return tuple(sorted(pick_order(groups, job, max_ranks)))


def pick_order(groups: Groups, job: models.Job, max_ranks: int) -> tuple[int, ...]:
    """``sample_ranks``'s picks in the order the greedy made them (not sorted).

    A prefix of the order is the sample of a smaller budget: the first ``min(groups, n)`` picks
    cover that many distinct DP groups, each on the node and stage used least so far, which is
    what ``rotation`` needs to split one spread order into anchors and a visiting order.
    """
    dpg = dp_groups(groups, job)
    if not dpg or max_ranks < 1:
        return ()
    nodes = node_map(job)
    stages = pp_stage(groups, job)
    cand_rank, cand_group = [], []
    for gi, g in enumerate(dpg):
        for r in g:
            cand_rank.append(r)
            cand_group.append(gi)
    rank_a = np.asarray(cand_rank, dtype=np.int64)
    group_a = np.asarray(cand_group, dtype=np.int64)
    node_ids = {n: i for i, n in enumerate(sorted(set(nodes.values())))}
    # Unknown placement: every rank its own pseudo-node, so spreading still means distinct ranks.
    node_a = np.asarray(
        [node_ids.get(nodes.get(r, ""), len(node_ids) + r) for r in cand_rank], dtype=np.int64
    )
    stage_a = np.asarray([stages.get(r, 0) for r in cand_rank], dtype=np.int64)
    node_use = np.zeros(int(node_a.max()) + 1, dtype=np.int64)
    stage_use = np.zeros(int(stage_a.max()) + 1, dtype=np.int64)
    group_use = np.zeros(len(dpg), dtype=np.int64)
    taken = np.zeros(len(rank_a), dtype=bool)
    chosen: list[int] = []
    budget = min(max_ranks, len(set(cand_rank)))
    while len(chosen) < budget:
        open_groups = group_use == 0
        must_cover = bool(open_groups.any()) and len(chosen) < min(len(dpg), max_ranks)
        ok = ~taken & ~np.isin(rank_a, chosen)
        if must_cover:
            ok &= open_groups[group_a]
        if not ok.any():
            break
        idx = np.flatnonzero(ok)
        order = np.lexsort(
            (rank_a[idx], group_use[group_a[idx]], stage_use[stage_a[idx]], node_use[node_a[idx]])
        )
        pick = int(idx[order[0]])
        taken[pick] = True
        chosen.append(int(rank_a[pick]))
        node_use[node_a[pick]] += 1
        stage_use[stage_a[pick]] += 1
        group_use[group_a[pick]] += 1
    return tuple(chosen)


def kind_of(
    job: models.Job,
    members: tuple[int, ...],
    *,
    p2p: bool,
    node_names: Sequence[str | None],
    world: int,
    ncomms: int,
) -> Kind:
    """The kind rule of this module's docstring, for callers that know communicator membership
    without a bundle (the operator's live TrainingJob, fed by the agents' ring identities)."""
    return _kind(job, members, p2p=p2p, node_names=node_names, world=world, ncomms=ncomms)
