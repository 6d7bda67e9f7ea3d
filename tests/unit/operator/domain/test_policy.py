"""Remediation policy: which diagnoses may go on to confirmation, and the cluster's floor that a
TrainingJob may only tighten."""

from __future__ import annotations

from typing import Any

import pytest

from collscope.operator import errors
from collscope.operator.analysis import diagnosis
from collscope.operator.domain import policy


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
    ("d", "code", "why"),
    [
        (result("hang.not_entered", component="software"), "SoftwareHang", "software hang"),
        (result("hang.inconsistent", component="software"), "SoftwareHang", "software hang"),
        (result("slow.host", component="host"), "HostSide", "not hardware"),
        (result("slow.mixed"), "CategoryNotRemediated", "not remediated by policy"),
        (result("slow.compute", component="host"), "NotHardware", "not a GPU, NIC or link"),
        (result(confidence=0.5), "BelowThreshold", "confidence 0.50 below threshold 0.70"),
        (result(node=None), "CulpritNodeUnknown", "culprit node unknown"),
        (result(None, anomaly=False), "NoAnomaly", "no anomaly"),
        (diagnosis.Diagnosis(anomaly=True, category="hang.gpu", confidence=1.0), "NoCulprit",
         "no culprit"),
    ],
)  # fmt: skip
def test_other_diagnoses_do_not_act(d: diagnosis.Diagnosis, code: str, why: str) -> None:
    decision = policy.decide(policy.RemediationPolicy(), d)
    assert not decision.act
    assert decision.code == code and why in decision.reason


def test_non_hardware_category_refused_even_if_listed() -> None:
    p = policy.RemediationPolicy(categories=frozenset({"hang.not_entered"}))
    d = policy.decide(p, result("hang.not_entered", component="gpu"))
    assert not d.act and d.code == "SoftwareHang"


@pytest.mark.parametrize(
    ("category", "code"), [("hang.process", "ProcessDeath"), ("hang.node", "NodeUnreachable")]
)
def test_dead_frozen_or_lost_never_cordons(category: str, code: str) -> None:
    """Issue 12/14: a dead or frozen process, a lost node: not by default, and not even when a
    policy lists the category and lowers the bar to nothing (a GPU culprit at confidence 1);
    the decision says why not."""
    d = policy.decide(policy.RemediationPolicy(), result(category, confidence=1.0))
    assert not d.act and d.code == code and d.node == "gpu-node-2"
    lax = policy.RemediationPolicy(confidence_threshold=0.0, categories=frozenset({category}))
    d = policy.decide(lax, result(category, confidence=1.0))
    assert not d.act and d.code == code
    if category == "hang.process":
        assert "died or froze" in d.reason and "not at fault" in d.reason


def test_disabled_and_dry_run() -> None:
    off = policy.RemediationPolicy(enabled=False)
    d = policy.decide(off, result())
    assert d.reason == "remediation disabled" and d.code == "RemediationDisabled"
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
    assert policy.RemediationPolicy().confirm_delay_s == 30.0
    assert helm.merged({"confirmDelaySeconds": 5}).confirm_delay_s == 5.0


def test_tenant_cannot_lower_the_clusters_floor() -> None:
    """Issue 14's case: the operator is configured disabled + dry run; a TrainingJob switches
    remediation on, dry run off and the threshold to 0. A diagnosis at confidence 0.05 must not
    act, and the notes say which asks were ignored."""
    floor = policy.RemediationPolicy.from_values({"enabled": False, "dryRun": True})
    job = {"enabled": True, "dryRun": False, "confidenceThreshold": 0.0}
    pol, notes = floor.bounded(job)
    assert not pol.enabled and pol.dry_run and pol.confidence_threshold == 0.7
    d = policy.decide(pol, result(confidence=0.05))
    assert not d.act and d.code == "RemediationDisabled"
    assert any("enabled=true" in n for n in notes)
    assert any("dryRun=false" in n for n in notes)
    assert any("confidenceThreshold=0.0" in n and "floor 0.7" in n for n in notes)
    # With remediation on in the cluster, the threshold still holds against the job's 0.
    on = policy.RemediationPolicy.from_values({"enabled": True, "dryRun": False})
    pol, _ = on.bounded(job)
    d = policy.decide(pol, result(confidence=0.05))
    assert not d.act and d.code == "BelowThreshold"


def test_tenant_may_be_stricter() -> None:
    floor = policy.RemediationPolicy()
    pol, notes = floor.bounded(
        {"confidenceThreshold": 0.9, "dryRun": True, "categories": ["hang.gpu", "slow.mixed"],
         "confirmDelaySeconds": 60}
    )  # fmt: skip
    assert notes == [next(n for n in notes if "slow.mixed" in n)]  # the one looser ask
    assert pol.confidence_threshold == 0.9 and pol.dry_run and pol.enabled
    assert pol.categories == frozenset({"hang.gpu"}) and pol.confirm_delay_s == 60.0
    off, notes = floor.bounded({"enabled": False, "confirmDelaySeconds": 1})
    assert not off.enabled and off.confirm_delay_s == 30.0 and len(notes) == 1
    assert floor.bounded(None) == (floor, [])


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"dryrun": True}, "unknown remediation keys"),
        ({"dryRun": "yes"}, "dryRun must be true or false"),
        ({"confidenceThreshold": 1.5}, "confidenceThreshold must be in 0..1"),
        ({"categories": ["hang.cosmic"]}, "unknown remediation categories"),
        ({"confirmDelaySeconds": -1}, "confirmDelaySeconds must be in 0..600"),
    ],
)
def test_bad_overrides_are_refused(overrides: dict[str, Any], needle: str) -> None:
    with pytest.raises(errors.PolicyError, match=needle):
        policy.RemediationPolicy().merged(overrides)
