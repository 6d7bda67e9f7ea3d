"""``collscope analyze BUNDLE [--json]``: diagnose a bundle offline, as the operator would.

    collscope analyze ./bundle            # collective records: trigger, then root cause
    collscope analyze ./bundle --sampled-only   # the trigger without the job-wide rows
    collscope analyze ./fabric --json     # flows only: black-box diagnosis (LLMPrism)
    collscope analyze ./prof              # functions.jsonl: EROICA localisation

Which analyses run depends on what the bundle holds: collective records (comm/op/state),
``flows.jsonl`` and ``functions.jsonl``; the subparser's description says how they combine.
The collective replay feeds the trigger, each tick, every rank's ``/v1/summaries`` row as the
live operator pulls them (``analysis/summaries.py``), so that a hang is detected when the
operator would detect it; ``--sampled-only`` replays with the sampled ranks' windows alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from collscope.nodeagent.bundle import reader
from collscope.operator.analysis import diagnosis, summaries
from collscope.operator.analysis import engine as analysis
from collscope.operator.analysis.flows import engine as flow_analysis
from collscope.operator.analysis.flows import table as flow_table
from collscope.operator.cli import exits
from collscope.operator.cli import patterns as pattern_commands
from collscope.operator.domain import report


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ana = sub.add_parser(
        "analyze",
        help="diagnose a trace bundle",
        description="Replay a trace bundle as the operator would (trigger every second on "
        "the sampled ranks' windows plus every rank's /v1/summaries row for the job-wide hang "
        "check, then root cause on the trigger window) and print the diagnosis. A bundle "
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
    ana.add_argument(
        "--sampled-only",
        action="store_true",
        help="replay the trigger on the sampled ranks' windows alone, without every rank's "
        "summary row each tick (the job-wide hang check the live operator runs): detects "
        "hangs as collscope did before it pulled those rows, later or at the same tick",
    )
    ana.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    bundle = reader.load(args.bundle)
    flows = flow_table.FlowTable.from_flows(reader.iter_net_flows(args.bundle))
    patterns = pattern_commands.read(args.bundle)
    collective = len(bundle.comms) + len(bundle.ops) + len(bundle.states) > 0
    result: diagnosis.Diagnosis | None = None
    if len(flows) and not collective:
        result = flow_analysis.diagnose_flows(flows, job=bundle.job)
    elif collective or not len(patterns):
        rows = None if args.sampled_only else summaries.Summaries()
        result = analysis.diagnose(bundle, summaries=rows)
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
    return exits.OK
