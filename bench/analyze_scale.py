"""Analysis time and peak memory for one trigger window at 1,024 / 4,096 / 16,384 ranks.

    .venv/bin/python bench/analyze_scale.py                       # the sizes in bench/README.md
    .venv/bin/python bench/analyze_scale.py --ranks 1024 --repeat 3

What is measured is what the operator does after a trigger: it holds the window (t - 2 s, t]
of state records and completions of every rank (plus the communicator records) and runs the
analysis on it. Per size we simulate a job in which one NIC goes down 1.5 s in (the hang path is
the heaviest: every rank is in flight with stalled flows), keep 2 s of records ending at the end
of the run by writing the bundle and reading it back through the reader's time filter (as the
agent export would hand it over), then time `analysis.engine.diagnose` on that window, alone, on
one core (the process pins itself to one CPU where the OS allows). Peak memory is tracemalloc's
peak of Python and numpy allocations during the analysis call, on top of the loaded window.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc

from collscope.nodeagent.bundle import reader, writer
from collscope.operator.analysis import engine as analysis
from collscope.operator.simulator import config, truth
from collscope.operator.simulator import engine as simulator

WINDOW_S = 2.0
DURATION_S = 3.5  # onset at 1.5 s, window (1.5 s, 3.5 s]: the hang and its propagation inside it
ONSET_S = 1.5


def measure(ranks: int, repeat: int) -> dict[str, float | int | str]:
    tp, pp, dp = config.default_parallelism(ranks)
    cfg = config.SimConfig(
        ranks=ranks,
        tp=tp,
        pp=pp,
        dp=dp,
        duration_s=DURATION_S,
        onset_s=ONSET_S,
        fault=truth.Fault.NIC_DOWN,
        seed=1,
    )
    t0 = time.perf_counter()
    sim = simulator.simulate(cfg)
    t_sim = time.perf_counter() - t0
    until = cfg.start_ns + int(DURATION_S * 1e9) + 10**9  # + skew margin: keep the end
    since = cfg.start_ns + int((DURATION_S - WINDOW_S) * 1e9)
    with tempfile.TemporaryDirectory() as tmp:
        path = writer.write(sim.bundle, os.path.join(tmp, "b"))
        window = reader.load(path, since_ns=since, until_ns=until)
    times = []
    diag = None
    for _ in range(repeat):
        t1 = time.perf_counter()
        diag = analysis.diagnose(window)
        times.append(time.perf_counter() - t1)
    tracemalloc.start()
    analysis.diagnose(window)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert diag is not None
    top = diag.culprits[0].rank if diag.culprits else None
    return {
        "ranks": ranks,
        "states": len(window.states),
        "flows": len(window.flows),
        "ops": len(window.ops),
        "median_s": statistics.median(times),
        "max_s": max(times),
        "peak_mib": peak / 2**20,
        "simulate_s": t_sim,
        "verdict": f"{diag.category} rank {top} (truth {sim.truth.culprit_ranks[0]})",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(
        f"# analysis of a {WINDOW_S:g} s trigger window; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, pinned to one core"
    )
    print(f"# command: {' '.join(sys.argv)}\n")
    print(
        "| ranks | state records | flows | op records | analysis median s | max s | "
        "peak MiB | verdict | simulate s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.ranks:
        r = measure(n, args.repeat)
        print(
            f"| {r['ranks']} | {r['states']} | {r['flows']} | {r['ops']} | "
            f"{r['median_s']:.3f} | {r['max_s']:.3f} | {r['peak_mib']:.0f} | {r['verdict']} "
            f"| {r['simulate_s']:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
