"""The k-sigma rule of LLMPrism §IV-D, across units (groups, switches) and along time (steps).

A data point is an outlier when it exceeds ``mean + k·sigma`` of its reference population, k = 3
(the paper; sigma is the population standard deviation: the paper's printed formula drops the
square and the root). Three practical guards, each a setting:

- *leave one out*: across units, a unit is compared with the others only. With the unit itself
  in the mean and sigma, one outlier among n units can never reach z = 3 unless n > 10 (its own
  weight bounds z by (n - 1)/√n), and jobs often have fewer DP groups than that;
- *sigma floor*: sigma is at least ``rel_sigma`` x |mean|, so that units or steps that agree
  to 0.1 % do not turn a 0.5 % wobble into an alarm;
- *persistence*: a unit is reported only when it is an outlier in ``persist`` consecutive
  steps or bins, so that one delayed step (a checkpoint, a data-loader hiccup) is not a fault;
- *outliers out of the reference*: across units, the reference leaves out units far from the
  median (k robust sigmas), then the units found outliers, so that two faults (two congested
  switches) do not mask each other by inflating sigma.

Arrays are ``[units, times]`` with NaN where a unit has no value.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Scores:
    """z-scores and their references, ``[units, times]`` (NaN where not tested)."""

    z: FloatArray
    mean: FloatArray
    sigma: FloatArray
    peers: IntArray  # units in the reference


def across(
    values: FloatArray,
    *,
    k: float,
    rel_sigma: float,
    min_peers: int,
    worse: str = "high",
    rounds: int = 2,  # re-scorings with the outliers out of the reference (picked: two settle)
) -> tuple[Scores, BoolArray]:
    """Leave-one-out k-sigma of each unit against the other units at the same time.

    ``worse`` is "high" (durations, time per byte) or "low" (bandwidth). The reference starts
    as the units within k robust sigmas (1.4826 MAD) of the median, so that several outliers
    cannot hide each other by inflating sigma; after each of ``rounds`` scorings it becomes
    the units that were not outliers.
    """
    ok = ~np.isnan(values)
    sign = 1.0 if worse == "high" else -1.0
    ref = ok
    if ok.any():
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
            med = np.nanmedian(values, axis=0, keepdims=True)
            mad = np.nanmedian(np.abs(values - med), axis=0, keepdims=True)
            # 1.4826 = 1 / Φ⁻¹(3/4): MAD of a normal sample x this is its standard deviation
            spread = np.maximum(1.4826 * mad, rel_sigma * np.abs(med))
            robust = sign * (values - med) / spread
        ref = ok & ~(np.nan_to_num(robust, nan=0.0, posinf=np.inf) > k)
    for _ in range(max(1, rounds)):
        scores, flags = _score(
            values, ok, ref, k=k, rel_sigma=rel_sigma, min_peers=min_peers, worse=worse
        )
        narrower = ok & ~flags
        if np.array_equal(narrower, ref):
            break
        ref = narrower
    return scores, flags


def _score(
    values: FloatArray,
    ok: BoolArray,
    ref: BoolArray,
    *,
    k: float,
    rel_sigma: float,
    min_peers: int,
    worse: str,
) -> tuple[Scores, BoolArray]:
    v = np.where(ok, values, 0.0)
    r = np.where(ref, v, 0.0)
    n = ref.sum(axis=0, keepdims=True)
    s1 = r.sum(axis=0, keepdims=True)
    s2 = (r * r).sum(axis=0, keepdims=True)
    own = np.where(ref, v, 0.0)  # a unit in the reference leaves itself out
    peers = np.broadcast_to(n - ref, values.shape).astype(np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = (s1 - own) / peers
        var = (s2 - own * own) / peers - mean * mean
    sigma = np.maximum(np.sqrt(np.maximum(var, 0.0)), rel_sigma * np.abs(mean))
    tested = ok & (peers >= min_peers) & (sigma > 0)
    sign = 1.0 if worse == "high" else -1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(tested, sign * (v - mean) / sigma, np.nan)
    scores = Scores(
        z=z,
        mean=np.where(tested, mean, np.nan),
        sigma=np.where(tested, sigma, np.nan),
        peers=peers,
    )
    return scores, np.nan_to_num(z, nan=-np.inf) > k


def along(
    values: FloatArray, *, k: float, rel_sigma: float, min_baseline: int
) -> tuple[Scores, BoolArray]:
    """Each time point of one series against the earlier points that were not outliers.

    ``values`` is ``[times]``; the result has one unit. Higher is worse (step durations).
    """
    n = len(values)
    z = np.full(n, np.nan)
    mean = np.full(n, np.nan)
    sigma = np.full(n, np.nan)
    base = np.zeros(n, dtype=np.int64)
    flagged = np.zeros(n, dtype=bool)
    history: list[float] = []
    for i, x in enumerate(values.tolist()):
        if np.isnan(x):
            continue
        if len(history) >= min_baseline:
            m = float(np.mean(history))
            s = max(float(np.std(history)), rel_sigma * abs(m))
            mean[i], sigma[i], base[i] = m, s, len(history)
            z[i] = (x - m) / s if s > 0 else np.nan
            flagged[i] = bool(z[i] > k)
        if not flagged[i]:
            history.append(x)
    scores = Scores(z=z[None, :], mean=mean[None, :], sigma=sigma[None, :], peers=base[None, :])
    return scores, flagged[None, :]


def persistent(flags: BoolArray, persist: int) -> tuple[IntArray, IntArray]:
    """For each unit, (first time of its first run of ``persist`` consecutive outliers, the
    time that run reached ``persist``); -1, -1 for units without one."""
    units, times = flags.shape
    first = np.full(units, -1, dtype=np.int64)
    reached = np.full(units, -1, dtype=np.int64)
    if times == 0 or persist < 1:
        return first, reached
    run = np.zeros(units, dtype=np.int64)
    for t in range(times):
        run = np.where(flags[:, t], run + 1, 0)
        hit = (run >= persist) & (reached < 0)
        reached[hit] = t
        first[hit] = t - persist + 1
    return first, reached
