"""Function-level localisation of a live job from the agents' profile reports: the slow data
loader's rank and function named with β/μ/sigma against the median worker, a healthy job with no
function culprit, and ranks that were not profiled reported, not guessed."""

from __future__ import annotations

import random

from collscope.nodeagent import api
from collscope.nodeagent.bundle import models
from collscope.operator.clients import agents
from collscope.operator.controller import profiling

W = 16  # two nodes of 8: enough workers for the comparisons with two left out
JOB = models.Job(world_size=W, ranks=[models.RankInfo(rank=r, node=f"node-{r // 8}")
                                      for r in range(W)])  # fmt: skip
LOADER = "__main__.train;data.load_batch"
STEP = "__main__.train;model.step"
WINDOW = 10_000_000_000


def rank_profile(r: int, rng: random.Random, slow: int | None) -> api.RankProfile:
    load = 0.40 if r == slow else 0.05 * rng.uniform(0.95, 1.05)
    pats = [
        models.FunctionPattern(rank=r, fn=LOADER, kind="python", beta=round(load, 4),
                               mu=0.02, sigma=0.01, window_ns=WINDOW),
        models.FunctionPattern(rank=r, fn=STEP, kind="python", beta=round(0.9 - load, 4),
                               mu=0.95 * rng.uniform(0.98, 1.02), sigma=0.02, window_ns=WINDOW),
    ]  # fmt: skip
    use = [api.ResourceUse(device=f"gpu{r % 4}", metric="sm_util", mean=0.3, max=0.5, samples=9)]
    return api.RankProfile(rank=r, state="done", patterns=pats, resources=use, samples=1000)


def reports(slow: int | None, **replace: api.RankProfile) -> dict[str, api.ProfileReport]:
    rng = random.Random(1)
    ranks = {r: rank_profile(r, rng, slow) for r in range(W)}
    for k, v in replace.items():
        ranks[int(k)] = v
    return {
        f"node-{n}": api.ProfileReport(id="x", node=f"node-{n}", deadline_ns=1,
                                       ranks=[ranks[r] for r in range(8 * n, 8 * n + 8)])
        for n in range(2)
    }  # fmt: skip


def test_the_slow_loader_rank_and_function_are_named() -> None:
    d = profiling.localise(reports(5), JOB)
    assert d.anomaly
    named = [(c.rank, c.function) for c in d.culprits if c.function]
    assert named[0] == (5, LOADER) and {r for r, _ in named} == {5}  # its step is shorter too
    line = next(e for e in d.evidence if e.startswith("rank 5: "))
    assert LOADER in line and "β 0.400" in line and "median worker's β 0.05" in line
    assert any(e.startswith("rank 5 over the window: gpu1 sm_util") for e in d.evidence)


def test_a_healthy_job_has_no_function_culprit() -> None:
    d = profiling.localise(reports(None), JOB)
    assert not d.anomaly and not [c for c in d.culprits if c.function]


def test_unprofiled_ranks_are_reported_not_guessed() -> None:
    gone = api.RankProfile(rank=2, state="no probe", reason="no probe answered before the deadline")
    held = api.RankProfile(rank=6, state="failed", reason="CUPTI held by another profiler")
    d = profiling.localise(reports(5, **{"2": gone, "6": held}), JOB,
                           [agents.Unreachable("node-9", "timeout")])  # fmt: skip
    assert next((c.rank, c.function) for c in d.culprits if c.function) == (5, LOADER)
    assert "rank 2 (node-0) not profiled: no probe (no probe answered before the deadline)" in (
        d.evidence
    )
    assert any("rank 6 (node-0) not profiled: failed (CUPTI held" in e for e in d.evidence)
    assert "node node-9: its agent did not answer (timeout)" in d.evidence


def test_too_few_ranks_and_pending() -> None:
    reps = reports(5)
    small = {"node-0": reps["node-0"].model_copy(update={"ranks": reps["node-0"].ranks[:2]})}
    d = profiling.localise(small, JOB)
    assert not d.anomaly and "fewer than 3" in d.evidence[0]
    assert not profiling.pending(reps)
    waiting = api.RankProfile(rank=0, state="armed")
    assert profiling.pending({"n": api.ProfileReport(id="x", node="n", ranks=[waiting])})


def test_request_ids_fit_the_agents_syntax() -> None:
    rid = profiling.request_id("llama/70b job", 1_732_001_234_567_000_000)
    assert rid == "llama-70b-job-1732001234567"
    assert api.ProfileRequest(id=rid).id == rid
