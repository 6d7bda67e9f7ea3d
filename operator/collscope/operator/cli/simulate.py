"""``collscope simulate``: a faulty job's traces, a fabric's flows or a job's function patterns.

    collscope simulate --ranks 64 --fault nic-down --seed 3 --out ./bundle
    collscope simulate --kind flows --gpus 512 --flow-fault congested-switch --out ./fabric
    collscope simulate --kind patterns --workers 3400 --pattern-case pin-memory --out ./prof

``--kind collective`` (the default) is here; ``--kind flows`` and ``--kind patterns`` add their
option groups and run from ``flows.py`` and ``patterns.py``. Every kind writes truth.json beside
the bundle: what was injected, for ``analyze`` and the benchmarks to be checked against.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from collscope.nodeagent.bundle import writer
from collscope.operator import errors
from collscope.operator.cli import exits, progress
from collscope.operator.cli import flows as flow_commands
from collscope.operator.cli import patterns as pattern_commands
from collscope.operator.simulator import config, truth
from collscope.operator.simulator import engine as simulator


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless it says its default itself.

    argparse's ``ArgumentDefaultsHelpFormatter`` appends it to every option, which printed
    "(default: a sensible split of --ranks) (default: None)"; an unset flag (None, False, an
    empty list) has no default worth printing either.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        d = action.default
        if (
            not action.option_strings
            or "default" in text
            or d is None
            or d is False
            or d == []
            or d is argparse.SUPPRESS
        ):
            return text
        return text + " (default: %(default)s)"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser(
        "simulate",
        help="simulate a training job with an injected fault; write a bundle",
        description="--kind collective (default): simulate a TPxPPxDP training job chunk "
        "by chunk (ring or tree collectives over NVLink and a network proxy) with one "
        "injected fault, and write what a node agent would export: a trace bundle "
        "(docs/spec/bundle-v1.md) plus truth.json. --kind flows: simulate several jobs on a "
        "shared leaf-spine fabric and write what a flow collector would export: a "
        "flows-only bundle (job.json with the fabric's GPUs, flows.jsonl) plus truth.json.",
        formatter_class=DefaultsFormatter,
    )
    sim.add_argument(
        "--kind",
        choices=["collective", "flows", "patterns"],
        default="collective",
        help="what to simulate: one job's collective traces, network flows of a fabric, or "
        "per-worker function behaviour patterns (functions.jsonl)",
    )
    _add_sim_options(sim)
    flow_commands.add_options(sim)
    pattern_commands.add_options(sim)
    sim.add_argument(
        "--out",
        required=True,
        type=Path,
        help="bundle directory to write, or a path ending in .tar.gz",
    )
    sim.add_argument(
        "--uncompressed",
        action="store_true",
        help="write records.jsonl instead of records.jsonl.gz",
    )
    sim.set_defaults(func=run)


def _add_sim_options(p: argparse.ArgumentParser) -> None:
    d = config.SimConfig()
    p.add_argument("--ranks", type=int, default=d.ranks, help="world size")
    p.add_argument(
        "--gpus-per-node", type=int, default=d.gpus_per_node, help="ranks (GPUs) per node"
    )
    p.add_argument(
        "--tp",
        type=int,
        default=None,
        help="tensor-parallel size (default: a sensible split of --ranks)",
    )
    p.add_argument(
        "--pp", type=int, default=None, help="pipeline-parallel size (default: see --tp)"
    )
    p.add_argument(
        "--dp",
        type=int,
        default=None,
        help="data-parallel size (default: see --tp; with --tp or --pp given, what remains)",
    )
    p.add_argument(
        "--order", default=d.order, help="rank order of the dimensions, fastest-varying first"
    )
    p.add_argument(
        "--algo",
        choices=["ring", "tree"],
        default=d.algo,
        help="collective algorithm (tree implies --dp-mode allreduce)",
    )
    p.add_argument("--channels", type=int, default=d.channels, help="NCCL channels, 2..16")
    p.add_argument(
        "--dp-mode",
        choices=["rs-ag", "allreduce"],
        default=None,
        help="DP gradient sync: ReduceScatter+AllGather or one AllReduce "
        "(default: rs-ag for ring, allreduce for tree)",
    )
    _add_fault_options(p, d)
    p.add_argument(
        "--no-parallelism",
        action="store_true",
        help="leave parallelism out of job.json (analysis must infer groups)",
    )


def _add_fault_options(p: argparse.ArgumentParser, d: config.SimConfig) -> None:
    """--duration, --fault, --target, --onset, --severity and --seed (in that order)."""
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help=f"seconds simulated (default: {d.duration_s:g}; --kind flows: "
        f"{flow_commands.DEFAULT_DURATION_S:g})",
    )
    p.add_argument(
        "--fault",
        choices=truth.FAULT_NAMES,
        default="none",
        help="fault to inject: "
        + "; ".join(f"{f.value.name}: {f.value.summary}" for f in truth.Fault),
    )
    p.add_argument(
        "--target",
        type=int,
        default=None,
        help="rank (or node index for node faults) to inject into (default: chosen by the seed)",
    )
    p.add_argument(
        "--onset",
        type=float,
        default=None,
        help=f"seconds after start when the fault strikes (default: {d.onset_s:g}; "
        f"--kind flows: {flow_commands.DEFAULT_ONSET_S:g})",
    )
    p.add_argument(
        "--severity",
        type=float,
        default=None,
        help="slowdown factor of slow faults (default: the fault's own)",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (reproducible)")


def sim_config(args: argparse.Namespace) -> config.SimConfig:
    """SimConfig from parsed `simulate` options, filling TP/PP/DP sensibly when absent."""
    tp, pp, dp = config.default_parallelism(args.ranks, args.gpus_per_node)
    if args.tp or args.pp or args.dp:
        tp, pp = args.tp or 1, args.pp or 1
        dp = args.dp or max(1, args.ranks // (tp * pp))
    dp_mode: config.DpMode = "allreduce" if args.algo == "tree" else "rs-ag"
    if args.dp_mode in ("rs-ag", "allreduce"):
        dp_mode = "rs-ag" if args.dp_mode == "rs-ag" else "allreduce"
    return config.SimConfig(
        ranks=args.ranks,
        gpus_per_node=args.gpus_per_node,
        tp=tp,
        pp=pp,
        dp=dp,
        order=args.order,
        algo=args.algo,
        channels=args.channels,
        dp_mode=dp_mode,
        duration_s=config.SimConfig.duration_s if args.duration is None else args.duration,
        fault=truth.Fault.from_name(args.fault),
        target=args.target,
        onset_s=config.SimConfig.onset_s if args.onset is None else args.onset,
        severity=args.severity,
        seed=args.seed,
        declare_parallelism=not args.no_parallelism,
    )


def run(args: argparse.Namespace) -> int:
    if args.kind == "flows":
        if args.fault != "none":
            raise errors.SimulationError("--fault is for --kind collective; use --flow-fault")
        return flow_commands.simulate(args)
    if args.kind == "patterns":
        if args.fault != "none":
            raise errors.SimulationError("--fault is for --kind collective; use --pattern-case")
        return pattern_commands.simulate(args)
    cfg = sim_config(args)
    t0 = time.perf_counter()
    bar = progress.Progress(f"simulating {cfg.ranks} ranks")
    result = simulator.simulate(cfg, progress=bar)
    bar.done()
    if bar.enabled:
        print("writing the bundle ...", file=sys.stderr)
    out = writer.write(
        result.bundle,
        args.out,
        compress=not args.uncompressed,
        extra_files={"truth.json": truth_json(result.truth)},
    )
    t = result.truth
    print(
        f"simulated {cfg.ranks} ranks (tp={cfg.tp} pp={cfg.pp} dp={cfg.dp}, {cfg.algo}, "
        f"{cfg.channels} channels) for {cfg.duration_s:g}s in "
        f"{time.perf_counter() - t0:.1f}s: {len(result.bundle.ops)} op and "
        f"{len(result.bundle.states)} state records"
    )
    print(
        f"fault: {t.fault}"
        + (f" on ranks {ranks_text(t.culprit_ranks)}" if t.culprit_ranks else "")
        + (f" ({t.detail})" if t.detail else "")
    )
    print(f"wrote {out}")
    return exits.OK


def truth_json(t: truth.Truth) -> str:
    """truth.json as written beside a simulated bundle."""
    return t.model_dump_json(by_alias=True, indent=2) + "\n"


def ranks_text(ranks: Sequence[int]) -> str:
    """The first 8 ranks, comma-separated, then `...` if there are more."""
    return ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")
