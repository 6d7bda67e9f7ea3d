"""Diagnosis accuracy: does collscope find the right rank, node and category, fast, with a
confidence that means what it says, and never alarm on a healthy job?

    .venv/bin/python bench/accuracy.py                 # the full sweep recorded in bench/README.md
    .venv/bin/python bench/accuracy.py --quick         # a smoke sweep, a minute or two
    .venv/bin/python bench/accuracy.py --strip-hw      # the same sweep without hardware samples
    .venv/bin/python bench/accuracy.py --json out.json # also keep every case
    .venv/bin/python bench/accuracy.py --bundles ../shared/eval-dev   # bundles from elsewhere
    .venv/bin/python bench/accuracy.py --faults nic-slow --duration 16  # one family, longer runs
    .venv/bin/python bench/accuracy.py --sampled-only  # no job-wide summaries (the trigger of
                                                       # the sampled ranks alone, as before)

Two sources of cases. By default each case simulates a job (collscope.operator.simulator) with
one fault and runs the analysis exactly as `collscope analyze` does (analysis.engine.diagnose on
the in-memory bundle: the bundle file round trip is tested separately and would only add I/O
time here); ``--strip-hw`` first drops the bundle's ``hw`` records (GPU/NIC counters), as a live
window without hardware samples would be (with ``--bundles`` too). ``--bundles DIR`` instead
scores a directory laid out like ``../shared/eval-dev/``::

    DIR/index.json            [{"case": "case-002", "kind": "nic-down", "shape": [8, 2, 8]}, ...]
    DIR/case-002/job.json, records.jsonl.gz    a bundle (docs/spec/bundle-v1.md)
    DIR/case-002/truth.json   {"fault": "nic-down", "onset": 1763000004641901401,
                               "culprits": [108], "category": "hang.network", "shape": {...}}

(``category`` and ``onset`` null for a fault-free case), each bundle read with ``reader.load``.

The replay models the operator's live pull (docs/design.md, "Data path" 5): at each tick the
trigger gets the windows of the sampled ranks and, unless ``--sampled-only``, every rank's
``GET /v1/summaries`` row for the job-wide hang check (``analysis/jobwide.py``), made here by
the agent's own ``summary.summarize`` from the records an agent would hold then
(``analysis/summaries.py``'s ``Summaries``, the one ``collscope analyze`` replays with).

Per case, against the truth: *detected* (an anomaly reported), *top-1* (the first culprit's rank
is a truth culprit), *right node* (the first culprit's node, from job.json, is the node of a
truth culprit), *category* (equal to the truth's), *latency* (detected_at - onset), analysis
wall time. A fault-free case counts a false alarm when any anomaly is reported, and is right on
every count when none is. Tables are keyed by fault name (the simulator's) or ``kind``
(``--bundles``).

After the tables, the confidence is checked. A verdict is *right* when its top-1 rank is a
truth culprit and its category equals the truth's; any verdict on a fault-free case is wrong.
The reliability table bins the anomaly verdicts by confidence, [0, 0.5), [0.5, 0.8),
[0.8, 0.95), [0.95, 1.0], and gives each bin's share right: a calibrated analysis is right about
as often as it says. The Brier score is taken over the anomaly verdicts only, mean((confidence -
right)^2) with right = 1 or 0: 0 when every confidence is exact, 0.25 for a constant 0.5. Cases
with no anomaly carry no confidence and are not in it; they are counted beside it (fault-free
cases that raised an anomaly, faulty cases with no verdict).

One file past 400 lines on purpose: bench scripts are run by path and import nothing from each
other, so both sources of cases, the scoring and the report stay in the script that runs them.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from collscope.nodeagent.bundle import reader, tables
from collscope.operator.analysis import diagnosis, placement
from collscope.operator.analysis import engine as analysis
from collscope.operator.analysis.summaries import Summaries
from collscope.operator.cli import progress
from collscope.operator.simulator import config, truth
from collscope.operator.simulator import engine as simulator

# (ranks, faulty seeds per (fault, algo), fault-free seeds per algo). 1,024-rank cases cost the
# most simulation time, so they get fewer seeds; totals: 330 faulty and 52 fault-free cases.
FULL_PLAN = ((16, 6, 12), (64, 6, 12), (256, 2, 2), (1024, 1, 0))
QUICK_PLAN = ((16, 1, 2), (64, 1, 2))
ALGOS: tuple[config.Algo, ...] = ("ring", "tree")
# Confidence bins of the reliability table, [lo, hi); the last one also holds 1.0. 0.8 is the
# confidence from which issue 12 wants verdicts right >= 95 % of the time.
RELIABILITY_BINS = ((0.0, 0.5), (0.5, 0.8), (0.8, 0.95), (0.95, 1.0))

_In = TypeVar("_In")
_Out = TypeVar("_Out")


@dataclass(frozen=True)
class Case:
    """One simulated case."""

    fault: str
    ranks: int
    algo: config.Algo
    seed: int
    duration_s: float = 10.0  # simulated seconds; the fault starts at 5 s (SimConfig.onset_s)


@dataclass(frozen=True)
class BundleCase:
    """One case of a ``--bundles`` directory: ``index.json``'s entry and where it lies."""

    name: str
    kind: str
    shape: tuple[int, ...]  # (tp, pp, dp)
    path: str


@dataclass(frozen=True)
class Expected:
    """What a case's truth says, whichever source it came from."""

    category: str | None  # None: fault-free
    culprits: tuple[int, ...]  # global ranks
    onset_ns: int | None
    hang: bool


@dataclass(frozen=True)
class Outcome:
    case: str  # "nic-down 64 ring seed 3", or the case directory's name
    family: str  # fault name (simulator) or kind (--bundles): the row of the table
    variant: str  # "ring"/"tree" (simulator) or the shape "tp8 pp2 dp4" (--bundles)
    ranks: int
    faulty: bool
    hang: bool
    detected: bool
    top1: bool
    node_ok: bool
    category_ok: bool
    category: str | None
    top_rank: int | None
    confidence: float
    truth_category: str | None
    truth_culprits: tuple[int, ...]
    latency_s: float | None
    analysis_s: float
    prepare_s: float  # simulating (and stripping) or loading the bundle
    # A declared tie: the first two culprits score alike on different nodes (the collective
    # evidence cannot tell them apart; the evidence names the counter that would), and the
    # ranks tied; why: the evidence line that says so.
    tied: tuple[int, ...] = ()
    tie_why: str = ""

    @property
    def right(self) -> bool:
        """Top-1 rank and category right; for a fault-free case, no anomaly."""
        return self.top1 and self.category_ok


def score(
    label: tuple[str, str, str],
    bundle: tables.Bundle,
    diag: diagnosis.Diagnosis,
    expected: Expected,
    *,
    analysis_s: float,
    prepare_s: float,
) -> Outcome:
    """One case's outcome; ``label`` = (case, family, variant)."""
    where = placement.Placement.of(bundle.job)
    top = diag.culprits[0].rank if diag.anomaly and diag.culprits else None
    if expected.category is None:
        top1 = node_ok = cat_ok = not diag.anomaly
    else:
        top1 = top is not None and top in expected.culprits
        nodes = {where.node(r) for r in expected.culprits} - {None}
        node_ok = top is not None and where.node(top) in nodes
        cat_ok = diag.anomaly and diag.category == expected.category
    latency = (
        None
        if diag.detected_at is None or expected.onset_ns is None
        else (diag.detected_at - expected.onset_ns) / 1e9
    )
    tied: tuple[int, ...] = ()
    cs = diag.culprits if diag.anomaly else []
    if len(cs) >= 2 and cs[1].score >= cs[0].score and cs[1].node != cs[0].node:
        tied = tuple(c.rank for c in cs if c.score >= cs[0].score and c.rank is not None)
    why = next((e for e in diag.evidence if "cannot tell" in e), "") if tied else ""
    return Outcome(
        *label,
        tied=tied,
        tie_why=why[:160],
        ranks=bundle.job.world_size,
        faulty=expected.category is not None,
        hang=expected.hang,
        detected=diag.anomaly,
        top1=top1,
        node_ok=node_ok,
        category_ok=cat_ok,
        category=diag.category,
        top_rank=top,
        confidence=diag.confidence if diag.anomaly else 0.0,
        truth_category=expected.category,
        truth_culprits=expected.culprits,
        latency_s=latency,
        analysis_s=analysis_s,
        prepare_s=prepare_s,
    )


def without_hw(bundle: tables.Bundle) -> tables.Bundle:
    """``bundle`` as if its producer had written no ``hw`` records: rebuilt by the one builder
    from a copy whose hw table is empty, so its string table also loses the hw names (as
    ``reader.load`` of such a bundle would give); every other table keeps its rows."""
    builder = tables.BundleBuilder(bundle.job, source=bundle.source)
    builder.add_tables(dataclasses.replace(bundle, hw=bundle.hw[:0]))
    return builder.build()


def plan_cases(plan: tuple[tuple[int, int, int], ...]) -> list[Case]:
    cases = []
    for ranks, faulty_seeds, healthy_seeds in plan:
        for algo in ALGOS:
            for fault in truth.FAULT_NAMES[1:]:
                cases += [Case(fault, ranks, algo, s) for s in range(faulty_seeds)]
            cases += [Case("none", ranks, algo, 100 + s) for s in range(healthy_seeds)]
    return cases


def run_case(case: Case, *, strip_hw: bool = False, jobwide: bool = True) -> Outcome:
    tp, pp, dp = config.default_parallelism(case.ranks)
    fault = truth.Fault.from_name(case.fault)
    cfg = config.SimConfig(
        ranks=case.ranks,
        tp=tp,
        pp=pp,
        dp=dp,
        algo=case.algo,
        dp_mode="allreduce" if case.algo == "tree" else "rs-ag",
        fault=fault,
        seed=case.seed,
        duration_s=case.duration_s,
    )
    t0 = time.perf_counter()
    sim = simulator.simulate(cfg)
    bundle = without_hw(sim.bundle) if strip_hw else sim.bundle
    t1 = time.perf_counter()
    diag = analysis.diagnose(bundle, summaries=Summaries() if jobwide else None)
    t2 = time.perf_counter()
    tr = sim.truth
    expected = Expected(
        tr.expected_category, tuple(tr.culprit_ranks), tr.onset, hang=fault.value.hang
    )
    label = (f"{case.fault} {case.ranks} {case.algo} seed {case.seed}", case.fault, case.algo)
    return score(label, bundle, diag, expected, analysis_s=t2 - t1, prepare_s=t1 - t0)


def bundle_cases(root: str | os.PathLike[str]) -> list[BundleCase]:
    """The cases ``root/index.json`` lists, in its order."""
    index = pathlib.Path(root) / "index.json"
    try:
        entries = json.loads(index.read_text())
        return [
            BundleCase(
                str(e["case"]),
                str(e["kind"]),
                tuple(int(n) for n in e["shape"]),
                str(pathlib.Path(root) / str(e["case"])),
            )
            for e in entries
        ]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{index}: not a list of {{case, kind, shape}} ({e!r})") from e


def read_expected(path: str | os.PathLike[str]) -> Expected:
    """A case's ``truth.json`` (fault, onset, culprits, category, shape)."""
    try:
        data = json.loads(pathlib.Path(path).read_text())
        category = None if data["category"] is None else str(data["category"])
        return Expected(
            category,
            tuple(int(r) for r in data["culprits"]),
            None if data["onset"] is None else int(data["onset"]),
            hang=category is not None and category.startswith("hang."),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a truth.json of --bundles ({e!r})") from e


def run_bundle(case: BundleCase, *, strip_hw: bool = False, jobwide: bool = True) -> Outcome:
    t0 = time.perf_counter()
    expected = read_expected(pathlib.Path(case.path) / "truth.json")
    bundle = reader.load(case.path)
    if strip_hw:
        bundle = without_hw(bundle)
    t1 = time.perf_counter()
    diag = analysis.diagnose(bundle, summaries=Summaries() if jobwide else None)
    t2 = time.perf_counter()
    variant = " ".join(f"{k}{n}" for k, n in zip(("tp", "pp", "dp"), case.shape, strict=False))
    label = (case.name, case.kind, variant)
    return score(label, bundle, diag, expected, analysis_s=t2 - t1, prepare_s=t1 - t0)


@dataclass(frozen=True)
class Bin:
    lo: float
    hi: float
    verdicts: int  # anomaly verdicts with lo <= confidence < hi (<= for the last bin)
    right: int


def reliability(outcomes: Iterable[Outcome]) -> list[Bin]:
    """Anomaly verdicts per confidence bin of ``RELIABILITY_BINS``, and how many were right."""
    verdicts = [o for o in outcomes if o.detected]
    bins = []
    for i, (lo, hi) in enumerate(RELIABILITY_BINS):
        last = i == len(RELIABILITY_BINS) - 1
        sel = [o for o in verdicts if lo <= o.confidence and (o.confidence < hi or last)]
        bins.append(Bin(lo, hi, len(sel), sum(o.right for o in sel)))
    return bins


def brier(outcomes: Iterable[Outcome]) -> float | None:
    """mean((confidence - right)^2) over the anomaly verdicts; None when there are none."""
    errs = [(o.confidence - float(o.right)) ** 2 for o in outcomes if o.detected]
    return statistics.fmean(errs) if errs else None


def _pct(n: int, d: int) -> str:
    return "-" if d == 0 else f"{100.0 * n / d:.0f}%"


def _q(values: list[float], q: float) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[min(len(values) - 1, int(q * len(values)))]:.2f}"


def _counts(sel: Sequence[Outcome]) -> str:
    """The detected | top-1 | right node | category cells."""
    counts = [sum(getattr(o, f) for o in sel) for f in ("detected", "top1", "node_ok")]
    counts.append(sum(o.category_ok for o in sel))
    return " | ".join(_pct(c, len(sel)) for c in counts)


def table(outcomes: list[Outcome], families: Sequence[str]) -> str:
    """One row per family in ``families`` order (those with cases), then all faulty cases."""
    rows = [
        "| fault | cases | detected | top-1 culprit | right node | category | "
        "latency median s | latency p90 s | analysis median s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for family in families:
        sel = [o for o in outcomes if o.family == family]
        if not sel:
            continue
        ana = statistics.median(o.analysis_s for o in sel)
        if not any(o.faulty for o in sel):
            alarms = sum(o.detected for o in sel)
            rows.append(
                f"| {family} (false alarms) | {len(sel)} | {alarms} alarms | - | - | - | - | - |"
                f" {ana:.2f} |"
            )
            continue
        lat = [o.latency_s for o in sel if o.latency_s is not None and o.detected]
        rows.append(
            f"| {family} | {len(sel)} | {_counts(sel)} "
            f"| {_q(lat, 0.5)} | {_q(lat, 0.9)} | {ana:.2f} |"
        )
    faulty = [o for o in outcomes if o.faulty]
    hang = [o.latency_s for o in faulty if o.latency_s is not None and o.detected and o.hang]
    rows.append(
        f"| **all faults** | {len(faulty)} | {_counts(faulty)} | "
        f"hangs: {_q(hang, 0.5)} | hangs: {_q(hang, 0.9)} | |"
    )
    return "\n".join(rows)


def by_size(outcomes: list[Outcome], variant: str) -> str:
    rows = [
        f"| ranks | {variant} | faulty cases | top-1 | right node | category | "
        "fault-free cases | false alarms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ranks, v in sorted({(o.ranks, o.variant) for o in outcomes}):
        sel = [o for o in outcomes if o.ranks == ranks and o.variant == v]
        f = [o for o in sel if o.faulty]
        h = [o for o in sel if not o.faulty]
        rows.append(
            f"| {ranks} | {v} | {len(f)} | {_pct(sum(o.top1 for o in f), len(f))}"
            f" | {_pct(sum(o.node_ok for o in f), len(f))}"
            f" | {_pct(sum(o.category_ok for o in f), len(f))} | {len(h)} | "
            f"{sum(o.detected for o in h)} |"
        )
    return "\n".join(rows)


def calibration(outcomes: list[Outcome]) -> str:
    """The reliability table and the Brier score (module docstring)."""
    rows = [
        "| confidence | anomaly verdicts | right | share right |",
        "|---|---|---|---|",
    ]
    for b in reliability(outcomes):
        close = "]" if b.hi == RELIABILITY_BINS[-1][1] else ")"
        rows.append(
            f"| [{b.lo:.2f}, {b.hi:.2f}{close} | {b.verdicts} | {b.right} "
            f"| {_pct(b.right, b.verdicts)} |"
        )
    score_ = brier(outcomes)
    verdicts = sum(o.detected for o in outcomes)
    healthy = [o for o in outcomes if not o.faulty]
    faulty = [o for o in outcomes if o.faulty]
    rows.append(
        f"\nBrier score over the {verdicts} anomaly verdicts: "
        + ("-" if score_ is None else f"{score_:.3f}")
        + " (mean of (confidence - right)^2: 0 is exact, a constant 0.5 scores 0.25)\n"
        f"fault-free cases that raised an anomaly: {sum(o.detected for o in healthy)} of "
        f"{len(healthy)}; faulty cases with no verdict: "
        f"{sum(not o.detected for o in faulty)} of {len(faulty)}"
    )
    return "\n".join(rows)


def ties(outcomes: list[Outcome], families: Sequence[str]) -> str:
    """Per family: verdicts that declared a tie, whether the truth was among the tied, and the
    top-1 share over the cases the topology makes identifiable (no tie declared)."""
    rows = [
        "| fault | faulty cases | declared ties | truth among the tied "
        "| top-1 where identifiable |",
        "|---|---|---|---|---|",
    ]
    for family in families:
        f = [o for o in outcomes if o.family == family and o.faulty]
        if not f:
            continue
        t = [o for o in f if o.tied]
        among = sum(any(r in o.truth_culprits for r in o.tied) for o in t)
        ident = [o for o in f if not o.tied]
        rows.append(
            f"| {family} | {len(f)} | {len(t)} | {among} of {len(t)} | "
            f"{_pct(sum(o.top1 for o in ident), len(ident))} of {len(ident)} |"
        )
    return "\n".join(rows)


def tie_cases(outcomes: list[Outcome]) -> list[str]:
    return [
        f"  {o.case}: tied ranks {list(o.tied)}, truth {list(o.truth_culprits)}"
        + (f"; {o.tie_why}" if o.tie_why else "")
        for o in outcomes
        if o.tied
    ]


def misdiagnosed(outcomes: list[Outcome]) -> list[str]:
    """One line per case whose top-1 rank or category is wrong (a false alarm included)."""
    lines = []
    for o in outcomes:
        if o.right:
            continue
        top = "no culprit" if o.top_rank is None else f"rank {o.top_rank}"
        got = f"{o.category}, {top}, confidence {o.confidence:.2f}" if o.detected else "no anomaly"
        shown = ", ".join(map(str, o.truth_culprits[:8]))
        more = " ..." if len(o.truth_culprits) > 8 else ""
        want = f"{o.truth_category}, ranks {shown}{more}" if o.faulty else "no anomaly"
        lines.append(f"  {o.case} ({o.family}) -> {got}; truth: {want}")
    return lines


def _map(fn: Callable[[_In], _Out], items: Sequence[_In], jobs: int) -> list[_Out]:
    """``fn`` over ``items`` with a progress bar on stderr (a terminal only)."""
    bar = progress.Progress(f"{len(items)} cases")
    if jobs <= 1:
        return list(bar.count(map(fn, items), len(items)))
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(bar.count(pool.map(fn, items), len(items)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small smoke sweep")
    p.add_argument(
        "--bundles",
        default=None,
        metavar="DIR",
        help="score the bundles of DIR (index.json, DIR/CASE/{job.json,records.jsonl.gz,"
        "truth.json}) instead of simulating",
    )
    p.add_argument("--strip-hw", action="store_true", help="drop hw records before analysis")
    p.add_argument(
        "--sampled-only",
        action="store_true",
        help="replay without the job-wide summaries (the sampled ranks' windows alone)",
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--json", default=None, help="write every case's outcome to this file")
    p.add_argument("--ties", action="store_true", help="list every case that declared a tie")
    p.add_argument(
        "--faults", default="", help="only these simulated faults, comma-separated (none: all)"
    )
    p.add_argument(
        "--duration",
        type=float,
        default=10.0,
        help="simulated seconds per case (fault at 5 s): longer runs give a rotating sample "
        "time to visit every DP group (analysis/rotation.py)",
    )
    args = p.parse_args(argv)
    if args.bundles and args.quick:
        p.error("--quick plans simulated cases; --bundles scores DIR's cases")
    t0 = time.perf_counter()
    if args.bundles:
        try:
            found = bundle_cases(args.bundles)
        except (OSError, ValueError) as e:
            p.error(str(e))
        families = list(dict.fromkeys(c.kind for c in found))
        run: Callable[[Any], Outcome] = functools.partial(
            run_bundle, strip_hw=args.strip_hw, jobwide=not args.sampled_only
        )
        items: Sequence[Any] = found
        source, variant = f"bundles in {args.bundles}", "shape"
    else:
        cases = plan_cases(QUICK_PLAN if args.quick else FULL_PLAN)
        wanted = {f for f in args.faults.split(",") if f}
        cases = [
            dataclasses.replace(c, duration_s=args.duration)
            for c in cases
            if not wanted or c.fault in wanted
        ]
        # Large cases first so the pool does not end on one long straggler.
        cases.sort(key=lambda c: -c.ranks)
        families = [f for f in truth.FAULT_NAMES if not wanted or f in wanted]
        run, items = (
            functools.partial(run_case, strip_hw=args.strip_hw, jobwide=not args.sampled_only),
            cases,
        )
        source, variant = "collscope's simulator", "algo"
    outcomes = _map(run, items, args.jobs)
    wall = time.perf_counter() - t0
    stripped = ", hw records stripped" if args.strip_hw else ""
    stripped += ", sampled ranks only" if args.sampled_only else ", job-wide summaries"
    print(f"# collscope accuracy: {len(outcomes)} cases in {wall:.0f}s with {args.jobs} workers")
    print(f"# source: {source}{stripped}")
    shown = sys.argv[1:] if argv is None else argv
    print(f"# command: {' '.join([sys.argv[0], *shown])}\n")
    print(table(outcomes, families))
    print()
    print(by_size(outcomes, variant))
    print()
    print(calibration(outcomes))
    print()
    print(ties(outcomes, families))
    wrong = misdiagnosed(outcomes)
    if wrong:
        print("\nmisdiagnosed cases (case (fault) -> category, top rank, confidence; truth):")
        print("\n".join(wrong))
    tied = tie_cases(outcomes)
    if tied and args.ties:
        print("\ncases declared unidentifiable (a tie between the two ends of one path):")
        print("\n".join(tied))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(o) | {"right": o.right} for o in outcomes], fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
