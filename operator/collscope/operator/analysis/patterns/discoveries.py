"""False-discovery control across workers x functions (issue 17; Benjamini & Hochberg 1995).

EROICA's outlier rule (§4.3, Eq. 11) is per comparison: each function's Δ is held to its own
median + k·MAD. A job of 4,096 workers with 16 functions makes some 65,000 such comparisons,
and the ordinary spread of a noisy dimension (sigma above all: a standard deviation estimated
from one window of samples) puts a few workers per function past any fixed per-comparison
bar. So a worker flagged by Δ must also stand out beyond what that many comparisons produce:

1. per function and dimension d in (β, μ, sigma): a robust z-score of each worker,
   z = |x - median of its role| / (1.4826 MAD) over the workers it is compared with, MAD taken
   over every worker's distance from its own role's median (roles may differ in level, e.g.
   the last pipeline stage's GEMMs carry the LM head, but not in spread; 1.4826 MAD is the
   standard deviation of a normal sample; when MAD is 0, 1.2533 x the mean absolute deviation,
   its normal-consistent counterpart; when both are 0 every worker is equal and z is 0, or
   infinite for a worker that is not);
2. its two-sided normal p-value, erfc(z / sqrt 2);
3. the Benjamini-Hochberg step-up over all m p-values of the bundle (every worker with β >
   0.01, every function and role, three dimensions): the cutoff is the largest p_(i) with
   p_(i) <= q i / m, q = ``fdr`` (0.01: on a healthy job whose dimensions spread normally, at
   most a 1 % chance of any alarm).

Only p-values at or below q can pass (i <= m), so only those are kept, however many workers.
A flagged worker whose β or μ passes is a culprit; one whose sigma alone passes, β and μ
ordinary, is evidence (its utilisation fluctuates more, it is not slower); one where none
passes is dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from collscope.operator.analysis.patterns import table

_MAD_TO_SD = 1.4826  # 1 / Φ⁻¹(3/4): MAD of a normal sample x this = its standard deviation
_MEANAD_TO_SD = 1.2533  # sqrt(pi / 2): mean absolute deviation of a normal sample x this = sd


@dataclass(frozen=True)
class DiscoverySettings:
    # q of Benjamini-Hochberg (module docstring): at most a 1 % chance of any alarm on a
    # healthy job whose dimensions spread normally. Picked (issue 17), checked on bench/
    # patterns_localise.py's healthy jobs; a probability, no time.
    fdr: float = 0.01


@dataclass
class Tally:
    """The p-values at or below q seen so far, and how many were computed in all (m)."""

    fdr: float
    small: list[table.F64] = field(default_factory=list)
    tested: int = 0

    def add(self, p: table.F64) -> None:
        self.tested += int(p.size)
        self.small.append(p[p <= self.fdr].ravel())

    def cutoff(self) -> float:
        """The BH cutoff: p-values at or below it are discoveries (-1 when none is)."""
        if not self.small or not self.tested:
            return -1.0
        p = np.sort(np.concatenate(self.small))
        rank = np.arange(1, p.size + 1)
        ok = np.flatnonzero(p <= self.fdr * rank / self.tested)
        return float(p[ok[-1]]) if ok.size else -1.0


def zscores(x: table.F64, role: table.I64 | None = None) -> table.F64:
    """Robust z of each value of ``x`` (one dimension over the compared workers).

    ``role``: each worker's role; distances are then from its role's median.
    """
    if role is None or np.unique(role).size <= 1:
        dev = np.abs(x - float(np.median(x)))
    else:
        dev = np.empty_like(x)
        for r in np.unique(role).tolist():
            at = role == r
            dev[at] = np.abs(x[at] - float(np.median(x[at])))
    scale = _MAD_TO_SD * float(np.median(dev))
    if scale <= 0:
        scale = _MEANAD_TO_SD * float(dev.mean())
    if scale <= 0:
        return np.where(dev > 0, np.inf, 0.0)
    out: table.F64 = dev / scale
    return out


def pvalues(
    beta: table.F64,
    mu: table.F64,
    sigma: table.F64,
    fdr: float,
    role: table.I64 | None = None,
) -> table.F64:
    """(workers, 3) two-sided normal p-values of the robust z of β, μ and sigma.

    erfc is evaluated only where the p-value can be at or below ``fdr`` (the rest are 1):
    a million workers cost one vectorised pass, not a million calls.
    """
    z = np.stack([zscores(x, role) for x in (beta, mu, sigma)], axis=1)
    out = np.ones_like(z)
    z_min = _z_of(fdr)
    idx = np.nonzero(z >= z_min)
    out[idx] = [math.erfc(v / math.sqrt(2.0)) for v in z[idx].tolist()]
    return out


def _z_of(p: float) -> float:
    """The z with two-sided p-value ``p`` (bisection on erfc; called once per function)."""
    lo, hi = 0.0, 40.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erfc(mid / math.sqrt(2.0)) > p else (lo, mid)
    return lo
