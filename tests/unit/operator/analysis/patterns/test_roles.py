"""Issue 17: roles before differences, and false-discovery control across comparisons."""

from __future__ import annotations

import numpy as np
import pytest

from collscope.nodeagent.bundle import models
from collscope.operator.analysis.patterns import discoveries, engine, roles, table
from collscope.operator.simulator.patterns import cases


def _table(p: cases.Patterns) -> table.PatternTable:
    r, c, b, m, s = p.rows()
    return table.PatternTable.from_arrays(
        rank=r,
        fn_id=c,
        beta=b,
        mu=m,
        sigma=s,
        fns=[f[0] for f in p.fns],
        fn_kind=[f[1] for f in p.fns],
    )


def test_stages_come_from_job_json_order() -> None:
    job = models.Job(world_size=64, parallelism=models.Parallelism(tp=8, pp=4, dp=2))
    st = roles.stages(job, np.arange(64))
    assert st is not None and st[:16].tolist() == [0] * 16 and st[48:].tolist() == [3] * 16
    inner = models.Parallelism(tp=8, pp=4, dp=2, order="tp-pp-cp-ep-dp")
    st = roles.stages(models.Job(world_size=64, parallelism=inner), np.arange(64))
    assert st is not None and st[:32].tolist() == [r // 8 % 4 for r in range(32)]


def test_roles_from_function_sets_absorb_a_few_workers_with_an_extra_function() -> None:
    p = cases.generate("healthy", 64, 0, pp=4)
    rl = roles.derive(_table(p))
    assert rl.source == "functions" and len(rl.names) == 3  # first, middle two, last stage
    assert rl.of[:16].tolist() == [rl.of[0]] * 16
    # three workers running one more function stay in their role: not a role of three
    t = _table(p)
    extra = table.PatternTable.from_arrays(
        rank=[*t.rank, 20, 21, 22],
        fn_id=[*t.fn_id, *[len(t.fns)] * 3],
        beta=[*t.beta, 0.2, 0.2, 0.2],
        mu=[*t.mu, 0.5, 0.5, 0.5],
        sigma=[*t.sigma, 0.1, 0.1, 0.1],
        fns=[*t.fns, "stall"],
        fn_kind=[*t.fn_kind, "kernel"],
    )
    assert len(roles.derive(extra).names) == 3


@pytest.mark.parametrize("with_job", [False, True])
def test_a_function_only_one_stage_runs_is_that_stage_s_not_an_anomaly(with_job: bool) -> None:
    p = cases.generate("healthy", 64, 1, pp=4)
    job = models.Job(world_size=64, parallelism=models.Parallelism(tp=8, pp=4, dp=2))
    d = engine.diagnose_patterns(_table(p), job=job if with_job else None)
    assert not d.anomaly, d.evidence
    assert any("roles" in e for e in d.evidence)


def test_bh_cutoff_grows_stricter_with_the_number_of_comparisons() -> None:
    t = discoveries.Tally(0.01)
    t.add(np.array([1e-5, 0.5, 0.9]))
    assert t.cutoff() == pytest.approx(1e-5)  # 1e-5 <= 0.01 x 1 / 3
    t.add(np.ones(10_000))
    assert t.cutoff() == -1.0  # 1e-5 > 0.01 x 1 / 10,003: that many comparisons make it usual


def test_robust_z_measures_each_worker_from_its_role_median() -> None:
    x = np.r_[np.full(30, 0.40), np.full(10, 0.46)] + np.tile([-0.01, 0.0, 0.01], 14)[:40]
    role = np.r_[np.zeros(30, dtype=np.int64), np.ones(10, dtype=np.int64)]
    assert discoveries.zscores(x).max() > 3  # a second role's level looks like outliers
    assert discoveries.zscores(x, role).max() < 2  # measured from their own role: ordinary


def test_sigma_alone_is_evidence_not_a_culprit() -> None:
    # 2,000 workers, sigma spread wide (lognormal, CV 0.3): thousands of comparisons
    p = cases.generate("healthy", 2000, 0, sigma_cv=0.3)
    rep = engine.analyze(_table(p))
    d = engine.to_diagnosis(rep, job=None)
    assert rep.findings == () and not d.anomaly
    # one worker with sigma far out but beta and mu ordinary: evidence, never a culprit
    p.sigma[7, cases.GEMM] = 1.0
    rep = engine.analyze(_table(p))
    assert rep.findings == () and any(7 in f.sigma_only for f in rep.sigma_only)
    d = engine.to_diagnosis(rep, job=None)
    assert not d.anomaly and any("only \u03c3 stands out" in e for e in d.evidence)
    # the same worker slower as well (mu down): a culprit
    p.mu[7, cases.GEMM] = 0.5
    d = engine.diagnose_patterns(_table(p))
    assert d.anomaly and d.culprits[0].rank == 7
