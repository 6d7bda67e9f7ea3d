"""EROICA §4.3 piece by piece: D against expected ranges, Δ and its outlier rule, Eq. 11."""

from __future__ import annotations

import numpy as np
import pytest

from collscope.operator import errors
from collscope.operator.analysis.patterns import differential, expectation, localise, table


def _table(beta: list[float], mu: list[float], sigma: list[float], kind: str) -> table.PatternTable:
    n = len(beta)
    return table.PatternTable.from_arrays(
        rank=range(n), fn_id=[0] * n, beta=beta, mu=mu, sigma=sigma, fns=["f"], fn_kind=[kind]
    )


def test_distance_from_expectation_is_manhattan_to_the_box() -> None:
    r = expectation.DEFAULT_RANGES["python"]
    d = expectation.distance(
        np.array([0.005, 0.01, 0.27]), np.array([0.5, 1.0, 0.0]), np.array([0.1, 0.0, 1.0]), r
    )
    assert d == pytest.approx([0.0, 0.0, 0.26])
    comm = expectation.DEFAULT_RANGES["comm"]
    assert expectation.distance(np.array([0.35]), np.array([0.5]), np.array([0.5]), comm)[
        0
    ] == pytest.approx(0.05)
    kernel = expectation.DEFAULT_RANGES["kernel"]
    assert expectation.distance(np.array([1.0]), np.array([0.0]), np.array([1.0]), kernel)[0] == 0


def test_normalise_divides_by_the_max_and_keeps_zero_columns() -> None:
    p = differential.normalise(np.array([0.1, 0.2]), np.array([0.0, 0.0]), np.array([0.5, 0.25]))
    assert np.allclose(p, [[0.5, 0.0, 1.0], [1.0, 0.0, 0.5]])


def test_delta_counts_sampled_workers_at_least_delta_away() -> None:
    pts = np.array([[1.0, 1.0, 1.0]] * 9 + [[0.0, 1.0, 1.0]], dtype=np.float32)
    s = differential.DifferentialSettings()
    d = differential.distance(pts, s, np.random.default_rng(0))
    assert d[-1] == pytest.approx(0.9)  # unlike the 9 others (N = 10 = everyone)
    assert d[:-1] == pytest.approx([0.1] * 9)


def test_delta_uses_blocks_without_changing_the_result() -> None:
    rng = np.random.default_rng(3)
    pts = rng.random((1000, 3)).astype(np.float32)
    a = differential.distance(pts, differential.DifferentialSettings(), np.random.default_rng(1))
    b = differential.distance(
        pts, differential.DifferentialSettings(block_rows=7), np.random.default_rng(1)
    )
    assert np.array_equal(a, b)


def test_outlier_rule_is_median_plus_k_mad_with_floors() -> None:
    s = differential.DifferentialSettings()
    delta = np.array([0.0] * 97 + [0.02, 0.95, 1.0])
    out = differential.outliers(delta, s, n_sample=100)
    assert out.median == 0.0 and out.mad == 0.0
    assert out.threshold == pytest.approx(0.7)  # floor min_delta above median + 5 x 0.01
    assert out.mask.nonzero()[0].tolist() == [98, 99]
    spread = np.linspace(0.7, 0.9, 100)
    assert differential.outliers(spread, s, 100).mask.sum() == 0  # k MAD above the median


def test_eq11_needs_beta_above_one_percent() -> None:
    # A worker unlike all others in mu, but at beta 0.005: it costs nothing, so not abnormal.
    n = 50
    t = _table([0.005] * n, [0.9] * (n - 1) + [0.1], [0.1] * n, "kernel")
    f = localise.function(
        t, 0, lo=0, hi=n, s=localise.LocaliseSettings(), rng=np.random.default_rng(0)
    )
    assert f is None
    t = _table([0.3] * n, [0.9] * (n - 1) + [0.1], [0.1] * n, "kernel")
    f = localise.function(
        t, 0, lo=0, hi=n, s=localise.LocaliseSettings(), rng=np.random.default_rng(0)
    )
    assert f is not None and f.ranks.tolist() == [n - 1] and f.by_difference == 1


def test_eq11_flags_every_worker_outside_the_expected_range() -> None:
    n = 40
    t = _table([0.05] * n, [0.9] * n, [0.1] * n, "python")  # recv_into on all workers (§6.1)
    f = localise.function(
        t, 0, lo=0, hi=n, s=localise.LocaliseSettings(), rng=np.random.default_rng(0)
    )
    assert f is not None and f.common and f.by_expectation == n and f.by_difference == 0


def test_table_rejects_bad_input() -> None:
    with pytest.raises(errors.AnalysisError, match="kind"):
        table.PatternTable.from_arrays(
            rank=[0], fn_id=[0], beta=[0.1], mu=[0.1], sigma=[0.1], fns=["f"], fn_kind=["gpu"]
        )
    with pytest.raises(errors.AnalysisError, match="beta"):
        table.PatternTable.from_arrays(
            rank=[0], fn_id=[0], beta=[1.5], mu=[0.1], sigma=[0.1], fns=["f"], fn_kind=["comm"]
        )


def test_function_missing_on_most_workers_is_compared_with_all_of_them() -> None:
    # The probe writes only functions that reached the critical path: pin_memory appears on
    # 3 of 200 workers. Absent workers count as (0, 0, 0), so those 3 are the outliers.
    n = 200
    ranks = [*range(n), 5, 77, 150]
    fn_id = [0] * n + [1, 1, 1]
    beta = [0.4] * n + [0.02, 0.03, 0.025]  # inside memory's expected β ≤ 0.05
    t = table.PatternTable.from_arrays(
        rank=ranks,
        fn_id=fn_id,
        beta=beta,
        mu=[0.9] * (n + 3),
        sigma=[0.05] * (n + 3),
        fns=["gemm", "pin_memory"],
        fn_kind=["kernel", "memory"],
    )
    spans = t.spans()
    fid, lo, hi = spans[1]
    f = localise.function(
        t,
        fid,
        lo=lo,
        hi=hi,
        s=localise.LocaliseSettings(),
        rng=np.random.default_rng(0),
        all_ranks=np.unique(t.rank),
    )
    assert f is not None and f.ranks.tolist() == [5, 77, 150]
    assert f.by_expectation == 0 and f.by_difference == 3 and f.workers == n
    assert not f.common
