"""Differential distance Δ and its robust outlier rule (EROICA §4.3, Eq. 8-11).

For one function f over the workers W that ran it:

1. max-normalise each dimension of P_f,w = (β, μ, sigma) over W (Eq. 8); a dimension that is 0
   on every worker stays 0;
2. draw W_N, N = min(100, |W|) workers at random (one sample for all workers of f, seeded so a
   bundle always gives the same answer) and let Δ_f,w be the share of W_N whose normalised
   pattern is at Manhattan distance >= δ = 0.4 from w's (Eq. 9-10): how *unique* w is, not how
   far it is (§3: a bigger distance is not a worse worker);
3. w is an outlier when Δ_f,w > M_f + k·MAD_f, k = 5, with M_f and MAD_f the median and the
   median absolute deviation of Δ_f over W (Eq. 11).

Δ is a multiple of 1/N, so on a healthy job MAD is often exactly 0 and the bare rule would flag
a worker that differs from one more sample member than its peers; MAD is floored at 1/N
(``mad_floor_samples``), so an outlier must differ from k more sampled workers than the median.
Ours too: Δ must also exceed ``min_delta`` = 0.7, i.e. an outlier is unlike 70 % of the sampled
workers. Without it the edges of a continuous spread (the paper's own healthy SendRecv β of
9-16 %, §6.2, normalised to 0.56-1.0) differ from a tail of 5-10 % of the sample and are flagged.

Vectorised: the |W| x N x 3 distance tensor is built in float32 blocks of ``block_rows``
workers, so a million workers take a few hundred MB at most and about a second per function.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
Bool = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class DifferentialSettings:
    """Eq. 9-11's constants; the paper's values (EROICA §4.3) where it has one.

    Distances are between max-normalised (β, μ, sigma), Δ is a share of sampled workers: no
    setting is a time, none assumes a step length or a sampling interval.
    """

    sample_max: int = 100  # N = min(100, |W|) (§4.3): workers each worker is compared with
    delta: float = 0.4  # δ of Eq. 10 (§4.3): Manhattan distance of normalised patterns
    k: float = 5.0  # k of Eq. 11 (§4.3): MADs above the median Δ
    # MAD floored at this many 1/N steps (module docstring): Δ is a multiple of 1/N. Ours.
    mad_floor_samples: float = 1.0
    # Ours: an outlier differs from at least 70 % of the sampled workers (module docstring:
    # set against the paper's healthy SendRecv spread, §6.2); checked on bench/
    # patterns_localise.py (0 false alarms on healthy jobs at CV 5 % and 30 %).
    min_delta: float = 0.7
    block_rows: int = 32_768  # workers per block of the distance tensor (memory, not a verdict)
    seed: int = 0  # of the worker sample: a bundle always gives the same answer


@dataclass(frozen=True)
class Outliers:
    """Δ of every worker of one function, and the Eq. 11 threshold it was held to."""

    delta: F64
    median: float
    mad: float
    threshold: float
    mask: Bool  # Δ > threshold


def normalise(beta: F64, mu: F64, sigma: F64) -> F32:
    """Eq. 8: each dimension divided by its maximum over the workers (0 stays 0)."""
    p = np.stack((beta, mu, sigma), axis=1).astype(np.float32)
    top = p.max(axis=0) if p.shape[0] else np.ones(3, dtype=np.float32)
    top[top <= 0] = 1.0
    out: F32 = p / top
    return out


def distance(points: F32, settings: DifferentialSettings, rng: np.random.Generator) -> F64:
    """Δ of each row of ``points`` (normalised patterns, one row per worker), Eq. 9-10."""
    n = points.shape[0]
    if n == 0:
        return np.zeros(0)
    size = min(settings.sample_max, n)
    sample = points[rng.choice(n, size=size, replace=False)]
    counts = np.empty(n, dtype=np.int64)
    step = max(1, settings.block_rows)
    for lo in range(0, n, step):
        block = points[lo : lo + step]
        d = np.abs(block[:, None, :] - sample[None, :, :]).sum(axis=2)
        counts[lo : lo + step] = np.count_nonzero(d >= settings.delta, axis=1)
    out: F64 = counts / float(size)
    return out


def outliers(delta: F64, settings: DifferentialSettings, n_sample: int) -> Outliers:
    """Eq. 11's Δ > M + k·MAD, with MAD floored (module docstring)."""
    if delta.size == 0:
        return Outliers(delta, 0.0, 0.0, 0.0, np.zeros(0, dtype=bool))
    med = float(np.median(delta))
    mad = float(np.median(np.abs(delta - med)))
    floor = settings.mad_floor_samples / max(1, n_sample)
    threshold = max(med + settings.k * max(mad, floor), settings.min_delta)
    return Outliers(delta, med, mad, threshold, delta > threshold)


def analyse(
    beta: F64, mu: F64, sigma: F64, settings: DifferentialSettings, rng: np.random.Generator
) -> Outliers:
    """Steps 1-3 of the module docstring for one function's workers."""
    delta = distance(normalise(beta, mu, sigma), settings, rng)
    return outliers(delta, settings, min(settings.sample_max, beta.size))
