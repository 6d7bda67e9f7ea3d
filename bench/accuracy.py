"""Diagnosis accuracy over simulated faults: does collscope find the right rank, the right
category, fast, and never alarm on a healthy job?

    .venv/bin/python bench/accuracy.py                 # the full sweep recorded in bench/README.md
    .venv/bin/python bench/accuracy.py --quick         # a smoke sweep, a minute or two
    .venv/bin/python bench/accuracy.py --json out.json # also keep every case

Each case simulates a job (collscope.operator.simulator) with one fault, runs the analysis
exactly as `collscope analyze` does (analysis.engine.diagnose on the in-memory bundle: the
bundle file round trip is tested separately and would only add I/O time here), and compares the
diagnosis with truth.json: detected (anomaly reported), top-1 culprit in the truth's culprit
ranks, category equal to the expected one, detection latency (detected_at - onset), analysis
wall time. Fault-free runs count a false alarm when any anomaly is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

from collscope.operator.analysis import engine as analysis
from collscope.operator.simulator import config, truth
from collscope.operator.simulator import engine as simulator

# (ranks, faulty seeds per (fault, algo), fault-free seeds per algo). 1,024-rank cases cost the
# most simulation time, so they get fewer seeds; totals: 330 faulty and 52 fault-free cases.
FULL_PLAN = ((16, 6, 12), (64, 6, 12), (256, 2, 2), (1024, 1, 0))
QUICK_PLAN = ((16, 1, 2), (64, 1, 2))
ALGOS: tuple[config.Algo, ...] = ("ring", "tree")


@dataclass(frozen=True)
class Case:
    fault: str
    ranks: int
    algo: config.Algo
    seed: int


@dataclass(frozen=True)
class Outcome:
    case: Case
    detected: bool
    top1: bool
    category_ok: bool
    category: str | None
    latency_s: float | None
    analysis_s: float
    simulate_s: float


def plan_cases(plan: tuple[tuple[int, int, int], ...]) -> list[Case]:
    cases = []
    for ranks, faulty_seeds, healthy_seeds in plan:
        for algo in ALGOS:
            for fault in truth.FAULT_NAMES[1:]:
                cases += [Case(fault, ranks, algo, s) for s in range(faulty_seeds)]
            cases += [Case("none", ranks, algo, 100 + s) for s in range(healthy_seeds)]
    return cases


def run_case(case: Case) -> Outcome:
    tp, pp, dp = config.default_parallelism(case.ranks)
    cfg = config.SimConfig(
        ranks=case.ranks,
        tp=tp,
        pp=pp,
        dp=dp,
        algo=case.algo,
        dp_mode="allreduce" if case.algo == "tree" else "rs-ag",
        fault=truth.Fault.from_name(case.fault),
        seed=case.seed,
    )
    t0 = time.perf_counter()
    sim = simulator.simulate(cfg)
    t1 = time.perf_counter()
    diag = analysis.diagnose(sim.bundle)
    t2 = time.perf_counter()
    tr = sim.truth
    if tr.expected_category is None:
        detected, top1, cat_ok = diag.anomaly, not diag.anomaly, not diag.anomaly
    else:
        detected = diag.anomaly
        top1 = detected and bool(diag.culprits) and diag.culprits[0].rank in tr.culprit_ranks
        cat_ok = detected and diag.category == tr.expected_category
    latency = (
        None
        if diag.detected_at is None or tr.onset is None
        else (diag.detected_at - tr.onset) / 1e9
    )
    return Outcome(case, detected, top1, cat_ok, diag.category, latency, t2 - t1, t1 - t0)


def _pct(n: int, d: int) -> str:
    return "-" if d == 0 else f"{100.0 * n / d:.0f}%"


def _q(values: list[float], q: float) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[min(len(values) - 1, int(q * len(values)))]:.2f}"


def table(outcomes: list[Outcome]) -> str:
    rows = [
        "| fault | cases | detected | top-1 culprit | category | latency median s | "
        "latency p90 s | analysis median s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for fault in truth.FAULT_NAMES:
        sel = [o for o in outcomes if o.case.fault == fault]
        if not sel:
            continue
        lat = [o.latency_s for o in sel if o.latency_s is not None and o.detected]
        ana = [o.analysis_s for o in sel]
        if fault == "none":
            alarms = sum(o.detected for o in sel)
            rows.append(
                f"| none (false alarms) | {len(sel)} | {alarms} alarms | - | - | - | - |"
                f" {statistics.median(ana):.2f} |"
            )
            continue
        rows.append(
            f"| {fault} | {len(sel)} | {_pct(sum(o.detected for o in sel), len(sel))} "
            f"| {_pct(sum(o.top1 for o in sel), len(sel))} "
            f"| {_pct(sum(o.category_ok for o in sel), len(sel))} "
            f"| {_q(lat, 0.5)} | {_q(lat, 0.9)} | {statistics.median(ana):.2f} |"
        )
    faulty = [o for o in outcomes if o.case.fault != "none"]
    hang = [
        o.latency_s
        for o in faulty
        if o.latency_s is not None and o.detected and truth.Fault.from_name(o.case.fault).value.hang
    ]
    rows.append(
        f"| **all faults** | {len(faulty)} | "
        f"{_pct(sum(o.detected for o in faulty), len(faulty))} | "
        f"{_pct(sum(o.top1 for o in faulty), len(faulty))} | "
        f"{_pct(sum(o.category_ok for o in faulty), len(faulty))} | "
        f"hangs: {_q(hang, 0.5)} | hangs: {_q(hang, 0.9)} | |"
    )
    return "\n".join(rows)


def by_size(outcomes: list[Outcome]) -> str:
    rows = [
        "| ranks | algo | faulty cases | top-1 | category | fault-free cases | false alarms |",
        "|---|---|---|---|---|---|---|",
    ]
    for ranks in sorted({o.case.ranks for o in outcomes}):
        for algo in ("ring", "tree"):
            sel = [o for o in outcomes if o.case.ranks == ranks and o.case.algo == algo]
            f = [o for o in sel if o.case.fault != "none"]
            h = [o for o in sel if o.case.fault == "none"]
            rows.append(
                f"| {ranks} | {algo} | {len(f)} | {_pct(sum(o.top1 for o in f), len(f))}"
                f" | {_pct(sum(o.category_ok for o in f), len(f))} | {len(h)} | "
                f"{sum(o.detected for o in h)} |"
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small smoke sweep")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--json", default=None, help="write every case's outcome to this file")
    args = p.parse_args(argv)
    cases = plan_cases(QUICK_PLAN if args.quick else FULL_PLAN)
    t0 = time.perf_counter()
    # Large cases first so the pool does not end on one long straggler.
    cases.sort(key=lambda c: -c.ranks)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(run_case, cases))
    wall = time.perf_counter() - t0
    wrong = [o for o in outcomes if not (o.top1 and o.category_ok)]
    print(f"# collscope accuracy: {len(outcomes)} cases in {wall:.0f}s with {args.jobs} workers")
    print(f"# command: {' '.join(sys.argv)}\n")
    print(table(outcomes))
    print()
    print(by_size(outcomes))
    if wrong:
        print("\nmisdiagnosed cases (fault ranks algo seed -> category):")
        for o in wrong:
            print(
                f"  {o.case.fault} {o.case.ranks} {o.case.algo} {o.case.seed} -> "
                f"{o.category} detected={o.detected} top1={o.top1}"
            )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(o) for o in outcomes], fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
