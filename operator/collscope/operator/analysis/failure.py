"""Root cause of a hang: Mycroft Algorithm 2 (AnalyzeFailureRootCause, §5.2-5.4) + CCL-D §4.2.2.

Input: the window (t - Δ, t] of every rank. Steps:

1. Last state per (rank, comm) and last completed seq per (rank, comm) at t (``inflight``).
   Trace id = (comm, seq) (CCL-D §5.1). *Stuck ops*: trace ids with members in flight whose
   progress stopped at least ``stuck_min_s`` ago.
2. For each stuck op, each member is *entered* (in flight on it, or completed it), *elsewhere*
   (in flight in another stuck op: an older seq of the same comm or another communicator) or
   *missing* (neither).
3. Cross-group walk (Mycroft §5.2 "a single responsible group whose stuck rank propagates
   problems to other Coll groups", §5.4): from the trigger's stuck op follow every *elsewhere*
   member to the op it is stuck in, until an op whose members are all entered or missing: the
   origin group. Cycle-safe (visited set); a pure cycle of waits is a deadlock of inconsistent
   call orders.
4. Classify the origin (CCL-D §4.2.2 decision tree, Fig. 7):
   - members disagreeing on (op, bytes) for the same trace id: the minority is the culprit,
     ``hang.inconsistent`` (H2);
   - missing members (no state for the seq, last completed seq below it, not in flight in any
     stuck op): ``hang.not_entered`` (H1); CCL-D: "no increment in its operation counter";
   - all entered and stalled: hardware (H3). Mycroft's MinOp (a rank behind in seq) is the
     walk of step 3; then the chunk table (``chunks``, Mycroft Table 4 and §5.3 sender/receiver
     comparison): the endpoint of most flows blocked at the network is the NIC culprit
     (``hang.network``); a rank that delivered all it produced while data for it arrived and
     was not consumed (or its senders see "receiver not ready") has a stopped GPU
     (``hang.gpu``); otherwise MinData (least chunk progress, CCL-D "fewest SendCount/
     RecvCount"). The NIC verdict (``nics``) also reads the stuck flows of every other
     communicator through the same NICs, and says when two NICs cannot be told apart. An
     origin without flows (intra-node only) can only be judged from kernel progress: node
     precision, the node's ranks as culprits, least progress first.

Why one module: the four steps above are one algorithm over one set of intermediate facts (the
stuck ops, each member's entered/elsewhere/missing state, the origin of the walk); the NIC and
chunk judgements it delegates to already live in ``nics`` and ``chunks``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import diagnosis, groups, hardware, inflight, placement

Trace = tuple[int, int]  # (comm index, seq)
NS = 1_000_000_000


@dataclass(frozen=True)
class FailureSettings:
    """Thresholds of the hang root cause, and where each value comes from (issue 12 item 5).

    ``stuck_min_s``: an operation in flight whose flows have not moved for this long is
    stuck. It stands above the longest idle of healthy flows (0.3 s on the own simulator,
    0.2 s at most in eval-dev's fault-free cases), picked at 0.5 s; the analysis runs at a
    hang threshold (>= 1.2 s), so every hung operation is stuck by then. It is at least
    ``stuck_min_intervals`` measured sampling intervals: a state sample up to that old is
    current (``trigger.TriggerSettings.state_max_age_intervals``), and an operation that moved
    just after it looks stalled that long (no change at 100 or 200 ms sampling).
    ``max_walk`` bounds the cross-group walk's cost, not a physical quantity: 256 stuck
    operations are more communicators than one rank belongs to in any job here.
    """

    stuck_min_s: float = 0.5
    stuck_min_intervals: float = 2.0
    max_walk: int = 256


@dataclass(frozen=True)
class Finding:
    """A root cause: what analysis concluded, before the engine adds trigger and confidence."""

    category: diagnosis.Category
    culprits: list[diagnosis.Culprit]
    evidence: list[str]
    margin: float  # 0..1, how far the best culprit stands above the next
    coverage: float  # 0..1, share of the implicated group with usable records
    precision: Literal["rank", "node"] = "rank"
    extra: dict[str, int] = field(default_factory=dict)
    alternatives: list[diagnosis.Alternative] = field(default_factory=list)


def runner_up(finding: Finding) -> list[diagnosis.Alternative]:
    """The best culprit on another node than the verdict's, as an alternative; its score is
    relative to the verdict's culprit (1.0: a tie)."""
    if not finding.culprits:
        return []
    first = finding.culprits[0]
    for c in finding.culprits[1:]:
        if c.rank is not None and c.node != first.node:
            tie = c.score >= first.score
            return [
                diagnosis.Alternative(
                    category=finding.category.value.name,
                    rank=c.rank,
                    node=c.node,
                    score=round(min(1.0, c.score / first.score if first.score else 1.0), 3),
                    why=(
                        "as strong as the verdict: the collective evidence cannot tell them "
                        "apart (the evidence says which counter would)"
                        if tie
                        else f"scored {c.score:.2f} against the verdict's {first.score:.2f}"
                    ),
                )
            ]
    return []


@dataclass
class _Op:
    trace: Trace
    entered: list[int] = field(default_factory=list)
    completed: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    elsewhere: dict[int, Trace] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)  # member -> in-flight row
    stall_start: int = 0


class _Ctx:
    def __init__(
        self,
        bundle: tables.Bundle,
        t_ns: int,
        *,
        grp: groups.Groups,
        where: placement.Placement,
        s: FailureSettings,
        interval_ns: int,
    ) -> None:
        self.b, self.t, self.grp, self.where, self.s = bundle, t_ns, grp, where, s
        self.now = inflight.at(bundle, t_ns, interval_ns=interval_ns)
        self.done = inflight.completed(bundle, t_ns)
        self.row = {
            (int(r), int(c)): i
            for i, (r, c) in enumerate(zip(self.now.rank, self.now.comm, strict=True))
        }
        stuck = self.now.stalled_ns >= max(
            int(s.stuck_min_s * NS), int(s.stuck_min_intervals * interval_ns)
        )
        self.stuck_rows = np.flatnonzero(stuck)
        self.stuck: set[Trace] = {
            (int(self.now.comm[i]), int(self.now.seq[i])) for i in self.stuck_rows
        }
        self.of_rank: dict[int, list[int]] = {}
        for i in self.stuck_rows.tolist():
            self.of_rank.setdefault(int(self.now.rank[i]), []).append(i)

    def members(self, comm: int) -> tuple[int, ...]:
        m = self.grp.members(comm)
        if m:
            return m
        return tuple(sorted({int(r) for r in self.now.rank[self.now.comm == comm]}))

    def op(self, trace: Trace) -> _Op:
        c, s = trace
        out = _Op(trace=trace)
        mem = self.members(c)
        done = self.done.lookup(
            np.asarray(mem, dtype=np.int64), np.full(len(mem), c, dtype=np.int64)
        )
        starts = []
        for m, d in zip(mem, done.tolist(), strict=True):
            i = self.row.get((m, c))
            if i is not None and int(self.now.seq[i]) == s:
                out.entered.append(m)
                out.rows[m] = i
                starts.append(int(self.now.stall_start[i]))
            elif d >= s:
                out.completed.append(m)
            elif i is not None and (c, int(self.now.seq[i])) in self.stuck:
                out.elsewhere[m] = (c, int(self.now.seq[i]))  # behind: MinOp
                out.rows[m] = i
            else:
                other = [j for j in self.of_rank.get(m, []) if int(self.now.comm[j]) != c]
                if other:
                    j = min(other, key=lambda k: int(self.now.stall_start[k]))
                    out.elsewhere[m] = (int(self.now.comm[j]), int(self.now.seq[j]))
                else:
                    out.missing.append(m)
        out.stall_start = min(starts) if starts else self.t
        return out

    def describe(self, trace: Trace) -> str:
        c, s = trace
        i = next(
            (
                j
                for j in self.stuck_rows
                if int(self.now.comm[j]) == c and int(self.now.seq[j]) == s
            ),
            None,
        )
        name = "op" if i is None else self.b.string(int(self.now.op[i]))
        return f"{name} seq {s} on comm {self.b.comm_id(c)}"


def analyze(
    bundle: tables.Bundle,
    t_ns: int,
    *,
    grp: groups.Groups,
    where: placement.Placement,
    settings: FailureSettings = FailureSettings(),
    interval_ns: int = 100_000_000,
    hint: Trace | None = None,
) -> Finding | None:
    """Root cause of a hang at ``t_ns`` from ``bundle`` (the window of all ranks), or None."""
    ctx = _Ctx(bundle, t_ns, grp=grp, where=where, s=settings, interval_ns=interval_ns)
    if not ctx.stuck:
        return None
    ops: dict[Trace, _Op] = {}
    first = (
        hint
        if hint in ctx.stuck
        else min(
            ctx.stuck,
            key=lambda tr: min(
                int(ctx.now.stall_start[i])
                for i in ctx.stuck_rows
                if (int(ctx.now.comm[i]), int(ctx.now.seq[i])) == tr
            ),
        )
    )
    path, origin, cycle = _walk(ctx, first, ops)
    evidence = _walk_evidence(ctx, path, ops)
    if cycle:
        return _deadlock(ctx, path, ops, evidence)
    return _classify(ctx, ops[origin], evidence)


def _walk(ctx: _Ctx, first: Trace, ops: dict[Trace, _Op]) -> tuple[list[Trace], Trace, bool]:
    """Follow 'elsewhere' members from op to op; the last op visited is the origin group."""
    path = [first]
    cur = first
    while len(path) <= ctx.s.max_walk:
        op = ops.setdefault(cur, ctx.op(cur))
        if not op.elsewhere:
            return path, cur, False
        # Follow the op that most absent members are stuck in; ties: the oldest stall.
        votes = Counter(op.elsewhere.values())
        nxt = max(votes, key=lambda tr: (votes[tr], -ops.setdefault(tr, ctx.op(tr)).stall_start))
        if nxt in path:
            return path, cur, True
        path.append(nxt)
        cur = nxt
    return path, cur, False


def _expected_signature(
    ctx: _Ctx, comm: int, seq: int, signature: Callable[[int, int], tuple[int, int]]
) -> tuple[int, int] | None:
    """The (op, bytes) that seq ``seq`` of ``comm`` should be, from the communicator's completed
    history: training issues the same sequence of collectives every iteration, so the history
    is periodic; the shortest period k it follows gives the answer as seq - k's signature."""
    ops = ctx.b.ops[(ctx.b.ops["comm"] == comm) & (ctx.b.ops["seq"] < seq)]
    hist: dict[int, tuple[int, int]] = {}
    for row in ops[np.argsort(ops["seq"], kind="stable")]:
        hist.setdefault(int(row["seq"]), signature(int(row["op"]), int(row["bytes"])))
    for k in range(1, 17):
        pairs = [(q, q - k) for q in hist if q - k in hist]
        if len(pairs) < k + 1 or any(hist[a] != hist[b] for a, b in pairs):
            continue
        for back in range(seq - k, seq - 17 * k, -k):
            if back in hist:
                return hist[back]
    return None


def _walk_evidence(ctx: _Ctx, path: list[Trace], ops: dict[Trace, _Op]) -> list[str]:
    out = []
    for a, b in itertools.pairwise(path):
        waiting = len(ops[a].entered)
        who = sorted(m for m, tr in ops[a].elsewhere.items() if tr == b)
        names = ", ".join(ctx.where.label(m) for m in who[:3]) + (" ..." if len(who) > 3 else "")
        out.append(
            f"{waiting} ranks wait in {ctx.describe(a)} for {names}, itself stuck in "
            f"{ctx.describe(b)}"
        )
    return out


def _deadlock(ctx: _Ctx, path: list[Trace], ops: dict[Trace, _Op], evidence: list[str]) -> Finding:
    links = sorted({m for tr in path for m in ops[tr].elsewhere})
    culprits = [
        ctx.where.culprit(m, component="software", score=0.5, comm=ctx.b.comm_id(path[0][0]))
        for m in links[:16]
    ]
    evidence.append("the waits form a cycle: ranks entered communicators in different orders")
    return Finding(
        category=diagnosis.Category.HANG_INCONSISTENT,
        culprits=culprits,
        evidence=evidence,
        margin=0.0,
        coverage=1.0,
    )


def _classify(ctx: _Ctx, op: _Op, evidence: list[str]) -> Finding:
    """The hang category of the stuck operation ``op``: members that entered different
    operations (inconsistent), members that never entered it (not entered), or else all in it
    and the hardware rules judge the flows that stopped (``hardware.judge``)."""
    c, _ = op.trace
    members = len(ctx.members(c))
    coverage = (len(op.entered) + len(op.completed) + len(op.missing)) / max(members, 1)
    sig, names, signature = _signatures(ctx, op)
    if len(Counter(sig.values())) > 1:
        return _inconsistent(
            ctx, op, sig, names, signature=signature, evidence=evidence, coverage=coverage
        )
    if op.missing:
        return _not_entered(ctx, op, evidence, coverage=coverage)
    late = _entered_late(ctx, op)
    if late:
        return _late_finding(ctx, op, late, evidence, coverage=coverage)
    comm_id = ctx.b.comm_id(c)
    rows = np.asarray([op.rows[m] for m in op.entered], dtype=np.intp)
    verdict = hardware.judge(
        ctx.b,
        ctx.now,
        rows,
        ctx.where,
        t_ns=ctx.t,
        members=ctx.members(c),
        comm_id=comm_id,
        context=ctx.stuck_rows,  # a dead NIC stops its flows on every communicator
    )
    evidence.extend(verdict.evidence)
    return Finding(
        category=verdict.category,
        culprits=verdict.culprits,
        evidence=evidence,
        margin=verdict.margin,
        coverage=coverage * verdict.coverage,
        precision=verdict.precision,
    )


def _entered_late(ctx: _Ctx, op: _Op) -> dict[int, int]:
    """Members of ``op`` that entered it after the latest state sample of every member still
    in flight and have completed it since: ``{member: entry ns}``; empty when there are none.

    An operation of NCCL's protocols moves only once every member has entered it: a ring or
    tree collective needs every rank's data on every path, a Send its Recv (CCL-D §4.2.2 H1:
    the ranks that entered wait for the one that did not). A member entering late explains
    the stall of the others up to its entry, and its completion shows the operation moved
    after that. The waiters' samples, all taken before that entry, cannot show the movement:
    their "no progress" since before the entry is the wait on the late member, not a stopped
    GPU (H3). At 10 s steps that wait lasts seconds and a sample taken on its own phase a
    few ms before the late entry reads as a stall of seconds. A member still in flight after
    a newer sample is judged on that sample as before (a GPU that stops later stays stuck).
    """
    if not op.completed or not op.entered:
        return {}
    rows = [op.rows[m] for m in op.entered]
    newest = max(int(ctx.now.ts[i]) for i in rows)
    stalled = max(int(ctx.now.stall_start[i]) for i in rows)
    c, s = op.trace
    ops = ctx.b.ops
    mine = ops[(ops["comm"] == c) & (ops["seq"] == s) & (ops["ts"] <= ctx.t)]
    late: dict[int, int] = {}
    for m in op.completed:
        start = mine["start"][mine["rank"] == m]
        if len(start) and int(start.max()) > max(newest, stalled):
            late[m] = int(start.max())
    return late


def _late_finding(
    ctx: _Ctx, op: _Op, late: dict[int, int], evidence: list[str], *, coverage: float
) -> Finding:
    """HANG_NOT_ENTERED for the members that entered ``op`` late (``_entered_late``): the
    engine then asks whether they kept moving (``progress``, CCL-D H1); having completed the
    operation, they did, and the wait is judged as a slowdown."""
    c, _ = op.trace
    comm_id = ctx.b.comm_id(c)
    waiters = len(op.entered) + len(op.completed) - len(late)
    share = waiters / max(waiters + len(late), 1)
    stalled = min(int(ctx.now.stall_start[op.rows[m]]) for m in op.entered)
    newest = max(int(ctx.now.ts[op.rows[m]]) for m in op.entered)
    desc = ctx.describe(op.trace)
    for m, start in sorted(late.items())[:4]:
        evidence.append(
            f"{ctx.where.label(m)} entered {desc} only {(start - stalled) / NS:.1f} s after "
            f"the others stopped moving in it, and has completed it since; the latest sample "
            f"of the {len(op.entered)} rank(s) still shown in flight is "
            f"{(start - newest) / NS * 1000:.0f} ms older than that entry: the operation "
            f"waited on {ctx.where.label(m)}, it is not stuck (CCL-D H1)"
        )
    return Finding(
        category=diagnosis.Category.HANG_NOT_ENTERED,
        culprits=[
            ctx.where.culprit(m, component="software", score=share, comm=comm_id)
            for m in sorted(late)
        ],
        evidence=evidence,
        margin=share,
        coverage=coverage,
    )


_Signature = Callable[[int, int], tuple[int, int]]


def _signatures(
    ctx: _Ctx, op: _Op
) -> tuple[dict[int, tuple[int, int]], dict[int, int], _Signature]:
    """Per member that entered or completed ``op``: its (op, bytes) signature and op name
    index, and the signature function (a Send and its matching Recv compare by size only)."""
    c, s = op.trace
    p2p = {i for i in (ctx.b.string_index("Send"), ctx.b.string_index("Recv")) if i is not None}

    def signature(o: int, nb: int) -> tuple[int, int]:
        # A Send and its matching Recv are one operation: compare sizes only.
        return (-1 if o in p2p else o, nb)

    sig: dict[int, tuple[int, int]] = {}
    names: dict[int, int] = {}
    for m, i in op.rows.items():
        if m in op.entered:
            sig[m] = signature(int(ctx.now.op[i]), int(ctx.now.nbytes[i]))
            names[m] = int(ctx.now.op[i])
    for m in op.completed:
        rec = ctx.b.ops[
            (ctx.b.ops["rank"] == m) & (ctx.b.ops["comm"] == c) & (ctx.b.ops["seq"] == s)
        ]
        if len(rec):
            sig[m] = signature(int(rec["op"][0]), int(rec["bytes"][0]))
            names[m] = int(rec["op"][0])
    return sig, names, signature


def _inconsistent(
    ctx: _Ctx,
    op: _Op,
    sig: dict[int, tuple[int, int]],
    names: dict[int, int],
    *,
    signature: _Signature,
    evidence: list[str],
    coverage: float,
) -> Finding:
    """HANG_INCONSISTENT: the members whose signature differs from the majority's (a tie
    goes to what the communicator's history expects)."""
    c, s = op.trace
    comm_id = ctx.b.comm_id(c)
    counts = Counter(sig.values())
    major = counts.most_common(1)[0][0]
    top = [v for v, n in counts.items() if n == counts[major]]
    if len(top) > 1:  # a tie (two members): what the communicator's history expects wins
        expected = _expected_signature(ctx, c, s, signature)
        if expected in top:
            major = expected
            evidence.append(
                f"the members split evenly; seq {s} on comm {comm_id} repeats what this "
                f"communicator ran one iteration earlier, which the minority did not enter"
            )
    minority = sorted(m for m, v in sig.items() if v != major)
    share = 1.0 - len(minority) / max(len(sig), 1)
    culprits = [
        ctx.where.culprit(m, component="software", score=share, comm=comm_id) for m in minority
    ]
    major_name = next(ctx.b.string(names[m]) for m, v in sig.items() if v == major)
    for m in minority[:4]:
        evidence.append(
            f"{ctx.where.label(m)} entered {ctx.b.string(names[m])} of "
            f"{sig[m][1]} bytes as seq {s} on comm {comm_id}, while "
            f"{counts[major]} ranks entered {major_name} of {major[1]} bytes"
        )
    return Finding(
        category=diagnosis.Category.HANG_INCONSISTENT,
        culprits=culprits,
        evidence=evidence,
        margin=share,
        coverage=coverage,
    )


def _not_entered(ctx: _Ctx, op: _Op, evidence: list[str], *, coverage: float) -> Finding:
    """HANG_NOT_ENTERED: the members that never entered ``op`` while the others did."""
    c, _ = op.trace
    comm_id = ctx.b.comm_id(c)
    entered = len(op.entered) + len(op.completed)
    share = entered / max(entered + len(op.missing), 1)
    desc = ctx.describe(op.trace)
    last = ctx.done.lookup(
        np.asarray(op.missing, dtype=np.int64), np.full(len(op.missing), c, dtype=np.int64)
    ).tolist()
    culprits = [
        ctx.where.culprit(m, component="software", score=share, comm=comm_id) for m in op.missing
    ]
    for m, d in list(zip(op.missing, last, strict=True))[:4]:
        seen = (
            f"its last completed seq there is {d}"
            if d >= 0
            else "it completed nothing on it in the window"
        )
        evidence.append(
            f"{ctx.where.label(m)} never entered {desc} while {entered} "
            f"ranks did; {seen} and it is in no operation: it is stuck before "
            f"the collective (dump its Python stack)"
        )
    return Finding(
        category=diagnosis.Category.HANG_NOT_ENTERED,
        culprits=culprits,
        evidence=evidence,
        margin=share,
        coverage=coverage,
    )
