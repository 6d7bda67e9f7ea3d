"""The operator's rotating trigger, step for step as ``trigger_loop.tick`` takes it, on windows
cut from a simulated job instead of pulled from agents: each tick the watched ranks come from
``JobRuntime.resample``, a tick where one joins reaches back ``join_history_s``, the window is
numbered by ``JobRuntime.numbering`` and fed through ``TriggerState.watch`` and ``update``; the
Diagnosis then replays ``JobRuntime.diagnosis_window_s`` of every rank with the ranks watched
when it fired and every rank's summary row each tick (``diagnosis_handlers.analyse``)."""

from __future__ import annotations

from collscope.operator.analysis import engine, summaries, trigger, view
from collscope.operator.domain import groups, ids, jobs, settings
from collscope.operator.simulator import config, truth
from collscope.operator.simulator import engine as simulator

NS = 1_000_000_000
LOOP = settings.TriggerLoopSettings()


def test_a_slow_nic_outside_the_first_sample_is_found_live() -> None:
    # 64 ranks TP8 x PP2 x DP4 (16 DP groups, 8 ranks a node): rank 54's NIC at 1/8 bandwidth
    # from 5 s (bench/accuracy.py's "nic-slow 64 ring seed 4", run 16 s). The first sample,
    # Mycroft's, does not hold its DP group; the rotation visits it at ticks 3-5 and 9-11.
    cfg = config.SimConfig(
        ranks=64, tp=8, pp=2, dp=4, algo="ring", dp_mode="rs-ag", duration_s=16.0,
        fault=truth.Fault.from_name("nic-slow"), seed=4,
    )  # fmt: skip
    sim = simulator.simulate(cfg)
    bundle = sim.bundle
    assert sim.truth.culprit_ranks == [54]
    rt = jobs.JobRuntime()
    rt.ranks = {
        ids.Rank(r): jobs.RankPlace(ids.Rank(r), ids.NodeName(f"n{r // 8}"), f"p{r}", f"u{r}")
        for r in range(64)
    }
    declared = groups.declared(groups.parse("tp=8,pp=2,dp=4"), 64)
    analysis = engine.AnalysisSettings()
    span = bundle.time_span()
    assert span is not None
    hit: trigger.TriggerResult | None = None
    t = span[0]
    sample: tuple[ids.Rank, ...] = ()
    first_sample: tuple[ids.Rank, ...] = ()
    while hit is None and t + NS < span[1]:
        t += NS
        sample = rt.resample(analysis.trigger, declared)
        first_sample = first_sample or sample
        assert rt.state is not None
        joins = not set(sample) <= set(rt.state.sampled.tolist())
        back_s = max(LOOP.window_s, LOOP.join_history_s if joins else 0.0)
        window = view.select(bundle, ranks=list(sample), since_ns=t - int(back_s * NS), until_ns=t)
        window = rt.numbering.apply(window)
        rt.state.watch(tuple(int(r) for r in sample), window)
        hit = rt.state.update(window, t)
        rt.advance()
    assert first_sample and 54 not in first_sample
    assert hit is not None and hit.kind == "slow" and hit.ranks == (54,)
    assert (t - span[0]) // NS == 12 and rt.tick == 12  # ticks 10-12 s: the group's 2nd visit
    assert rt.diagnosis_window_s(10.0, 1.0) == 16.0
    cut = view.select(bundle, since_ns=t - 16 * NS, until_ns=t)
    # As diagnosis_handlers.analyse: the watched ranks, and every rank's summary row each tick.
    sampled = [int(r) for r in sample]
    d = engine.diagnose(cut, analysis, sampled=sampled, summaries=summaries.Summaries())
    assert d.anomaly and d.category == "slow.network" and d.culprits[0].rank == 54
