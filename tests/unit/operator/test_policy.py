"""Remediation policy: which diagnoses may mark their culprit node, and per-job overrides."""

from __future__ import annotations

from typing import Any

import pytest

from collscope.operator import errors, policy
from collscope.operator.analysis import diagnosis


def result(
    category: str | None = "hang.gpu",
    *,
    component: str = "gpu",
    node: str | None = "gpu-node-2",
    confidence: float = 0.9,
    anomaly: bool = True,
) -> diagnosis.Diagnosis:
    culprits = [diagnosis.Culprit(rank=3, node=node, component=component, score=0.9)]
    return diagnosis.Diagnosis(
        anomaly=anomaly, category=category, culprits=culprits, confidence=confidence
    )


@pytest.mark.parametrize(
    ("category", "component"),
    [
        ("hang.gpu", "gpu"),
        ("hang.network", "nic"),
        ("slow.network", "link"),
        ("slow.compute", "gpu"),
    ],
)
def test_hardware_categories_act(category: str, component: str) -> None:
    d = policy.decide(policy.RemediationPolicy(), result(category, component=component))
    assert d.act and not d.dry_run and d.node == "gpu-node-2"
    assert category in d.reason and d.reason.startswith("cordon gpu-node-2")


@pytest.mark.parametrize(
    ("d", "why"),
    [
        (result("hang.not_entered", component="software"), "not remediated by policy"),
        (result("slow.host", component="host"), "not remediated by policy"),
        (result("slow.compute", component="host"), "not a GPU, NIC or link"),
        (result(confidence=0.5), "confidence 0.50 below threshold 0.70"),
        (result(node=None), "culprit node unknown"),
        (result(None, anomaly=False), "no anomaly"),
        (diagnosis.Diagnosis(anomaly=True, category="hang.gpu", confidence=1.0), "no culprit"),
    ],
)
def test_other_diagnoses_do_not_act(d: diagnosis.Diagnosis, why: str) -> None:
    decision = policy.decide(policy.RemediationPolicy(), d)
    assert not decision.act
    assert why in decision.reason


def test_non_hardware_category_refused_even_if_listed() -> None:
    p = policy.RemediationPolicy(categories=frozenset({"hang.not_entered"}))
    d = policy.decide(p, result("hang.not_entered", component="gpu"))
    assert not d.act and "not a hardware fault" in d.reason


@pytest.mark.parametrize("category", ["hang.process", "hang.node"])
def test_dead_frozen_or_lost_never_cordons(category: str) -> None:
    """Issue 12: a dead or frozen process, a lost node: not by default, and not even when a
    policy lists the category and lowers the bar to nothing (a GPU culprit at confidence 1)."""
    d = policy.decide(policy.RemediationPolicy(), result(category, confidence=1.0))
    assert not d.act and d.reason == f"category {category} is not remediated by policy"
    lax = policy.RemediationPolicy(confidence_threshold=0.0, categories=frozenset({category}))
    d = policy.decide(lax, result(category, confidence=1.0))
    assert not d.act and d.reason == f"category {category} is not a hardware fault"


def test_disabled_and_dry_run() -> None:
    off = policy.RemediationPolicy(enabled=False)
    assert policy.decide(off, result()).reason == "remediation disabled"
    dry = policy.decide(policy.RemediationPolicy(dry_run=True), result())
    assert dry.act and dry.dry_run and dry.reason.startswith("would cordon")


def test_threshold_is_inclusive() -> None:
    p = policy.RemediationPolicy(confidence_threshold=0.75)
    assert policy.decide(p, result(confidence=0.75)).act


def test_overrides_merge_over_helm_defaults() -> None:
    helm = policy.RemediationPolicy.from_values({"dryRun": True, "confidenceThreshold": 0.8})
    assert helm.dry_run and helm.confidence_threshold == 0.8 and helm.enabled
    job = helm.merged({"dryRun": False, "categories": ["hang.gpu"]})
    assert not job.dry_run and job.confidence_threshold == 0.8
    assert job.categories == frozenset({"hang.gpu"})
    assert helm.merged(None) is helm and helm.merged({}) is helm
    assert policy.RemediationPolicy().categories == frozenset(
        {"hang.gpu", "hang.network", "slow.network", "slow.compute"}
    )


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"dryrun": True}, "unknown remediation keys"),
        ({"dryRun": "yes"}, "dryRun must be true or false"),
        ({"confidenceThreshold": 1.5}, "confidenceThreshold must be in 0..1"),
        ({"categories": ["hang.cosmic"]}, "unknown remediation categories"),
    ],
)
def test_bad_overrides_are_refused(overrides: dict[str, Any], needle: str) -> None:
    with pytest.raises(errors.PolicyError, match=needle):
        policy.RemediationPolicy().merged(overrides)
