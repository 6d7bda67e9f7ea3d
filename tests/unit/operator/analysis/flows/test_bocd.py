"""BOCD step division (LLMPrism §IV-B) on synthetic interval series."""

from __future__ import annotations

import numpy as np
import pytest

from collscope.operator.analysis.flows import bocd

S = bocd.BocdSettings()
MS = 1e6


def _steps(
    rng: np.random.Generator, steps: int, per_step: int, gap_ms: float
) -> tuple[np.ndarray, np.ndarray]:
    """Idle intervals (ns) of ``steps`` steps: short ones inside, one long gap closing each."""
    idle, truth = [], []
    for _ in range(steps):
        idle += list(rng.uniform(0.0, 0.08 * MS, per_step - 1))  # back-to-back buckets
        truth += [False] * (per_step - 1)
        idle.append(rng.normal(gap_ms, gap_ms * 0.01) * MS)
        truth.append(True)
    return np.array(idle), np.array(truth)


def test_every_step_gap_of_a_dp_series_is_a_boundary_and_nothing_else() -> None:
    rng = np.random.default_rng(0)
    idle, truth = _steps(rng, steps=12, per_step=5, gap_ms=4000.0)
    flags = bocd.boundaries([bocd.log_intervals(idle, S)], S)
    assert np.array_equal(flags, truth)


def test_stationary_series_has_no_boundary() -> None:
    rng = np.random.default_rng(1)
    series = [bocd.log_intervals(rng.lognormal(np.log(100 * MS), 0.6, 300), S) for _ in range(50)]
    assert not bocd.boundaries(series, S).any()


def test_a_short_interval_is_never_a_boundary() -> None:
    # intervals well below the series' median: a change, but not a pause between steps
    idle = np.full(60, 200 * MS)
    idle[30] = 0.0
    prob = bocd.gap_probability_flat(bocd.log_intervals(idle, S), np.array([60]), S)
    assert prob[30] == 0.0


def test_batched_series_equal_one_by_one() -> None:
    rng = np.random.default_rng(2)
    series = [
        bocd.log_intervals(_steps(rng, steps=k, per_step=3 + k % 4, gap_ms=3000.0)[0], S)
        for k in range(1, 9)
    ]
    together = bocd.boundaries(series, S)
    alone = np.concatenate([bocd.boundaries([x], S) for x in series])
    assert np.array_equal(together, alone)
    assert together.sum() >= sum(len(x) // 8 for x in series)  # not trivially all False


def test_threshold_is_the_papers_and_applies() -> None:
    assert S.threshold == 0.95
    rng = np.random.default_rng(3)
    idle, _ = _steps(rng, steps=6, per_step=4, gap_ms=50.0)  # weak gaps: ~500x the floor
    x = [bocd.log_intervals(idle, S)]
    prob = bocd.gap_probability_flat(x[0], np.array([len(x[0])]), S)
    strict = bocd.BocdSettings(threshold=float(np.max(prob)))
    assert bocd.boundaries(x, S).sum() >= bocd.boundaries(x, strict).sum() == 0


@pytest.mark.parametrize("n", [0, 1, 2])
def test_tiny_series(n: int) -> None:
    flags = bocd.boundaries([np.full(n, 15.0)], S)
    assert flags.shape == (n,) and not flags.any()
