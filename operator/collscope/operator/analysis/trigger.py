"""Real-time trigger on the sampled ranks: Mycroft Algorithm 1 (§4.3) with CCL-D §4.2.1.

``TriggerState.update(view, t)`` is called once per tick with whatever the operator pulled for
the sampled ranks; it only ever reads rows with ``ts <= t`` (never looks ahead) and returns a
``TriggerResult`` the first time a condition holds.

Hang (Mycroft Algorithm 1 lines 3-4, "stalls mid-operation with real-time state log but without
producing completion log"): a sampled rank has an operation in flight (``inflight``) whose
progress stopped longer than the stall threshold of its communicator (``baseline``), and the rank
completed nothing since the stall began. We read "no op completed in (t - Δ, t]" with Δ = the
stall itself: a rank that keeps completing work elsewhere is not hung, and waiting a full extra
window after the threshold would only delay detection. AllReduce of <= 4 bytes is a barrier and
is ignored (CCL-D §4.2.1). ``at_ns`` is stall start + threshold: when the condition first held.
Given every rank's summary (``GET /v1/summaries``) the same rule also runs job-wide
(``jobwide``): the unsampled ranks, with this state's thresholds where it knows the
communicator and a conservative fallback where it does not.

Slow (Algorithm 1 lines 6-8, plus CCL-D's ratio), per sampled rank over the window (t - Δ, t]:

- throughput (bytes completed per second) at most ``throughput_drop`` x normal, or
- mean interval between completions of one communicator at least ``interval_growth`` x normal,
- or CCL-D eq. 2-3: ``R = (Tmax - Tbase) / Tbase > theta`` for a (comm, op, bytes), where Tmax is
  the maximum duration of the window's round with the widest spread among sampled members, and
  the excess ``Tmax - Tbase`` is at least ``slow_min_excess_s`` (sub-millisecond operations
  jitter by multiples of themselves; CCL-D's production θ≈3 assumes larger ones).

A slow condition must hold on ``repeat_ticks`` consecutive ticks (CCL-D's repetition counter), so
one jittery round never fires. While a sampled rank is stalled (but not yet past the hang
threshold) the slow checks are skipped, the streak paused: a stall is the hang rule's business
(Algorithm 1 checks failure before slowness). Normals are updated only on ticks where nothing
looked slow (Algorithm 1 line 9).

Why one module: the rules above are one state machine, not independent checks. They read and
write one ``TriggerState`` each tick (the baselines, the slow streak, the sampled set, the
remembered episodes), and the interplay is Algorithm 1 itself: a hang is checked before
slowness, a stall pauses the slow streak without resetting it, a resolved stall becomes an
episode, normals are learned only on ticks where no rule fired, and a rank that rotates in is
learned before it is judged. Putting each rule in its own module would spread that order over
modules that reach into one object's fields. What needs no per-tick state already lives
elsewhere: thresholds, Tbase and normals in ``baseline``, stalls in ``inflight``. The two
pieces with state of their own, the ratio rule's round verdicts (``_round_slow``) and the
bursty-stall episodes (``_episodes``), could become small classes of their own modules; that
was not done because each is ~60 lines read together with the streak logic it feeds, so at
535 lines the module is long by what it documents, not by what it mixes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from collscope.nodeagent import api
from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import baseline, inflight, jobwide

NS = 1_000_000_000


@dataclass(frozen=True)
class TriggerSettings:
    """Trigger thresholds. Seconds in ``_s`` fields; ratios are plain numbers.

    Each says which quantity it stands for and where its value comes from (issue 12 item 5):
    a paper, a fact of NCCL's protocol, a measurement (and the bench that made it), or, said
    as such, a value picked on collscope's own simulator and kept because eval-dev
    (``bench/accuracy.py --bundles ../shared/eval-dev``) agrees. Durations that must hold
    iterations scale with the job's measured step (``baseline.period_ns``), and those that
    must hold state samples with the measured sampling interval
    (``inflight.infer_interval_ns``); none assumes sub-second steps or 100 ms sampling.
    """

    # Δ of Algorithm 1 (Mycroft §4.3), the window throughput and op intervals are measured
    # over. 2 s: one pull of a few steps of the jobs both simulators run (0.2-0.5 s steps);
    # picked, not derived. It only bounds the window from below: ...
    window_s: float = 2.0
    # ... it is at least this many measured steps of the job: throughput and op intervals are
    # only comparable over whole steps, and three keep one late step from halving the
    # throughput on its own (a 10 s-step job gets a 30 s window).
    window_periods: float = 3.0
    # The agent's sampling period, only where the bundle cannot tell: the interval is measured
    # (``inflight.infer_interval_ns``, the median gap between states of one operation).
    state_interval_s: float = 0.1
    # A state older than this many measured intervals (and a rank that wrote since) is not
    # current: one late or missed sample is tolerated (per-rank sampling phases), two are not.
    state_max_age_intervals: float = 2.0
    # The stall threshold of a communicator is max(floor + usual stall, k * usual stall), the usual
    # stall the p99 of the longest stall each of its completed operations showed, its duration where
    # no sample showed it (``baseline.stall_threshold_ns``; 0 before any operation is known). The
    # floor is the longest stall that is not a hang, as the sampled state can show it: a proxy that
    # sleeps ``proxy_hiccup_s`` and resumes (Mycroft §7.1 fault #7 injects a 1 s sleep in
    # sendProxyProgress; it is a slowdown, ``slow.host``, caught by the bursty-stall rule below),
    # seen through states at most ``state_max_age_intervals`` sampling intervals old (a stall that
    # already ended looks that much longer until the next sample shows progress). A rank waiting on
    # the sleeping proxy also waits as long as its operations usually stall (a pipeline receive
    # waits for its sender), hence ``+ usual stall``: not ``+ p99`` of durations, which a
    # bandwidth-bound operation (eval-dev's 0.3 s DP AllReduce, stalls under 10 ms) spends moving
    # data. The interval is the one measured in the bundle (``inflight.infer_interval_ns``), so 100
    # ms sampling gives 1.2 s and 200 ms 1.4 s. ``hang_floor_s`` set overrides the derived floor
    # (the TrainingJob's hangFloorSeconds): then the threshold is max(floor, k * p99).
    hang_floor_s: float | None = None
    proxy_hiccup_s: float = 1.0
    # Completed operations of a communicator that no sampled rank knows the job-wide check
    # must have seen in the summaries before it judges it (``jobwide``): as
    # ``episode_min_history``, enough to say what usual is.
    stall_min_ops: int = 8
    hang_k: float = 4.0  # ... k * usual stall: a communicator's ops stall up to 4x their
    # usual stall (CCL-D §4.2.1 sets the threshold "considering such long operations"; 4 is
    # picked, not CCL-D's). With ``hang_floor_s`` set, k * p99 of durations, as CCL-D.
    # Durations kept per communicator for that p99: a p99 needs ~100 samples to mean anything,
    # 512 keep ~5 above it. A count, not a time: a 10 s-step job keeps more history.
    hang_history: int = 512
    barrier_max_bytes: int = 4  # AllReduce this small is a barrier (CCL-D §4.2.1)
    throughput_drop: float = 0.5  # Mycroft §4.3: "throughput drops by half"
    interval_growth: float = 2.0  # Mycroft §4.3: "Coll Op interval doubles"
    # Completions of a comm in the window to measure its interval: two intervals, so one gap
    # is compared with another of the same window. Picked.
    min_interval_ops: int = 3
    # Healthy ticks kept for the normal throughput and intervals (Algorithm 1 line 9), and
    # needed before those rules judge. Ticks, whose windows span >= window_periods steps, so
    # the normals hold whole steps whatever their length. 30 and 3 picked on the own
    # simulator; eval-dev agrees (0 false alarms).
    normal_history_ticks: int = 30
    normal_min_ticks: int = 3
    slow_theta: float = 3.0  # CCL-D θ_slow ("in practice usually close to 3")
    # Tmax - Tbase must also exceed this: the jitter of operations that take a millisecond or
    # less (kernel launch, proxy polling), which is a multiple of themselves; CCL-D's θ
    # assumes larger operations. An absolute time by nature; 10 ms picked on the own
    # simulator, kept because eval-dev agrees.
    slow_min_excess_s: float = 0.01
    base_rounds: int = 100  # CCL-D m_max
    # Tbase averages at least this many rounds: the standard error of a mean of per-round
    # maxima shrinks with sqrt(m); at 10 it is a third of one round's spread (see baseline).
    base_min_rounds: int = 3
    # CCL-D learns Tbase from the rounds of a job's first 2 min; runs here last seconds, so 3 s.
    # It does not assume short steps: Tbase also waits for base_min_rounds rounds, however
    # long they take (a 10 s-step job freezes it after three steps).
    base_span_s: float = 3.0
    # Consecutive slow ticks before firing (CCL-D's repetition counter), and, for the ratio
    # rule, consecutive slow rounds of one (comm, op, bytes). A tick's window spans
    # window_periods steps, so three ticks are three windows of whole steps. Picked (one
    # jittery round, or one tick, never fires); eval-dev agrees.
    repeat_ticks: int = 3
    repeat_rounds: int = 3
    # An op stalled past this share of its own communicator's hang threshold pauses the slow
    # checks: the hang rule's business. Relative, so it scales with the threshold. Picked.
    stall_pause_fraction: float = 0.5
    # A stall this long that then resolves is an episode (Mycroft §7.1 #7's 1 s proxy sleep
    # is the event): above the longest stall healthy flows show (0.3 s on the own simulator,
    # under 10 ms p99 and 0.2 s at most on eval-dev's fault-free cases), and below the 1 s
    # sleep seen through a sample up to one interval late (0.8 s at 200 ms sampling). Also the
    # merge distance of stalls several sampled ranks see at once.
    episode_floor_s: float = 0.5
    # ... and longer than k x the op's usual longest duration (its Tbase, else the comm's
    # episode_quantile of durations): as hang_k, an op is not stalled within its own usual
    # spread. Picked.
    episode_k: float = 4.0
    episode_quantile: float = 0.9
    # This many episodes within the episode window: slow (bursty). The window is
    # episode_window_s (picked on the own simulator: several 1 s sleeps a few seconds apart)
    # and at least episode_window_periods measured steps, so that a proxy that stalls once
    # per step is seen twice in it when steps are long (a 10 s-step job: 20 s).
    episode_repeat: int = 2
    episode_window_s: float = 8.0
    episode_window_periods: float = 2.0
    # Completions of the comm seen before its stalls are judged: before that there is no
    # "usual" to be abnormal against (a job's first steps, a pipeline stage's first wait).
    episode_min_history: int = 8


# A slow rule's finding: (since, rank, comm or -1, seq or -1, text).
Finding = tuple[int, int, int, int, str]


@dataclass(frozen=True)
class TriggerResult:
    """The first condition that held. Times in ns."""

    kind: Literal["hang", "slow"]
    at_ns: int  # when the condition first held (stall start + threshold; Nth slow tick)
    tick_ns: int  # the tick that saw it
    since_ns: int  # hang: stall start; slow: start of the earliest slow round of the streak
    ranks: tuple[int, ...]  # sampled ranks where it held
    comm: int | None  # comm index of the stalled op / slowest (comm, op, bytes)
    seq: int | None
    reason: str


class TriggerState:
    """Stateful evaluator of Algorithm 1 over successive ticks."""

    def __init__(
        self,
        sampled: tuple[int, ...],
        settings: TriggerSettings = TriggerSettings(),
        *,
        interval_ns: int | None = None,
    ) -> None:
        self.sampled = np.asarray(sorted(sampled), dtype=np.int32)
        self.s = settings
        self.interval_ns = interval_ns or int(settings.state_interval_s * NS)
        self.base = baseline.Baselines(
            history=settings.hang_history,
            base_rounds=settings.base_rounds,
            base_span_ns=int(settings.base_span_s * NS),
            normal_history=settings.normal_history_ticks,
            base_min_rounds=settings.base_min_rounds,
            barrier_max_bytes=settings.barrier_max_bytes,
        )
        self._seen_ns: int | None = None
        self._first_ns: dict[int, int] = {}
        self._streak = 0
        self._streak_since: int | None = None
        self._streak_reason = ""
        # (comm, op, bytes) -> seq -> (slow?, first start): the ratio rule's round verdicts
        self._round_slow: dict[tuple[int, int, int], dict[int, tuple[bool, int]]] = {}
        self._prev_ns: int | None = None
        self._episodes: dict[tuple[int, int, int], tuple[int, int]] = {}  # key -> (start, idle)
        self._away: dict[int, tuple[int, int | None]] = {}  # rank -> (left at, first ts)
        # (rank, comm, seq) -> the longest stall its state samples showed, until it completes
        self._op_stall: dict[tuple[int, int, int], int] = {}
        self._stall_seen_ns = -1
        self.jobwide = jobwide.JobWide(history=settings.hang_history)
        self._runs: dict[tuple[int, int], set[int]] = {}  # (op, bytes) -> comms that ran it
        self._paced: dict[int, set[int]] = {}  # rank -> comms whose interval normal it learned

    def update(
        self,
        view: tables.Bundle,
        t_ns: int,
        summaries: Sequence[api.TriggerSummary] | None = None,
    ) -> TriggerResult | None:
        """One tick: ``view``, the sampled ranks' records; ``summaries``, when pulled, every
        rank's summary at this tick for the job-wide hang check (``jobwide``)."""
        ops = view.ops[np.isin(view.ops["rank"], self.sampled) & (view.ops["ts"] <= t_ns)]
        states = view.states["rank"]
        st_keep = np.isin(states, self.sampled)
        sub = view if st_keep.all() else _only_states(view, st_keep)
        self._note_stalls(sub, t_ns)
        self._learn(ops, t_ns)
        now = inflight.at(
            sub,
            t_ns,
            interval_ns=self.interval_ns,
            max_age_intervals=self.s.state_max_age_intervals,
        )
        self._note_episodes(sub, t_ns)
        hang, stalled_any = self._hang(view, now, ops, t_ns)
        wide = None if summaries is None else self._jobwide(view, summaries, t_ns)
        if wide is not None and (hang is None or wide.at_ns < hang.at_ns):
            hang = wide  # the rank that stalled first, sampled or not
        if hang is not None:
            return hang
        if stalled_any:
            # The slow streak pauses (neither counts nor resets): a stall is the hang rule's
            # business. Stalls that already resolved are not hangs, so they still count.
            return self._bursty(t_ns, ops)
        barrier = view.string_index("AllReduce")
        return self._slow(ops, t_ns, now, barrier) or self._bursty(t_ns, ops)

    def window_ns(self) -> int:
        """Δ of Algorithm 1: ``window_s``, stretched to ``window_periods`` steps of the job."""
        period = self.base.period_ns() or 0
        return max(int(self.s.window_s * NS), int(self.s.window_periods * period))

    def episode_window_ns(self) -> int:
        """How far back bursty stalls are counted: ``episode_window_s``, stretched to
        ``episode_window_periods`` steps of the job (a stall once per step counts twice)."""
        period = self.base.period_ns() or 0
        return max(int(self.s.episode_window_s * NS), int(self.s.episode_window_periods * period))

    def hang_floor_ns(self) -> tuple[int, bool]:
        """The hang threshold's floor and whether the communicator's p99 adds to it: the
        configured ``hang_floor_s`` (not added), else the derived one (see ``proxy_hiccup_s``)."""
        if self.s.hang_floor_s is not None:
            return int(self.s.hang_floor_s * NS), False
        stale = self.s.state_max_age_intervals * self.interval_ns
        return int(self.s.proxy_hiccup_s * NS + stale), True

    def watch(self, sampled: tuple[int, ...], view: tables.Bundle | None = None) -> None:
        """Change the sampled ranks between two ``update`` calls (``rotation``'s moving sample).

        A rank that leaves keeps what was learned from it (its normal throughput and intervals,
        its communicators' baselines) and is no longer judged. A rank that joins is judged from
        the next ``update`` on; first its op records in ``view`` that this state has not learned
        (after it last left, up to the last tick seen) are learned, in completion order, so the
        baselines of its communicators come from its own history, not from the slowdown it may
        be in now. ``view`` must be the bundle the next ``update`` gets (same comm indices).
        """
        new = np.asarray(sorted(set(sampled)), dtype=np.int32)
        gone = np.setdiff1d(self.sampled, new).tolist()
        for r in gone:
            left = -1 if self._seen_ns is None else self._seen_ns
            self._away[r] = (left, self._first_ns.pop(r, None))
        if gone:  # a rank that leaves completes its operations unseen
            self._op_stall = {k: v for k, v in self._op_stall.items() if k[0] not in gone}
        joined = np.setdiff1d(new, self.sampled).tolist()
        self.sampled = new
        left_ns: dict[int, int] = {}
        for r in joined:
            left, first = self._away.pop(r, (-1, None))
            left_ns[r] = left
            if first is not None:
                self._first_ns[r] = first
        if view is None or self._seen_ns is None or not joined:
            return
        got = _flow_samples(view, -1, self._seen_ns)
        if got is not None:  # what the joined ranks' samples showed while they were away
            st, idle = got
            away = np.asarray([left_ns.get(r, self._seen_ns) for r in st["rank"].tolist()])
            mine = st["ts"] > away
            self._note_samples(st[mine], idle[mine])
        ops = view.ops[np.isin(view.ops["rank"], joined) & (view.ops["ts"] <= self._seen_ns)]
        after = np.asarray([left_ns[r] for r in ops["rank"].tolist()], dtype=np.int64)
        ops = ops[ops["ts"] > after]
        if len(ops) == 0:
            return
        ops = ops[np.argsort(ops["ts"], kind="stable")]
        for r, ts in zip(ops["rank"].tolist(), ops["ts"].tolist(), strict=True):
            self._first_ns.setdefault(r, ts)
        self.base.learn_ops(ops)
        self._learn_stalls(ops)

    # -- learning ------------------------------------------------------------------------------
    def _learn(self, ops: tables.Table, t_ns: int) -> None:
        new = ops if self._seen_ns is None else ops[ops["ts"] > self._seen_ns]
        self._seen_ns = t_ns
        if len(new) == 0:
            return
        new = new[np.argsort(new["ts"], kind="stable")]
        for r, ts in zip(new["rank"].tolist(), new["ts"].tolist(), strict=True):
            self._first_ns.setdefault(r, ts)
        self.base.learn_ops(new)
        runs = zip(new["op"].tolist(), new["bytes"].tolist(), new["comm"].tolist(), strict=True)
        for o, b, c in set(runs):
            self._runs.setdefault((o, b), set()).add(c)
        self._learn_stalls(new)

    def _learn_stalls(self, done: tables.Table) -> None:
        """Each completed operation's longest stall as far as known: the one its flow-carrying
        samples showed (``_note_stalls``), else its duration (``baseline.learn_stall``)."""
        keys = zip(done["rank"].tolist(), done["comm"].tolist(), done["seq"].tolist(), strict=True)
        for key, d in zip(keys, (done["end"] - done["start"]).tolist(), strict=True):
            stall = self._op_stall.pop(key, None)
            self.base.learn_stall(key[1], int(d) if stall is None else min(stall, int(d)))

    def _note_stalls(self, view: tables.Bundle, t_ns: int) -> None:
        """Remember, per operation in flight, the longest stall its state samples since the
        previous tick showed (``ts - min(idle_ns)`` of its flows, at most ``ts - start``);
        ``_learn`` hands it to the baselines when the operation completes. Only samples with
        flows: without them a sample does not tell a stall from progress (``inflight``)."""
        lo_ns, self._stall_seen_ns = self._stall_seen_ns, t_ns
        got = _flow_samples(view, lo_ns, t_ns)
        if got is not None:
            self._note_samples(*got)

    def _note_samples(self, st: tables.Table, idle: inflight.I64) -> None:
        stall = np.maximum(0, np.minimum(idle, st["ts"] - st["start"])).tolist()
        keys = zip(st["rank"].tolist(), st["comm"].tolist(), st["seq"].tolist(), strict=True)
        for key, v in zip(keys, stall, strict=True):
            if v > self._op_stall.get(key, -1):
                self._op_stall[key] = int(v)

    # -- hang ----------------------------------------------------------------------------------
    def _hang(
        self, view: tables.Bundle, now: inflight.InFlight, ops: tables.Table, t_ns: int
    ) -> tuple[TriggerResult | None, bool]:
        s = self.s
        floor, add_p99 = self.hang_floor_ns()
        allreduce = view.string_index("AllReduce")
        best: tuple[int, int] | None = None  # (at_ns, row)
        hits: list[int] = []
        stalled_any = False
        for i in range(len(now)):
            if (
                allreduce is not None
                and now.op[i] == allreduce
                and now.nbytes[i] <= s.barrier_max_bytes
            ):
                continue
            stall = int(now.stalled_ns[i])
            thr = self.base.stall_threshold_ns(
                int(now.comm[i]),
                floor_ns=floor,
                k=s.hang_k,
                add_p99=add_p99,
            )
            # Half way to its own communicator's hang threshold, not to the floor: a pipeline
            # receive that waits a whole forward pass every step (seconds, when steps are
            # long) is in its ordinary durations, and pausing the slow checks on it would
            # pause them on every tick of such a job.
            if stall > s.stall_pause_fraction * thr:
                stalled_any = True
            if stall <= thr:
                continue
            r = int(now.rank[i])
            mine = ops[(ops["rank"] == r) & (ops["end"] > now.stall_start[i])]
            if len(mine):
                continue
            hits.append(i)
            at = int(now.stall_start[i]) + thr
            if best is None or at < best[0]:
                best = (at, i)
        if best is None:
            return None, stalled_any
        at, i = best
        name = view.string(int(now.op[i]))
        reason = (
            f"rank {int(now.rank[i])} has {name} seq {int(now.seq[i])} on comm "
            f"{view.comm_id(int(now.comm[i]))} in flight with no progress for "
            f"{(t_ns - int(now.stall_start[i])) / NS:.1f} s "
            f"(threshold {(at - int(now.stall_start[i])) / NS:.1f} s)"
        )
        return TriggerResult(
            kind="hang",
            at_ns=at,
            tick_ns=t_ns,
            since_ns=int(now.stall_start[i]),
            ranks=tuple(sorted({int(now.rank[j]) for j in hits})),
            comm=int(now.comm[i]),
            seq=int(now.seq[i]),
            reason=reason,
        ), True

    def _jobwide(
        self, view: tables.Bundle, rows: Sequence[api.TriggerSummary], t_ns: int
    ) -> TriggerResult | None:
        """The job-wide check (``jobwide``) with this trigger's thresholds where its baselines
        know the communicator: a hang of unsampled ranks."""
        s = self.s
        floor, add_p99 = self.hang_floor_ns()
        index = {c: i for i, c in enumerate(view.comm_ids)}

        def known(comm: str) -> int | None:
            i = index.get(comm)
            if i is None or self.base.durations_seen(i) == 0:
                return None
            return self.base.stall_threshold_ns(i, floor_ns=floor, k=s.hang_k, add_p99=add_p99)

        def twin(op: str, nbytes: int) -> int | None:
            o = view.string_index(op)
            if op in _P2P or o is None:
                return None
            thr = [t for c in self._runs.get((o, nbytes), ()) if (t := known(view.comm_id(c)))]
            return max(thr, default=None)

        limits = jobwide.Limits(
            floor_ns=floor, k=s.hang_k, interval_ns=self.interval_ns,
            max_age_intervals=s.state_max_age_intervals, period_ns=self.base.period_ns(),
            periods=s.episode_window_periods, min_ops=s.stall_min_ops,
            barrier_max_bytes=s.barrier_max_bytes, known=known, twin=twin,
        )  # fmt: skip
        hits = self.jobwide.update(rows, t_ns, limits, skip=set(self.sampled.tolist()))
        if not hits:
            return None
        h = hits[0]
        how = {
            "known": "its communicator's",
            "twin": "a sampled communicator running the same collective's",
        }.get(h.source, "the fallback: no sampled member, no sampled twin")
        return TriggerResult(
            kind="hang",
            at_ns=h.at_ns,
            tick_ns=t_ns,
            since_ns=h.since_ns,
            ranks=tuple(sorted({x.rank for x in hits if x.comm == h.comm})),
            comm=index.get(h.comm),
            seq=h.seq,
            reason=(
                f"rank {h.rank} (not sampled: job-wide summary) has {h.op} seq {h.seq} on "
                f"comm {h.comm} in flight with no progress for {h.stalled_ns / NS:.1f} s "
                f"(threshold {h.threshold_ns / NS:.1f} s, {how})"
            ),
        )

    # -- bursty stalls ---------------------------------------------------------------------------
    def _note_episodes(self, view: tables.Bundle, t_ns: int) -> None:
        """Record stalls seen in the state records since the previous tick.

        A rare long stall (Mycroft fault #7: the proxy thread sleeps 1 s) is over before the hang
        threshold and too short to halve a window's throughput, and it pauses the slow streak
        while it lasts; so each one is remembered as an episode (rank, comm, seq) with the time
        since anything moved (the minimum ``idle_ns`` of its flows) at its longest.
        """
        lo_ns = -1 if self._prev_ns is None else self._prev_ns
        self._prev_ns = t_ns
        got = _flow_samples(view, lo_ns, t_ns)
        if got is None:
            return
        st, idle = got
        floor = int(self.s.episode_floor_s * NS)
        for i in np.flatnonzero(idle >= floor).tolist():
            comm = int(st["comm"][i])
            # A stall is only abnormal against what this communicator's operations usually
            # take; before that is known (a job's first steps, where a pipeline stage waits
            # a whole forward pass for its input) it says nothing.
            if self.base.durations_seen(comm) < self.s.episode_min_history:
                continue
            # Against what this operation usually takes at most: its CCL-D Tbase (the mean of
            # its rounds' longest member duration, learned early and frozen), else the comm's
            # p90. A pipeline receive waits a whole forward pass of the previous stage once
            # per step: that is in its Tbase, the schedule, not an episode. A proxy that sleeps
            # now and then stays far above the Tbase of operations that take milliseconds.
            # Tbase is a property of the operation, so the ranks watched alongside (a rotating
            # sample) do not move it the way a pooled recent quantile does.
            tb = self.base.tbase_ns((comm, int(st["op"][i]), int(st["bytes"][i])))
            usual = self.base.duration_quantile_ns(comm, self.s.episode_quantile) or 0
            usual = int(tb) if tb is not None else usual
            if idle[i] < self.s.episode_k * usual:
                continue
            key = (int(st["rank"][i]), comm, int(st["seq"][i]))
            start = int(st["ts"][i]) - int(idle[i])
            old = self._episodes.get(key)
            if old is None or idle[i] > old[1]:
                self._episodes[key] = (start, int(idle[i]))

    def _bursty(self, t_ns: int, ops: tables.Table) -> TriggerResult | None:
        """Slow when ``episode_repeat`` separate stalls resolved within ``episode_window_ns``.

        Stalls seen by several sampled ranks at once (everyone waits on the stalled rank) are
        one episode: starts within ``episode_floor_s`` of each other are merged. Only stalls
        whose operation has completed by ``t`` count: one still going may be a hang.
        """
        since = t_ns - self.episode_window_ns()
        live = [(k, v) for k, v in self._episodes.items() if v[0] > since]
        if not live:
            return None
        # An episode's operation completes after the episode started (> since): only the
        # window's completions are looked at, not the whole history of the sampled ranks.
        recent_ops = ops[ops["ts"] > since]
        done = recent_ops[np.isin(recent_ops["rank"], [k[0] for k, _ in live])]
        completed = set(
            zip(done["rank"].tolist(), done["comm"].tolist(), done["seq"].tolist(), strict=True)
        )
        recent = sorted((v[0], v[1], k) for k, v in live if k in completed)
        if not recent:
            return None
        merge = int(self.s.episode_floor_s * NS)
        starts = [recent[0]]
        for e in recent[1:]:
            if e[0] - starts[-1][0] > merge:
                starts.append(e)
        if len(starts) < self.s.episode_repeat:
            return None
        longest = max(recent, key=lambda e: e[1])
        return TriggerResult(
            kind="slow",
            at_ns=t_ns,
            tick_ns=t_ns,
            since_ns=starts[0][0],
            ranks=tuple(sorted({e[2][0] for e in recent})),
            comm=longest[2][1],
            seq=longest[2][2],
            reason=(
                f"{len(starts)} separate stalls of >= {self.s.episode_floor_s:g} s within "
                f"{(t_ns - starts[0][0]) / NS:.1f} s on sampled ranks, the longest "
                f"{longest[1] / NS:.2f} s (rank {longest[2][0]}, seq {longest[2][2]} on comm "
                f"#{longest[2][1]}), none past the hang threshold: bursty stalls"
            ),
        )

    # -- slow ----------------------------------------------------------------------------------
    def _slow(
        self,
        ops: tables.Table,
        t_ns: int,
        now: inflight.InFlight | None = None,
        allreduce: int | None = None,
    ) -> TriggerResult | None:
        """Algorithm 1 lines 6-8 and CCL-D's ratio on the window; ``allreduce``, the string
        index of AllReduce (its barriers do not count as waiting, see ``_waited``)."""
        s = self.s
        win_ns = self.window_ns()
        w = ops[ops["ts"] > t_ns - win_ns]
        findings, thr_now, int_now = self._pace(w, t_ns, win_ns)
        paused = self._idle(w, now, t_ns, allreduce) or (
            bool(findings) and not self._waited(w, now, t_ns, allreduce)
        )
        if paused:
            # The window holds a span longer than a step in which no watched rank ran a
            # collective, or throughput fell and completions spaced out while no watched rank
            # waited inside an operation longer than its baseline: every rank paused outside
            # communication (a checkpoint, an evaluation pass, a data stall of the whole job).
            # That is the job's schedule, not a collective slowdown, and no rank could be
            # named for it.
            findings = []
        findings += self._ratio(w)
        if not findings:
            self._streak, self._streak_since = 0, None
            # Algorithm 1 line 9 learns the normals from healthy ticks; a paused one is not
            # the job's normal pace either: learned, a 30 s checkpoint's ~zero throughput
            # would become the median normal and hide a slowdown after it.
            if not paused:
                self._learn_pace(thr_now, int_now)
            return None
        since = min(f[0] for f in findings)
        self._streak += 1
        self._streak_since = since if self._streak_since is None else min(self._streak_since, since)
        if self._streak < s.repeat_ticks:
            return None
        top = next((f for f in findings if f[2] >= 0), findings[0])
        return TriggerResult(
            kind="slow",
            at_ns=t_ns,
            tick_ns=t_ns,
            since_ns=self._streak_since,
            ranks=tuple(sorted({f[1] for f in findings})),
            comm=top[2] if top[2] >= 0 else None,
            seq=top[3] if top[3] >= 0 else None,
            reason="; ".join(f[4] for f in findings[:4]),
        )

    def _pace(
        self, w: tables.Table, t_ns: int, win_ns: int
    ) -> tuple[list[Finding], dict[int, float], dict[tuple[int, int], float]]:
        """Algorithm 1 lines 6-7 per watched rank over the window ``w``: throughput at most
        ``throughput_drop`` x normal, or a communicator's mean interval between completions
        at least ``interval_growth`` x normal. Returns the findings and what was measured
        (throughput per rank, interval per (rank, comm)), for ``_learn_pace``."""
        s = self.s
        win_s = win_ns / NS
        # Throughput and op intervals compare whole steps: until the step is known a window
        # may hold none of a long-step job's, so neither is judged nor learned.
        full = (
            [r for r, f in self._first_ns.items() if f <= t_ns - win_ns]
            if self.base.period_ns() is not None
            else []
        )
        findings: list[Finding] = []
        thr_now: dict[int, float] = {}
        int_now: dict[tuple[int, int], float] = {}
        for r in full:
            mine = w[w["rank"] == r]
            thr = float(mine["bytes"].sum()) / win_s
            thr_now[r] = thr
            normal = self.base.normal_throughput(r, s.normal_min_ticks)
            if normal and thr <= s.throughput_drop * normal:
                since = int(mine["start"].min()) if len(mine) else t_ns - win_ns
                findings.append(
                    (
                        since,
                        r,
                        -1,
                        -1,
                        f"rank {r} throughput {thr / 1e9:.2f} GB/s, normal {normal / 1e9:.2f} GB/s",
                    )
                )
            for c in np.unique(mine["comm"]).tolist():
                ends = np.sort(mine["end"][mine["comm"] == c])
                if len(ends) < s.min_interval_ops:
                    continue
                iv = float(ends[-1] - ends[0]) / (len(ends) - 1)
                int_now[(r, c)] = iv
                ni = self.base.normal_interval(r, c, s.normal_min_ticks)
                if ni and iv >= s.interval_growth * ni:
                    findings.append(
                        (
                            int(ends[0]),
                            r,
                            c,
                            -1,
                            f"rank {r} op interval on comm "
                            f"#{c} {iv / 1e6:.1f} ms, normal {ni / 1e6:.1f} ms",
                        )
                    )
        return findings, thr_now, int_now

    def _learn_pace(self, thr_now: dict[int, float], int_now: dict[tuple[int, int], float]) -> None:
        """Algorithm 1 line 9 for the ranks whose window holds the job's usual mix of work:
        every communicator whose interval the rank learned before completed enough operations
        in it to be measured again. A window in which one went silent (an evaluation pass:
        TP and PP run at the forward-only pace, no DP gradient reduction) is another
        workload; learned, its faster TP/PP intervals became the normal, and training's own
        pace after it read as intervals that doubled."""
        for r, thr in thr_now.items():
            mine = {c for (q, c) in int_now if q == r}
            known = self._paced.setdefault(r, set())
            if not known <= mine:
                continue
            known |= mine
            ints = {(r, c): int_now[(r, c)] for c in mine}
            self.base.learn_tick({r: thr}, ints)

    def _idle(
        self, w: tables.Table, now: inflight.InFlight | None, t_ns: int, allreduce: int | None
    ) -> bool:
        """Does the window hold a span longer than one step (``baseline.period_ns``) in which
        no watched rank had a collective in flight, barriers aside (``_waited``)?

        Every rank of a training job runs collectives every step (Mycroft §4.3 reads the step
        from them), so a longer silence of all of them is no step at all: the job paused
        outside communication (a checkpoint, whose writers are outside NCCL while everyone
        else waits in a barrier). Throughput over such a window falls by the pause's share
        of it, which is not a slower pace: without this, a 30 s checkpoint in a 10 s-step
        job's 60 s window halved the throughput, and any ordinary wide round in the rest of
        the window passed for waiting."""
        period = self.base.period_ns()
        if period is None or not self._first_ns:
            return False
        lo = max(t_ns - self.window_ns(), min(self._first_ns.values()))
        start, end = w["start"].astype(np.int64), w["end"].astype(np.int64)
        data = ~((w["op"] == allreduce) & (w["bytes"] <= self.s.barrier_max_bytes))
        start, end = start[data], end[data]
        if now is not None:
            live = ~((now.op == allreduce) & (now.nbytes <= self.s.barrier_max_bytes))
            start = np.concatenate([start, now.start[live].astype(np.int64)])
            end = np.concatenate([end, np.full(int(live.sum()), t_ns, dtype=np.int64)])
        order = np.argsort(start, kind="stable")
        start, end = start[order], np.maximum.accumulate(end[order]) if len(end) else end
        covered = np.maximum(np.concatenate([[lo], end]), lo)  # busy up to here ...
        nxt = np.concatenate([start, [t_ns]])  # ... until the next collective starts
        return bool(np.any(nxt - covered > period))

    def _waited(
        self, w: tables.Table, now: inflight.InFlight | None, t_ns: int, allreduce: int | None
    ) -> bool:
        """Did a watched rank spend longer inside an operation than that operation's baseline
        (``interval_growth`` x its CCL-D Tbase, learned before and then frozen, plus
        ``slow_min_excess_s``)? Completed ops of the window and ops in flight at ``t`` count;
        an operation without a baseline yet cannot be cleared, so it counts.

        A barrier (AllReduce of at most ``barrier_max_bytes``, CCL-D §4.2.1) never counts:
        ``dist.barrier()`` is how ranks wait for a peer that is *outside* communication (rank
        0 writing a checkpoint), so the time spent in it is the pause itself, not a transfer
        that slowed. It carries no data to be slow, and it has no baseline (once per
        checkpoint), so without this rule every checkpoint pause would count as waiting."""
        s = self.s
        excess = s.slow_min_excess_s * NS

        def too_long(key: tuple[int, int, int], dur: int) -> bool:
            if key[1] == allreduce and key[2] <= s.barrier_max_bytes:
                return False
            tb = self.base.tbase_ns(key)
            return tb is None or dur > s.interval_growth * tb + excess

        keys = zip(w["comm"].tolist(), w["op"].tolist(), w["bytes"].tolist(), strict=True)
        for k, d in zip(keys, (w["end"] - w["start"]).tolist(), strict=True):
            if too_long((int(k[0]), int(k[1]), int(k[2])), int(d)):
                return True
        if now is not None:
            keys = zip(now.comm.tolist(), now.op.tolist(), now.nbytes.tolist(), strict=True)
            for k, st in zip(keys, now.start.tolist(), strict=True):
                if too_long((int(k[0]), int(k[1]), int(k[2])), t_ns - int(st)):
                    return True
        return False

    def _ratio(self, w: tables.Table) -> list[tuple[int, int, int, int, str]]:
        """CCL-D eq. 2-3 per (comm, op, bytes) over the window's rounds."""
        out: list[tuple[int, int, int, int, str]] = []
        if len(w) == 0:
            return out
        dur = (w["end"] - w["start"]).astype(np.int64)
        keys = np.stack(
            [
                w["comm"].astype(np.int64),
                w["op"].astype(np.int64),
                w["bytes"].astype(np.int64),
                w["seq"].astype(np.int64),
            ],
            axis=1,
        )
        uk, inv = np.unique(keys, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        tmax = np.full(len(uk), -1, dtype=np.int64)
        tmin = np.full(len(uk), np.iinfo(np.int64).max, dtype=np.int64)
        np.maximum.at(tmax, inv, dur)
        np.minimum.at(tmin, inv, dur)
        first = np.full(len(uk), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, inv, w["start"].astype(np.int64))
        excess_min = self.s.slow_min_excess_s * NS
        ranks = w["rank"].astype(np.int64)
        members = np.bincount(inv, minlength=len(uk))
        for k in {tuple(x) for x in uk[:, :3].tolist()}:
            key = (k[0], k[1], k[2])
            tb = self.base.tbase_ns(key)
            if tb is None or tb <= 0:
                continue
            m = np.flatnonzero((uk[:, 0] == k[0]) & (uk[:, 1] == k[1]) & (uk[:, 2] == k[2]))
            # Judge only rounds every sampled member has completed (a partial round's Tmax
            # still grows), and remember each verdict by sequence number.
            m = m[members[m] == members[m].max()]
            slow = ((tmax[m] - tb) / tb > self.s.slow_theta) & (tmax[m] - tb > excess_min)
            seen = self._round_slow.setdefault(key, {})
            for q, v, f in zip(uk[m, 3].tolist(), slow.tolist(), first[m].tolist(), strict=True):
                seen[int(q)] = (bool(v), int(f))
            for q in sorted(seen)[: -4 * self.s.repeat_rounds]:
                del seen[q]
            # CCL-D's repetition counter counts detections, i.e. rounds: the key is slow when
            # its latest rounds are slow one after the other. A jittery round, or a wide one
            # of a job whose arrival spread has a long tail, is followed by ordinary ones.
            run = 0
            for q in sorted(seen, reverse=True):
                if not seen[q][0]:
                    break
                run += 1
            if run < self.s.repeat_rounds:
                continue
            since = min(seen[q][1] for q in sorted(seen)[-run:])
            spread = tmax[m] - tmin[m]
            pick = m[np.lexsort((tmax[m], spread))[-1]]
            r_ratio = (float(tmax[pick]) - tb) / tb
            rows = np.flatnonzero(inv == pick)
            who = int(ranks[rows[np.argmax(dur[rows])]])
            out.append(
                (
                    since,
                    who,
                    k[0],
                    int(uk[pick, 3]),
                    f"comm #{k[0]} seq {int(uk[pick, 3])}: R = {r_ratio:.1f} "
                    f"(Tmax {tmax[pick] / 1e6:.1f} ms, Tbase {tb / 1e6:.1f} ms), its last "
                    f"{run} rounds above theta",
                )
            )
        return out


# NCCL's point-to-point operations: a receive waits for its sender's compute, which differs by
# pipeline stage, so it never borrows another communicator's threshold.
_P2P = frozenset({"Send", "Recv"})


def _only_states(view: tables.Bundle, keep: npt.NDArray[np.bool_]) -> tables.Bundle:
    """The view with only the kept state rows (flows untouched: rows keep their slices)."""
    return tables.Bundle(
        job=view.job,
        comm_ids=view.comm_ids,
        strings=view.strings,
        comms=view.comms,
        ops=view.ops,
        states=view.states[keep],
        flows=view.flows,
        hw=view.hw,
        source=view.source,
    )


def _flow_samples(
    view: tables.Bundle, lo_ns: int, t_ns: int
) -> tuple[tables.Table, inflight.I64] | None:
    """The state samples in ``(lo_ns, t_ns]`` that carry flows, and for each the smallest
    ``idle_ns`` of its flows (the time since anything of its operation moved); None when there
    are none. Without flows a sample does not tell a stall from progress (``inflight``)."""
    st = view.states
    m = (st["ts"] > lo_ns) & (st["ts"] <= t_ns) & (st["flow_hi"] > st["flow_lo"])
    if not m.any():
        return None
    st = st[m]
    idle = inflight.segment_min(
        view.flows["idle_ns"].astype(np.int64),
        st["flow_lo"].astype(np.int64),
        st["flow_hi"].astype(np.int64),
    )
    return st, idle
