"""Remediation policy: whether a Diagnosis may mark its culprit node, and how.

Only hardware faults justify taking a node out of scheduling, and only when analysis is sure
enough (DESIGN.md §7; NVSentinel's lesson that safe defaults and dry run matter to users): the
category must be one of ``categories`` (default: ``hang.gpu``, ``hang.network``,
``slow.network``, ``slow.compute``), flagged as hardware in the category table
(``analysis.diagnosis.Category``), the top culprit's component a GPU, NIC or link, its node
known, and the confidence at least ``confidence_threshold``. ``dry_run`` records what would be
done and changes nothing. The circuit breaker (``breaker.py``) is applied after the policy.

Operator-wide defaults come from Helm values (``remediation:`` in values.yaml, camelCase keys as
in ``TrainingJob.spec.diagnosis.remediation``); a TrainingJob's overrides are merged over them
key by key (``merged``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from collscope.operator import errors, ids
from collscope.operator.analysis import diagnosis

DEFAULT_CATEGORIES = frozenset({"hang.gpu", "hang.network", "slow.network", "slow.compute"})
HARDWARE_COMPONENTS = frozenset({"gpu", "nic", "link"})


@dataclass(frozen=True)
class RemediationPolicy:
    """What remediation may do. Every field has the default the Helm chart ships."""

    # Master switch; off: diagnoses are written, nodes are never touched.
    enabled: bool = True
    # Record the actions that would be taken (status, Events) without patching any node.
    dry_run: bool = False
    # 0..1; below it the culprit is a suspect, not a verdict. 0.7 keeps the two-sided
    # hang.network verdicts (the culprit's NIC and its peer's, score 1.0 and 0.5 -> 0.75) and
    # drops single weak signals.
    confidence_threshold: float = 0.7
    # Categories that may cordon; each must also be a hardware category of the table.
    categories: frozenset[str] = field(default=DEFAULT_CATEGORIES)

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence_threshold <= 1.0:
            raise errors.PolicyError(
                f"confidenceThreshold must be in 0..1 (got {self.confidence_threshold})"
            )
        unknown = self.categories - set(diagnosis.CATEGORY_NAMES)
        if unknown:
            raise errors.PolicyError(f"unknown remediation categories: {sorted(unknown)}")

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> RemediationPolicy:
        """From Helm values / CR fields (camelCase); missing keys keep the defaults."""
        return cls().merged(values)

    def merged(self, overrides: Mapping[str, Any] | None) -> RemediationPolicy:
        """This policy with the keys present in ``overrides`` replaced (a per-job override)."""
        if not overrides:
            return self
        known = {"enabled", "dryRun", "confidenceThreshold", "categories"}
        unknown = set(overrides) - known
        if unknown:
            raise errors.PolicyError(f"unknown remediation keys: {sorted(unknown)}")
        changes: dict[str, Any] = {}
        if "enabled" in overrides:
            changes["enabled"] = _bool(overrides["enabled"], "enabled")
        if "dryRun" in overrides:
            changes["dry_run"] = _bool(overrides["dryRun"], "dryRun")
        if "confidenceThreshold" in overrides:
            changes["confidence_threshold"] = float(overrides["confidenceThreshold"])
        if "categories" in overrides:
            changes["categories"] = frozenset(str(c) for c in overrides["categories"])
        return replace(self, **changes)


def _bool(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise errors.PolicyError(f"{key} must be true or false (got {value!r})")
    return value


@dataclass(frozen=True)
class Decision:
    """Whether to mark ``node``; ``reason`` is one line for the status and Events."""

    act: bool
    dry_run: bool
    node: ids.NodeName | None
    reason: str


def decide(policy: RemediationPolicy, result: diagnosis.Diagnosis) -> Decision:
    """Apply the policy to one analysis result (the breaker comes after)."""

    def no(reason: str, node: ids.NodeName | None = None) -> Decision:
        return Decision(False, policy.dry_run, node, reason)

    if not policy.enabled:
        return no("remediation disabled")
    if not result.anomaly or result.category is None:
        return no("no anomaly")
    if result.category not in policy.categories:
        return no(f"category {result.category} is not remediated by policy")
    if not diagnosis.Category.from_name(result.category).value.hardware:
        return no(f"category {result.category} is not a hardware fault")
    if not result.culprits:
        return no("no culprit")
    top = result.culprits[0]
    node = None if top.node is None else ids.NodeName(top.node)
    if top.component not in HARDWARE_COMPONENTS:
        return no(f"culprit component {top.component} is not a GPU, NIC or link", node)
    if node is None:
        return no("culprit node unknown")
    if result.confidence < policy.confidence_threshold:
        return no(
            f"confidence {result.confidence:.2f} below threshold {policy.confidence_threshold:.2f}",
            node,
        )
    verb = "would cordon" if policy.dry_run else "cordon"
    return Decision(
        True,
        policy.dry_run,
        node,
        f"{verb} {node}: {result.category} on {top.component} "
        f"with confidence {result.confidence:.2f}",
    )
