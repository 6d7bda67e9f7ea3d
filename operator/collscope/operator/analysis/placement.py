"""Where ranks run (``job.json`` ``ranks``): labels for evidence sentences and Culprit records.

An SRE acts on a node and a device, not on a rank number, so every sentence names both, e.g.
``rank 12 (gpu-node-01, GPU 4)``. Unknown placement degrades to ``rank 12``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from collscope.nodeagent.bundle import models
from collscope.operator.analysis import diagnosis


@dataclass(frozen=True)
class Placement:
    """Rank -> RankInfo lookups for one job."""

    job: models.Job
    by_rank: dict[int, models.RankInfo] = field(default_factory=dict)
    by_node: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, job: models.Job) -> Placement:
        by_rank = {r.rank: r for r in job.ranks}
        nodes: dict[str, list[int]] = defaultdict(list)
        for r in job.ranks:
            if r.node is not None:
                nodes[r.node].append(r.rank)
        return cls(
            job=job, by_rank=by_rank, by_node={n: tuple(sorted(v)) for n, v in nodes.items()}
        )

    def node(self, rank: int) -> str | None:
        info = self.by_rank.get(rank)
        return None if info is None else info.node

    def ranks_on(self, node: str) -> tuple[int, ...]:
        return self.by_node.get(node, ())

    def label(self, rank: int) -> str:
        info = self.by_rank.get(rank)
        if info is None:
            return f"rank {rank}"
        where = [p for p in (info.node, None if info.gpu is None else f"GPU {info.gpu}") if p]
        return f"rank {rank}" + (f" ({', '.join(where)})" if where else "")

    def culprit(
        self,
        rank: int,
        *,
        component: diagnosis.Component,
        score: float,
        comm: str | None = None,
        channel: int | None = None,
        peer: int | None = None,
    ) -> diagnosis.Culprit:
        info = self.by_rank.get(rank)
        return diagnosis.Culprit(
            rank=rank,
            node=None if info is None else info.node,
            pod=None if info is None else info.pod,
            gpu=None if info is None else info.gpu,
            nic=None if info is None else info.nic,
            component=component,
            comm=comm,
            channel=channel,
            peer=peer,
            score=round(min(max(score, 0.0), 1.0), 3),
        )


def seconds(ns: int | float) -> str:
    """'2.1 s' / '340 ms' / '85 us' for evidence text."""
    v = float(ns)
    if abs(v) >= 1e9:
        return f"{v / 1e9:.1f} s"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.0f} ms" if abs(v) >= 1e7 else f"{v / 1e6:.1f} ms"
    return f"{v / 1e3:.0f} us"
