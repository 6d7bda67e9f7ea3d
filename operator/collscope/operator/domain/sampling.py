"""Which ranks of a TrainingJob the trigger polls, tick by tick, and when to choose again.

The choice itself is Mycroft §4.3 as ``analysis.groups.sample_ranks`` implements it: at least
one rank per DP group, at most ``max_ranks`` (10 by default), each pick on the node (then the
pipeline stage) used least so far, so the sample spreads across nodes. With more DP groups than
the budget, part of the sample rotates over the groups (``analysis.rotation``, the same pure
function the replay uses): ``Sample.plan.at(tick)`` is the set watched at the job's tick number
``tick``, and every DP group is watched within ``plan.period_ticks`` ticks. This module adds
what a live job needs on top:

- only ranks whose pod is present (scheduled, with a node) are candidates: polling a rank with
  no agent behind it would only report errors;
- a *fingerprint* of the placement (rank -> pod uid, node) and of the groups; ``Sampler.update``
  chooses again exactly when it changes (a pod replaced, moved, added or gone) and otherwise
  keeps the previous sample, so the trigger's learned baselines stay with the same ranks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from collscope.nodeagent.bundle import models
from collscope.operator.analysis import groups as analysis_groups
from collscope.operator.analysis import rotation
from collscope.operator.domain import groups, ids

DEFAULT_MAX_RANKS = 10  # Mycroft §4.3: "at most 10 ranks", bounded cost at any scale


@dataclass(frozen=True)
class Placement:
    """Where a rank's process runs now."""

    pod_uid: ids.PodUID
    node: ids.NodeName


@dataclass(frozen=True)
class Sample:
    plan: rotation.Plan  # the ranks watched at each tick
    fingerprint: str

    @property
    def ranks(self) -> tuple[ids.Rank, ...]:
        """Every rank the plan ever watches."""
        return tuple(ids.Rank(r) for r in self.plan.ranks)

    def at(self, tick: int) -> tuple[ids.Rank, ...]:
        return tuple(ids.Rank(r) for r in self.plan.at(tick))


def fingerprint(
    placement: Mapping[ids.Rank, Placement],
    job_groups: groups.JobGroups,
    max_ranks: int,
    dwell_ticks: int = rotation.DEFAULT_DWELL_TICKS,
) -> str:
    """A short digest of everything the sample depends on."""
    doc = {
        "p": sorted([int(r), p.pod_uid, p.node] for r, p in placement.items()),
        "g": job_groups.as_status(),
        "n": max_ranks,
        "d": dwell_ticks,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def choose(
    placement: Mapping[ids.Rank, Placement],
    job_groups: groups.JobGroups,
    max_ranks: int = DEFAULT_MAX_RANKS,
) -> tuple[ids.Rank, ...]:
    """Mycroft sampling over the present ranks: >= 1 per DP group that has any, <= max_ranks.

    Without any DP group (nothing declared, no multi-node collective seen yet) every present
    rank is its own group, so the budget is spread over nodes. The set watched at the first
    tick of ``plan``'s rotation.
    """
    return tuple(ids.Rank(r) for r in plan(placement, job_groups, max_ranks).at(0))


def plan(
    placement: Mapping[ids.Rank, Placement],
    job_groups: groups.JobGroups,
    max_ranks: int = DEFAULT_MAX_RANKS,
    dwell_ticks: int = rotation.DEFAULT_DWELL_TICKS,
) -> rotation.Plan:
    """``analysis.rotation.plan`` over the present ranks (see ``choose`` for the groups)."""
    present = set(placement)
    if not present or max_ranks < 1:
        return rotation.fixed(())
    dp = [g for g in (_present(g, present) for g in job_groups.dp) if g]
    if not dp:
        dp = [(r,) for r in sorted(present)]
    pp = [g for g in (_present(g, present) for g in job_groups.pp) if len(g) > 1]
    kinds: list[tuple[analysis_groups.Kind, tuple[int, ...]]] = [("dp", g) for g in dp]
    kinds += [("pp", g) for g in pp]
    synthetic = [
        analysis_groups.Communicator(
            index=i, comm_id=f"{kind}-{i}", members=g, nodes=(), kind=kind, p2p=kind == "pp"
        )
        for i, (kind, g) in enumerate(kinds)
    ]
    # Rank-only placement and no declared layout: sample_ranks then reads the groups above
    # (stages from the pp groups) and spreads over the nodes given here.
    job = models.Job(
        world_size=max(present) + 1,
        ranks=[models.RankInfo(rank=r, node=p.node) for r, p in sorted(placement.items())],
    )
    dp_comms = analysis_groups.Groups(comms=tuple(synthetic))
    return rotation.plan(dp_comms, job, max_ranks, dwell_ticks=dwell_ticks)


def _present(group: groups.Group, present: set[ids.Rank]) -> tuple[int, ...]:
    return tuple(r for r in group if r in present)


class Sampler:
    """Keeps one job's sample; chooses again only when its inputs change."""

    def __init__(
        self,
        max_ranks: int = DEFAULT_MAX_RANKS,
        dwell_ticks: int = rotation.DEFAULT_DWELL_TICKS,
    ) -> None:
        self.max_ranks = max_ranks
        self.dwell_ticks = dwell_ticks
        self.current: Sample | None = None

    def update(
        self, placement: Mapping[ids.Rank, Placement], job_groups: groups.JobGroups
    ) -> tuple[Sample, bool]:
        """The sample for this placement, and whether it was (re)chosen now."""
        fp = fingerprint(placement, job_groups, self.max_ranks, self.dwell_ticks)
        if self.current is not None and self.current.fingerprint == fp:
            return self.current, False
        chosen = plan(placement, job_groups, self.max_ranks, self.dwell_ticks)
        self.current = Sample(chosen, fp)
        return self.current, True
