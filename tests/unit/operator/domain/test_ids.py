"""The operator's id types are the node agent's where both name the same thing, so a value read
from an agent keeps its type."""

from __future__ import annotations

from collscope.nodeagent import ids as agent_ids
from collscope.operator.domain import ids


def test_shared_ids_are_the_agents() -> None:
    assert ids.Rank is agent_ids.Rank
    assert ids.CommHash is agent_ids.CommId
    assert ids.NodeName is agent_ids.NodeName
    assert ids.PodUID is agent_ids.PodUID


def test_ids_are_plain_values_at_runtime() -> None:
    assert ids.Rank(3) == 3 and ids.TrainingJobName("job-a") == "job-a"
    assert ids.Namespace.__name__ == "Namespace" and ids.DiagnosisName.__name__ == "DiagnosisName"
