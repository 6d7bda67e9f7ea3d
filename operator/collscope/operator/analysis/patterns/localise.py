"""Abnormal function executions (EROICA §4.3, Eq. 11), one function at a time.

f on w is abnormal iff β_f,w > 0.01 and (D_f,w > 0 or Δ_f,w > M_f + k·MAD_f): it costs at
least 1 % of the training time and either leaves the range expected of its kind
(``expectation``) or behaves unlike most other workers (``differential``).

When several workers are flagged by Δ, the same Δ rule is run again among them alone: the
paper's NIC-down case (§6.2 Problem 2) flags 40 workers of one ring by β, and among those the
one with the distinctly lower μ (and low sigma: it does not wait, it *is* the slow link) is the
faulty NIC. Such workers are ``distinct`` and lead the culprit list, when they differ from the
other flagged workers in μ or sigma (hardware), not merely in β (how long).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collscope.operator.analysis.patterns import differential, expectation, table


@dataclass(frozen=True)
class LocaliseSettings:
    min_beta: float = 0.01  # β > 0.01 of Eq. 11
    ranges: dict[str, expectation.ExpectedRange] = field(
        default_factory=lambda: dict(expectation.DEFAULT_RANGES)
    )
    differential: differential.DifferentialSettings = field(
        default_factory=differential.DifferentialSettings
    )
    min_flagged_for_rerun: int = 5  # the second Δ pass among flagged workers needs this many
    distinct_rel: float = 0.25  # ... and reports workers whose median μ or sigma differs this much


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
) -> FunctionFinding | None:
    """Eq. 11 over the rows ``lo:hi`` of ``t`` (one function); None when nothing is abnormal.

    ``all_ranks`` (sorted): every worker of the job; those without a row for f never had it on
    their critical path and count as (0, 0, 0), so a function seen on three workers only is
    compared with all the others, not among those three.
    """
    kind = t.fn_kind[fid]
    rng_ = s.ranges[kind]
    ranks = t.rank[lo:hi]
    beta, mu, sigma = t.beta[lo:hi], t.mu[lo:hi], t.sigma[lo:hi]
    if all_ranks is not None and ranks.size < all_ranks.size:
        pos = np.searchsorted(all_ranks, ranks)
        beta, mu, sigma = (_spread(x, pos, all_ranks.size) for x in (beta, mu, sigma))
        ranks = all_ranks
    active = beta > s.min_beta
    if not active.any():
        return None
    d = expectation.distance(beta, mu, sigma, rng_)
    out = differential.analyse(beta, mu, sigma, s.differential, rng)
    by_d = active & (d > 0)
    by_delta = active & out.mask
    flagged = by_d | by_delta
    if not flagged.any():
        return None
    distinct = np.zeros(0, dtype=np.int64)
    idx = np.flatnonzero(by_delta)
    if idx.size >= s.min_flagged_for_rerun:
        again = differential.analyse(beta[idx], mu[idx], sigma[idx], s.differential, rng)
        a, b = idx[again.mask], idx[~again.mask]
        if 0 < a.size * 2 < idx.size and (_apart(mu[a], mu[b], s) or _apart(sigma[a], sigma[b], s)):
            distinct = ranks[a]
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
    )


def _apart(a: table.F64, b: table.F64, s: LocaliseSettings) -> bool:
    ma, mb = float(np.median(a)), float(np.median(b))
    return abs(ma - mb) > s.distinct_rel * max(ma, mb, 1e-9)


def _spread(x: table.F64, pos: table.I64, n: int) -> table.F64:
    out = np.zeros(n)
    out[pos] = x
    return out
