"""Abnormal function executions (EROICA §4.3, Eq. 11), one function at a time.

f on w is abnormal iff β_f,w > 0.01 and (D_f,w > 0 or Δ_f,w > M_f + k·MAD_f): it costs at
least 1 % of the training time and either leaves the range expected of its kind
(``expectation``) or behaves unlike most other workers (``differential``).

When several workers are flagged by Δ, the same Δ rule is run again among them alone: the
paper's NIC-down case (§6.2 Problem 2) flags 40 workers of one ring by β, and among those the
one with the distinctly lower μ (and low sigma: it does not wait, it *is* the slow link) is the
faulty NIC. Such workers are ``distinct`` and lead the culprit list, when they differ from the
other flagged workers in μ or sigma (hardware), not merely in β (how long).

Issue 17 adds two things around Eq. 11. Workers are compared within their role (``roles``:
the rows of ``function`` are those of one role's workers), and a worker flagged by Δ alone
(not by D, which compares with nothing) must pass the false-discovery control of
``discoveries`` (``control``): a β or μ beyond what the spread of all the bundle's comparisons
produces makes it a culprit; sigma alone makes it evidence (``FunctionFinding.sigma_only``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from collscope.operator.analysis.patterns import differential, discoveries, expectation, table


@dataclass(frozen=True)
class LocaliseSettings:
    # β > 0.01 of Eq. 11 (EROICA §4.3): a function under 1 % of the profiling window is
    # noise to the customer. A share of the window: no step length or sampling assumed.
    min_beta: float = 0.01
    ranges: dict[str, expectation.ExpectedRange] = field(
        default_factory=lambda: dict(expectation.DEFAULT_RANGES)
    )
    differential: differential.DifferentialSettings = field(
        default_factory=differential.DifferentialSettings
    )
    # The second Δ pass (module docstring, EROICA §6.2 Problem 2) needs this many flagged
    # workers: among fewer, "most of them" is one or two. Picked; a count of workers.
    min_flagged_for_rerun: int = 5
    # ... and reports workers whose median μ or sigma differs this much (relative) from the
    # other flagged ones: the paper's faulty NIC differs by far more (μ about half). Picked,
    # checked on simulator.patterns' nic-down case (bench/patterns_localise.py); a ratio.
    distinct_rel: float = 0.25


@dataclass(frozen=True)
class FunctionFinding:
    """The abnormal workers of one function and the numbers that made them so."""

    fn: str
    kind: str
    workers: int  # workers that ran f
    ranks: table.I64  # flagged, by Eq. 11
    by_expectation: int  # of them, with D > 0
    by_difference: int  # of them, with Δ above the threshold
    beta: table.F64  # of the flagged ranks, same order
    mu: table.F64
    sigma: table.F64
    delta: table.F64  # Δ of the flagged ranks
    distinct: table.I64  # flagged ranks unique even among the flagged (second pass)
    rest: tuple[table.F64, table.F64, table.F64]  # β, μ, sigma of the workers not flagged
    threshold: float  # M + k·MAD of Δ
    d_max: float  # the largest D among flagged workers
    expected: expectation.ExpectedRange
    by_d: table.Bool  # of the flagged ranks, D > 0 (same order)
    p: table.F64  # (flagged, 3): p-values of the robust z of β, μ, sigma (``discoveries``)
    role: str = ""  # the role whose workers f was compared among ("" : everyone)
    sigma_only: table.I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def common(self) -> bool:
        """Flagged on at least half the workers: a problem of the whole job, not of a few."""
        return self.ranks.size * 2 >= self.workers

    @property
    def impact(self) -> float:
        """How much more time on the critical path the flagged workers spend than the rest."""
        rest_beta = self.rest[0]
        base = float(np.median(rest_beta)) if rest_beta.size else self.expected.beta[1]
        return float(np.median(self.beta)) - min(base, self.expected.beta[1])


def function(
    t: table.PatternTable,
    fid: int,
    *,
    lo: int,
    hi: int,
    s: LocaliseSettings,
    rng: np.random.Generator,
    all_ranks: table.I64 | None = None,
    tally: discoveries.Tally | None = None,
    role: str = "",
    role_of: tuple[table.I64, table.I64] | None = None,
) -> FunctionFinding | None:
    """Eq. 11 over the rows ``lo:hi`` of ``t`` (one function); None when nothing is abnormal.

    ``all_ranks`` (sorted): the workers f is compared among (a role's, or the whole job's);
    rows of other workers are left out, and those without a row for f never had it on their
    critical path and count as (0, 0, 0), so a function seen on three workers only is compared
    with all the others, not among those three. ``tally`` collects the p-values of every
    active worker for the bundle-wide false-discovery control; ``role_of`` (sorted ranks, their
    role) lets its z-scores measure each worker from its own role's median.
    """
    kind = t.fn_kind[fid]
    rng_ = s.ranges[kind]
    ranks = t.rank[lo:hi]
    beta, mu, sigma = t.beta[lo:hi], t.mu[lo:hi], t.sigma[lo:hi]
    if all_ranks is not None:
        keep = np.isin(ranks, all_ranks)
        ranks, beta, mu, sigma = ranks[keep], beta[keep], mu[keep], sigma[keep]
    if all_ranks is not None and ranks.size < all_ranks.size:
        pos = np.searchsorted(all_ranks, ranks)
        beta, mu, sigma = (_spread(x, pos, all_ranks.size) for x in (beta, mu, sigma))
        ranks = all_ranks
    active = beta > s.min_beta
    if not active.any():
        return None
    d = expectation.distance(beta, mu, sigma, rng_)
    out = differential.analyse(beta, mu, sigma, s.differential, rng)
    fdr = tally.fdr if tally is not None else 1.0
    groups = None
    if role_of is not None:
        groups = role_of[1][np.searchsorted(role_of[0], ranks)]
    p = discoveries.pvalues(beta, mu, sigma, fdr, groups)
    if tally is not None:
        tally.add(p[active])
    by_d = active & (d > 0)
    by_delta = active & out.mask
    flagged = by_d | by_delta
    if not flagged.any():
        return None
    idx = np.flatnonzero(by_delta)
    distinct = ranks[_distinct(beta, mu, sigma, idx, s=s, rng=rng)]
    return FunctionFinding(
        fn=t.fns[fid],
        kind=kind,
        workers=int(ranks.size),
        ranks=ranks[flagged],
        by_expectation=int(by_d.sum()),
        by_difference=int(by_delta.sum()),
        beta=beta[flagged],
        mu=mu[flagged],
        sigma=sigma[flagged],
        delta=out.delta[flagged],
        distinct=distinct,
        rest=(beta[~flagged], mu[~flagged], sigma[~flagged]),
        threshold=out.threshold,
        d_max=float(d[flagged].max()),
        expected=rng_,
        by_d=by_d[flagged],
        p=p[flagged],
        role=role,
    )


def _distinct(
    beta: table.F64,
    mu: table.F64,
    sigma: table.F64,
    idx: table.I64,
    *,
    s: LocaliseSettings,
    rng: np.random.Generator,
) -> table.I64:
    """The second Δ pass among the rows ``idx`` flagged by Δ: the rows that stand apart."""
    if idx.size < s.min_flagged_for_rerun:
        return np.zeros(0, dtype=np.int64)
    again = differential.analyse(beta[idx], mu[idx], sigma[idx], s.differential, rng)
    a, b = idx[again.mask], idx[~again.mask]
    if 0 < a.size * 2 < idx.size and (_apart(mu[a], mu[b], s) or _apart(sigma[a], sigma[b], s)):
        return a
    return np.zeros(0, dtype=np.int64)


def control(
    f: FunctionFinding,
    cutoff: float,
    s: LocaliseSettings = LocaliseSettings(),
    rng: np.random.Generator | None = None,
) -> FunctionFinding | None:
    """``f`` with the workers Δ alone flagged held to the BH ``cutoff`` (module docstring).

    Kept: D > 0, or β or μ at or below the cutoff. Moved to ``sigma_only``: sigma alone at or
    below it. None when no worker is kept and none is sigma-only. The second Δ pass
    (``distinct``) is run again among the kept Δ outliers only: workers dropped here must not
    decide who stands apart among the rest.
    """
    beta_mu = (f.p[:, :2] <= cutoff).any(axis=1)
    keep = f.by_d | beta_mu
    sig = ~keep & (f.p[:, 2] <= cutoff)
    if keep.all():
        return f
    if not keep.any() and not sig.any():
        return None
    gone = ~keep
    rest = tuple(
        np.concatenate((r, x[gone])) for r, x in zip(f.rest, (f.beta, f.mu, f.sigma), strict=True)
    )
    kept = f.ranks[keep]
    return dataclasses.replace(
        f,
        ranks=kept,
        by_expectation=int(f.by_d[keep].sum()),
        by_difference=int(np.count_nonzero(f.delta[keep] > f.threshold)),
        beta=f.beta[keep],
        mu=f.mu[keep],
        sigma=f.sigma[keep],
        delta=f.delta[keep],
        distinct=kept[
            _distinct(
                f.beta[keep],
                f.mu[keep],
                f.sigma[keep],
                np.flatnonzero(f.delta[keep] > f.threshold),
                s=s,
                rng=rng or np.random.default_rng(s.differential.seed),
            )
        ],
        rest=(rest[0], rest[1], rest[2]),
        d_max=float(f.d_max if f.by_d[keep].any() else 0.0),
        by_d=f.by_d[keep],
        p=f.p[keep],
        sigma_only=f.ranks[sig],
    )


def _apart(a: table.F64, b: table.F64, s: LocaliseSettings) -> bool:
    ma, mb = float(np.median(a)), float(np.median(b))
    return abs(ma - mb) > s.distinct_rel * max(ma, mb, 1e-9)


def _spread(x: table.F64, pos: table.I64, n: int) -> table.F64:
    out = np.zeros(n)
    out[pos] = x
    return out
