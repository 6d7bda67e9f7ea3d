"""Job recognition (LLMPrism Algorithm 1): union-find, topology, Jaccard merge."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from collscope.nodeagent.bundle import models
from collscope.operator.analysis.flows import jobs, table, topology
from collscope.operator.simulator.flows import engine as simulator

Sim = tuple[simulator.FlowSimResult, table.FlowTable]


def _table(pairs: list[tuple[str, str]]) -> table.FlowTable:
    names = sorted({n for p in pairs for n in p})
    idx = {n: i for i, n in enumerate(names)}
    n = len(pairs)
    return table.FlowTable.from_columns(
        endpoints=names,
        src=[idx[a] for a, _ in pairs],
        dst=[idx[b] for _, b in pairs],
        ts=np.arange(n) * 1000,
        nbytes=np.full(n, 1 << 20),
        duration=np.full(n, 100),
    )


def _job(servers: int, gpus: int = 2) -> models.Job:
    ranks = [
        models.RankInfo(rank=s * gpus + g, node=f"s{s}", gpu=g, nic=f"s{s}g{g}")
        for s in range(servers)
        for g in range(gpus)
    ]
    return models.Job(world_size=servers * gpus, ranks=ranks)


def test_disjoint_set_components() -> None:
    root = jobs.components(6, np.array([0, 1, 4]), np.array([1, 2, 5]))
    assert root[0] == root[1] == root[2]
    assert root[4] == root[5] != root[0]
    assert root[3] not in (root[0], root[4])


def test_rails_spanning_the_same_servers_merge_into_one_job() -> None:
    # job A: servers s0, s1, two rails (g0, g1) that never talk to each other over the network
    # job B: servers s2, s3, one rail only; s4g0 talks to storage, which is not a GPU
    flows = _table(
        [
            ("s0g0", "s1g0"),
            ("s0g1", "s1g1"),
            ("s2g0", "s3g0"),
            ("s4g0", "storage-1"),
        ]
    )
    rec = jobs.recognize(flows, topology.Topology.from_job(_job(5)))
    got = [sorted(flows.endpoints[e] for e in j.endpoints) for j in rec.jobs]
    assert got == [["s0g0", "s0g1", "s1g0", "s1g1"], ["s2g0", "s3g0"]]
    assert [j.clusters for j in rec.jobs] == [2, 1]
    assert [j.servers for j in rec.jobs] == [("s0", "s1"), ("s2", "s3")]
    storage = flows.endpoints.index("storage-1")
    assert rec.server_of[storage] == -1 and rec.job_of[storage] == -1


def test_different_server_sets_stay_apart_unless_jaccard_relaxed() -> None:
    # rail 0 seen on s0-s1-s2, rail 1 only on s0-s1 (its flows to s2 were lost): J = 2/3
    flows = _table([("s0g0", "s1g0"), ("s1g0", "s2g0"), ("s0g1", "s1g1")])
    topo = topology.Topology.from_job(_job(3))
    assert len(jobs.recognize(flows, topo).jobs) == 2
    assert len(jobs.recognize(flows, topo, jobs.JobSettings(jaccard=0.6)).jobs) == 1


def test_topology_locates_by_nic_then_node_prefix() -> None:
    topo = topology.Topology.from_job(_job(2))
    assert topo.server("s1g0") == "s1"
    assert topo.server("s1/mlx5_3") == "s1"
    assert topo.server("10.9.9.9") is None  # a topology is known: not a GPU
    bare = topology.Topology.from_job(None)
    assert bare.server("node7/mlx5_0") == "node7"
    assert bare.server("10.9.9.9") == "10.9.9.9"


def test_simulated_jobs_are_recognised_exactly(flow_sim: Callable[..., Sim]) -> None:
    res, ft = flow_sim()
    one_minute = ft.window(int(ft.ts[0]) + 20 * 10**9, int(ft.ts[0]) + 80 * 10**9)
    rec = jobs.recognize(one_minute, topology.Topology.from_job(res.job))
    got = {frozenset(one_minute.endpoints[e] for e in j.endpoints) for j in rec.jobs}
    want = {frozenset(j.endpoints) for j in res.truth.jobs}
    assert got == want
    assert all(j.clusters == 8 for j in rec.jobs)  # one cross-machine cluster per rail
