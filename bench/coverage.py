"""Coverage of big jobs: how long until the rotating sample has watched every DP group, and
whether a slowdown confined to one DP group is then found, within the stated bound.

    .venv/bin/python bench/coverage.py            # both tables, ~2 min on 2 cores
    .venv/bin/python bench/coverage.py --bound    # the bound table only, seconds

1. *Bound.* For each shape, the DP groups come from the declared layout alone (no simulation,
   so 16,384 ranks cost nothing), ``analysis.rotation.plan`` makes the plan the trigger uses
   (budget 10 ranks, dwell 3 ticks), and two numbers are printed side by side: the stated
   bound ``ceil(G / 10) * 3`` ticks and the *measured* one, ``rotation.coverage_ticks``: ticks
   from the first until every DP group had one of its ranks watched 3 ticks in a row.
2. *Detection.* ``nic-slow`` (Mycroft #2, the NIC at 1/8 bandwidth) on one rank of a DP group
   that is *not* an anchor, simulated (collscope.operator.simulator, bench/accuracy.py's
   shapes) with the onset at several phases of the rotation, the run lasting past the
   worst-case latency, analysed by ``engine.diagnose`` exactly as bench/accuracy.py does.
   The bound is stated from the first *slow tick*, the first tick at which the trigger's
   rules see the slowdown on a watched rank: the next visit of the group starts within
   ``period - 1`` ticks of it and fires on its last (``dwell``-th) tick, ``period + dwell - 2``
   ticks after it at worst, where a rank watched on every tick fires ``dwell - 1`` ticks after
   it. So rotation adds at most ``period - 1`` ticks. Measured the same way: each case is also
   diagnosed with only the culprit watched, on every tick (``sampled=[culprit]``), and the
   table gives the latency after the onset and the extra delay over that run, against
   ``period - 1``. (When the first slow tick comes after the onset depends on the trigger's
   rules and the job's step, not on sampling.)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import engine, groups, rotation
from collscope.operator.simulator import config, truth
from collscope.operator.simulator import engine as simulator

BUDGET = 10  # Mycroft §4.3, engine.AnalysisSettings.max_sampled
DWELL = 3  # trigger.TriggerSettings.repeat_ticks
# (ranks, tp, pp): bench/accuracy.py's default shapes (TP8 x PP2), then deeper pipelines
# that give more DP groups at the same size.
SHAPES = (
    (64, 8, 2), (256, 8, 2), (1024, 8, 2), (16384, 8, 2),
    (1024, 8, 4), (16384, 8, 8), (16384, 8, 16), (16384, 4, 16),
)  # fmt: skip
# (ranks, groups tried, onsets in s): onsets one tick apart cover every phase of a 6-tick
# period with the groups' own offsets; 1,024 ranks cost ~10 s a simulation, so fewer cases.
DETECT = ((64, 12, (5.0, 6.0, 7.0)), (256, 6, (5.0, 7.0)), (1024, 2, (5.0,)))


def declared(ranks: int, tp: int, pp: int, per_node: int = 8) -> tuple[groups.Groups, models.Job]:
    job = models.Job(
        world_size=ranks,
        parallelism=models.Parallelism(tp=tp, pp=pp, dp=ranks // (tp * pp)),
        ranks=[models.RankInfo(rank=r, node=f"n{r // per_node}") for r in range(ranks)],
    )
    return groups.build(tables.BundleBuilder(job).build()), job


def bound_table() -> str:
    head = "| ranks | TP x PP x DP | DP groups | anchors | rotating slots | stated bound (ticks) "
    rows = [head + "| measured (ticks) | plan computed in s |", "|---|---|---|---|---|---|---|---|"]
    for ranks, tp, pp in SHAPES:
        grp, job = declared(ranks, tp, pp)
        dpg = groups.dp_groups(grp, job)
        t0 = time.perf_counter()
        plan = rotation.plan(grp, job, BUDGET, dwell_ticks=DWELL)
        took = time.perf_counter() - t0
        stated = math.ceil(len(dpg) / BUDGET) * DWELL if len(dpg) > BUDGET else 1
        measured = rotation.coverage_ticks(plan, dpg)
        slots = plan.slots if plan.rotation else 0
        rows.append(
            f"| {ranks:,} | {tp} x {pp} x {ranks // (tp * pp)} | {len(dpg)} | "
            f"{len(plan.anchors)} | {slots} | {stated} | {measured} | {took:.2f} |"
        )
    return "\n".join(rows)


@dataclass(frozen=True)
class Case:
    ranks: int
    target: int
    onset_s: float
    duration_s: float


@dataclass(frozen=True)
class Found:
    case: Case
    right: bool
    latency_s: float | None  # detection - onset
    extra_s: float | None  # detection - detection with the culprit watched on every tick
    bound_s: float  # period - 1 ticks


def detect_cases() -> list[Case]:
    cases = []
    for ranks, ngroups, onsets in DETECT:
        tp, pp, _ = config.default_parallelism(ranks)
        grp, job = declared(ranks, tp, pp)
        plan = rotation.plan(grp, job, BUDGET, dwell_ticks=DWELL)
        worst = plan.period_ticks + DWELL - 1
        # One rank per rotating group, spread over the visiting order (so over its phases) and,
        # by the odd/even offset, over both pipeline stages (the order alternates them).
        n = len(plan.rotation)
        odd = n >= 2 * ngroups  # room for the offset
        picks = {min(n - 1, i * n // ngroups + (i % 2 if odd else 0)) for i in range(ngroups)}
        for r in (plan.rotation[i] for i in sorted(picks)):
            cases += [Case(ranks, r, on, on + worst + 2.0) for on in onsets]
    return cases


def run(case: Case) -> Found:
    tp, pp, dp = config.default_parallelism(case.ranks)
    cfg = config.SimConfig(
        ranks=case.ranks, tp=tp, pp=pp, dp=dp, algo="ring", dp_mode="rs-ag",
        fault=truth.Fault.from_name("nic-slow"), target=case.target, onset_s=case.onset_s,
        duration_s=case.duration_s, seed=0,
    )  # fmt: skip
    sim = simulator.simulate(cfg)
    d = engine.diagnose(sim.bundle)
    grp = groups.build(sim.bundle)
    plan = rotation.plan(grp, sim.bundle.job, BUDGET, dwell_ticks=DWELL)
    right = (
        d.anomaly
        and d.category == "slow.network"
        and bool(d.culprits)
        and d.culprits[0].rank in sim.truth.culprit_ranks
    )
    onset = sim.truth.onset
    latency = None if d.detected_at is None or onset is None else (d.detected_at - onset) / 1e9
    watched = engine.diagnose(sim.bundle, sampled=[case.target])
    extra = (
        None
        if d.detected_at is None or watched.detected_at is None
        else (d.detected_at - watched.detected_at) / 1e9
    )
    return Found(case, right, latency, extra, float(plan.period_ticks - 1))


def detect_table(found: list[Found]) -> str:
    head = "| ranks | DP groups | cases | right rank and category | after onset: median / max s "
    rows = [head + "| extra over the culprit always watched: median / max s | stated max extra s |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for ranks, _, _ in DETECT:
        sel = [f for f in found if f.case.ranks == ranks]
        lat = [f.latency_s for f in sel if f.right and f.latency_s is not None]
        aft = [f.extra_s for f in sel if f.right and f.extra_s is not None]
        tp, pp, _ = config.default_parallelism(ranks)
        ngroups = len(groups.dp_groups(*declared(ranks, tp, pp)))
        rows.append(
            f"| {ranks:,} | {ngroups} | {len(sel)} | {sum(f.right for f in sel)} | "
            f"{_mm(lat)} | {_mm(aft)} | {sel[0].bound_s:.0f} |"
        )
    return "\n".join(rows)


def _mm(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} / {max(values):.2f}" if values else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bound", action="store_true", help="the bound table only")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    print(f"# command: bench/coverage.py{' --bound' if args.bound else ''}")
    print(f"# budget {BUDGET} ranks, dwell {DWELL} ticks of 1 s\n")
    print(bound_table())
    if args.bound:
        return 0
    cases = detect_cases()
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        found = list(pool.map(run, cases))
    print(f"\n# nic-slow in a rotating DP group: {len(cases)} cases in "
          f"{time.perf_counter() - t0:.0f} s with {args.workers} workers\n")  # fmt: skip
    print(detect_table(found))
    for f in found:
        if not f.right or f.extra_s is None or f.extra_s > f.bound_s + 0.01:
            print(f"miss or late: {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
