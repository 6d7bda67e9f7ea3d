"""Tainted id types: distinct names for values that are all ints or strings underneath.

A ``Rank`` is a global rank (``RANK`` of the training process), never an index into a
communicator; ``CommRank`` is the latter. ``CommId`` is the communicator hash as a lowercase hex
string (``"0x1f3a..."``), as bundle records carry it. A ``Workload`` is what the agent keys a
ring's data by besides its rank: its pod's uid, or ``dir-<hash>`` for a ring in no pod
(``discovery.workload_of``).
"""

from __future__ import annotations

from typing import NewType

Rank = NewType("Rank", int)
CommRank = NewType("CommRank", int)
CommId = NewType("CommId", str)
NodeName = NewType("NodeName", str)
PodName = NewType("PodName", str)
PodUID = NewType("PodUID", str)
Workload = NewType("Workload", str)
