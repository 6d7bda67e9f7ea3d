"""Typed views of collscope's custom resources, ``TrainingJob`` and ``Diagnosis``
(``collscope.dev/v1alpha1``; the schemas: ``crds/``).

The handlers parse a resource's ``spec`` and ``status`` once, where they receive it
(``TrainingJobSpec.parse(spec)``, ``Diagnosis.parse(obj)``, ...), and pass the models on; the
domain modules take the models, never the raw dictionaries. Field names are the CRD's
(camelCase) as aliases of snake_case attributes.

- Defaults are what the code used before the models: an absent setting is ``None`` where the
  code tells "not set" from a value (the trigger thresholds, the remediation overrides: only the
  keys given tighten the cluster's policy), else the value it read in its place (an empty
  ``trainingJob.name``, no ``requestedActions``).
- Unknown fields are ignored (``extra="ignore"``): the API server prunes them under the CRDs'
  structural schemas anyway, and an older operator reads a newer resource.
- A value of the wrong type raises ``SpecError`` naming the resource and the field, e.g.
  ``TrainingJob spec.diagnosis.trigger.intervalSeconds: Input should be a valid number, ...
  (got 'fast')``.
- ``status.conditions`` are typed here for the schema's sake; the handlers still merge them as
  dictionaries (``status.set_condition``), which is what they patch back.

``tests/unit/operator/domain/test_resources.py`` walks each CRD's ``openAPIV3Schema`` beside
these models and fails on a field on one side only or a type or enum that differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError
from pydantic.alias_generators import to_camel

from collscope.operator import errors
from collscope.operator.analysis import diagnosis


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="ignore", frozen=True, populate_by_name=True, alias_generator=to_camel
    )


class _Part(_Model):
    """A part parsed on its own at a handler's boundary (a ``spec`` or a ``status``)."""

    KIND: ClassVar[str] = ""
    PART: ClassVar[str] = ""

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None) -> Self:
        """From the resource's part as the API server gave it (None or {}: all defaults)."""
        return _parse(cls, data, cls.KIND, cls.PART)


M = TypeVar("M", bound=BaseModel)


def _parse(model: type[M], data: Mapping[str, Any] | None, kind: str, part: str = "") -> M:
    try:
        return model.model_validate(dict(data or {}))
    except ValidationError as e:
        raise errors.SpecError(_describe(e, kind, part)) from None


def _describe(e: ValidationError, kind: str, part: str) -> str:
    """``TrainingJob spec.selector.matchExpressions[0].operator: Input should be ... (got 'x')``,
    one clause per wrong field, joined by ``; ``."""
    clauses = []
    for err in e.errors(include_url=False):
        path = part
        for loc in err["loc"]:
            path += f"[{loc}]" if isinstance(loc, int) else f".{loc}" if path else str(loc)
        got = "" if err["type"] == "missing" else f" (got {err['input']!r})"
        clauses.append(f"{path}: {err['msg']}{got}")
    return f"{kind} {'; '.join(clauses)}"


# --- shared ----------------------------------------------------------------------------------


class Condition(_Model):
    """One of ``status.conditions`` (the Kubernetes condition shape)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    observed_generation: int | None = None
    last_transition_time: str
    reason: str
    message: str | None = None


# --- TrainingJob -----------------------------------------------------------------------------


class MatchExpression(_Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = None


class LabelSelector(_Model):
    """``spec.selector``: the job's pods, in the TrainingJob's namespace."""

    match_labels: dict[str, str] | None = None
    match_expressions: list[MatchExpression] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The selector as written (``owners.selector_matches`` reads it)."""
        return self.model_dump(by_alias=True, exclude_unset=True)


class OwnerRef(_Model):
    """``spec.owner``: the controller owning the job's pods; empty strings when not given."""

    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""


class Parallelism(_Model):
    """``spec.parallelism``: the declared layout, each size only when given."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    ep: int | None = None
    order: str | None = None

    def as_text(self) -> str:
        """As the ``collscope.dev/parallelism`` annotation (``tp=8,dp=4``; ``groups.parse``
        reads it), the keys given in the order written; "" when none is."""
        given = self.model_dump(by_alias=True, exclude_unset=True, exclude_none=True)
        return ",".join(f"{k}={v}" for k, v in given.items())


class TriggerSettings(_Model):
    """``spec.diagnosis.trigger``; None: the operator's (``engine.AnalysisSettings``) applies."""

    interval_seconds: float | None = None
    hang_floor_seconds: float | None = None
    throughput_drop: float | None = None
    interval_growth: float | None = None


class SamplingSettings(_Model):
    max_ranks: int | None = None


RemediationCategory = Literal[
    "hang.gpu", "hang.network", "slow.network", "slow.compute", "slow.mixed"
]  # fmt: skip


class RemediationSettings(_Model):
    """``spec.diagnosis.remediation``: tightens the cluster's policy, key by key."""

    enabled: StrictBool | None = None
    dry_run: StrictBool | None = None
    confidence_threshold: float | None = None
    categories: list[RemediationCategory] | None = None
    confirm_delay_seconds: float | None = None

    def overrides(self) -> dict[str, Any]:
        """The keys given, camelCase (``policy.RemediationPolicy.bounded`` takes them)."""
        return self.model_dump(by_alias=True, exclude_unset=True, exclude_none=True)


class DiagnosisSettings(_Model):
    """``spec.diagnosis``."""

    trigger: TriggerSettings = TriggerSettings()
    sampling: SamplingSettings = SamplingSettings()
    remediation: RemediationSettings = RemediationSettings()


class TrainingJobSpec(_Part):
    KIND = "TrainingJob"
    PART = "spec"

    selector: LabelSelector | None = None
    owner: OwnerRef | None = None
    parallelism: Parallelism | None = None
    diagnosis: DiagnosisSettings = DiagnosisSettings()


class GroupCount(_Model):
    count: int | None = None
    size: int | None = None


class GroupsStatus(_Model):
    source: Literal["declared", "inferred"] | None = None
    communicators: int | None = None
    tp: GroupCount | None = None
    pp: GroupCount | None = None
    dp: GroupCount | None = None


class LastTrigger(_Model):
    time: str | None = None
    trigger: Literal["hang", "slow", "manual"] | None = None
    diagnosis: str | None = None
    message: str | None = None


class TrainingJobStatus(_Part):
    KIND = "TrainingJob"
    PART = "status"

    observed_generation: int | None = None
    phase: Literal["Pending", "Watching", "Diagnosing", "Finished", "Failed"] | None = None
    health: Literal["Unknown", "Healthy", "Hung", "Slow"] | None = None
    rank_count: int | None = None
    node_count: int | None = None
    groups: GroupsStatus | None = None
    sampled_ranks: list[int] | None = None
    last_trigger: LastTrigger | None = None
    unreachable_agents: list[str] | None = None
    unreachable_count: int | None = None
    conditions: list[Condition] | None = None


class TrainingJob(_Model):
    """A whole TrainingJob object (``metadata`` left as the API server gave it)."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: TrainingJobSpec = TrainingJobSpec()
    status: TrainingJobStatus = TrainingJobStatus()

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        return _parse(cls, _present(obj), "TrainingJob")


# --- Diagnosis -------------------------------------------------------------------------------


class TrainingJobName(_Model):
    name: str = ""


class DiagnosisSpec(_Part):
    KIND = "Diagnosis"
    PART = "spec"

    training_job: TrainingJobName = TrainingJobName()
    trigger: Literal["hang", "slow", "manual"] | None = None
    incident: str | None = None
    detected_at: str | None = None
    requested_actions: list[Literal["stacks", "flightRecorder", "cordon", "profile"]] = Field(
        default_factory=list
    )
    window_seconds: float | None = None


Category = Literal[
    "hang.not_entered", "hang.inconsistent", "hang.network", "hang.gpu", "hang.process",
    "hang.node", "slow.compute", "slow.network", "slow.mixed", "slow.host",
]  # fmt: skip


class Symptom(_Model):
    device: str
    key: str
    kind: Literal["fault", "load"]
    text: str


class Confirmation(_Model):
    """``status.confirmation``: hardware corroboration, then the re-check (``confirmation``)."""

    state: Literal["Pending", "Confirmed", "NotConfirmed"]
    node: str
    reason: Literal[
        "Corroborated", "NoHardwareSamples", "DeviceUnresolved", "NotCorroborated",
        "TenantContention", "Persistent", "NotPersistent",
    ]  # fmt: skip
    message: str | None = None
    devices: list[str] | None = None
    symptoms: list[Symptom] | None = None
    checked_at: str
    recheck_at: str | None = None


class ActionRecord(_Model):
    action: Literal["cordon", "taint", "label", "annotate", "release", "stacks", "flightRecorder"]
    node: str | None = None
    outcome: Literal["Done", "DryRun", "Skipped", "Blocked", "Failed"]
    time: str
    message: str | None = None


class StackGroup(_Model):
    ranks: list[int]
    frames: list[str]
    thread: str | None = None


class ProcessGroupState(_Model):
    pg: str
    op: str | None = None
    seq: int
    state: Literal["scheduled", "started", "completed", "failed"]


class FlightRecorderGroup(_Model):
    ranks: str
    count: int
    state: str
    process_groups: list[ProcessGroupState] | None = None


class FlightRecorderStatus(_Model):
    summary: str | None = None
    ranks_asked: int | None = None
    ranks_dumped: int | None = None
    omitted_groups: int | None = None
    groups: list[FlightRecorderGroup] | None = None
    notes: list[str] | None = None


class ProfilingStatus(_Model):
    """``status.profiling``: the function-level profiling for this Diagnosis
    (``profile_handlers``)."""

    state: Literal["Requested", "Running", "Done", "Failed"]
    reason: Literal[
        "UserRequested", "SlowVerdict", "Armed", "FunctionFound", "NoFunctionCulprit",
        "ProfilingOff", "TrainingJobNotFound", "NoRanks", "NoAgentArmed", "Superseded",
        "KubeError",
    ]  # fmt: skip
    message: str | None = None
    id: str | None = None
    ranks_profiled: int | None = None
    time: str | None = None


class AgentErrorEntry(_Model):
    node: str
    message: str | None = None


Action = Literal[
    "pending", "cordoned", "dry-run", "blocked", "held", "not-confirmed", "failed", "none"
]  # fmt: skip


class DiagnosisStatus(_Part):
    KIND = "Diagnosis"
    PART = "status"

    observed_generation: int | None = None
    phase: Literal["Detected", "Analyzing", "Diagnosed", "Remediated", "Failed"] | None = None
    category: Category | None = None
    culprit_node: str | None = None
    culprit_rank: int | None = None
    culprit_gpu: int | None = Field(None, alias="culpritGPU")
    culprit_nic: str | None = Field(None, alias="culpritNIC")
    component: Literal["gpu", "nic", "link", "host", "software"] | None = None
    confidence: float | None = None
    message: str | None = None
    result: diagnosis.Diagnosis | None = None
    action: Action | None = None
    confirmation: Confirmation | None = None
    actions: list[ActionRecord] | None = None  # None: no remediation step has run yet
    stacks: list[StackGroup] | None = None
    flight_recorder: FlightRecorderStatus | None = None
    agent_errors: list[AgentErrorEntry] | None = None
    profiling: ProfilingStatus | None = None
    conditions: list[Condition] | None = None


class Diagnosis(_Model):
    """A whole Diagnosis object (``metadata`` left as the API server gave it)."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: DiagnosisSpec = DiagnosisSpec()
    status: DiagnosisStatus = DiagnosisStatus()

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        return _parse(cls, _present(obj), "Diagnosis")


def _present(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object without its null parts (a ``spec`` or ``status`` of null: the defaults)."""
    return {k: v for k, v in obj.items() if v is not None}
