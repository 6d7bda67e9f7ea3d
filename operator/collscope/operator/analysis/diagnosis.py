"""The Diagnosis result of docs/spec/bundle-v1.md and the category table it draws from.

``Category`` is an Enum of frozen records (STYLE habit 7): each category carries its trigger
family, the component usually at fault, how severe it is, and what an SRE should do about it, so
remediation code and the CLI read one table instead of repeating ``if category == ...`` chains.
Sample output::

    {"schema": "collscope.diagnosis/v1", "anomaly": true, "trigger": "hang",
     "detected_at": 1732001234000000000, "category": "hang.network",
     "culprits": [{"rank": 12, "node": "gpu-node-02", "component": "nic", "score": 0.93}],
     "confidence": 0.9, "evidence": ["rank 12 ..."]}
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

DIAGNOSIS_SCHEMA: Literal["collscope.diagnosis/v1"] = "collscope.diagnosis/v1"

Component = Literal["gpu", "nic", "link", "host", "software"]
Trigger = Literal["hang", "slow"]


@dataclass(frozen=True)
class CategoryInfo:
    name: str
    trigger: Trigger
    component: Component
    hardware: bool  # a hardware fault: remediation may cordon the culprit node
    meaning: str
    action: str


class Category(enum.Enum):
    """The categories of docs/spec/bundle-v1.md, each with what follows from it."""

    HANG_NOT_ENTERED = CategoryInfo(
        "hang.not_entered",
        "hang",
        "software",
        False,
        "some ranks never entered an operation the others are waiting in",
        "dump the Python stacks of the culprit ranks: they are stuck before the collective",
    )
    HANG_INCONSISTENT = CategoryInfo(
        "hang.inconsistent",
        "hang",
        "software",
        False,
        "ranks entered different operations, sizes or sequence numbers",
        "compare the culprit's call path with its peers': a code path diverged",
    )
    HANG_NETWORK = CategoryInfo(
        "hang.network",
        "hang",
        "nic",
        True,
        "data produced by the GPU is not sent, or sent but never delivered",
        "check the culprit's NIC and link (port state, error counters); cordon the node",
    )
    HANG_GPU = CategoryInfo(
        "hang.gpu",
        "hang",
        "gpu",
        True,
        "the network delivered all it was given but the culprit's GPU stopped",
        "check the culprit GPU (XID events, ECC); cordon the node",
    )
    HANG_PROCESS = CategoryInfo(
        "hang.process",
        "hang",
        "host",
        False,
        "the culprit's training process died or froze (its heartbeat stopped) and its peers wait",
        "restart the job; find why the process stopped (exit status, OOM killer, a debugger); "
        "its node is not at fault unless its GPU reported a hardware error",
    )
    HANG_NODE = CategoryInfo(
        "hang.node",
        "hang",
        "host",
        False,
        "every rank of the culprit node fell silent and its node agent is unreachable",
        "check the node (Kubernetes Ready condition, power, kernel, network) and restart the "
        "job elsewhere; collscope does not cordon on it",
    )
    SLOW_COMPUTE = CategoryInfo(
        "slow.compute",
        "slow",
        "gpu",
        True,
        "the culprit enters operations late or produces chunks slowly",
        "check the culprit GPU's clocks, power cap, PCIe link and competing processes",
    )
    SLOW_NETWORK = CategoryInfo(
        "slow.network",
        "slow",
        "nic",
        True,
        "the culprit's flows move chunks slowly while its GPU keeps up",
        "check the culprit NIC's bandwidth, congestion and competing traffic",
    )
    SLOW_MIXED = CategoryInfo(
        "slow.mixed",
        "slow",
        "gpu",
        True,
        "both compute and network of the culprit are slow",
        "check the culprit's GPU and NIC",
    )
    SLOW_HOST = CategoryInfo(
        "slow.host",
        "slow",
        "host",
        False,
        "the culprit's CPU proxy or host side stalls transfers",
        "check the culprit host's CPU load, proxy thread placement and interrupts",
    )

    @classmethod
    def from_name(cls, name: str) -> Category:
        for c in cls:
            if c.value.name == name:
                return c
        raise ValueError(f"unknown category {name!r}")


CATEGORY_NAMES = tuple(c.value.name for c in Category)


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Culprit(_Model):
    """One suspected rank; node/pod/gpu come from job.json when known.

    Extension for black-box (network flow) analysis, where a culprit may be bigger than a rank:
    ``job`` (a job recognised from flows, e.g. ``job-3``), ``group`` (one of its DP groups,
    e.g. ``job-3/dp-5``: one culprit per member GPU), ``switch`` (a switch name from
    ``flows.jsonl``) and ``endpoint`` (the flow endpoint id of a GPU). ``rank`` is then None
    when no GPU is meant (a job or a switch). The four are left out of the JSON when None, so
    collective diagnoses print exactly as before. Profiling analysis (``functions.jsonl``) adds
    ``function``: the abnormal function on that rank, likewise left out when None; so is
    ``gpu_uuid``, the GPU's NVML UUID when job.json gives it (the node agent's device map), and
    ``unresolved``, the device map's reason when ``gpu`` or ``nic`` stayed None.
    """

    rank: Annotated[int, Field(ge=0)] | None = None
    node: str | None = None
    pod: str | None = None
    gpu: int | None = None
    nic: str | None = None
    component: Component
    comm: str | None = None
    channel: int | None = None
    peer: int | None = None
    score: Annotated[float, Field(ge=0.0, le=1.0)]
    job: str | None = None
    group: str | None = None
    switch: str | None = None
    endpoint: str | None = None
    function: str | None = None  # profiling analysis: the abnormal function (fn of functions.jsonl)
    gpu_uuid: str | None = None  # job.json ranks[].gpu_uuid: the GPU by NVML's UUID
    unresolved: str | None = None  # job.json ranks[].unresolved: why gpu or nic is None

    @model_serializer(mode="wrap")
    def _omit_unset_extensions(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in _CULPRIT_EXTENSIONS:
            if data.get(key) is None:
                data.pop(key, None)
        return data


_CULPRIT_EXTENSIONS = ("job", "group", "switch", "endpoint", "function", "gpu_uuid", "unresolved")


class Alternative(_Model):
    """Another explanation analysis weighed and ranked below the verdict (extension).

    ``score`` is its strength relative to the verdict's (1.0: as strong, a tie); ``why`` says
    what ranked it lower, or, for a tie, what would settle it.
    """

    category: str
    rank: Annotated[int, Field(ge=0)] | None = None
    node: str | None = None
    score: Annotated[float, Field(ge=0.0, le=1.0)]
    why: str


class Diagnosis(_Model):
    """What analysis concludes; also the operator's ``Diagnosis.status.result``."""

    schema_: Literal["collscope.diagnosis/v1"] = Field(DIAGNOSIS_SCHEMA, alias="schema")
    anomaly: bool
    trigger: Trigger | None = None
    detected_at: int | None = None
    category: str | None = None
    culprits: list[Culprit] = Field(default_factory=list)
    confidence: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    evidence: list[str] = Field(default_factory=list)
    # Extension (unknown fields are ignored by readers): "rank" or "node" when the data only
    # allows naming the node (intra-node hops have no flows).
    precision: Literal["rank", "node"] | None = None
    # Extension: the other explanations weighed, strongest first; left out of the JSON when
    # empty, so diagnoses without any print exactly as before.
    alternatives: list[Alternative] = Field(default_factory=list)

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    @model_serializer(mode="wrap")
    def _omit_empty_alternatives(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not data.get("alternatives"):
            data.pop("alternatives", None)
        return data

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)
