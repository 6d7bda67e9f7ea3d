"""Does a verdict survive other sampling, clocks, jitter and step lengths? A grid sweep.

    .venv/bin/python bench/time_invariance.py                    # 16 ranks, the grid below
    .venv/bin/python bench/time_invariance.py --ranks 64 --pp 2  # TP8 x PP2 x DP4
    .venv/bin/python bench/time_invariance.py --faults none,pcie-downgrade --scales 1,50
    .venv/bin/python bench/time_invariance.py --sampled-only     # no job-wide summaries

Each case simulates one job with collscope's simulator (the fault on a seeded rank, onset at
60 % of the run, at least 20 steps) where every rank samples its state on its own phase
(``SimConfig.sample_phase``), node clocks disagree by up to ``--skew`` ms, compute spans jitter
by 0, 3 or 5 % (seed mod 3), and the compute of every step is scaled by ``--scales`` (a step
lasts ~0.16 s x scale: 0.3 -> ~50 ms, 63 -> ~10 s). It then runs ``analysis.engine.diagnose``,
fed every rank's job-wide summary each tick as bench/accuracy.py and collscope analyze do
(``analysis.summaries.Summaries()``; ``--sampled-only``: the sampled ranks' windows alone),
and counts a case right when the top culprit is a truth culprit and the category is the
expected one (a fault-free case: no anomaly).

Benign pauses (issue 12) are fault-free cases named like faults, right only when nothing is
raised: ``pause-checkpoint`` (every rank stops for 2, 8 or 30 s by seed, writers saving while
the rest wait in a 4-byte barrier), ``pause-eval`` (3, 10 or 20 s of forward-only
iterations) and ``wide-round`` (one rank starts one iteration 0.3, 0.6 or 0.9 s late). Each
starts at 40 % of the run's base length and the run is longer by the pause. ``EVENT+FAULT``
(e.g. ``pause-eval+nic-slow``) puts the fault's onset after the pause, 60 % of the base
length plus the pause, and is judged as the fault. The unit test
``tests/unit/operator/analysis/test_time_invariance.py`` draws the same shifts with hypothesis
for four faults; this script covers every fault family on a grid.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from collscope.operator.analysis import engine, summaries
from collscope.operator.simulator import config, truth
from collscope.operator.simulator import engine as simulator

STEP_S_PER_SCALE = 0.16
JITTERS = (0.0, 0.03, 0.05)
# Benign events by name: kind and length per seed (seed mod 3), seconds.
BENIGN: dict[str, tuple[config.BenignKind, tuple[float, float, float]]] = {
    "pause-checkpoint": ("checkpoint", (2.0, 8.0, 30.0)),
    "pause-eval": ("eval", (3.0, 10.0, 20.0)),
    "wide-round": ("wide-round", (0.3, 0.6, 0.9)),
}


@dataclasses.dataclass(frozen=True)
class Case:
    fault: str
    scale: float
    interval_ms: float
    skew_ms: float
    seed: int
    ranks: int
    pp: int
    jobwide: bool = True


def run(c: Case) -> tuple[Case, bool, str]:
    w = config.Workload()
    w = dataclasses.replace(
        w,
        fwd_compute_ms=w.fwd_compute_ms * c.scale,
        bwd_compute_ms=w.bwd_compute_ms * c.scale,
        compute_jitter=JITTERS[c.seed % len(JITTERS)],
    )
    base = max(10.0, 20 * STEP_S_PER_SCALE * c.scale)
    names = c.fault.split("+")
    fault = next((n for n in names if n not in BENIGN), "none")
    events = tuple(
        config.Benign(BENIGN[n][0], 0.4 * base, BENIGN[n][1][c.seed % 3])
        for n in names
        if n in BENIGN
    )
    shift = sum(ev.length_s for ev in events)
    duration = base + shift
    sim = simulator.simulate(
        config.SimConfig(
            ranks=c.ranks,
            tp=8,
            pp=c.pp,
            dp=c.ranks // 8 // c.pp,
            duration_s=duration,
            onset_s=0.6 * base + shift,
            fault=truth.Fault.from_name(fault),
            seed=c.seed,
            state_interval_ms=c.interval_ms,
            clock_skew_ms=c.skew_ms,
            sample_phase=True,
            workload=w,
            benign=events,
        )
    )
    d = engine.diagnose(sim.bundle, summaries=summaries.Summaries() if c.jobwide else None)
    tr = sim.truth
    if tr.expected_category is None:
        ok = not d.anomaly
    else:
        top = d.culprits[0].rank if d.culprits else None
        ok = d.category == tr.expected_category and top in tr.culprit_ranks
    got = f"{d.category} {[x.rank for x in d.culprits][:3]} conf={d.confidence}"
    return c, ok, f"truth {list(tr.culprit_ranks)} {tr.expected_category} -> {got}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--faults", default=",".join(truth.FAULT_NAMES), help="comma-separated")
    p.add_argument("--scales", default="0.3,1,10,63", help="compute scale per case")
    p.add_argument("--intervals", default="50,200", help="sampling intervals, ms")
    p.add_argument("--skew", type=float, default=50.0, help="max node clock offset, ms")
    p.add_argument("--seeds", default="0,1,2", help="seeds (jitter = seed mod 3)")
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument(
        "--sampled-only",
        action="store_true",
        help="replay without the job-wide summaries (the sampled ranks' windows alone)",
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = p.parse_args(argv)
    cases = [
        Case(f, float(sc), float(iv), a.skew, int(sd), a.ranks, a.pp, not a.sampled_only)
        for f, sc, iv, sd in itertools.product(
            a.faults.split(","), a.scales.split(","), a.intervals.split(","), a.seeds.split(",")
        )
    ]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        results = list(pool.map(run, cases))
    print(f"# time invariance: {len(cases)} cases in {time.perf_counter() - t0:.0f}s")
    print(f"# command: {' '.join(sys.argv)}")
    print(f"# replay: {'sampled ranks only' if a.sampled_only else 'job-wide summaries'}\n")
    print("| fault | " + " | ".join(f"scale {s}" for s in a.scales.split(",")) + " |")
    print("|---" * (1 + len(a.scales.split(","))) + "|")
    for f in a.faults.split(","):
        cells = []
        for sc in a.scales.split(","):
            sel = [ok for c, ok, _ in results if c.fault == f and c.scale == float(sc)]
            cells.append(f"{sum(sel)}/{len(sel)}")
        print(f"| {f} | " + " | ".join(cells) + " |")
    right = sum(ok for _, ok, _ in results)
    print(f"\n{right} of {len(results)} right")
    for c, ok, text in results:
        if not ok:
            print(
                f"  miss: {c.fault} scale {c.scale} interval {c.interval_ms} seed {c.seed}: {text}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
