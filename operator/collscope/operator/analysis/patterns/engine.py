"""``diagnose_patterns(table) -> Diagnosis``: profiling-based localisation (EROICA §4.3).

Input: ``functions.jsonl``, one (β, μ, sigma) pattern per worker and function (EROICA §4.2),
column-wise in a ``table.PatternTable``. Per function (``localise``): the distance from the
range expected of its kind D (``expectation``) and the differential distance Δ over a sample of
N = min(100, W) workers with δ = 0.4 and the median + 5·MAD rule (``differential``), for
functions with β > 0.01 only, among the workers of one role (``roles``: pipeline stages or
function sets), and a Δ outlier held to a Benjamini-Hochberg bound over every comparison of
the bundle (``discoveries``; issue 17). Across kernels, load imbalance (``imbalance``). Findings are
ranked by impact (how much more critical-path time the flagged workers spend than the rest),
the first sets the category (kernel: slow.compute, comm: slow.network, memory and Python:
slow.host; imbalance: slow.host with a ``software`` culprit), and every finding becomes an
evidence sentence naming the function, the workers and how they differ.

Units: every threshold here is a share of a profiling window (β: share of the window f is on
the critical path; μ, sigma: mean and spread of its resource utilisation, all in [0, 1]), a
count of workers or a probability; none is a time, so none assumes a step length or a
sampling interval. What is assumed of time is the profiler's: its window must hold several
steps so that β is a share of whole iterations (EROICA §4.1 and §7: a 20 s window, at the
3.6 s iterations of §6.1 about five); ``table.window_ns`` reports it.

Cost: O(rows x N) in numpy blocks; a million workers with ten functions each is well under
a minute on one core (``bench/patterns_localise.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collscope.nodeagent.bundle import models
from collscope.operator.analysis import diagnosis, placement
from collscope.operator.analysis.patterns import (
    discoveries,
    explain,
    imbalance,
    localise,
    roles,
    table,
)


@dataclass(frozen=True)
class PatternSettings:
    localise: localise.LocaliseSettings = field(default_factory=localise.LocaliseSettings)
    imbalance: imbalance.ImbalanceSettings = field(default_factory=imbalance.ImbalanceSettings)
    roles: roles.RoleSettings = field(default_factory=roles.RoleSettings)
    discoveries: discoveries.DiscoverySettings = field(
        default_factory=discoveries.DiscoverySettings
    )
    # Culprits listed per finding and in all: a Diagnosis names workers for a person to look
    # at, and a common problem flags hundreds. Picked (display limits, not judgements).
    culprits_per_function: int = 16
    max_culprits: int = 64


@dataclass(frozen=True)
class PatternReport:
    table: table.PatternTable
    findings: tuple[localise.FunctionFinding, ...]  # most impact first
    imbalance: imbalance.Imbalance | None
    roles: roles.Roles | None = None
    sigma_only: tuple[localise.FunctionFinding, ...] = ()  # evidence only (``discoveries``)
    cutoff: float = -1.0  # the BH cutoff on p-values (-1: nothing passed)


def analyze(
    t: table.PatternTable,
    settings: PatternSettings = PatternSettings(),
    *,
    job: models.Job | None = None,
) -> PatternReport:
    """Every function's Eq. 11 verdict per role under the BH bound, plus load imbalance."""
    rng = np.random.default_rng(settings.localise.differential.seed)
    spans = t.spans()
    im = imbalance.detect(t, spans, settings.imbalance)
    skip = set() if im is None else {k.fn_id for k in im.kernels}
    rl = roles.derive(t, job, settings.roles)
    tally = discoveries.Tally(settings.discoveries.fdr)
    found = []
    for fid, lo, hi in spans:
        if fid in skip:  # its spread is the imbalance, not some workers being different
            continue
        # compared among the workers of the roles that run f: everyone for a function every
        # role runs, one stage's workers for a function only that stage runs
        runs = np.unique(rl.of[np.searchsorted(rl.ranks, t.rank[lo:hi])])
        members, name = rl.ranks, ""
        if runs.size < len(rl.names):
            members = rl.ranks[np.isin(rl.of, runs)]
            name = " and ".join(rl.names[int(r)] for r in runs)
        f = localise.function(
            t,
            fid,
            lo=lo,
            hi=hi,
            s=settings.localise,
            rng=rng,
            all_ranks=members,
            tally=tally,
            role=name,
            role_of=(rl.ranks, rl.of),
        )
        if f is not None:
            found.append(f)
    cutoff = tally.cutoff()
    held = [
        g
        for g in (localise.control(f, cutoff, settings.localise, rng) for f in found)
        if g is not None
    ]
    kept = [f for f in held if f.ranks.size]
    kept.sort(key=lambda f: (-f.impact, f.fn))
    sig = tuple(f for f in held if f.sigma_only.size)
    return PatternReport(t, tuple(kept), im, rl, sig, cutoff)


def diagnose_patterns(
    t: table.PatternTable,
    settings: PatternSettings = PatternSettings(),
    *,
    job: models.Job | None = None,
) -> diagnosis.Diagnosis:
    """The Diagnosis of docs/spec/bundle-v1.md from function patterns (see module docstring)."""
    return to_diagnosis(analyze(t, settings, job=job), settings, job=job)


def to_diagnosis(
    report: PatternReport, settings: PatternSettings = PatternSettings(), *, job: models.Job | None
) -> diagnosis.Diagnosis:
    t = report.table
    where = placement.Placement.of(job or models.Job(world_size=max(1, t.workers)))
    summary = (
        f"patterns: {len(t):,} patterns of {len(t.fns):,} functions on {t.workers:,} workers"
        + (f" ({t.window_ns / 1e9:g} s profiling window)" if t.window_ns else "")
        + f"; Eq. 11 with β > {settings.localise.min_beta:g}, N = min("
        f"{settings.localise.differential.sample_max}, W), δ = "
        f"{settings.localise.differential.delta:g}, k = {settings.localise.differential.k:g}"
    )
    summary += (
        f"; Δ outliers held to Benjamini-Hochberg at q = {settings.discoveries.fdr:g} over "
        "workers x functions x (β, μ, \u03c3)"
    )
    context = [explain.sigma_only_sentence(f) for f in report.sigma_only]
    rl = report.roles
    if rl is not None and len(rl.names) > 1:
        context.insert(0, explain.roles_sentence(rl.names, rl.source))
    if not report.findings and report.imbalance is None:
        return diagnosis.Diagnosis(
            anomaly=False,
            evidence=[
                summary,
                "no function costs more than 1 % of the window while outside its expected "
                "range or unlike most workers of its role beyond what that many comparisons "
                "produce, and GPU kernels are balanced",
                *context,
            ],
        )
    culprits: list[diagnosis.Culprit] = []
    evidence: list[str] = []
    for f in report.findings:
        evidence.append(explain.sentence(f))
        if f.distinct.size:
            evidence.append(explain.distinct_sentence(f))
        culprits += explain.culprits(f, where, settings.culprits_per_function)
    note = explain.gc_note(report.findings)
    if note:
        evidence.append(note)
    im = report.imbalance
    if im is not None:
        line = explain.imbalance_sentence(im, t)
        if report.findings:
            evidence.append(line)
        else:
            evidence.insert(0, line)
        for r in im.busiest[: settings.culprits_per_function]:
            c = where.culprit(r, component="software", score=0.6)
            culprits.append(c.model_copy(update={"function": t.fns[im.kernels[0].fn_id]}))
    if report.findings:
        top = report.findings[0]
        category, _ = explain.CATEGORY[top.kind]
        # picked: a few workers unlike the rest (or a distinct one among many) 0.9; a problem
        # of half the job or more, whose cause may lie outside the flagged function, 0.8;
        # imbalance alone, a property of the input more than of a worker, 0.6
        confidence = 0.9 if top.distinct.size or not top.common else 0.8
    else:
        category, confidence = diagnosis.Category.SLOW_HOST, 0.6
    return diagnosis.Diagnosis(
        anomaly=True,
        trigger="slow",
        category=category.value.name,
        culprits=culprits[: settings.max_culprits],
        confidence=confidence,
        evidence=[*evidence, *context, summary],
    )


def combine(other: diagnosis.Diagnosis, patterns: diagnosis.Diagnosis) -> diagnosis.Diagnosis:
    """One Diagnosis for a bundle with function patterns beside records or flows.

    As ``flows.engine.combine``: the other analysis leads when it found an anomaly, the pattern
    culprits follow and its evidence is appended prefixed ``functions:``; when only the
    patterns show an anomaly they are the result, the other evidence appended prefixed
    ``other:``.
    """
    if other.anomaly or not patterns.anomaly:
        return other.model_copy(
            update={
                "anomaly": other.anomaly or patterns.anomaly,
                "culprits": [*other.culprits, *patterns.culprits],
                "evidence": [*other.evidence, *(f"functions: {e}" for e in patterns.evidence)],
            }
        )
    return patterns.model_copy(
        update={"evidence": [*patterns.evidence, *(f"other: {e}" for e in other.evidence)]}
    )
