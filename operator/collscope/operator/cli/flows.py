"""The network-flow side of the `collscope` command (used by simulate.py).

    collscope simulate --kind flows --gpus 512 --flow-fault congested-switch --out ./fabric
    collscope simulate --kind flows --flow-fault slow-group@train-03/pp0/tp5 --severity 3 ...
    collscope analyze ./fabric            # flows only: black-box diagnosis (LLMPrism)

``--kind flows`` simulates several concurrent jobs on a shared leaf-spine fabric
(``simulator.flows``) and writes a flows-only bundle: job.json (every GPU slot with its server
and NIC address: the physical topology), an empty records.jsonl.gz, flows.jsonl.gz and
truth.json.
"""

from __future__ import annotations

import argparse
import time

from collscope.operator.cli import progress
from collscope.operator.simulator.flows import config as flow_config
from collscope.operator.simulator.flows import engine as flow_sim

DEFAULT_GPUS = 512
DEFAULT_DURATION_S = 120.0  # two minutes: a baseline minute, then the fault
DEFAULT_ONSET_S = 60.0


def fault_spec(text: str) -> tuple[flow_config.FaultKind, str | None]:
    """``KIND`` or ``KIND@TARGET`` (argparse ``type``)."""
    kind, _, target = text.partition("@")
    for known in flow_config.FAULT_KINDS:
        if kind == known:
            return known, target or None
    raise argparse.ArgumentTypeError(
        f"unknown flow fault {kind!r}; choose from {', '.join(flow_config.FAULT_KINDS)}"
    )


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of `simulate --kind flows` (their own group in --help)."""
    g = p.add_argument_group(
        "flow simulation (--kind flows)",
        "Several concurrent Megatron-style jobs (TP inside 8-GPU servers, DP x PP across "
        "them, 1F1B pipeline, bucketed DP ring all-reduce) on a shared leaf-spine fabric, "
        "seen by a flow collector (lost and split records, timing noise, storage traffic). "
        "--duration, --onset, --severity, --seed, --out and --uncompressed apply too; "
        "--ranks, --tp/--pp/--dp, --algo, --channels, --fault and --target do not.",
    )
    g.add_argument(
        "--gpus",
        type=int,
        default=DEFAULT_GPUS,
        help="fabric size in GPUs (8 per server); a seeded mix of jobs fills about 90%% of it",
    )
    g.add_argument(
        "--flow-fault",
        action="append",
        type=fault_spec,
        default=[],
        metavar="KIND[@TARGET]",
        help="inject a fault (repeatable): "
        + "; ".join(f"{k}: {v}" for k, v in flow_config.FAULT_SUMMARY.items())
        + ". TARGET is a switch (leaf-03, spine-01), a job (train-02) or a DP group "
        "(train-02/pp1/tp5); without it the seed picks one",
    )


def simulate(args: argparse.Namespace) -> int:
    duration = DEFAULT_DURATION_S if args.duration is None else args.duration
    onset = DEFAULT_ONSET_S if args.onset is None else args.onset
    faults = tuple(
        flow_config.FlowFault(kind=kind, target=target, onset_s=onset, severity=args.severity)
        for kind, target in args.flow_fault
    )
    cfg = flow_config.preset(args.gpus, seed=args.seed, duration_s=duration, faults=faults)
    t0 = time.perf_counter()
    bar = progress.Progress(f"simulating {cfg.fabric.gpus} GPUs")
    result = flow_sim.simulate(cfg, progress=bar)
    bar.done()
    bar = progress.Progress(f"writing {len(result):,} flows")
    out = result.write(args.out, compress=not args.uncompressed, progress=bar)
    bar.done()
    fab = cfg.fabric
    print(
        f"simulated {fab.gpus} GPUs ({len(cfg.jobs)} jobs on {fab.servers} servers, "
        f"{fab.leaves} leaves, {fab.spines} spines) for {duration:g}s in "
        f"{time.perf_counter() - t0:.1f}s: {len(result):,} flows"
    )
    for f in result.truth.faults:
        print(f"fault: {f.kind} on {f.culprit} from t={onset:g}s (x{f.severity:g})")
    if not result.truth.faults:
        print("fault: none")
    print(f"wrote {out}")
    return 0
