"""Parallel groups (TP/PP/DP) of a live TrainingJob, declared or inferred.

Two sources, in order of trust:

1. declared: the pod annotation ``collscope.dev/parallelism: "tp=8,pp=2,dp=4"`` (or
   ``spec.parallelism`` of the TrainingJob), parsed by ``parse``. Optional keys ``cp``, ``ep``
   (default 1) and ``order`` (dimensions fastest-varying first, Megatron's ``tp-cp-ep-dp-pp`` by
   default, written with ``-`` as in job.json). The product must equal the world size.
2. inferred: communicator membership as the node agents read it from the rings (one
   ``CommMember`` per rank and communicator). Each communicator gets a kind with the same rule
   ``collscope analyze`` uses (``analysis.groups.kind_of``: point-to-point only -> pp, one node
   -> tp, other multi-node -> dp, the world communicator -> other), so the operator and the
   offline analysis never disagree about a job.

The result feeds ``TrainingJob.status.groups`` and the sampler (``sampling.py``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import pydantic

from collscope.nodeagent.bundle import models
from collscope.operator import errors
from collscope.operator.analysis import groups as analysis_groups
from collscope.operator.domain import ids

ANNOTATION = "collscope.dev/parallelism"
_SIZES = ("tp", "pp", "dp", "cp", "ep")
Source = Literal["declared", "inferred"]
Group = tuple[ids.Rank, ...]


def parse(text: str) -> models.Parallelism:
    """``"tp=8,pp=2,dp=4"`` -> ``Parallelism``; ``ParallelismError`` naming the defect."""

    def bad(reason: str) -> errors.ParallelismError:
        return errors.ParallelismError(f"parallelism {text!r}: {reason}")

    fields: dict[str, int | str] = {}
    items = [p.strip() for p in text.split(",")]
    if not text.strip():
        raise bad("empty; expected e.g. 'tp=8,pp=2,dp=4'")
    for item in items:
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not key:
            raise bad(f"{item!r} is not key=value")
        if key in fields:
            raise bad(f"{key!r} given twice")
        if key == "order":
            fields[key] = value
            continue
        if key not in _SIZES:
            raise bad(f"unknown key {key!r} (known: {', '.join((*_SIZES, 'order'))})")
        if not value.isdigit() or int(value) < 1:
            raise bad(f"{key!r} must be a positive integer (got {value!r})")
        fields[key] = int(value)
    try:
        return models.Parallelism.model_validate(fields)
    except pydantic.ValidationError as e:
        raise bad(e.errors()[0]["msg"]) from e


def check_world(par: models.Parallelism, world_size: int) -> None:
    """Raise unless the declared layout covers exactly ``world_size`` ranks."""
    if par.size != world_size:
        raise errors.ParallelismError(
            f"parallelism {format_spec(par)!r}: product {par.size} != {world_size} ranks"
        )


def format_spec(par: models.Parallelism) -> str:
    """The annotation text of a layout (sizes of 1 for cp/ep and the default order omitted)."""
    parts = [
        f"{k}={getattr(par, k)}" for k in _SIZES if k in ("tp", "pp", "dp") or getattr(par, k) > 1
    ]
    if par.order != models.Parallelism().order:
        parts.append(f"order={par.order}")
    return ",".join(parts)


@dataclass(frozen=True)
class CommMember:
    """One rank's membership of one communicator, as its ring header says."""

    comm: ids.CommHash
    rank: ids.Rank
    comm_rank: ids.CommRank
    nranks: int
    name: str = ""
    p2p: bool = False  # every operation seen on it so far is Send/Recv


@dataclass(frozen=True)
class JobGroups:
    """Groups of one job; ``comms`` are the real communicators with their kinds."""

    source: Source
    comms: tuple[analysis_groups.Communicator, ...]
    tp: tuple[Group, ...]
    pp: tuple[Group, ...]
    dp: tuple[Group, ...]

    def as_status(self) -> dict[str, object]:
        """``TrainingJob.status.groups``."""
        return {
            "source": self.source,
            "tp": [list(g) for g in self.tp],
            "pp": [list(g) for g in self.pp],
            "dp": [list(g) for g in self.dp],
        }


def communicators(
    members: Iterable[CommMember],
    world_size: int,
    placement: Mapping[ids.Rank, ids.NodeName],
    parallelism: models.Parallelism | None = None,
) -> tuple[analysis_groups.Communicator, ...]:
    """Communicators from ring memberships, members in comm-rank order, each with its kind."""
    slots: dict[str, dict[int, int]] = defaultdict(dict)
    names: dict[str, str] = {}
    p2p: dict[str, bool] = {}
    for m in members:
        slots[m.comm][m.comm_rank] = m.rank
        names[m.comm] = names.get(m.comm) or m.name
        p2p[m.comm] = p2p.get(m.comm, True) and m.p2p
    job = models.Job(world_size=world_size, parallelism=parallelism)
    ordered = {c: tuple(s[k] for k in sorted(s)) for c, s in sorted(slots.items())}
    world = max((len(v) for v in ordered.values()), default=0)
    out = []
    for index, (comm, mem) in enumerate(ordered.items()):
        node_names = [placement.get(ids.Rank(r)) for r in mem]
        kind = analysis_groups.kind_of(
            job, mem, p2p=p2p[comm], node_names=node_names, world=world, ncomms=len(ordered)
        )
        out.append(
            analysis_groups.Communicator(
                index=index,
                comm_id=comm,
                members=mem,
                nodes=tuple(sorted({n for n in node_names if n is not None})),
                kind=kind,
                p2p=p2p[comm],
                name=names[comm],
            )
        )
    return tuple(out)


def declared(par: models.Parallelism, world_size: int) -> JobGroups:
    """Groups from a declared layout: ranks that differ only along one dimension."""
    check_world(par, world_size)
    ranks = list(range(world_size))
    coords = analysis_groups.coordinates(par, ranks)
    found: dict[str, tuple[Group, ...]] = {}
    for dim in ("tp", "pp", "dp"):
        others = [d for d in analysis_groups.DIMS if d != dim]
        by_key: dict[tuple[int, ...], list[ids.Rank]] = defaultdict(list)
        for r in ranks:
            by_key[tuple(int(coords[d][r]) for d in others)].append(ids.Rank(r))
        found[dim] = tuple(sorted(tuple(g) for g in by_key.values()))
    return JobGroups("declared", (), found["tp"], found["pp"], found["dp"])


def infer(
    members: Iterable[CommMember],
    world_size: int,
    placement: Mapping[ids.Rank, ids.NodeName],
    parallelism: models.Parallelism | None = None,
) -> JobGroups:
    """Groups of a job: the declared layout when given, else communicator kinds.

    With a declared layout the communicators are still listed (their kinds then follow the
    layout); without one, a dimension no communicator shows is empty.
    """
    comms = communicators(members, world_size, placement, parallelism)
    if parallelism is not None:
        base = declared(parallelism, world_size)
        return JobGroups("declared", comms, base.tp, base.pp, base.dp)

    def of(kind: analysis_groups.Kind) -> tuple[Group, ...]:
        return tuple(sorted({_as_group(c.members) for c in comms if c.kind == kind}))

    return JobGroups("inferred", comms, of("tp"), of("pp"), of("dp"))


def _as_group(members: Sequence[int]) -> Group:
    return tuple(ids.Rank(r) for r in sorted(members))
