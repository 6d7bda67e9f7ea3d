"""The function-pattern side of the `collscope` command (used by simulate.py and analyze.py).

    collscope simulate --kind patterns --workers 3400 --pattern-case nic-down --out ./prof
    collscope analyze ./prof            # functions.jsonl: EROICA localisation

``--kind patterns`` writes a profiling bundle: job.json (workers on 8-GPU nodes), an empty
records.jsonl.gz, functions.jsonl (one (β, μ, sigma) pattern per worker and function) and
truth.json. ``analyze`` localises abnormal functions whenever a bundle has functions.jsonl,
alone (the result) or beside records or flows (``patterns.engine.combine``).
"""

from __future__ import annotations

import argparse
import os
import time

from collscope.nodeagent.bundle import models, reader
from collscope.operator.analysis import diagnosis
from collscope.operator.analysis.patterns import engine as pattern_analysis
from collscope.operator.analysis.patterns import table as pattern_table
from collscope.operator.cli import progress
from collscope.operator.simulator.patterns import cases
from collscope.operator.simulator.patterns import engine as pattern_sim

DEFAULT_WORKERS = 3400  # EROICA §6.2's job


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of `simulate --kind patterns` (their own group in --help)."""
    g = p.add_argument_group(
        "function pattern simulation (--kind patterns)",
        "Per-worker EROICA behaviour patterns of a training job's kernels, collectives, "
        "memory operations and Python functions, with one of the paper's case studies. "
        "--seed and --out apply too.",
    )
    g.add_argument(
        "--workers", type=int, default=DEFAULT_WORKERS, help="workers (GPUs, one rank each)"
    )
    g.add_argument(
        "--pattern-case",
        choices=cases.CASES,
        default="healthy",
        help="case study to reproduce: healthy; nic-down (low μ with low sigma on one worker's "
        "SendRecv); gc (random Python β); gpu-throttle (high β low μ kernels on some hosts); "
        "pin-memory (3 workers); load-imbalance (same μ, spread β)",
    )


def simulate(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    bar = progress.Progress(f"simulating {args.workers} workers")
    out, truth = pattern_sim.write(
        args.pattern_case, args.workers, args.seed, args.out, progress=bar
    )
    bar.done()
    print(
        f"simulated function patterns of {args.workers} workers ({len(cases.FUNCTIONS)} "
        f"functions each) in {time.perf_counter() - t0:.1f}s"
    )
    print(f"case: {truth.case}: {truth.detail}")
    print(f"wrote {out}")
    return 0


def read(path: str | os.PathLike[str]) -> pattern_table.PatternTable:
    """functions.jsonl of a bundle column-wise (empty when it has none)."""
    return pattern_table.PatternTable.from_patterns(reader.iter_functions(path))


def merge(
    result: diagnosis.Diagnosis | None,
    patterns: pattern_table.PatternTable,
    job: models.Job,
) -> diagnosis.Diagnosis | None:
    """``result`` of the other analyses with the pattern diagnosis folded in (if any)."""
    if not len(patterns):
        return result
    found = pattern_analysis.diagnose_patterns(patterns, job=job)
    return found if result is None else pattern_analysis.combine(result, found)
