"""`collscope` itself: the parser assembled from the subcommand modules, `python -m` works."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator

from collscope.operator.cli import exits, main


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # A real subprocess: `python -m collscope.operator.cli` is how the tests run the command.
    return subprocess.run(
        [sys.executable, "-m", "collscope.operator.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_help_lists_every_subcommand_in_order() -> None:
    res = _run("--help")
    assert res.returncode == exits.OK, res.stderr
    assert res.stdout.startswith("usage: ")
    commands = ["simulate", "analyze", "demo", "ring", "uncordon", "breaker", "flightrecorder"]
    listed = [m[1] for m in re.finditer(r"^ {4}(\S+)", res.stdout, re.MULTILINE)]
    assert listed == commands


def _leaves(p: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield name, p
    for sub in subs:
        for child, q in sub.choices.items():
            yield from _leaves(q, f"{name} {child}")


def test_every_subcommand_runs_a_function() -> None:
    leaves = dict(_leaves(main.parser(), "collscope"))
    assert "collscope ring dump" in leaves and "collscope breaker" in leaves
    for name, p in leaves.items():
        assert callable(p.get_default("func")), name


def test_no_command_is_a_usage_error() -> None:
    res = _run()
    assert res.returncode == exits.BAD_INPUT
    assert res.stdout == ""
    assert res.stderr.startswith("usage: collscope") and "Traceback" not in res.stderr
