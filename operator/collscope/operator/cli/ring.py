"""``collscope ring dump FILE...``: the trace rings of the NCCL profiler plugin as records.

    collscope ring dump /run/collscope/collscope-node7-pid4242-0.ring [MORE.ring ...]
    collscope ring dump --rank 3 ./collscope-pid77-0.ring    # a process with no RANK set

bundle-v1 JSON lines go to stdout, a header summary per ring to stderr (``ring.dump`` of the
node agent reads and translates them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from collscope.nodeagent import errors as agent_errors
from collscope.nodeagent import ring
from collscope.operator.cli import exits


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    dump.set_defaults(func=run_dump)


def run_dump(args: argparse.Namespace) -> int:
    if args.rank is not None and len(args.rings) != 1:
        print("collscope ring: error: --rank needs exactly one FILE", file=sys.stderr)
        return exits.BAD_INPUT
    try:
        for dump in ring.dump(args.rings, rank=args.rank):
            for rec in dump.records:
                print(rec.model_dump_json(exclude_none=True))
            print(dump.summary(), file=sys.stderr)
    except agent_errors.RingRankUnset as e:
        print(f"collscope ring: error: {e}; pass --rank", file=sys.stderr)
        return exits.BAD_INPUT
    return exits.OK
