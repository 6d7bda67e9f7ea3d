"""Bayesian online change-point detection (BOCD) of step boundaries in inter-flow intervals.

LLMPrism §IV-B divides the flows of one endpoint pair (and, in §IV-C, the DP flows of one GPU)
into training steps: "intervals between communication flows within the same step are
significantly shorter than those between adjacent steps", and BOCD reports timestamp t as a
change point when the posterior probability of run length ``r_t = 0`` exceeds 0.95.

The recursion is Adams & MacKay's (2007) over the run length ``r`` (intervals seen since the
last boundary), with a Normal-Gamma conjugate model of ``log(interval)`` inside a step, so the
predictive of a run of ``r`` intervals is a Student-t:

    P(r_t = r + 1, x_1..t)  ∝  P(r_{t-1} = r, x_1..t-1) · (1 - H) · t_r(x_t)
    P(r_t = 0,     x_1..t)  ∝  H · p_gap(x_t)

Two modelling choices make ``P(r_t = 0)`` the probability that interval ``x_t`` *is* a step
boundary, which is what the paper thresholds:

- In the textbook recursion the change branch scores ``x_t`` with the previous run's
  predictive too, so ``P(r_t = 0 | x) ≡ H`` and no threshold above ``H`` ever fires. Here the
  boundary interval is scored by its own density ``p_gap`` (uniform over ``gap_span`` e-folds
  above the series' median: a boundary is a long pause, never a short one) and the next step
  starts with no observations: the gap belongs to neither step.
- The prior is empirical Bayes per series: mean = median of the log-intervals, scale =
  1.4826·MAD (at least ``min_scale``), ``alpha0`` pseudo-observations of it. A step's intervals
  are then judged against the series' own typical spacing.

Run lengths are truncated at ``max_run`` (the longest run absorbs the tail and is scored on
its last ``max_run - 1`` intervals), so the cost is O(T · max_run) per series. Many series are
processed at once, padded to a common length and sorted by length so that step t touches only
the series still running: one numpy pass per time step for tens of thousands of pairs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class BocdSettings:
    """BOCD parameters; defaults tuned on simulated flows (see bench/flows_accuracy.py).

    Every one is a probability, a count of intervals or a scale in e-folds of the series' own
    intervals (the prior is the series' median and MAD), except ``floor_ns``, a timestamp
    resolution. None assumes a step length: a longer step is a longer gap between DP phases,
    which only makes its boundary stand out more (``p_gap`` has no upper end, see
    ``gap_span``). Flows are transfer records, not samples: no sampling interval enters.
    """

    # LLMPrism §IV-B: "If this likelihood exceeds a predefined threshold (set to 0.95 ...)".
    threshold: float = 0.95
    # Prior probability that any one interval is a boundary: 1/50, picked between the flows
    # per step of a DP pair (a few buckets) and of a PP pair (2 flows per micro-batch), checked
    # on bench/flows_accuracy.py. A count of flows per step, not a time: steps of any length.
    hazard: float = 0.02
    # Run lengths kept, in intervals (cost O(T x max_run)); longer runs share the longest
    # slot, whose statistics are then the last 31 intervals: enough for a Student-t of a
    # step's spacing. Picked for speed (bench/flows_accuracy.py part 4); a count.
    max_run: int = 32
    # Prior pseudo-observations of the variance and of the mean: the weakest proper prior
    # (2 dof, heavy tails), so that a step's own intervals decide after a few. Picked.
    alpha0: float = 1.0
    kappa0: float = 1.0
    # Floor of the prior's scale, in e-folds of the interval (a factor e^0.5 ≈ 1.6): a series
    # whose intervals are all equal must not make every small wobble a boundary. Picked on
    # the simulator's flows; relative, so independent of step length and link speed.
    min_scale: float = 0.5
    # The boundary density p_gap is uniform over 9.2 e-folds (e^9.2 ≈ 10^4 times the median
    # interval) above the median: it sets how unlikely a long pause is a priori, not a cap. A
    # gap beyond it (a step over 10^4 intra-step intervals, e.g. 10 s at the 1 ms floor) is
    # scored with the same density and is an even clearer boundary (the run's Student-t falls
    # further). Picked: 10^4 spans ms-scale intra-step spacing to 10 s pauses.
    gap_span: float = 9.2
    # Intervals are idle times plus 1 ms: IPFIX stamps flows in milliseconds, and an idle gap
    # shorter than that is a launch latency between back-to-back transfers (DP buckets, QPs
    # of one collective), not a pause. Overlapping flows (idle 0) then stay finite.
    floor_ns: float = 1_000_000.0


def log_intervals(idle_ns: FloatArray, settings: BocdSettings) -> FloatArray:
    """``log(idle + floor)``: the observation BOCD models (natural log of ns)."""
    return np.log(np.maximum(idle_ns, 0.0) + settings.floor_ns)


def boundaries(series: Sequence[FloatArray], settings: BocdSettings = BocdSettings()) -> BoolArray:
    """Boundary flags of many log-interval series, concatenated in the order given.

    ``series[i]`` holds one pair's (or GPU's) log-intervals in time order; the result has
    ``sum(len(s))`` flags, True where ``P(r_t = 0 | x_1..t) > threshold``.
    """
    lengths = np.fromiter((len(s) for s in series), dtype=np.int64, count=len(series))
    flat = np.concatenate(series) if len(series) else np.zeros(0)
    return boundaries_flat(flat, lengths, settings)


def boundaries_flat(
    flat: FloatArray, lengths: IntArray, settings: BocdSettings = BocdSettings()
) -> BoolArray:
    """As ``boundaries``, for series given as one flat array split by ``lengths``."""
    prob = gap_probability_flat(flat, lengths, settings)
    return prob > settings.threshold


def gap_probability_flat(
    flat: FloatArray, lengths: IntArray, settings: BocdSettings = BocdSettings()
) -> FloatArray:
    """``P(r_t = 0 | x_1..t)`` for every interval of every series (flat, in input order)."""
    out = np.zeros(len(flat))
    if len(flat) == 0:
        return out
    order = np.argsort(-lengths, kind="stable")
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    n_series, width = len(lengths), int(lengths.max())
    # Padded [series, time], longest first; positions past a series' end are never read.
    col = np.arange(width)
    sorted_len = lengths[order]
    take = starts[order][:, None] + np.minimum(col[None, :], np.maximum(sorted_len - 1, 0)[:, None])
    x = flat[take] if len(flat) else np.zeros((n_series, width))
    prob = _run(x, sorted_len, settings)
    # Scatter back to the flat input order.
    valid = col[None, :] < sorted_len[:, None]
    out[take[valid]] = prob[valid]
    return out


def _median_rows(x: FloatArray, lengths: IntArray) -> FloatArray:
    """Median of each row's first ``lengths[i]`` values (rows padded past their length)."""
    width = x.shape[1]
    padded = np.where(np.arange(width)[None, :] < lengths[:, None], x, np.inf)
    padded.sort(axis=1)
    n = np.maximum(lengths, 1)
    rows = np.arange(len(x))
    lo = padded[rows, (n - 1) // 2]
    hi = padded[rows, n // 2]
    out: FloatArray = np.where(lengths > 0, (lo + hi) / 2.0, 0.0)
    return out


def _prior(x: FloatArray, lengths: IntArray, settings: BocdSettings) -> tuple[FloatArray, ...]:
    """Per-series prior (mu0, beta0): median and MAD of the series' own log-intervals."""
    mu0 = _median_rows(x, lengths)
    mad = _median_rows(np.abs(x - mu0[:, None]), lengths)
    scale = np.maximum(1.4826 * mad, settings.min_scale)
    beta0 = settings.alpha0 * scale**2
    return mu0, beta0


def _run(x: FloatArray, lengths: IntArray, settings: BocdSettings) -> FloatArray:
    """The recursion over padded series sorted by length, longest first.

    Data are centred on the prior mean (mu0 = 0), so that the Normal-Gamma posterior of a run
    of r intervals with sums s1, s2 has mean s1/κ and β = β0 + s2/2 - s1²/(2κ), κ = κ0 + r.
    Each run's sums move one slot up per step (plus the new interval); the last slot takes
    the growth of the last two, which makes it the window of the last ``max_run - 1``.
    """
    n_series, width = x.shape
    runs = max(2, min(settings.max_run, width + 1))
    mu0, beta0 = _prior(x, lengths, settings)
    xc = (x - mu0[:, None]).astype(np.float32)
    b0 = beta0.astype(np.float32)[:, None]
    k0, a0, h = settings.kappa0, settings.alpha0, settings.hazard
    r = np.arange(runs, dtype=np.float64)
    kappa = k0 + r
    alpha = a0 + r / 2.0
    nu = 2.0 * alpha
    c = (kappa + 1.0) / (alpha * kappa)  # Student-t scale² = β·c
    lg = np.array([math.lgamma((v + 1.0) / 2.0) - math.lgamma(v / 2.0) for v in nu])
    const_a = (lg - 0.5 * np.log(nu * math.pi * c)).astype(np.float32)
    const_b = ((nu + 1.0) / 2.0).astype(np.float32)
    const_d = (nu * c).astype(np.float32)
    inv_k = (1.0 / kappa).astype(np.float32)
    half_inv_k = (0.5 / kappa).astype(np.float32)
    # Boundary branch relative to growth (the common 1 - H cancels in the normalisation).
    log_cp = np.float32(math.log(h) - math.log1p(-h) - math.log(settings.gap_span))
    s1 = np.zeros((n_series, runs), dtype=np.float32)
    s2 = np.zeros((n_series, runs), dtype=np.float32)
    log_r = np.full((n_series, runs), -np.inf, dtype=np.float32)
    log_r[:, 0] = 0.0
    prob = np.zeros((n_series, width))
    active = n_series
    for t in range(width):
        while active and lengths[active - 1] <= t:
            active -= 1
        if not active:
            break
        a = slice(0, active)
        xt = xc[a, t : t + 1]
        s1a, s2a = s1[a], s2[a]
        d = xt - s1a * inv_k
        beta = b0[a] + 0.5 * s2a - s1a * s1a * half_inv_k
        grow = log_r[a] + (
            const_a - 0.5 * np.log(beta) - const_b * np.log1p(d * d / (beta * const_d))
        )
        new = np.empty_like(grow)
        new[:, 1:] = grow[:, :-1]
        new[:, -1] = np.logaddexp(grow[:, -2], grow[:, -1])
        new[:, 0] = np.where(xt[:, 0] > 0, log_cp, -np.inf)
        new -= new.max(axis=1, keepdims=True)
        new -= np.log(np.exp(new).sum(axis=1, keepdims=True))
        log_r[a] = new
        prob[a, t] = np.exp(new[:, 0])
        s1a[:, 1:] = s1a[:, :-1] + xt
        s1a[:, 0] = 0.0
        s2a[:, 1:] = s2a[:, :-1] + xt * xt
        s2a[:, 0] = 0.0
    return prob
