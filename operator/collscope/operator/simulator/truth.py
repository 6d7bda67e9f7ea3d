"""Ground truth of a simulated fault (``truth.json``) and the catalogue of faults.

Analysis never imports this module (an import-linter contract forbids it): only the simulator
writes truth and only benchmarks and tests compare against it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TRUTH_SCHEMA: Literal["collscope.truth/v1"] = "collscope.truth/v1"

Target = Literal["rank", "node", "link"]


@dataclass(frozen=True)
class FaultInfo:
    name: str
    target: Target  # what the fault is injected into
    category: str | None  # expected diagnosis category; None for the fault-free run
    hang: bool  # does it stop the job (True) or slow it (False)
    summary: str  # one line for --help


class Fault(enum.Enum):
    """Faults the simulator injects (Mycroft §7.1's seven plus CCL-D's hang classes)."""

    NONE = FaultInfo("none", "rank", None, False, "no fault: a healthy run")
    NIC_DOWN = FaultInfo(
        "nic-down", "rank", "hang.network", True, "the culprit's NIC stops delivering (Mycroft #1)"
    )
    NIC_SLOW = FaultInfo(
        "nic-slow",
        "rank",
        "slow.network",
        False,
        "the culprit's NIC bandwidth is limited (Mycroft #2)",
    )
    PCIE_DOWNGRADE = FaultInfo(
        "pcie-downgrade",
        "rank",
        "slow.compute",
        False,
        "the culprit GPU's PCIe link trains down (Mycroft #3)",
    )
    GPU_POWER_LIMIT = FaultInfo(
        "gpu-power-limit",
        "rank",
        "slow.compute",
        False,
        "the culprit GPU is power-capped (Mycroft #4)",
    )
    BACKGROUND_COMPUTE = FaultInfo(
        "background-compute",
        "node",
        "slow.compute",
        False,
        "extra GPU load on every GPU of a node (Mycroft #5)",
    )
    BACKGROUND_TRAFFIC = FaultInfo(
        "background-traffic",
        "node",
        "slow.network",
        False,
        "competing traffic on a node's NICs (Mycroft #6)",
    )
    PROXY_DELAY = FaultInfo(
        "proxy-delay",
        "rank",
        "slow.host",
        False,
        "rare 1 s stalls of the culprit's network proxy thread (Mycroft #7)",
    )
    NOT_ENTERED = FaultInfo(
        "not-entered", "rank", "hang.not_entered", True, "the culprit skips a collective (CCL-D H1)"
    )
    INCONSISTENT = FaultInfo(
        "inconsistent",
        "rank",
        "hang.inconsistent",
        True,
        "the culprit issues a different op or size (CCL-D H2)",
    )
    GPU_HANG = FaultInfo(
        "gpu-hang",
        "rank",
        "hang.gpu",
        True,
        "the culprit GPU stops producing mid-operation (CCL-D H3)",
    )
    MIXED_SLOW = FaultInfo(
        "mixed-slow",
        "rank",
        "slow.mixed",
        False,
        "the culprit's GPU and NIC are both slowed (CCL-D S3)",
    )

    @classmethod
    def from_name(cls, name: str) -> Fault:
        for f in cls:
            if f.value.name == name:
                return f
        raise ValueError(f"unknown fault {name!r}; choose from {', '.join(FAULT_NAMES)}")


FAULT_NAMES = tuple(f.value.name for f in Fault)


class Truth(BaseModel):
    """``truth.json``: what was injected, where and when."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    schema_: Literal["collscope.truth/v1"] = Field(TRUTH_SCHEMA, alias="schema")
    fault: str
    onset: int | None = None  # ns; when the fault actually took effect
    culprit_ranks: list[int] = Field(default_factory=list)
    culprit_node: str | None = None
    expected_category: str | None = None
    seed: int
    detail: str = ""
