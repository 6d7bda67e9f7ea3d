"""EROICA localisation time on one core: 3,400 and 1,000,000 synthetic workers.

    .venv/bin/python bench/patterns_localise.py                 # 3,400 and 1,000,000 workers
    .venv/bin/python bench/patterns_localise.py --workers 3400  # one size

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, action="append", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus "
        f"(pinned to one), numpy {np.__version__}, python {platform.python_version()}"
    )
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
