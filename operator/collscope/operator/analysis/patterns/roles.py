"""Worker roles: who may be compared with whom (issue 17; EROICA §4.3 compares "workers").

EROICA's differential distance assumes every worker does the same work (§4.3: "workers in
large-scale training are supposed to behave similarly"). A pipeline-parallel job breaks that:
only the first stage runs the embedding and the data loader, only the last the loss, and a
function one stage runs looks "unique" on a quarter of the workers when the other stages count
as (0, 0, 0). So workers are compared within their *role*, derived in this order:

1. ``job.json``'s parallelism with pp > 1: the pipeline stage of each rank, from the order of
   the dimensions (fastest-varying first, Megatron's convention, as ``models.Parallelism``);
2. otherwise the data: the set of functions each worker runs. Workers with the same set form a
   group; a group of at least ``min_role_workers`` is a role; a smaller group (a function seen
   on a few workers only, e.g. a stall on three of them) joins the role whose set differs from
   its own by the fewest functions (the largest on a tie), so that such a function is still
   compared with every worker of that role (absent = (0, 0, 0)), as before;
3. one role of everyone when neither separates the workers.

A function that a whole role runs and other roles do not is the role's: it is compared among
that role's workers only, and never against the zeros of workers that do not run it. A
function every role runs is compared across the whole job, as EROICA does: a throttled server
is 1/8 of a 64-worker job but half of one of its 16-worker stages, where Δ, which looks for
what is *unusual*, could no longer see it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collscope.nodeagent.bundle import models
from collscope.operator.analysis.patterns import table


@dataclass(frozen=True)
class RoleSettings:
    # The smallest group of workers with their own function set taken as a role from the data
    # alone: one 8-GPU server (the smallest pipeline stage of a job that spans servers). Smaller
    # groups are workers with an extra function, compared within the role they join.
    min_role_workers: int = 8


@dataclass(frozen=True)
class Roles:
    """``of[i]``: role index of ``ranks[i]`` (ranks sorted); ``names[role]`` describes it."""

    ranks: table.I64
    of: table.I64
    names: tuple[str, ...]
    source: str  # "parallelism", "functions" or "none"

    def members(self, role: int) -> table.I64:
        out: table.I64 = self.ranks[self.of == role]
        return out


def stages(job: models.Job, ranks: table.I64) -> table.I64 | None:
    """Pipeline stage of each rank from job.json's parallelism, or None (no pp > 1)."""
    par = job.parallelism
    if par is None or par.pp <= 1:
        return None
    stride = 1
    for dim in par.order.split("-"):
        if dim == "pp":
            break
        stride *= int(getattr(par, dim))
    out: table.I64 = (ranks // stride) % par.pp
    return out


def derive(
    t: table.PatternTable, job: models.Job | None = None, s: RoleSettings = RoleSettings()
) -> Roles:
    """The roles of the module docstring over every worker of ``t``."""
    ranks = np.unique(t.rank)
    staged = None if job is None else stages(job, ranks)
    if staged is not None:
        present = np.unique(staged)
        of = np.searchsorted(present, staged)
        names = tuple(f"pipeline stage {int(p)}" for p in present)
        return Roles(ranks, of.astype(np.int64), names, "parallelism")
    # each worker's function set as a row of a (workers x functions) presence matrix
    pos = np.searchsorted(ranks, t.rank)
    has = np.zeros((ranks.size, len(t.fns)), dtype=bool)
    has[pos, t.fn_id] = True
    sets, group, counts = np.unique(has, axis=0, return_inverse=True, return_counts=True)
    group = group.reshape(-1)
    big = np.flatnonzero(counts >= s.min_role_workers)
    if big.size <= 1:
        return Roles(ranks, np.zeros(ranks.size, dtype=np.int64), ("all workers",), "none")
    # every group to its nearest role (fewest differing functions, then the largest)
    diff = (sets[:, None, :] != sets[None, big, :]).sum(axis=2)
    key = diff * (counts.max() + 1) - counts[big][None, :]
    nearest = big[np.argmin(key, axis=1)]
    role_of_group = np.searchsorted(big, nearest)
    of = role_of_group[group].astype(np.int64)
    names = tuple(_describe(sets[g], sets[big], t.fns) for g in big)
    return Roles(ranks, of, names, "functions")


def _describe(mine: table.Bool, every: table.Bool, fns: tuple[str, ...]) -> str:
    """'workers running f, g' naming the functions this role runs that not every role does."""
    own = np.flatnonzero(mine & ~every.all(axis=0))
    if not own.size:
        return "workers running only the common functions"
    names = [fns[i][:60] for i in own[:2].tolist()]
    more = f" (+{own.size - 2} more)" if own.size > 2 else ""
    return f"workers running {', '.join(names)}{more}"
