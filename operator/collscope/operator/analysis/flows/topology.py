"""Physical topology ``T`` of LLMPrism Algorithm 1: which server each flow endpoint sits in.

The platform knows its machines even when it knows nothing of the jobs (§IV-A). In a bundle
that knowledge is ``job.json``'s ``ranks``: one entry per GPU slot of the fabric, whose ``nic``
is the endpoint id exactly as the collector names it in ``flows.jsonl`` (an IP address, a NIC
or GPU name) and whose ``node`` is the server::

    {"rank": 17, "node": "gpu-node-0002", "gpu": 1, "nic": "10.0.2.2"}

Endpoints are located in this order: an exact ``nic`` match; ``NODE/ANYTHING`` where ``NODE``
is a known server (``gpu-node-0002/mlx5_1``); when ``ranks`` is empty (no topology at all) the
``NODE/`` prefix, or else the endpoint as its own server. With a topology, an endpoint found
nowhere is not a GPU (storage, management): its flows are left out, as Algorithm 1's input is
the list of GPUs ``X``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import models

I32Array = npt.NDArray[np.int32]


@dataclass(frozen=True)
class Topology:
    """Endpoint id -> where it sits; empty means "no topology known"."""

    info: dict[str, models.RankInfo] = field(default_factory=dict)
    nodes: frozenset[str] = frozenset()

    @classmethod
    def from_job(cls, job: models.Job | None) -> Topology:
        if job is None:
            return cls()
        info = {r.nic: r for r in job.ranks if r.nic is not None and r.node is not None}
        return cls(info=info, nodes=frozenset(r.node for r in job.ranks if r.node is not None))

    def server(self, endpoint: str) -> str | None:
        """The server of ``endpoint``, or None when it is not a GPU of the fabric."""
        hit = self.info.get(endpoint)
        if hit is not None:
            return hit.node
        head, sep, _ = endpoint.partition("/")
        if sep and head in self.nodes:
            return head
        if not self.info:
            return head if sep else endpoint
        return None

    def rank_info(self, endpoint: str) -> models.RankInfo | None:
        return self.info.get(endpoint)

    def locate(self, endpoints: Sequence[str]) -> tuple[I32Array, tuple[str, ...]]:
        """Server index of every endpoint (-1: not a GPU) and the server names."""
        names: dict[str, int] = {}
        out = np.full(len(endpoints), -1, dtype=np.int32)
        for i, ep in enumerate(endpoints):
            node = self.server(ep)
            if node is not None:
                out[i] = names.setdefault(node, len(names))
        return out, tuple(names)
