"""Ground truth of a flow simulation (``truth.json`` beside ``flows.jsonl``).

Analysis never imports this module (an import-linter contract forbids it); benchmarks and tests
compare its answers against it. Sample (abridged)::

    {"schema": "collscope.flowtruth/v1", "seed": 1,
     "jobs": [{"name": "train-00", "servers": ["gpu-node-0012", ...], "endpoints": [...],
               "tp": 8, "pp": 2, "dp": 4, "micro_batches": 8}],
     "dp_groups": [{"label": "train-00/pp0/tp3", "job": "train-00", "members": [...]}],
     "pairs": [["10.0.12.4", "10.0.13.4", "dp"], ...],
     "step_ends": {"10.0.12.1": [1767225602123456789, ...]},
     "faults": [{"kind": "slow-group", "culprit": "train-00/pp0/tp3", "onset": ...,
                 "severity": 2.5, "members": [...], "expected_category": "slow.network"}]}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TRUTH_SCHEMA: Literal["collscope.flowtruth/v1"] = "collscope.flowtruth/v1"
EXPECTED_CATEGORY = {
    "congested-switch": "slow.network",
    "slow-group": "slow.network",
    "slow-job": "slow.compute",
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class JobTruth(_Model):
    name: str
    servers: list[str]
    endpoints: list[str]  # every GPU of the job, in rank order
    tp: int
    pp: int
    dp: int
    micro_batches: int


class GroupTruth(_Model):
    label: str  # JOB/ppS/tpT
    job: str
    members: list[str]  # ring order


class FaultTruth(_Model):
    kind: str
    culprit: str  # switch name, job name, or DP group label
    onset: int  # ns, reference clock
    severity: float
    job: str | None = None
    members: list[str] = Field(default_factory=list)  # endpoints of the culprit group or job
    nic: str | None = None  # slow-group: the member whose NIC is degraded
    expected_category: str


class FlowTruth(_Model):
    schema_: Literal["collscope.flowtruth/v1"] = Field(TRUTH_SCHEMA, alias="schema")
    seed: int
    jobs: list[JobTruth]
    dp_groups: list[GroupTruth]
    pairs: list[tuple[str, str, Literal["dp", "pp"]]]  # unordered, first < second
    step_ends: dict[str, list[int]]  # GPU endpoint -> iteration ends (ns, reference clock)
    faults: list[FaultTruth] = Field(default_factory=list)

    def pair_types(self) -> dict[tuple[str, str], str]:
        return {(a, b): t for a, b, t in self.pairs}
