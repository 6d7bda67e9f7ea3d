"""The paper's case studies (EROICA §6.1, §6.2, Appendix A), synthetic, against ground truth."""

from __future__ import annotations

import numpy as np
import pytest

from collscope.operator.analysis.patterns import engine, table
from collscope.operator.simulator.patterns import cases
from collscope.operator.simulator.patterns import engine as sim

WORKERS = 3400  # EROICA §6.2


def _table(p: cases.Patterns) -> table.PatternTable:
    w, f = p.beta.shape
    return table.PatternTable.from_arrays(
        rank=np.repeat(np.arange(w), f),
        fn_id=np.tile(np.arange(f), w),
        beta=p.beta.ravel(),
        mu=p.mu.ravel(),
        sigma=p.sigma.ravel(),
        fns=[x[0] for x in cases.FUNCTIONS],
        fn_kind=[x[1] for x in cases.FUNCTIONS],
    )


def _run(
    case: str, seed: int, workers: int = WORKERS
) -> tuple[cases.Patterns, engine.PatternReport]:
    p = cases.generate(case, workers, seed)
    return p, engine.analyze(_table(p))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("workers", [64, WORKERS])
def test_healthy_jobs_raise_no_alarm(seed: int, workers: int) -> None:
    p, rep = _run("healthy", seed, workers)
    assert rep.findings == () and rep.imbalance is None
    d = engine.diagnose_patterns(_table(p))
    assert not d.anomaly and d.culprits == []


@pytest.mark.parametrize("seed", range(3))
def test_nic_down_names_the_worker_with_low_mu_and_low_sigma(seed: int) -> None:
    p, rep = _run("nic-down", seed)
    d = engine.to_diagnosis(rep, job=sim.job(WORKERS))
    assert d.category == "slow.network"
    assert d.culprits[0].rank == p.culprit_ranks[0]
    assert d.culprits[0].function == "ncclDevKernel_SendRecv"
    assert d.culprits[0].node == f"gpu-node-{p.culprit_ranks[0] // 8:04d}"
    assert [f.fn for f in rep.findings] == ["ncclDevKernel_SendRecv"]
    assert rep.findings[0].distinct.tolist() == [p.culprit_ranks[0]]
    assert any("stands apart" in e and "μ 0.30" in e for e in d.evidence)


@pytest.mark.parametrize("seed", range(3))
def test_gc_flags_exactly_the_random_workers(seed: int) -> None:
    p, rep = _run("gc", seed)
    flagged = {int(r) for f in rep.findings for r in f.ranks}
    assert flagged == set(p.culprit_ranks)
    assert {f.fn for f in rep.findings} == set(p.culprit_fns)
    d = engine.to_diagnosis(rep, job=None)
    assert d.category == "slow.host"
    assert any("garbage collection" in e for e in d.evidence)


@pytest.mark.parametrize("seed", range(3))
def test_throttled_gpus_are_high_beta_low_mu_kernels(seed: int) -> None:
    p, rep = _run("gpu-throttle", seed)
    assert {f.fn for f in rep.findings} == set(p.culprit_fns)
    for f in rep.findings:
        assert set(f.ranks.tolist()) == set(p.culprit_ranks)
    d = engine.to_diagnosis(rep, job=None)
    assert d.category == "slow.compute" and d.culprits[0].rank in p.culprit_ranks


@pytest.mark.parametrize("seed", range(3))
def test_pin_memory_sentence_names_the_three_ranks(seed: int) -> None:
    p, rep = _run("pin-memory", seed)
    assert [f.fn for f in rep.findings] == ["pin_memory"]
    d = engine.to_diagnosis(rep, job=None)
    ranks = ", ".join(map(str, p.culprit_ranks))
    assert d.evidence[0].startswith("pin_memory (memory): β ")
    assert f"on ranks {ranks} vs ≤ 0.01 elsewhere" in d.evidence[0]
    assert {c.rank for c in d.culprits} == set(p.culprit_ranks)


@pytest.mark.parametrize("seed", range(3))
def test_load_imbalance_is_same_mu_spread_beta(seed: int) -> None:
    p, rep = _run("load-imbalance", seed)
    assert rep.findings == ()
    assert rep.imbalance is not None
    busiest = set(rep.imbalance.busiest)
    assert busiest == set(p.culprit_ranks)
    d = engine.to_diagnosis(rep, job=None)
    assert d.evidence[0].startswith("load imbalance: 3 of 3 GPU kernels")
    assert {c.component for c in d.culprits} == {"software"}


def test_common_problem_on_all_workers_is_reported_once() -> None:
    p = cases.generate("healthy", 200, 0)
    p.beta[:, cases.FN["socket.py(705): recv_into"]] = 0.2  # slow storage on every worker
    rep = engine.analyze(_table(p))
    assert [f.fn for f in rep.findings] == ["socket.py(705): recv_into"]
    assert rep.findings[0].common
    d = engine.to_diagnosis(rep, job=None)
    assert "on 200 of 200 workers" in d.evidence[0] and "whole job" in d.evidence[0]
