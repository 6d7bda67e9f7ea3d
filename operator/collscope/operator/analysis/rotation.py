"""Which ranks the trigger watches at each tick: Mycroft's sample, rotated over the DP groups.

Mycroft §4.3 watches at most 10 ranks, at least one per DP group, and counts on a fault spreading
to every rank that depends on it. With more DP groups than the budget that leaves groups nobody
watches, and a slowdown that stays inside its own group (a slow NIC carrying only that group's
gradient exchange, its delay absorbed by the pipeline bubble: the job slows by 0-4 %) is never
seen. The paper does not rotate; this module keeps its budget and adds rotation:

- ``A`` anchors are watched on every tick, as Mycroft's fixed sample is: the first picks of
  ``groups.pick_order`` (distinct DP groups, spread over nodes and stages), so a fault that
  does spread is seen at once by ranks whose normals were learned without a gap. ``A`` is the
  most that does not lengthen the rotation (``most_anchors``);
- the other ``M - A`` slots visit the remaining DP groups, one rank per group (the rest of
  ``pick_order``, so each phase's ranks are spread over nodes too), ``M - A`` groups at a time,
  staying ``D = dwell_ticks`` ticks on each (the trigger's repeat count: a slowdown must hold
  that many consecutive ticks on watched ranks before it fires).

The bound, for ``G`` DP groups and a budget of ``M`` ranks: with ``G <= M`` nothing rotates
(every group is watched on every tick, as before). Otherwise every DP group is watched for
``D`` consecutive ticks once in every ``period_ticks = ceil((G - A) / (M - A)) * D`` =
``ceil(G / M) * D`` ticks (the last phase wraps around to the first groups so that every
phase fills every slot). A slowdown that persists is seen within ``period_ticks + D - 2`` ticks
of its first slow tick: the next visit of its group starts within ``period_ticks - 1`` ticks,
and the streak completes on that visit's last tick because a rank that joins brings its recent
records with it (``trigger.TriggerState.watch``). With 1 s ticks, ``M = 10``, ``D = 3``:
16 DP groups -> every group within 6 s (4 anchors), 32 -> 12 s, 64 -> 21 s, 128 -> 39 s.

The same pure function decides the watched set in the replay (``engine.diagnose``) and in the
live operator (``collscope.operator.domain.sampling``): from the groups and the tick number only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from collscope.nodeagent.bundle import models
from collscope.operator.analysis import groups as groups_mod

DEFAULT_DWELL_TICKS = 3  # = trigger.TriggerSettings.repeat_ticks: one streak per visit


@dataclass(frozen=True)
class Plan:
    """A sample over time. ``rotation`` is empty when every DP group fits the budget."""

    anchors: tuple[int, ...]  # watched on every tick, sorted
    rotation: tuple[int, ...] = ()  # one rank per remaining DP group, in visiting order
    slots: int = 0  # rotating ranks watched at once
    dwell_ticks: int = 1  # consecutive ticks each rotating rank stays
    dp_groups: int = 0  # DP groups of the job (for messages)

    @property
    def phases(self) -> int:
        return math.ceil(len(self.rotation) / self.slots) if self.rotation and self.slots else 1

    @property
    def period_ticks(self) -> int:
        """Ticks after which every DP group has been watched ``dwell_ticks`` ticks in a row."""
        return self.phases * self.dwell_ticks if self.rotation else 1

    @property
    def ranks(self) -> tuple[int, ...]:
        """Every rank the plan ever watches, sorted."""
        return tuple(sorted({*self.anchors, *self.rotation}))

    def at(self, tick: int) -> tuple[int, ...]:
        """The ranks watched at tick number ``tick`` (0 for the first tick), sorted."""
        if not self.rotation or self.slots < 1:
            return self.anchors
        n = len(self.rotation)
        first = ((tick // self.dwell_ticks) % self.phases) * self.slots
        rotating = {self.rotation[(first + j) % n] for j in range(min(self.slots, n))}
        return tuple(sorted({*self.anchors, *rotating}))

    def last_seen(self, tick: int, ranks: Iterable[int]) -> int | None:
        """Where a slowdown first seen at ``tick`` on ``ranks`` may have begun, as a tick number.

        A rank that rotated in sees a slowdown that may be as old as its absence: the answer is
        the last tick before the rank's current visit at which it was watched (one period before
        the visit when it never was; negative when that is before tick 0), the earliest over
        ``ranks``. None when one of them was watched on every tick up to ``tick`` (an anchor):
        the trigger's own start of the slowdown then stands.
        """
        out: int | None = None
        for r in ranks:
            k = tick
            while k >= 0 and r in self.at(k):
                k -= 1
            if k < 0:
                return None
            visit = k + 1
            while k >= 0 and r not in self.at(k):
                k -= 1
            seen = k if k >= 0 else visit - self.period_ticks
            out = seen if out is None else min(out, seen)
        return out

    def describe(self) -> str:
        if not self.rotation:
            return f"sampled ranks {list(self.anchors)}"
        return (
            f"anchors {list(self.anchors)} and {self.slots} slots rotating over "
            f"{len(self.rotation)} more DP groups ({self.dwell_ticks} ticks each, every group "
            f"watched within {self.period_ticks} ticks)"
        )


def fixed(ranks: Sequence[int]) -> Plan:
    """A plan that never rotates (a sample given by the caller)."""
    return Plan(anchors=tuple(sorted(set(ranks))))


def plan(
    grp: groups_mod.Groups,
    job: models.Job,
    max_ranks: int = 10,
    *,
    anchors: int | None = None,
    dwell_ticks: int = DEFAULT_DWELL_TICKS,
) -> Plan:
    """The rotation plan of a job (see the module docstring); deterministic."""
    ndp = len(groups_mod.dp_groups(grp, job))
    if ndp <= max_ranks:
        return Plan(
            anchors=groups_mod.sample_ranks(grp, job, max_ranks), dwell_ticks=1, dp_groups=ndp
        )
    keep = most_anchors(ndp, max_ranks) if anchors is None else max(0, min(anchors, max_ranks - 1))
    order = groups_mod.pick_order(grp, job, ndp)  # one rank per DP group, spread
    return Plan(
        anchors=tuple(sorted(order[:keep])),
        rotation=order[keep:],
        slots=max_ranks - keep,
        dwell_ticks=max(1, dwell_ticks),
        dp_groups=ndp,
    )


def most_anchors(dp_groups: int, max_ranks: int) -> int:
    """The most ranks that can stay fixed without lengthening the rotation: the largest ``A``
    with ``ceil((G - A) / (M - A)) == ceil(G / M)`` (0 when even one anchor would cost a
    phase). Fixed ranks keep Mycroft's continuity (normals learned without gaps, a fault that
    spreads seen on every tick by the same ranks); rotating ones bound the time to cover all."""
    if dp_groups <= max_ranks:
        return max_ranks
    least = math.ceil(dp_groups / max_ranks)
    a = 0
    while a + 1 < max_ranks and math.ceil((dp_groups - a - 1) / (max_ranks - a - 1)) == least:
        a += 1
    return a


def coverage_ticks(p: Plan, dp_groups: Sequence[Sequence[int]], *, limit: int = 100_000) -> int:
    """Measured, not computed: ticks from tick 0 until every DP group had one of its ranks
    watched ``p.dwell_ticks`` ticks in a row (``limit`` when some group never is)."""
    need = p.dwell_ticks if p.rotation else 1
    group_of = {r: gi for gi, g in enumerate(dp_groups) for r in g}
    run = [0] * len(dp_groups)
    done = [False] * len(dp_groups)
    for t in range(limit):
        watched = {group_of[r] for r in p.at(t) if r in group_of}
        for gi in range(len(dp_groups)):
            run[gi] = run[gi] + 1 if gi in watched else 0
            done[gi] = done[gi] or run[gi] >= need
        if all(done):
            return t + 1
    return limit
