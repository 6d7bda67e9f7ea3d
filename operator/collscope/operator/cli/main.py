"""The `collscope` command: ``main()`` assembles the parser from one module per subcommand.

    collscope simulate --ranks 64 --fault nic-down --seed 3 --out ./bundle      (simulate.py)
    collscope analyze ./bundle [--json]                                         (analyze.py)
    collscope demo [--fault nic-down] [--seed 7] [--simulated]                  (demo.py)
    collscope ring dump /run/collscope/collscope-node7-pid4242-0.ring [MORE]    (ring.py)
    collscope uncordon NODE | collscope breaker show|reset --by NAME            (nodes.py)
    collscope flightrecorder --agent URL --out DIR                              (flightrecorder.py)

Each module's ``add_parser(subparsers)`` adds its subparser and sets ``func``, the function that
runs it and returns the exit code (``exits.py``). ``main`` turns the errors a command may raise
on bad input (``CollscopeError``, ``OSError``) into one line on stderr and exit code 2, never a
traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from collscope.nodeagent import version
from collscope.operator import errors
from collscope.operator.cli import analyze, demo, exits, flightrecorder, nodes, ring, simulate


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except errors.CollscopeError as e:
        print(f"collscope {args.command}: error: {e}", file=sys.stderr)
        return exits.BAD_INPUT
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        print(f"collscope {args.command}: error:{where}: {e.strerror or e}", file=sys.stderr)
        return exits.BAD_INPUT
    except KeyboardInterrupt:
        return 130
    return code


def parser() -> argparse.ArgumentParser:
    """The whole command line: each subcommand's module adds its own subparser, in this order
    (the order of ``collscope --help``)."""
    p = argparse.ArgumentParser(
        prog="collscope",
        description="Find the rank, GPU, NIC or node that hangs or slows a training job.",
    )
    p.add_argument("--version", action="version", version=version.line("collscope"))
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    simulate.add_parser(sub)
    analyze.add_parser(sub)
    demo.add_parser(sub)
    ring.add_parser(sub)
    nodes.add_parsers(sub)
    flightrecorder.add_parser(sub)
    return p


if __name__ == "__main__":
    sys.exit(main())
