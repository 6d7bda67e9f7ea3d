"""Tainted id types of the operator: distinct names for values that are ints or strings underneath.

The rank, communicator, node and pod ids are the node agent's (``collscope.nodeagent.ids``), so
a value read from an agent keeps its type across the boundary; the operator adds the names of its
own Kubernetes objects. ``CommHash`` is the name the plugin and NCCL use for a communicator id
(NCCL's ``commHash``), the same lowercase hex string as the agent's ``CommId``.
"""

from __future__ import annotations

from typing import NewType

from collscope.nodeagent import ids as agent_ids

Rank = agent_ids.Rank
CommRank = agent_ids.CommRank
CommHash = agent_ids.CommId
NodeName = agent_ids.NodeName
PodName = agent_ids.PodName
PodUID = agent_ids.PodUID

Namespace = NewType("Namespace", str)
TrainingJobName = NewType("TrainingJobName", str)
DiagnosisName = NewType("DiagnosisName", str)
