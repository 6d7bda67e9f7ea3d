"""The k-sigma rule (LLMPrism §IV-D) and its guards."""

from __future__ import annotations

import numpy as np

from collscope.operator.analysis.flows import ksigma


def test_one_outlier_among_few_units_is_found_only_leaving_it_out() -> None:
    values = np.array([[1.00], [1.01], [0.99], [1.02], [2.0]])
    _, flags = ksigma.across(values, k=3, rel_sigma=0.0, min_peers=3)
    assert flags[:, 0].tolist() == [False, False, False, False, True]
    # with the unit in its own mean and sigma, z can never pass (n - 1)/sqrt(n) = 1.79
    v = values[:, 0]
    assert ((v[4] - v.mean()) / v.std()) < 3


def test_sigma_floor_ignores_a_tiny_wobble() -> None:
    values = np.array([[1.000], [1.0001], [0.9999], [1.004]])
    _, loose = ksigma.across(values, k=3, rel_sigma=0.0, min_peers=3)
    _, floored = ksigma.across(values, k=3, rel_sigma=0.01, min_peers=3)
    assert loose[3, 0] and not floored[3, 0]


def test_low_is_worse_for_bandwidth_and_two_outliers_do_not_mask_each_other() -> None:
    values = np.array([[45.0], [44.0], [46.0], [45.5], [44.5], [15.0], [16.0]])
    _, flags = ksigma.across(values, k=3, rel_sigma=0.02, min_peers=3, worse="low")
    assert flags[:, 0].tolist() == [False] * 5 + [True, True]
    # the plain leave-one-out rule misses both: the other slow switch inflates sigma
    v = values[:, 0]
    others = np.delete(v, 5)
    assert (others.mean() - v[5]) / others.std() < 3


def test_too_few_peers_are_not_tested() -> None:
    scores, flags = ksigma.across(np.array([[1.0], [5.0], [1.0]]), k=3, rel_sigma=0.0, min_peers=3)
    assert not flags.any() and np.isnan(scores.z).all()


def test_along_uses_only_earlier_normal_steps() -> None:
    d = np.array([np.nan, 10.0, 10.1, 9.9, 10.0, 13.0, 13.1, 10.0])
    scores, flags = ksigma.along(d, k=3, rel_sigma=0.01, min_baseline=3)
    assert flags[0].tolist() == [False] * 5 + [True, True, False]
    assert scores.peers[0, 6] == 4  # step 5 (an outlier) is not in step 6's baseline


def test_persistence() -> None:
    flags = np.array([[True, False, True, True, True], [True, False, False, False, True]])
    first, reached = ksigma.persistent(flags, 2)
    assert first.tolist() == [2, -1] and reached.tolist() == [3, -1]
