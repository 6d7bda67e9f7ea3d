"""EROICA localisation on one core: accuracy and false alarms, then time at 3,400 and 1 M workers.

    .venv/bin/python bench/patterns_localise.py                 # accuracy, then both sizes
    .venv/bin/python bench/patterns_localise.py --workers 3400  # one size
    .venv/bin/python bench/patterns_localise.py --accuracy-only

Accuracy (issue 17): every case of ``simulator.patterns.cases`` (collscope's own simulator) on
64, 1,024 and 4,096 workers, flat (pp = 1) and with 4 pipeline stages (stage-only functions;
roles left to the data, no job.json parallelism), with sigma's spread as before (CV 5 %) and
wide (lognormal, CV 30 %), ``--seeds`` seeds each. Healthy: false alarms per healthy job (any
anomaly). Faulty: the first culprit is a truth worker *and* function ("worker+fn"), and the
category is truth's.

Each size: the ``pin-memory`` case of ``simulator.patterns.cases`` (11 functions per worker,
three workers spending 23-33 % in pin_memory), built into a ``PatternTable`` in memory (not
timed: reading functions.jsonl is I/O), then ``patterns.engine.diagnose_patterns`` timed
(D, Δ with N = 100 per function, the MAD rule, load-imbalance check, explanation). The paper
reports ~3 min for 1 M workers (EROICA Fig. 17c). Numeric libraries are pinned to one thread
before numpy loads, so the time is one core's.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from collscope.operator.analysis.patterns import engine, table  # noqa: E402
from collscope.operator.simulator.patterns import cases  # noqa: E402


def build(workers: int, seed: int) -> tuple[table.PatternTable, cases.Patterns]:
    p = cases.generate("pin-memory", workers, seed)
    w, f = p.beta.shape
    t = table.PatternTable.from_arrays(
        rank=np.repeat(np.arange(w), f),
        fn_id=np.tile(np.arange(f), w),
        beta=p.beta.ravel(),
        mu=p.mu.ravel(),
        sigma=p.sigma.ravel(),
        fns=[x[0] for x in cases.FUNCTIONS],
        fn_kind=[x[1] for x in cases.FUNCTIONS],
    )
    return t, p


def table_of(p: cases.Patterns) -> table.PatternTable:
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


def accuracy(seeds: int) -> None:
    print("| case | pp | sigma CV | jobs | false alarms | worker+fn top-1 | category |")
    print("|---|---|---|---|---|---|---|")
    for case in cases.CASES:
        for pp in (1, 4):
            for cv in (cases.NOISE_CV[2], 0.3):
                n = alarms = top = cat = 0
                for workers in (64, 1024, 4096):
                    for seed in range(seeds):
                        p = cases.generate(case, workers, seed, pp=pp, sigma_cv=cv)
                        d = engine.diagnose_patterns(table_of(p))
                        n += 1
                        alarms += d.anomaly
                        c = d.culprits[0] if d.culprits else None
                        top += bool(
                            c is not None
                            and c.rank in p.culprit_ranks
                            and c.function in p.culprit_fns
                        )
                        cat += d.category == p.expected_category
                if case == "healthy":
                    print(f"| {case} | {pp} | {cv:g} | {n} | {alarms}/{n} | - | - |")
                else:
                    print(f"| {case} | {pp} | {cv:g} | {n} | - | {top}/{n} | {cat}/{n} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, action="append", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=3, help="seeds per accuracy cell and size")
    ap.add_argument("--accuracy-only", action="store_true")
    ap.add_argument("--no-accuracy", action="store_true")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus "
        f"(pinned to one), numpy {np.__version__}, python {platform.python_version()}"
    )
    if not args.no_accuracy:
        accuracy(args.seeds)
    if args.accuracy_only:
        return
    for workers in args.workers or [3400, 1_000_000]:
        t0 = time.perf_counter()
        t, p = build(workers, args.seed)
        t1 = time.perf_counter()
        d = engine.diagnose_patterns(t)
        t2 = time.perf_counter()
        top = sorted(
            c.rank for c in d.culprits if c.function == "pin_memory" and c.rank is not None
        )
        ok = top == sorted(p.culprit_ranks)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{workers:>9,} workers x {len(cases.FUNCTIONS)} functions = {len(t):>11,} patterns: "
            f"localised in {t2 - t1:7.2f} s (built in {t1 - t0:.1f} s); "
            f"pin_memory ranks {'found' if ok else 'MISSED'} {top}; max RSS {rss:,.0f} MiB"
        )


if __name__ == "__main__":
    main()
