"""Load imbalance: GPU kernels with the same μ on every worker but a spread β (EROICA §6.2,
Problem 4: "almost all GPU computation kernel functions have similar μ but significantly
different β across workers ... the busiest GPU spends 46 % more time computing than the most
idle one").

Eq. 11 does not catch this: β spreads evenly, so no worker is unique and no kernel leaves its
expected range. So, per kernel with a median β above ``min_beta`` on at least ``min_workers``
workers, robust spreads over workers are compared: β's p95/p5 at least ``beta_spread`` while
μ's p95/p5 stays under ``mu_spread`` (equal hardware speed, unequal work). The job is
imbalanced when at least ``min_share`` of those kernels are, and the busiest workers (highest β
summed over the imbalanced kernels) are named. Thresholds are ours, set between the healthy
noise of real jobs (a few % in β) and the paper's 46 %.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collscope.operator.analysis.patterns import table


@dataclass(frozen=True)
class ImbalanceSettings:
    """Ours (module docstring), all shares of the profiling window, ratios or counts of
    workers: none assumes a step length or a sampling interval."""

    min_beta: float = 0.01  # a kernel examined costs over 1 % of the window (Eq. 11's β)
    min_workers: int = 8  # workers running it: p5 and p95 of fewer are the extremes
    # p95/p5 of β at least this (30 % between busy and idle workers; the paper's 46 % is
    # busiest over most idle, §6.2 Problem 4, healthy jobs a few %) ...
    beta_spread: float = 1.3
    mu_spread: float = 1.2  # ... with p95/p5 of μ below this (equal hardware speed)
    min_share: float = 0.5  # of the qualifying kernels: imbalance touches most of them
    busiest_share: float = 0.05  # culprits: the busiest 5 % of workers


@dataclass(frozen=True)
class KernelSpread:
    fn_id: int
    beta_ratio: float  # p95/p5
    mu_ratio: float
    max_over_min: float  # busiest over most idle worker's β


@dataclass(frozen=True)
class Imbalance:
    kernels: tuple[KernelSpread, ...]  # the imbalanced kernels
    qualifying: int  # kernels that were examined
    busiest: tuple[int, ...]  # ranks, busiest first
    busiest_beta: tuple[float, ...]  # their summed β over the imbalanced kernels
    median_beta: float  # summed β of the median worker


def _ratio(x: table.F64) -> float:
    lo, hi = np.percentile(x, [5, 95])
    return float("inf") if lo <= 0 else float(hi / lo)


def detect(
    t: table.PatternTable, spans: Sequence[tuple[int, int, int]], s: ImbalanceSettings
) -> Imbalance | None:
    """The imbalance finding of the module docstring, or None."""
    found: list[KernelSpread] = []
    qualifying = 0
    for fid, lo, hi in spans:
        if t.fn_kind[fid] != "kernel" or hi - lo < s.min_workers:
            continue
        beta, mu = t.beta[lo:hi], t.mu[lo:hi]
        if float(np.median(beta)) <= s.min_beta:
            continue
        qualifying += 1
        rb, rm = _ratio(beta), _ratio(mu)
        if rb >= s.beta_spread and rm < s.mu_spread:
            top = float(beta.max()) / max(float(beta.min()), 1e-12)
            found.append(KernelSpread(fid, rb, rm, top))
    if not found or len(found) < s.min_share * qualifying:
        return None
    keep = np.isin(t.fn_id, [k.fn_id for k in found])
    ranks, inverse = np.unique(t.rank[keep], return_inverse=True)
    total = np.bincount(inverse, weights=t.beta[keep])
    n = max(1, round(s.busiest_share * ranks.size))
    order = np.argsort(-total, kind="stable")[:n]
    return Imbalance(
        kernels=tuple(found),
        qualifying=qualifying,
        busiest=tuple(int(r) for r in ranks[order]),
        busiest_beta=tuple(float(b) for b in total[order]),
        median_beta=float(np.median(total)),
    )
