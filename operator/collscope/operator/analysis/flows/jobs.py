"""Which GPUs form one training job: LLMPrism Algorithm 1 (§IV-A).

(1) A disjoint-set over endpoints: every flow merges the sets of its source and destination,
since only GPUs of the same job ever talk to each other. Each resulting set is a
*cross-machine cluster*: with tensor parallelism inside a server, one cluster per rail (the GPUs
of one TP index across the job's servers), all spanning the same servers. (2) The physical
topology gives each cluster its server set; clusters whose server sets have Jaccard similarity
1 (the paper's threshold; ``JobSettings.jaccard`` may relax it) are merged into one job.

Jobs are labelled ``job-0``, ``job-1``, ... in the order of their first server's name, so the
labels are stable for a given fabric and window.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.operator.analysis.flows import table, topology

IntArray = npt.NDArray[np.int64]
I32Array = npt.NDArray[np.int32]


@dataclass(frozen=True)
class JobSettings:
    # Algorithm 1 line 12: merge when the server sets are identical (Jaccard similarity = 1;
    # LLMPrism §IV-A). A similarity of sets: independent of time, steps and sampling.
    jaccard: float = 1.0


class DisjointSet:
    """Union-find with path halving and union by size, over ints 0..n-1."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))
        self.size = [1] * n

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.size[ra] < self.size[rb]:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.size[ra] += self.size[rb]

    def labels(self) -> IntArray:
        """The root of every element."""
        return np.array([self.find(i) for i in range(len(self.parent))], dtype=np.int64)


def components(n: int, u: IntArray, v: IntArray) -> IntArray:
    """Connected-component root of each of ``n`` nodes for the edges ``(u[i], v[i])``."""
    ds = DisjointSet(n)
    for a, b in zip(u.tolist(), v.tolist(), strict=True):
        ds.union(a, b)
    return ds.labels()


@dataclass(frozen=True)
class Job:
    """One recognised job."""

    label: str
    endpoints: IntArray  # endpoint indices of the FlowTable, ascending
    servers: tuple[str, ...]  # sorted
    clusters: int  # cross-machine clusters merged into it (= rails seen)


@dataclass(frozen=True)
class Recognition:
    jobs: tuple[Job, ...]
    job_of: I32Array  # [endpoints] index into jobs, -1 for endpoints in no job
    server_of: I32Array  # [endpoints] index into server_names, -1 when not a GPU
    server_names: tuple[str, ...]

    def job(self, label: str) -> Job | None:
        return next((j for j in self.jobs if j.label == label), None)


def gpu_rows(flows: table.FlowTable, server_of: I32Array) -> npt.NDArray[np.bool_]:
    """Flows between two different GPUs of the fabric (Algorithm 1's input F over X)."""
    out: npt.NDArray[np.bool_] = (
        (server_of[flows.src] >= 0) & (server_of[flows.dst] >= 0) & (flows.src != flows.dst)
    )
    return out


def recognize(
    flows: table.FlowTable, topo: topology.Topology, settings: JobSettings = JobSettings()
) -> Recognition:
    """Algorithm 1 over ``flows``; endpoints that are not GPUs are ignored."""
    server_of, server_names = topo.locate(flows.endpoints)
    n = len(flows.endpoints)
    keep = gpu_rows(flows, server_of)
    pairs = np.unique(
        np.minimum(flows.src[keep], flows.dst[keep]).astype(np.int64) * n
        + np.maximum(flows.src[keep], flows.dst[keep])
    )
    root = components(n, pairs // n, pairs % n)
    used = np.zeros(n, dtype=bool)
    used[pairs // n] = True
    used[pairs % n] = True
    # (1) cross-machine clusters and their server sets
    members: dict[int, list[int]] = defaultdict(list)
    for ep in np.flatnonzero(used).tolist():
        members[int(root[ep])].append(ep)
    clusters = list(members.values())
    servers = [frozenset(int(server_of[e]) for e in c) for c in clusters]
    # (2) merge clusters by Jaccard similarity of their server sets
    merged = _merge(servers, settings.jaccard)
    groups: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(merged.tolist()):
        groups[g].append(i)
    found = []
    for idx in groups.values():
        eps = np.sort(np.concatenate([np.array(clusters[i], dtype=np.int64) for i in idx]))
        names = tuple(sorted({server_names[s] for i in idx for s in servers[i]}))
        found.append((names, eps, len(idx)))
    found.sort(key=lambda f: f[0])
    jobs = tuple(
        Job(label=f"job-{k}", endpoints=eps, servers=names, clusters=c)
        for k, (names, eps, c) in enumerate(found)
    )
    job_of = np.full(n, -1, dtype=np.int32)
    for k, j in enumerate(jobs):
        job_of[j.endpoints] = k
    return Recognition(jobs=jobs, job_of=job_of, server_of=server_of, server_names=server_names)


def _merge(servers: list[frozenset[int]], jaccard: float) -> IntArray:
    """Group index of each cluster after merging by server-set similarity."""
    if jaccard >= 1.0:  # identical sets: hashing, linear time
        ids: dict[frozenset[int], int] = {}
        return np.array([ids.setdefault(s, len(ids)) for s in servers], dtype=np.int64)
    ds = DisjointSet(len(servers))
    for i in range(len(servers)):
        for j in range(i + 1, len(servers)):
            inter = len(servers[i] & servers[j])
            if inter and inter / len(servers[i] | servers[j]) >= jaccard:
                ds.union(i, j)
    return ds.labels()
