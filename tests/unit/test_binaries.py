"""Every binary parses its arguments before touching a network or a cluster (issue 16 item 3).

``--help`` and ``--version`` of each ``[project.scripts]`` entry point are run as a process with
no kubeconfig anywhere and a Kubernetes API host that cannot be reached: they must exit 0
quickly (``collscope-operator --help`` used to start the operator against the current context).
Every argparse action of every parser and subparser has help text, and no help line says its
default twice ("(default: …) (default: None)").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from collscope.nodeagent import __main__ as agent_main
from collscope.operator import __main__ as operator_main
from collscope.operator.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
# TEST-NET-1 (RFC 5737): never routed, so a binary that tried the API would hang, not pass.
UNREACHABLE_API = "192.0.2.1"


def _run(script: str, arg: str, home: Path) -> subprocess.CompletedProcess[str]:
    module, func = SCRIPTS[script].split(":")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "COLLSCOPE_"))}
    env |= {
        "HOME": str(home),  # no ~/.kube/config
        "KUBERNETES_SERVICE_HOST": UNREACHABLE_API,
        "KUBERNETES_SERVICE_PORT": "443",
        "HTTPS_PROXY": f"http://{UNREACHABLE_API}:3128",
        "HTTP_PROXY": f"http://{UNREACHABLE_API}:3128",
    }
    code = f"import sys; from {module} import {func}; sys.argv[0] = {script!r}; sys.exit({func}())"
    return subprocess.run(
        [sys.executable, "-c", code, arg],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,  # an import of the operator takes seconds on a loaded CI runner
        check=False,
    )


def test_every_script_is_covered() -> None:
    assert set(SCRIPTS) == {"collscope", "collscope-agent", "collscope-operator"}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_exits_0_without_a_cluster(script: str, tmp_path: Path) -> None:
    done = _run(script, "--help", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script}"), done.stdout
    assert "--version" in done.stdout


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_version_exits_0_without_a_cluster(script: str, tmp_path: Path) -> None:
    done = _run(script, "--version", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{script} "), done.stdout


PARSERS = {
    "collscope": cli.parser,
    "collscope-agent": agent_main._parser,
    "collscope-operator": operator_main.parser,
}


def _walk(p: argparse.ArgumentParser) -> Iterator[tuple[argparse.ArgumentParser, argparse.Action]]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {a.dest for a in action._choices_actions if a.help}
            for name, sub in action.choices.items():
                assert name in helped, f"{p.prog} {name}: the subcommand has no help"
                yield from _walk(sub)
        else:
            yield p, action


@pytest.mark.parametrize("script", sorted(PARSERS))
def test_every_flag_has_help_text(script: str) -> None:
    missing = [
        f"{p.prog} {'/'.join(a.option_strings) or a.dest}"
        for p, a in _walk(PARSERS[script]())
        if not a.help or a.help == argparse.SUPPRESS
    ]
    assert not missing


@pytest.mark.parametrize("script", sorted(PARSERS))
def test_help_says_a_default_at_most_once(script: str) -> None:
    for p, a in _walk(PARSERS[script]()):
        text = p._get_formatter()._expand_help(a) if a.help else ""
        name = f"{p.prog} {'/'.join(a.option_strings) or a.dest}"
        assert text.count("default:") <= 1, f"{name}: {text}"
        assert "(default: None)" not in text, f"{name}: {text}"
