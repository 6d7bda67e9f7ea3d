"""Remediation policy: whether a Diagnosis may mark its culprit node, and how.

Only hardware faults justify taking a node out of scheduling, and only when analysis is sure
enough (docs/design.md, "Data path" 7; NVSentinel's lesson that safe defaults and dry run
matter to users): the category must be one of ``categories`` (default: ``hang.gpu``,
``hang.network``, ``slow.network``, ``slow.compute``), flagged as hardware in the category table
(``analysis.diagnosis.Category``), the top culprit's component a GPU, NIC or link, its node
known, and the confidence at least ``confidence_threshold``. ``dry_run`` records what would be
done and changes nothing. ``decide`` is only the first of three gates: the verdict must then be
corroborated by the culprit device's hardware samples and still hold on a re-check
``confirm_delay_s`` later (``confirmation.py``); the circuit breaker (``breaker.py``) comes last.

A dead or frozen process (``hang.process``), a lost node (``hang.node``), a software hang
(``hang.not_entered``, ``hang.inconsistent``) and a host-side stall (``slow.host``) never mark
a node, whatever a policy lists: ``Decision.code`` says which (the Diagnosis's ``Confirmed``
condition reason).

The bounds belong to the cluster. Operator-wide values come from Helm (``remediation:`` in
values.yaml, camelCase keys as in ``TrainingJob.spec.diagnosis.remediation``) and are the floor;
a TrainingJob may only be stricter (``bounded``): raise the threshold, narrow the categories,
lengthen the re-check delay, turn remediation off or dry run on, never the reverse. A tenant
does not set the bar for cordoning shared nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from collscope.operator import errors
from collscope.operator.analysis import diagnosis
from collscope.operator.domain import ids

DEFAULT_CATEGORIES = frozenset({"hang.gpu", "hang.network", "slow.network", "slow.compute"})
HARDWARE_COMPONENTS = frozenset({"gpu", "nic", "link"})
KEYS = frozenset({"enabled", "dryRun", "confidenceThreshold", "categories", "confirmDelaySeconds"})
# The agents keep 120 s of hardware samples; a re-check later than that could not compare.
MAX_CONFIRM_DELAY_S = 600.0
# Categories that never mark a node, with the Confirmed condition's reason and why not.
NEVER: dict[str, tuple[str, str]] = {
    "hang.process": (
        "ProcessDeath",
        "the culprit's training process died or froze: restart the job; its node is not at fault",
    ),
    "hang.node": (
        "NodeUnreachable",
        "the culprit node and its agent fell silent: Kubernetes' node lifecycle handles that",
    ),
    "hang.not_entered": (
        "SoftwareHang",
        "ranks never entered the operation their peers wait in: a software hang, not hardware",
    ),
    "hang.inconsistent": (
        "SoftwareHang",
        "ranks entered different operations: a software hang, not hardware",
    ),
    "slow.host": (
        "HostSide",
        "the host side (CPU proxy thread) stalls transfers: load or placement, not hardware",
    ),
}


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
    # Seconds between the hardware corroboration and the re-check that must still see the
    # symptom before a node is marked: a link that flapped or an XID burst that ended is not a
    # faulty node. 30 s: longer than a NIC's link retraining and NCCL's retries of a
    # connection, short enough that the job's next restart has not yet landed on the node.
    confirm_delay_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence_threshold <= 1.0:
            raise errors.PolicyError(
                f"confidenceThreshold must be in 0..1 (got {self.confidence_threshold})"
            )
        unknown = self.categories - set(diagnosis.CATEGORY_NAMES)
        if unknown:
            raise errors.PolicyError(f"unknown remediation categories: {sorted(unknown)}")
        if not 0.0 <= self.confirm_delay_s <= MAX_CONFIRM_DELAY_S:
            raise errors.PolicyError(
                f"confirmDelaySeconds must be in 0..{MAX_CONFIRM_DELAY_S:g} "
                f"(got {self.confirm_delay_s})"
            )

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> RemediationPolicy:
        """From Helm values / CR fields (camelCase); missing keys keep the defaults."""
        return cls().merged(values)

    def merged(self, overrides: Mapping[str, Any] | None) -> RemediationPolicy:
        """This policy with the keys present in ``overrides`` replaced (a per-job override)."""
        if not overrides:
            return self
        unknown = set(overrides) - KEYS
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
        if "confirmDelaySeconds" in overrides:
            changes["confirm_delay_s"] = float(overrides["confirmDelaySeconds"])
        return replace(self, **changes)

    def bounded(self, overrides: Mapping[str, Any] | None) -> tuple[RemediationPolicy, list[str]]:
        """This (the cluster's) policy tightened by a TrainingJob's ``overrides``, and one note
        per requested loosening that was ignored. Raises ``PolicyError`` on malformed keys."""
        if not overrides:
            return self, []
        asked = self.merged(overrides)
        notes: list[str] = []

        def ignored(key: str, wanted: object, kept: object) -> None:
            notes.append(f"TrainingJob asks {key}={wanted}; the cluster's {kept} applies")

        if asked.enabled and not self.enabled:
            ignored("enabled", "true", "enabled=false")
        if not asked.dry_run and self.dry_run:
            ignored("dryRun", "false", "dryRun=true")
        if asked.confidence_threshold < self.confidence_threshold:
            ignored(
                "confidenceThreshold", asked.confidence_threshold,
                f"floor {self.confidence_threshold:g}",
            )  # fmt: skip
        extra = asked.categories - self.categories
        if extra:
            ignored("categories", sorted(extra), f"categories {sorted(self.categories)}")
        if asked.confirm_delay_s < self.confirm_delay_s:
            ignored("confirmDelaySeconds", asked.confirm_delay_s, f"{self.confirm_delay_s:g} s")
        strict = RemediationPolicy(
            enabled=self.enabled and asked.enabled,
            dry_run=self.dry_run or asked.dry_run,
            confidence_threshold=max(self.confidence_threshold, asked.confidence_threshold),
            categories=self.categories & asked.categories,
            confirm_delay_s=max(self.confirm_delay_s, asked.confirm_delay_s),
        )
        return strict, notes


def _bool(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise errors.PolicyError(f"{key} must be true or false (got {value!r})")
    return value


@dataclass(frozen=True)
class Decision:
    """Whether the verdict may go on to confirmation for ``node``; ``reason`` is one line for
    the status and Events, ``code`` the CamelCase reason of the ``Confirmed`` condition when
    it may not (``Eligible`` when it may)."""

    act: bool
    dry_run: bool
    node: ids.NodeName | None
    reason: str
    code: str = "Eligible"


def decide(policy: RemediationPolicy, result: diagnosis.Diagnosis) -> Decision:
    """Apply the policy to one analysis result (confirmation and the breaker come after)."""

    def no(code: str, reason: str, node: ids.NodeName | None = None) -> Decision:
        return Decision(False, policy.dry_run, node, reason, code)

    if not result.anomaly or result.category is None:
        return no("NoAnomaly", "no anomaly")
    top = result.culprits[0] if result.culprits else None
    named = None if top is None or top.node is None else ids.NodeName(top.node)
    if result.category in NEVER:
        code, why = NEVER[result.category]
        return no(code, f"category {result.category}: {why}", named)
    if not policy.enabled:
        return no("RemediationDisabled", "remediation disabled", named)
    if result.category not in policy.categories:
        why = f"category {result.category} is not remediated by policy"
        return no("CategoryNotRemediated", why, named)
    if not diagnosis.Category.from_name(result.category).value.hardware:
        return no("NotHardware", f"category {result.category} is not a hardware fault", named)
    if top is None:
        return no("NoCulprit", "no culprit")
    if top.component not in HARDWARE_COMPONENTS:
        why = f"culprit component {top.component} is not a GPU, NIC or link"
        return no("NotHardware", why, named)
    if named is None:
        return no("CulpritNodeUnknown", "culprit node unknown")
    if result.confidence < policy.confidence_threshold:
        return no(
            "BelowThreshold",
            f"confidence {result.confidence:.2f} below threshold {policy.confidence_threshold:.2f}",
            named,
        )
    verb = "would cordon" if policy.dry_run else "cordon"
    return Decision(
        True,
        policy.dry_run,
        named,
        f"{verb} {named}: {result.category} on {top.component} "
        f"with confidence {result.confidence:.2f}",
    )
