"""DP/PP identification (LLMPrism Algorithm 2): step division, distinct sizes, refinement."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from collscope.nodeagent.bundle import models
from collscope.operator.analysis.flows import engine, jobs, parallelism, table, topology
from collscope.operator.simulator.flows import engine as simulator

Report = Callable[..., tuple[simulator.FlowSimResult, engine.FlowReport]]
S = 1_000_000_000
MS = 1_000_000


def _truth_dp(report: engine.FlowReport, res: simulator.FlowSimResult) -> np.ndarray:
    names, types = report.flows.endpoints, res.truth.pair_types()
    par = report.parallelism
    return np.array(
        [
            types[(min(names[a], names[b]), max(names[a], names[b]))] == "dp"
            for a, b in zip(par.a.tolist(), par.b.tolist(), strict=True)
        ]
    )


def test_every_simulated_pair_is_labelled_as_in_truth(flow_report: Report) -> None:
    res, report = flow_report()
    truth_dp = _truth_dp(report, res)
    assert truth_dp.any() and (~truth_dp).any()
    assert np.array_equal(report.parallelism.dp, truth_dp)


def test_dp_groups_are_the_true_rings(flow_report: Report) -> None:
    res, report = flow_report()
    par, names = report.parallelism, report.flows.endpoints
    got = {frozenset(names[m] for m in par.group_members(g)) for g in range(len(par.group_label))}
    assert got == {frozenset(g.members) for g in res.truth.dp_groups}


def _synthetic(dp_single_size: bool) -> tuple[table.FlowTable, models.Job]:
    """One job on 3 servers: a DP ring a0-a1-a2 (a0 on s0 ...) and a PP pair a0-b1.

    8 steps, 5 s apart. Each step: 4 DP buckets per ring link (3 sizes), 16 PP flows of one
    size. ``dp_single_size``: link a1-a2 carries one bucket size only (looks PP).
    """
    eps = ["a0", "a1", "a2", "b1"]
    node = {"a0": "s0", "a1": "s1", "a2": "s2", "b1": "s1"}
    rows: list[tuple[int, int, int, int]] = []  # ts, src, dst, bytes
    for step in range(8):
        t = step * 5 * S
        for i in range(16):
            rows.append((t + i * 100 * MS, 0, 3, 8 << 20))
        for k, size in enumerate((300 << 20, 300 << 20, 200 << 20, 100 << 20)):
            ts = t + 2 * S + k * 20 * MS
            rows += [(ts, 0, 1, size), (ts, 2, 0, size)]
            rows.append((ts, 1, 2, 300 << 20 if dp_single_size else size))
    cols = np.array(rows, dtype=np.int64)
    flows = table.FlowTable.from_columns(
        endpoints=eps,
        src=cols[:, 1],
        dst=cols[:, 2],
        ts=cols[:, 0],
        nbytes=cols[:, 3],
        duration=cols[:, 3] // 40,
    )
    ranks = [models.RankInfo(rank=i, node=node[e], nic=e) for i, e in enumerate(eps)]
    return flows, models.Job(world_size=len(eps), ranks=ranks)


def _identify(
    flows: table.FlowTable, job: models.Job, *, refine: bool = True
) -> tuple[dict[tuple[str, str], bool], dict[tuple[str, str], bool]]:
    rec = jobs.recognize(flows, topology.Topology.from_job(job))
    par = parallelism.identify(flows, rec, parallelism.ParallelismSettings(refine=refine))
    names = flows.endpoints
    keys = [(names[a], names[b]) for a, b in zip(par.a.tolist(), par.b.tolist(), strict=True)]
    return dict(zip(keys, par.dp_raw.tolist(), strict=True)), dict(
        zip(keys, par.dp.tolist(), strict=True)
    )


def test_refinement_repairs_a_dp_pair_that_looked_pp() -> None:
    flows, job = _synthetic(dp_single_size=True)
    raw, refined = _identify(flows, job)
    assert raw[("a1", "a2")] is False  # one size per step: Mode(N_k) = 1
    assert refined[("a1", "a2")] is True  # a1 ~ a0 ~ a2 are DP: so is a1-a2
    assert refined[("a0", "b1")] is False and refined[("a0", "a1")] is True
    _, unrefined = _identify(flows, job, refine=False)
    assert unrefined[("a1", "a2")] is False


def test_steps_are_divided_by_bocd() -> None:
    flows, job = _synthetic(dp_single_size=False)
    rec = jobs.recognize(flows, topology.Topology.from_job(job))
    par = parallelism.identify(flows, rec)
    names = flows.endpoints
    steps = {
        (names[a], names[b]): int(n)
        for a, b, n in zip(par.a.tolist(), par.b.tolist(), par.steps.tolist(), strict=True)
    }
    assert steps[("a0", "a1")] == 8  # 8 DP phases, 5 s apart
    assert steps[("a0", "b1")] == 8


@pytest.mark.parametrize(("repeats", "dp"), [(2, False), (1, True)])
def test_a_one_off_size_does_not_make_a_pp_pair_dp(repeats: int, dp: bool) -> None:
    # A PP pair whose flows show no step gap (one undivided "step", as a 1F1B pipeline's
    # small inter-step gaps often leave it), with one odd-sized record among 120.
    n = 120
    nbytes = np.full(n, 8 << 20)
    nbytes[40] = 3_141_593
    flows = table.FlowTable.from_columns(
        endpoints=["a0", "b0"],
        src=np.arange(n) % 2,
        dst=1 - np.arange(n) % 2,
        ts=np.arange(n) * 300 * MS,
        nbytes=nbytes,
        duration=np.full(n, 200_000),
    )
    job = models.Job(
        world_size=2,
        ranks=[
            models.RankInfo(rank=0, node="s0", nic="a0"),
            models.RankInfo(rank=1, node="s1", nic="b0"),
        ],
    )
    rec = jobs.recognize(flows, topology.Topology.from_job(job))
    par = parallelism.identify(
        flows, rec, parallelism.ParallelismSettings(min_size_repeats=repeats)
    )
    assert par.steps.tolist() == [1]
    assert bool(par.dp[0]) is dp  # the guard keeps it PP; the paper's plain count does not


def test_running_max_restarts_per_segment() -> None:
    values = np.array([5, 3, 9, 1, 2, 7, 4], dtype=np.int64)
    seg = np.array([0, 0, 0, 1, 1, 2, 2], dtype=np.int64)
    assert parallelism.running_max(values, seg).tolist() == [5, 5, 9, 1, 2, 7, 7]
