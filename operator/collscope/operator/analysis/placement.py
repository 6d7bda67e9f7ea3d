"""Where ranks run (``job.json`` ``ranks``): labels for evidence sentences and Culprit records.

An SRE acts on a node and a device, not on a rank number, so every sentence names both, e.g.
``rank 12 (gpu-node-01, GPU 4)``. Unknown placement degrades to ``rank 12``.

NICs: ``nic_of(rank)`` is the (node, NIC) a rank's inter-node traffic goes through. Several
ranks of a node may share one NIC (NCCL gives each GPU its nearest NIC; a node with fewer NICs
than GPUs pairs them), so a NIC is a device of its own with its ranks (``nic_users``). A rank
whose NIC job.json does not name is taken to have a NIC of its own.
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
    by_nic: dict[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, job: models.Job) -> Placement:
        by_rank = {r.rank: r for r in job.ranks}
        nodes: dict[str, list[int]] = defaultdict(list)
        nics: dict[tuple[str, str], list[int]] = defaultdict(list)
        for r in job.ranks:
            if r.node is not None:
                nodes[r.node].append(r.rank)
                if r.nic is not None:
                    nics[(r.node, r.nic)].append(r.rank)
        return cls(
            job=job,
            by_rank=by_rank,
            by_node={n: tuple(sorted(v)) for n, v in nodes.items()},
            by_nic={k: tuple(sorted(v)) for k, v in nics.items()},
        )

    def node(self, rank: int) -> str | None:
        info = self.by_rank.get(rank)
        return None if info is None else info.node

    def ranks_on(self, node: str) -> tuple[int, ...]:
        return self.by_node.get(node, ())

    def nic_of(self, rank: int) -> tuple[str, str] | None:
        """(node, NIC) of ``rank`` when job.json names both, else None."""
        info = self.by_rank.get(rank)
        if info is None or info.node is None or info.nic is None:
            return None
        return (info.node, info.nic)

    def nic_users(self, rank: int) -> tuple[int, ...]:
        """Every rank whose traffic goes through ``rank``'s NIC (itself included)."""
        key = self.nic_of(rank)
        return (rank,) if key is None else self.by_nic.get(key, (rank,))

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
            gpu_uuid=None if info is None else info.gpu_uuid,
            nic=None if info is None else info.nic,
            unresolved=None if info is None else _unresolved(info),
            component=component,
            comm=comm,
            channel=channel,
            peer=peer,
            score=round(min(max(score, 0.0), 1.0), 3),
        )


def _unresolved(info: models.RankInfo) -> str | None:
    """The device map's reason, kept only while a device it explains is still unknown."""
    if info.unresolved and (info.gpu is None or info.nic is None):
        return info.unresolved
    return None


def seconds(ns: int | float) -> str:
    """'2.1 s' / '340 ms' / '85 us' for evidence text."""
    v = float(ns)
    if abs(v) >= 1e9:
        return f"{v / 1e9:.1f} s"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.0f} ms" if abs(v) >= 1e7 else f"{v / 1e6:.1f} ms"
    return f"{v / 1e3:.0f} us"
