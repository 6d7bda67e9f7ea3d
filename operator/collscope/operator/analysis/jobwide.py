"""Job-wide hang check: every rank's trigger summary, every tick (issue 12 item 7).

The trigger (``trigger``) reads the windows of at most 10 sampled ranks (Mycroft §4.3). A hang
reaches them late: the ranks that go silent first are the culprit's ring neighbours, usually
not sampled, and the sampled ones follow 0.3-0.8 s later (eval-dev). The agents' ``GET
/v1/summaries`` gives, for every rank, the operation in flight at its latest state sample with
how long nothing of it moved (``api.InFlightOp``) and its latest completion: a few hundred
bytes per rank, cheap enough to pull for the whole job each tick. ``JobWide.update`` applies
the trigger's hang rule to those rows: an operation in flight whose progress stopped longer
than the threshold its communicator would get, on a rank that completed nothing since.

The threshold is where a false alarm would come from, so it is never lower than what the
trigger would apply, and it only exists where enough is known:

- *Known communicator* (the trigger's baselines hold ``stall_min_ops`` durations of it, from
  its sampled members): the trigger's own ``stall_threshold_ns``, and at least ``floor`` plus
  the longest stall this check itself saw any member's completed operation show. The second
  term covers roles the sampled members do not play (a pipeline receiver waits where its
  sampled sender does not).
- *A collective with a sampled twin* (no sampled member, but a sampled communicator ran the
  same collective with the same bytes: the DP groups of one stage run one program, and a
  collective's stall is its members' arrival skew): the largest of those twins' trigger
  thresholds, at least ``floor`` and k times the longest stall seen of this communicator, once
  ``stall_min_ops`` of its completed operations were seen. Send and Recv never borrow: a
  receive waits for its sender's compute, which differs by pipeline stage.
- *Unknown communicator* (no sampled member, no twin, e.g. an unsampled stage's pipeline comm):
  only what the summaries taught. A completed operation's longest stall L is bounded by what
  the ticks saw of it: a stall longer than the tick spacing contains a tick at most one
  spacing before it ended, so L <= observed + spacing; one never seen in flight lasted less
  than a spacing. The threshold is ``max(floor + spacing + longest observed, k x longest
  observed)``, i.e. the trigger's ``floor + usual stall`` with the usual stall replaced by its
  upper bound, and CCL-D's "long operations" (§4.2.1) by k times the longest one seen. A
  pipeline receive of an unsampled stage that waits through a long step is seen waiting (the
  wait spans ticks) and completing, and raises its own threshold above itself; it needs
  ``stall_min_ops`` such completed operations (CCL-D's repetition counter: a long wait is
  usual once it has recurred) before the communicator is judged at all.

Either way a communicator is judged only after it was watched for ``episode_window_periods``
measured steps of the job (the step must be known): what it usually waits is learned over whole
steps, not over one step's fill of a pipeline. A state sample older than
``state_max_age_intervals`` intervals is not current and neither judged nor learned from, as in
``inflight.at``. AllReduce of <= ``barrier_max_bytes`` is a barrier and is ignored (CCL-D
§4.2.1). The sampled ranks are skipped: the trigger judges them from their windows.

Times in a row are the agent's node clock (``to_ns`` is its now); a stall is measured within
one row, so clocks of different nodes are never compared.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Collection, Sequence

from collscope.nodeagent import api

NS = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the trigger lends the check (``TriggerState.jobwide_limits``), in ns."""

    floor_ns: int  # the hang threshold's floor (``TriggerState.hang_floor_ns``)
    k: float  # ``hang_k``
    interval_ns: int  # the measured sampling interval
    max_age_intervals: float  # ``state_max_age_intervals``
    period_ns: int | None  # the job's measured step; None: not known yet, nothing judged
    periods: float  # steps a communicator is watched before it is judged
    min_ops: int  # completed operations seen in flight before an unknown comm is judged
    barrier_max_bytes: int
    # comm id -> the trigger's threshold, None where its baselines do not know the comm
    known: Callable[[str], int | None]
    # (op, bytes) of a collective -> the largest threshold of the known communicators that
    # run it (its twins), None for point-to-point operations and where none does
    twin: Callable[[str, int], int | None] = lambda op, nbytes: None


@dataclasses.dataclass(frozen=True)
class Hit:
    """A rank's operation stalled past its threshold; times on the rank's node clock."""

    rank: int
    comm: str
    seq: int
    op: str
    since_ns: int  # stall start
    at_ns: int  # stall start + threshold
    stalled_ns: int
    threshold_ns: int
    source: str  # "known", "twin" or "fallback" (``JobWide.threshold_ns``)


@dataclasses.dataclass
class _Open:
    seq: int
    start_ns: int
    stall_ns: int  # the longest stall seen so far (at its samples)


class JobWide:
    """Per job: what the summaries showed of each communicator, and the check."""

    def __init__(self, history: int = 512) -> None:
        self._open: dict[int, dict[str, _Open]] = {}  # rank -> comm -> op in flight
        self._stalls: dict[str, collections.deque[int]] = {}  # comm -> completed ops' stalls
        self._first_ns: dict[str, int] = {}  # comm -> first tick it was seen
        self._history = history
        self._prev_ns: int | None = None
        self._spacing_ns = 0  # the longest spacing between two ticks seen
        self._longest: dict[str, int] = {}  # comm -> longest stall in _stalls, this tick

    def update(
        self,
        rows: Sequence[api.TriggerSummary],
        t_ns: int,
        limits: Limits,
        *,
        skip: Collection[int] = (),
    ) -> list[Hit]:
        """Learn from ``rows`` (one per rank, pulled at tick ``t_ns``), then the hits, earliest
        first (none while nothing is past its threshold)."""
        if self._prev_ns is not None:
            self._spacing_ns = max(self._spacing_ns, t_ns - self._prev_ns)
        self._prev_ns = t_ns
        self._longest = {}
        current = [(row, self._current(row, limits)) for row in rows]
        for row, ops in current:
            self._learn(row, ops, t_ns)
        hits = []
        for row, ops in current:
            if row.rank in skip:
                continue
            for op in ops:
                hit = self._judge(row, op, t_ns, limits)
                if hit is not None:
                    hits.append(hit)
        return sorted(hits, key=lambda h: (h.at_ns, h.rank))

    def threshold_ns(self, op: api.InFlightOp, t_ns: int, limits: Limits) -> tuple[int, str] | None:
        """The threshold of ``op``'s communicator and where it comes from (module docstring):
        "known", "twin" or "fallback"; None while the communicator is not judged."""
        comm = op.comm
        first = self._first_ns.get(comm)
        if limits.period_ns is None or first is None:
            return None
        if t_ns - first < limits.periods * limits.period_ns:
            return None
        seen = self._stalls.get(comm, ())
        longest = self._longest.get(comm)
        if longest is None:
            longest = self._longest[comm] = max(seen, default=0)
        thr = limits.known(comm)
        if thr is not None:
            return max(thr, limits.floor_ns + longest), "known"
        if len(seen) < limits.min_ops:
            return None
        twin = limits.twin(op.op, op.bytes)
        if twin is not None:
            return max(twin, limits.floor_ns + longest, int(limits.k * longest)), "twin"
        bound = limits.floor_ns + self._spacing_ns + longest
        return max(bound, int(limits.k * longest)), "fallback"

    def _current(self, row: api.TriggerSummary, limits: Limits) -> list[api.InFlightOp]:
        """The row's ops in flight from a current sample that are not barriers."""
        max_age = limits.max_age_intervals * limits.interval_ns
        return [
            op
            for op in row.in_flight
            if row.to_ns - op.sampled_ns <= max_age
            and not (op.op == "AllReduce" and op.bytes <= limits.barrier_max_bytes)
        ]

    def _learn(self, row: api.TriggerSummary, ops: list[api.InFlightOp], t_ns: int) -> None:
        """Close the operations of ``row.rank`` that completed since the last tick (another
        seq in flight on the comm, or none and a completion after its start) into their
        comm's stalls; open or extend the ones in flight."""
        for c in row.comms:
            self._first_ns.setdefault(c.comm, t_ns)
        now = {op.comm: op for op in ops}
        mine = self._open.setdefault(row.rank, {})
        for comm, was in list(mine.items()):
            op = now.get(comm)
            done = (
                op.seq != was.seq
                if op is not None
                else (row.last_completion_ns or 0) >= was.start_ns
            )
            if done:
                del mine[comm]
                stalls = self._stalls.setdefault(comm, collections.deque(maxlen=self._history))
                stalls.append(was.stall_ns)
        for op in ops:
            self._first_ns.setdefault(op.comm, t_ns)
            stall = max(0, min(op.idle_ns, op.sampled_ns - op.start_ns))
            cur = mine.get(op.comm)
            if cur is None or cur.seq != op.seq:
                mine[op.comm] = _Open(op.seq, op.start_ns, stall)
            else:
                cur.stall_ns = max(cur.stall_ns, stall)

    def _judge(
        self, row: api.TriggerSummary, op: api.InFlightOp, t_ns: int, limits: Limits
    ) -> Hit | None:
        got = self.threshold_ns(op, t_ns, limits)
        if got is None:
            return None
        thr, source = got
        since = op.sampled_ns - op.idle_ns
        if op.stalled_ns <= thr:
            return None
        if row.last_completion_ns is not None and row.last_completion_ns > since:
            return None  # it completed work since the stall began: not hung
        return Hit(
            rank=row.rank,
            comm=op.comm,
            seq=op.seq,
            op=op.op,
            since_ns=since,
            at_ns=since + thr,
            stalled_ns=op.stalled_ns,
            threshold_ns=thr,
            source=source,
        )
