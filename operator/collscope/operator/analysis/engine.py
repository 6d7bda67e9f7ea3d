"""``diagnose(bundle) -> Diagnosis``: the one entry point of analysis (CLI, operator, benchmarks).

It replays a bundle the way the operator lives through a job (docs/design.md, "Data path" 4-6):

0. the bundle is put on one clock (``clocks``: node offsets from operations that span nodes);
1. communicators and groups from ``comm`` records (``groups``); up to 10 sampled ranks, at
   least one per DP group (Mycroft §4.3), part of them rotating over the DP groups when there
   are more (``rotation``: every group watched within ``ceil(groups / 10) * 3`` ticks);
2. ticks every ``tick_s`` from the bundle's first timestamp to its last (and the last one
   itself); at each tick the trigger (``trigger``, Mycroft Algorithm 1 + CCL-D §4.2.1) sees the
   records of the ranks sampled at that tick with ts <= tick and, when ``summaries`` is given
   (``analysis/summaries.py``: ``collscope analyze`` and the operator's Diagnosis replay),
   every rank's ``/v1/summaries`` row for the job-wide hang check (``jobwide``), as live;
3. at the first trigger, the window of *every* rank around it is cut (``view``: Mycroft §5.1's
   (t - Δ, t], stretched back to the start of the stall or slowdown, plus the baseline history
   a slowdown is judged against) and root-cause analysis runs on it (``liveness``, then
   ``failure`` for hangs, ``straggler`` for slowdowns). A hang whose waiters wait on ranks that
   are still moving is judged as a slowdown (``progress``, CCL-D H1); when that, or a
   slowdown, names no culprit yet, the replay goes on to the next trigger.

No trigger => ``Diagnosis(anomaly=False)`` with one line saying what was checked.
Confidence = coverage x (0.5 + 0.5 x margin): how much of the implicated group had records,
and how far the best culprit stands above the next one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from collscope.nodeagent import api
from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import (
    clocks,
    diagnosis,
    failure,
    groups,
    hwsamples,
    inflight,
    liveness,
    placement,
    progress,
    rotation,
    straggler,
    trigger,
    view,
)

NS = 1_000_000_000


@dataclass(frozen=True)
class AnalysisSettings:
    """Every threshold of analysis, grouped by stage. Each says which quantity it stands for
    and where its value comes from (issue 12 item 5): a paper, a fact of the protocol or of
    collscope's own agent, or, said as such, picked on collscope's own simulator and kept
    because eval-dev (``bench/accuracy.py --bundles ../shared/eval-dev``) agrees. Durations
    that must hold steps scale with the measured step (``baseline.period_ns``), and those
    that must hold state samples with the measured sampling interval
    (``inflight.infer_interval_ns``)."""

    # The operator's trigger tick (docs/design.md, "Data path" 5): how often it pulls the
    # sampled ranks' windows. The replay ticks as the operator does. A time of the operator,
    # not of the job: the trigger's windows span whole steps whatever the tick.
    tick_s: float = 1.0
    # How long the replay keeps ticking after the last record before a gap in the records (a
    # time of the job; the rest of the gap holds no data and is skipped, so ticks are bounded
    # by the records, not by the span: issue 15 item 3). A hang whose ranks stop writing
    # (dead, frozen, lost: no state samples either) is judged within it only if it outlasts
    # the longest hang threshold the trigger can apply, max(floor + usual stall, hang_k x
    # usual stall) <= floor + hang_k x step, a usual stall being at most one step (a pipeline
    # receive waits through its sender's compute). So the replay keeps ticking
    # max(idle_replay_s, floor + idle_replay_periods x the measured step): the floor is the
    # trigger's (``TriggerState.hang_floor_ns``: 1 s plus two measured sampling intervals, or
    # the TrainingJob's hangFloorSeconds) and the step ``baseline.period_ns``, so neither a
    # step length nor a sampling interval is assumed. idle_replay_s is what holds before any
    # step is measured (a job that stops within its first steps): 300 s, a hang of steps up
    # to ~75 s long (hang_k = 4); at most 300 ticks of 1 s per gap. idle_replay_periods =
    # 2 x hang_k: room for steps that vary. Both picked; below 75 s steps and 150 s sampling
    # the 300 s minimum is the value (eval-dev's and the simulator's cases unchanged).
    idle_replay_s: float = 300.0
    idle_replay_periods: float = 8.0
    max_sampled: int = 10  # Mycroft §4.3: at most 10 ranks watched at each tick
    # Δ of the failure window (t - Δ, t] (Mycroft §5.1): the records the hang analysis reads.
    # It only needs each rank's latest state and completions at t, and reaches back past the
    # stall's start anyway (below), so it does not hold steps. 2 s picked (Mycroft's Δ is not
    # given); eval-dev agrees (8/8 hangs).
    hang_window_s: float = 2.0
    # ... reaching at least this far before the stall began, and at least this many measured
    # sampling intervals: the window must hold the last samples that showed the stuck ranks
    # moving (a sample up to trigger.state_max_age_intervals intervals old is current), so at
    # slow sampling one second would hold none. 1 s picked; unchanged up to 500 ms sampling.
    hang_lookback_s: float = 1.0
    hang_lookback_intervals: float = 2.0
    # History before a slowdown its baseline is learned from (late starts' arrival spread,
    # CCL-D Tmin per round) ... and at least this many steps of the job: late starts and
    # transfer times are compared with the same rounds before, and a job with 10 s steps has
    # none in 4 s (the step period is the trigger's, ``baseline.period_ns``). Four steps: a
    # median of four rounds of each operation survives one odd step. Picked.
    slow_baseline_s: float = 4.0
    slow_baseline_periods: float = 4.0
    trigger: trigger.TriggerSettings = field(default_factory=trigger.TriggerSettings)
    failure: failure.FailureSettings = field(default_factory=failure.FailureSettings)
    straggler: straggler.StragglerSettings = field(default_factory=straggler.StragglerSettings)


def diagnose(
    bundle: tables.Bundle,
    settings: AnalysisSettings = AnalysisSettings(),
    *,
    sampled: Sequence[int] | None = None,
    summaries: Callable[[tables.Bundle, int], Sequence[api.TriggerSummary]] | None = None,
) -> diagnosis.Diagnosis:
    """Replay ``bundle`` tick by tick; diagnose the first anomaly (see module docstring).
    ``summaries(bundle, t)``: every rank's agent summary at tick ``t`` of the (clock-aligned)
    bundle, as the operator pulls them for the job-wide hang check (``jobwide``); None: the
    sampled ranks only."""
    span = bundle.time_span()
    if span is None:
        return diagnosis.Diagnosis(anomaly=False, evidence=["the bundle holds no records"])
    where = placement.Placement.of(bundle.job)
    observed = bundle  # with its liveness rows, which the cuts below leave out
    # Cross-node comparisons need one clock: offsets estimated from the data (``clocks``).
    bundle = clocks.aligned(bundle, clocks.estimate(bundle, where))
    grp = groups.build(bundle)
    plan = (  # Mycroft's sample, rotated over the DP groups when they outnumber it
        rotation.fixed(sampled)
        if sampled is not None
        else rotation.plan(
            grp, bundle.job, settings.max_sampled, dwell_ticks=settings.trigger.repeat_ticks
        )
    )
    watch = plan.ranks
    interval = inflight.infer_interval_ns(bundle, int(settings.trigger.state_interval_s * NS))
    watched = view.select(bundle, ranks=watch)
    state = trigger.TriggerState(plan.at(0), settings.trigger, interval_ns=interval)
    first, last = span
    step = int(settings.tick_s * NS)
    replayed: list[int] = []  # tick times: as many as records allow, never as a span asks

    def idle() -> int:  # the time ticked after the last record (``idle_replay_s``)
        floor, _ = state.hang_floor_ns()
        steps = int(settings.idle_replay_periods * (state.base.period_ns() or 0))
        return max(int(settings.idle_replay_s * NS), floor + steps)

    for i, t in enumerate(_ticks(bundle, first, last, step, idle)):
        replayed.append(t)
        state.watch(plan.at(i), watched)
        hit = state.update(watched, t, None if summaries is None else summaries(bundle, t))
        if hit is None:
            continue
        seen = plan.last_seen(i, hit.ranks) if hit.kind == "slow" else None
        if seen is not None:  # a rank that rotated in: the slowdown may predate its visit
            at = replayed[seen] if seen >= 0 else first + (seen + 1) * step
            hit = dataclasses.replace(hit, since_ns=min(hit.since_ns, at))
        found = _root_cause(
            bundle, hit, grp=grp, where=where, settings=settings, interval=interval,
            observed=observed, period=state.base.period_ns() or 0,
        )  # fmt: skip
        if found is not None:
            return found
    return diagnosis.Diagnosis(
        anomaly=False,
        evidence=[
            f"replayed {(last - first) / NS:.1f} s in {len(replayed)} ticks of "
            f"{settings.tick_s:g} s on {plan.describe()} "
            f"({len(grp.of_kind('dp'))} DP groups, {len(grp.comms)} communicators): no "
            f"operation stalled past its threshold and no throughput, interval or CCL-D "
            f"slowdown ratio alarm held {settings.trigger.repeat_ticks} ticks in a row"
        ],
    )


def _ticks(
    bundle: tables.Bundle, first: int, last: int, step: int, idle: Callable[[], int]
) -> Iterator[int]:
    """The replay's tick times: ``first + k * step`` (k >= 1) before ``last``, then ``last``.

    Bounded by the records, never by the span (issue 15 item 3: one record at ``ts = 1``
    asked for 1.8e9 ticks): where no record falls within ``idle()`` ns before a tick (asked
    after each tick was replayed: it grows with the step measured so far), the replay jumps
    to the last grid tick before the next record. Nothing changes there (the trigger sees no
    new data; a hang is judged within ``idle()``), so a bundle without such gaps replays every
    grid tick, as before. At most ``records x (idle / step + 1) + 1`` ticks; the record times
    are only gathered when the grid is longer than ``_PLAIN_TICKS`` plus the records.
    """
    grid = max(0, (last - first - 1) // step)
    parts = [t["ts"] for t in (bundle.comms, bundle.ops, bundle.states, bundle.hw) if len(t)]
    if grid <= sum(len(p) for p in parts) + _PLAIN_TICKS:
        yield from range(first + step, last, step)
        yield last
        return
    times = np.unique(np.concatenate(parts))
    t = first + step
    while t < last:
        yield t
        t += step
        k = int(np.searchsorted(times, t, side="right"))  # records at or before t
        if k < len(times) and t - int(times[k - 1]) > idle():
            t = max(t, first + (int(times[k]) - first) // step * step)
    yield last


# A span of this many ticks replays every tick whatever the records (an hour at 1 s ticks):
# the cost of gathering record times is skipped where the grid cannot be large.
_PLAIN_TICKS: Final = 3600


def _root_cause(
    bundle: tables.Bundle,
    hit: trigger.TriggerResult,
    *,
    grp: groups.Groups,
    where: placement.Placement,
    settings: AnalysisSettings,
    interval: int,
    observed: tables.Bundle | None = None,
    period: int = 0,
) -> diagnosis.Diagnosis | None:
    """The diagnosis of the trigger ``hit``, or None when a hang trigger turned out to be a
    wait on ranks that are still moving and no slowdown stands out yet (replay goes on)."""
    t = hit.tick_ns
    kind: diagnosis.Trigger = hit.kind
    evidence = [f"trigger ({hit.kind}): {hit.reason}"]
    finding: failure.Finding | None = None
    window = bundle
    if hit.kind == "hang":
        judged = _hang_finding(
            bundle, hit, grp=grp, where=where, settings=settings, interval=interval,
            observed=observed, evidence=evidence,
        )  # fmt: skip
        if judged is None:
            return None
        kind, finding, window = judged
    if kind == "slow":
        base_from = hit.since_ns - max(
            int(settings.slow_baseline_s * NS), int(settings.slow_baseline_periods * period)
        )
        window = view.select(bundle, since_ns=base_from, until_ns=t)
        finding = straggler.analyze(
            window,
            since_ns=hit.since_ns,
            t_ns=t,
            base_from_ns=base_from,
            where=where,
            interval_ns=interval,
            settings=settings.straggler,
        )
        if finding is None and hit.kind == "hang":
            return None
        if finding is None and t - hit.since_ns < hit.since_ns - base_from:
            # No culprit stands out yet: wait while the slow window is shorter than its
            # baseline (a step-long job shows one late round per step; "constant" late starts
            # need several). A slowdown that persists that long without a culprit is reported.
            return None
    return _verdict(hit, kind, finding, window, where=where, evidence=evidence)


def _hang_finding(
    bundle: tables.Bundle,
    hit: trigger.TriggerResult,
    *,
    grp: groups.Groups,
    where: placement.Placement,
    settings: AnalysisSettings,
    interval: int,
    observed: tables.Bundle | None,
    evidence: list[str],
) -> tuple[diagnosis.Trigger, failure.Finding | None, tables.Bundle] | None:
    """``(kind, finding, window)`` of a hang trigger: kind "slow" (finding None) when the
    waiters wait on ranks still moving (CCL-D H1), None when those ranks have been silent no
    longer than their own compute phases (not stuck yet: replay goes on). Appends to
    ``evidence``."""
    t = hit.tick_ns
    lookback = max(
        int(settings.hang_lookback_s * NS), int(settings.hang_lookback_intervals * interval)
    )
    since = min(t - int(settings.hang_window_s * NS), hit.since_ns - lookback)
    window = view.select(bundle, since_ns=since, until_ns=t)
    hint = None if hit.comm is None or hit.seq is None else (hit.comm, hit.seq)
    # A dead, frozen or lost rank first (``liveness``): its peers' traces look like H3.
    finding = liveness.analyze(observed or bundle, hit, where=where) or failure.analyze(
        window,
        t,
        grp=grp,
        where=where,
        settings=settings.failure,
        interval_ns=interval,
        hint=hint,
    )
    if finding is not None and finding.category is diagnosis.Category.HANG_NOT_ENTERED:
        late = sorted({c.rank for c in finding.culprits if c.rank is not None})
        busy = progress.moving(bundle, late, since_ns=hit.since_ns, t_ns=t)
        if late and busy >= set(late):
            evidence.append(
                f"the waiters wait on rank(s) {late}, which kept completing operations or "
                f"moving chunks in the last {(t - hit.since_ns) / 2 / NS:.1f} s: not stuck "
                f"(CCL-D H1 needs no increment of their operation counter) but late, so "
                f"the stall is judged as a slowdown"
            )
            return "slow", None, window
        if late and progress.within_usual_gaps(
            bundle, late, t_ns=t, k=settings.trigger.hang_k
        ) >= set(late):
            return None  # silent no longer than their own compute phases: not stuck yet
    return "hang", finding, window


def _verdict(
    hit: trigger.TriggerResult,
    kind: diagnosis.Trigger,
    finding: failure.Finding | None,
    window: tables.Bundle,
    *,
    where: placement.Placement,
    evidence: list[str],
) -> diagnosis.Diagnosis:
    """The diagnosis of ``finding`` (None: the trigger's sampled ranks, confidence 0.1)."""
    if finding is None:
        return diagnosis.Diagnosis(
            anomaly=True,
            trigger=kind,
            detected_at=hit.at_ns,
            confidence=0.1,
            culprits=[where.culprit(r, component="software", score=0.1) for r in hit.ranks],
            evidence=[
                *evidence,
                "root-cause analysis found no rank to blame in the window; "
                "the culprits are the sampled ranks where the trigger held",
            ],
        )
    confidence = max(0.0, min(1.0, finding.coverage * (0.5 + 0.5 * finding.margin)))
    top = finding.culprits[0].rank if finding.culprits else None
    hardware = hwsamples.notes(window, top, where) if top is not None else []
    unmodelled = _unmodelled(window, t_ns=hit.tick_ns)
    if unmodelled:
        confidence = min(confidence, UNMODELLED_CONFIDENCE)
        evidence.append(
            f"the window ran {', '.join(unmodelled)}, which the rules do not model (they "
            f"follow NCCL's Ring and Tree: chunk flows between ring or tree neighbours); the "
            f"verdict is a best guess, confidence capped at {UNMODELLED_CONFIDENCE:g}"
        )
    return diagnosis.Diagnosis(
        anomaly=True,
        trigger=kind,
        detected_at=hit.at_ns,
        category=finding.category.value.name,
        culprits=finding.culprits,
        confidence=round(confidence, 3),
        evidence=evidence + finding.evidence + hardware,
        precision=finding.precision,
        alternatives=finding.alternatives or failure.runner_up(finding),
    )


# Algorithms the hang and slowdown rules are written for (NCCL's algorithm names as the
# profiler reports them; empty when the plugin could not tell). Others (NVLS, NVLSTree,
# CollNetDirect, CollNetChain, PAT) move data through switches or in patterns the rules'
# sender/receiver pairing does not describe.
MODELLED_ALGOS = frozenset({"", "Ring", "Tree"})
UNMODELLED_CONFIDENCE = 0.5  # a guess is no better than a coin between two explanations


def _unmodelled(window: tables.Bundle, *, t_ns: int) -> list[str]:
    """Names of algorithms outside ``MODELLED_ALGOS`` among the window's completed operations
    (a hung operation has no completion: the ones before it on the window's communicators say
    which algorithm NCCL picked)."""
    ops = window.ops
    sel = ops[ops["ts"] <= t_ns]
    names = {window.string(int(a)) for a in np.unique(sel["algo"]).tolist() if a >= 0}
    return sorted(n for n in names if n not in MODELLED_ALGOS)
