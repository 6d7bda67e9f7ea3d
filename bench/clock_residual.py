"""How far is ``analysis.clocks`` from the simulator's true node clock offsets? A residual table.

    .venv/bin/python bench/clock_residual.py                        # the shapes and seeds below
    .venv/bin/python bench/clock_residual.py --seeds 0,1 --scales 1 --skew 50

Each case simulates a fault-free job (``bench/time_invariance.py``'s workload: compute scaled
by ``--scales``, jitter 0/3/5 % by seed, each rank sampled on its own phase, node clocks off by
up to ``--skew`` ms) for 16 ranks TP8xDP2, 64 ranks TP8xPP2xDP4 and 128 ranks TP8xPP4xDP4. The
true offsets are the simulator's (``simulator.engine.simulate``: ``default_rng([seed, 3])``
uniform in +-skew per node). ``clocks.estimate`` is relative to its median node, so the
residual of node n is ``est[n] - truth[n] - median(est - truth)``; the table gives per shape and
scale the max and median |residual| over nodes and seeds, and the worst node pair (the largest
|residual[a] - residual[b]|: how far apart two nodes remain after alignment).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from collscope.operator.analysis import clocks, placement
from collscope.operator.simulator import config, topology
from collscope.operator.simulator import engine as simulator

SHAPES = {"16 TP8xDP2": (16, 1), "64 TP8xPP2xDP4": (64, 2), "128 TP8xPP4xDP4": (128, 4)}
JITTERS = (0.0, 0.03, 0.05)
MS = 1e6


def residual(shape: str, scale: float, seed: int, skew_ms: float) -> list[float]:
    """|residual| per node (ms) of one simulated case."""
    ranks, pp = SHAPES[shape]
    w = config.Workload()
    w = dataclasses.replace(
        w,
        fwd_compute_ms=w.fwd_compute_ms * scale,
        bwd_compute_ms=w.bwd_compute_ms * scale,
        compute_jitter=JITTERS[seed % len(JITTERS)],
    )
    cfg = config.SimConfig(
        ranks=ranks,
        tp=8,
        pp=pp,
        dp=ranks // 8 // pp,
        duration_s=max(10.0, 20 * 0.16 * scale),
        seed=seed,
        clock_skew_ms=skew_ms,
        sample_phase=True,
        workload=w,
    )
    sim = simulator.simulate(cfg)
    truth = np.random.default_rng([seed, 3]).uniform(-skew_ms, skew_ms, cfg.nodes) * MS
    off = clocks.estimate(sim.bundle, placement.Placement.of(sim.bundle.job))
    est = np.zeros(cfg.nodes)
    for n in range(cfg.nodes):
        est[n] = off.of(n * cfg.gpus_per_node)
        assert topology.node_name(n) == sim.bundle.job.ranks[n * cfg.gpus_per_node].node
    res = est - truth
    res -= np.median(res)
    return [float(x) / MS for x in res]


def _run(case: tuple[str, float, int, float]) -> tuple[tuple[str, float, int, float], list[float]]:
    return case, residual(*case)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated keys of SHAPES")
    p.add_argument("--scales", default="1,20")
    p.add_argument("--seeds", default="0,1,2,3,4,5")
    p.add_argument("--skew", type=float, default=50.0, help="max node clock offset, ms")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = p.parse_args(argv)
    cases = [
        (sh, float(sc), int(sd), a.skew)
        for sh, sc, sd in itertools.product(
            a.shapes.split(","), a.scales.split(","), a.seeds.split(",")
        )
    ]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        results = list(pool.map(_run, cases))
    print(f"# clock residual: {len(cases)} cases in {time.perf_counter() - t0:.0f}s")
    print(f"# command: {' '.join(sys.argv)}\n")
    print("| shape | scale | max \\|res\\| ms | median \\|res\\| ms | worst pair ms | worst seed |")
    print("|---|---|---|---|---|---|")
    for sh, sc in itertools.product(a.shapes.split(","), a.scales.split(",")):
        sel = [(c[2], r) for c, r in results if c[0] == sh and c[1] == float(sc)]
        absall = np.abs(np.concatenate([np.asarray(r) for _, r in sel]))
        pairs = [(float(np.ptp(r)), seed) for seed, r in sel]
        worst = max(pairs)
        print(
            f"| {sh} | {sc} | {absall.max():.2f} | {np.median(absall):.2f} | "
            f"{worst[0]:.2f} | {worst[1]} |"
        )
    for c, r in results:
        print(f"  {c[0]} scale {c[1]:g} seed {c[2]}: " + " ".join(f"{x:+.1f}" for x in r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
