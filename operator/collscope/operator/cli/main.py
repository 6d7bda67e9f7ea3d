"""The `collscope` command: simulate a faulty job, analyse a bundle, run the demo, read rings.

    collscope simulate --ranks 64 --fault nic-down --seed 3 --out ./bundle
    collscope simulate --kind flows --gpus 512 --flow-fault congested-switch --out ./fabric
    collscope simulate --kind patterns --workers 3400 --pattern-case pin-memory --out ./prof
    collscope analyze ./bundle [--json]
    collscope demo [--fault nic-down] [--seed 7] [--simulated]
    collscope ring dump /run/collscope/collscope-node7-pid4242-0.ring [MORE.ring ...]
    collscope uncordon NODE | collscope breaker show|reset --by NAME   (node_commands.py)
    collscope flightrecorder --agent URL --out DIR      (flightrecorder_commands.py)

Exit codes: 0 analysed (anomaly or not) / simulated / demo diagnosed correctly; 1 the demo's
diagnosis disagreed with the injected truth; 2 bad input or bad arguments, with one line on
stderr naming what and where, never a traceback.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from collscope.nodeagent import errors as agent_errors
from collscope.nodeagent import ring, version
from collscope.nodeagent.bundle import reader, writer
from collscope.operator import errors
from collscope.operator.analysis import diagnosis
from collscope.operator.analysis import engine as analysis
from collscope.operator.analysis.flows import engine as flow_analysis
from collscope.operator.analysis.flows import table as flow_table
from collscope.operator.cli import flightrecorder as flightrecorder_commands
from collscope.operator.cli import flows as flow_commands
from collscope.operator.cli import nodes as node_commands
from collscope.operator.cli import patterns as pattern_commands
from collscope.operator.cli import progress
from collscope.operator.domain import report
from collscope.operator.onebox import box as onebox_box
from collscope.operator.onebox import demo as onebox_demo
from collscope.operator.onebox import faults as onebox_faults
from collscope.operator.simulator import config, truth
from collscope.operator.simulator import engine as simulator

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_BAD_INPUT = 2


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except errors.CollscopeError as e:
        print(f"collscope {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        print(f"collscope {args.command}: error:{where}: {e.strerror or e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    return code


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="collscope",
        description="Find the rank, GPU, NIC or node that hangs or slows a training job.",
    )
    p.add_argument("--version", action="version", version=version.line("collscope"))
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
    sim.set_defaults(func=_cmd_simulate)

    ana = sub.add_parser(
        "analyze",
        help="diagnose a trace bundle",
        description="Replay a trace bundle as the operator would (sampled trigger every "
        "second, then root cause on the trigger window) and print the diagnosis. A bundle "
        "with flows.jsonl and no collective records (comm/op/state) gets the black-box "
        "flow diagnosis instead (LLMPrism: jobs, DP/PP pairs and step timelines from flows, "
        "k-sigma across steps, DP groups and switches). With both, the collective "
        "diagnosis leads when it finds an anomaly and the flow culprits and evidence "
        "(prefixed 'flows:') follow; when only the flows show one, the flow diagnosis is "
        "the result. A bundle with functions.jsonl gets EROICA's localisation of abnormal "
        "functions (alone, or folded in after the other analyses, prefixed 'functions:').",
    )
    ana.add_argument("bundle", type=Path, help="bundle directory or .tar.gz")
    ana.add_argument(
        "--json",
        action="store_true",
        help="print the Diagnosis JSON of docs/spec/bundle-v1.md instead of a summary",
    )
    ana.set_defaults(func=_cmd_analyze)

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
    demo.set_defaults(func=_cmd_demo)

    rng = sub.add_parser(
        "ring",
        help="read the trace rings written by the NCCL profiler plugin",
        description="Read trace ring files written by libnccl-profiler-collscope.so.",
    )
    ring_sub = rng.add_subparsers(dest="ring_command", required=True, metavar="SUBCOMMAND")
    dump = ring_sub.add_parser(
        "dump",
        help="print rings as bundle-v1 records",
        description="Print each ring as docs/spec/bundle-v1.md JSON lines on stdout: its comm "
        "records, the op records still in its event ring, and a state record per "
        "communicator with an operation in flight now; a header summary per ring goes to "
        "stderr. Peers are communicator ranks in a ring: give the rings of the other "
        "processes of the job too, and they are translated to global ranks.",
    )
    dump.add_argument("rings", nargs="+", type=Path, metavar="FILE", help="ring file")
    dump.add_argument(
        "--rank",
        type=int,
        default=None,
        help="global rank of the writer of a single FILE whose process had no RANK set",
    )
    dump.set_defaults(func=_cmd_ring_dump)
    node_commands.add_parsers(sub)
    flightrecorder_commands.add_parsers(sub)
    return p


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
    p.add_argument(
        "--no-parallelism",
        action="store_true",
        help="leave parallelism out of job.json (analysis must infer groups)",
    )


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


def _cmd_simulate(args: argparse.Namespace) -> int:
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
        extra_files={"truth.json": _truth_json(result.truth)},
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
        + (f" on ranks {_ranks(t.culprit_ranks)}" if t.culprit_ranks else "")
        + (f" ({t.detail})" if t.detail else "")
    )
    print(f"wrote {out}")
    return EXIT_OK


def _cmd_analyze(args: argparse.Namespace) -> int:
    bundle = reader.load(args.bundle)
    flows = flow_table.FlowTable.from_flows(reader.iter_net_flows(args.bundle))
    patterns = pattern_commands.read(args.bundle)
    collective = len(bundle.comms) + len(bundle.ops) + len(bundle.states) > 0
    result: diagnosis.Diagnosis | None = None
    if len(flows) and not collective:
        result = flow_analysis.diagnose_flows(flows, job=bundle.job)
    elif collective or not len(patterns):
        result = analysis.diagnose(bundle)
        if len(flows):
            flow_result = flow_analysis.diagnose_flows(flows, job=bundle.job)
            result = flow_analysis.combine(result, flow_result)
    result = pattern_commands.merge(result, patterns, bundle.job)
    assert result is not None  # one of the analyses ran
    if args.json:
        print(result.to_json())
    else:
        span = bundle.time_span() or flows.time_span()
        print(
            report.summary(
                result, source=str(args.bundle), start_ns=None if span is None else span[0]
            )
        )
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.simulated:
        return _cmd_demo_simulated(args)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10_000)
    fault_name = args.fault or random.Random(seed).choice(onebox_faults.RELIABLE)
    plugin = onebox_box.find_plugin(args.plugin)
    return onebox_demo.run(fault_name, seed=seed, out=args.out, plugin=plugin).code


def _cmd_demo_simulated(args: argparse.Namespace) -> int:
    if args.fault in onebox_faults.PROCESS:
        print(
            f"collscope demo: error: --fault {args.fault} needs rank processes: the simulator "
            "has none (run it without --simulated)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
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
    path = writer.write(result.bundle, out, extra_files={"truth.json": _truth_json(result.truth)})
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
    ok = verdict(diag, result.truth)
    t = result.truth
    latency = (
        ""
        if diag.detected_at is None or t.onset is None
        else f", detected {(diag.detected_at - t.onset) / 1e9:.2f}s after onset"
    )
    print(
        f"injected: {t.fault} on rank(s) {_ranks(t.culprit_ranks)}"
        f" ({t.culprit_node}), expected {t.expected_category}: {t.detail}"
    )
    print(f"verdict:  {'CORRECT' if ok else 'MISMATCH'} (top culprit and category{latency})")
    print(f"\nre-run the analysis yourself: collscope analyze {path}")
    return EXIT_OK if ok else EXIT_MISMATCH


def _cmd_ring_dump(args: argparse.Namespace) -> int:
    if args.rank is not None and len(args.rings) != 1:
        print("collscope ring: error: --rank needs exactly one FILE", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        for dump in ring.dump(args.rings, rank=args.rank):
            for rec in dump.records:
                print(rec.model_dump_json(exclude_none=True))
            print(dump.summary(), file=sys.stderr)
    except agent_errors.RingRankUnset as e:
        print(f"collscope ring: error: {e}; pass --rank", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def verdict(diag: diagnosis.Diagnosis, t: truth.Truth) -> bool:
    """Does the diagnosis agree with the truth: top-1 culprit and category (or no anomaly)?"""
    return onebox_demo.verdict(diag, t)


def _truth_json(t: truth.Truth) -> str:
    return t.model_dump_json(by_alias=True, indent=2) + "\n"


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")


if __name__ == "__main__":
    sys.exit(main())
