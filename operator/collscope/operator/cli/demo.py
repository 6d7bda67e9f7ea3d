"""``collscope demo``: the whole data path on this machine, a fault injected and diagnosed.

    collscope demo [--fault nic-down] [--seed 7] [--out DIR]   # the one-box (``onebox/``)
    collscope demo --simulated                                 # the 64-rank simulator

Exits 0 when the diagnosis agrees with the injected truth (top culprit and category), 1 when
it does not; a process fault with ``--simulated`` is bad input (2): the simulator has no rank
processes to kill or freeze.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from collscope.nodeagent.bundle import reader, writer
from collscope.operator.analysis import engine as analysis
from collscope.operator.cli import exits, simulate
from collscope.operator.domain import report
from collscope.operator.onebox import box as onebox_box
from collscope.operator.onebox import demo as onebox_demo
from collscope.operator.onebox import faults as onebox_faults
from collscope.operator.simulator import config, truth
from collscope.operator.simulator import engine as simulator


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser(
        "demo",
        help="run the whole data path on this machine, inject a fault and diagnose it",
        description="Start an 8-rank job on 2 simulated nodes on this machine: every rank a "
        "process driving the real NCCL profiler plugin (make -C native), a real node agent per "
        "node, the operator's trigger loop and analysis pulling from them. Inject a fault, "
        "print the Diagnosis as `kubectl get diagnoses -o wide` would, its evidence, and write "
        "the window as a bundle plus a self-contained HTML report. --simulated runs the "
        "64-rank simulator instead (no plugin needed).",
    )
    demo.add_argument(
        "--fault",
        choices=(*truth.FAULT_NAMES, *onebox_faults.PROCESS),
        default=None,
        help="inject this fault instead of a random one ('none': a healthy run; "
        + "; ".join(f"{f.name}: {f.summary}" for f in onebox_faults.PROCESS.values())
        + ", not with --simulated)",
    )
    demo.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed for the fault choice and the simulation (default: random)",
    )
    demo.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to keep the bundle (default: a new temporary directory); the HTML report "
        "is written beside it",
    )
    demo.add_argument(
        "--simulated",
        action="store_true",
        help="simulate a 64-rank job chunk by chunk instead (the simulator; no plugin, no agents)",
    )
    demo.add_argument(
        "--plugin",
        default=None,
        help="the built libnccl-profiler-collscope.so (default: $COLLSCOPE_PLUGIN, else "
        "native/build/ of this checkout)",
    )
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.simulated:
        return _run_simulated(args)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10_000)
    fault_name = args.fault or random.Random(seed).choice(onebox_faults.RELIABLE)
    plugin = onebox_box.find_plugin(args.plugin)
    return onebox_demo.run(fault_name, seed=seed, out=args.out, plugin=plugin).code


def _run_simulated(args: argparse.Namespace) -> int:
    if args.fault in onebox_faults.PROCESS:
        print(
            f"collscope demo: error: --fault {args.fault} needs rank processes: the simulator "
            "has none (run it without --simulated)",
            file=sys.stderr,
        )
        return exits.BAD_INPUT
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10_000)
    fault_name = args.fault or random.Random(seed).choice(truth.FAULT_NAMES[1:])
    cfg = config.SimConfig(
        ranks=64, tp=8, pp=2, dp=4, fault=truth.Fault.from_name(fault_name), seed=seed
    )
    out = args.out or Path(tempfile.mkdtemp(prefix="collscope-demo-")) / "bundle"
    print(
        f"collscope demo (seed {seed}): a 64-rank job, TP=8 PP=2 DP=4 on 8 nodes, "
        f"{cfg.duration_s:g}s simulated; injecting '{fault_name}' at "
        f"t={cfg.onset_s:g}s ..."
    )
    t0 = time.perf_counter()
    result = simulator.simulate(cfg)
    extra = {"truth.json": simulate.truth_json(result.truth)}
    path = writer.write(result.bundle, out, extra_files=extra)
    t1 = time.perf_counter()
    bundle = reader.load(path)
    diag = analysis.diagnose(bundle)
    t2 = time.perf_counter()
    start = cfg.start_ns
    print(f"simulated and exported in {t1 - t0:.1f}s, analysed in {t2 - t1:.1f}s; bundle: {path}\n")
    print(report.diagnoses_wide(diag, name=f"demo-{seed}", job="demo-64", age_s=(t2 - t0)))
    print()
    print(report.summary(diag, source="diagnosis", start_ns=start))
    print()
    ok = onebox_demo.verdict(diag, result.truth)
    t = result.truth
    latency = (
        ""
        if diag.detected_at is None or t.onset is None
        else f", detected {(diag.detected_at - t.onset) / 1e9:.2f}s after onset"
    )
    print(
        f"injected: {t.fault} on rank(s) {simulate.ranks_text(t.culprit_ranks)}"
        f" ({t.culprit_node}), expected {t.expected_category}: {t.detail}"
    )
    print(f"verdict:  {'CORRECT' if ok else 'MISMATCH'} (top culprit and category{latency})")
    print(f"\nre-run the analysis yourself: collscope analyze {path}")
    return exits.OK if ok else exits.MISMATCH
