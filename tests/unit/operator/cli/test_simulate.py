"""`collscope simulate` (--kind collective) as a user meets it: help, one-line errors, a bundle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from collscope.operator.cli import exits
from collscope.operator.simulator import truth


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # A real subprocess: checks that no traceback ever reaches the user's terminal.
    return subprocess.run(
        [sys.executable, "-m", "collscope.operator.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_simulate_help_documents_every_fault_and_option() -> None:
    out = _run("simulate", "--help").stdout
    for name in truth.FAULT_NAMES:
        assert name in out
    for option in (
        "--ranks",
        "--tp",
        "--pp",
        "--dp",
        "--algo",
        "--channels",
        "--duration",
        "--fault",
        "--target",
        "--onset",
        "--seed",
        "--out",
    ):
        assert option in out


def test_simulate_bad_parallelism_is_one_line_exit_2(tmp_path: Path) -> None:
    res = _run(
        "simulate",
        "--ranks",
        "16",
        "--tp",
        "3",
        "--pp",
        "1",
        "--dp",
        "2",
        "--out",
        str(tmp_path / "b"),
    )
    assert res.returncode == exits.BAD_INPUT
    assert "Traceback" not in res.stderr
    assert "ranks 16" in res.stderr


@pytest.mark.timeout(240)
def test_simulate_then_analyze_json(tmp_path: Path) -> None:
    out = tmp_path / "bundle.tar.gz"
    res = _run("simulate", "--ranks", "16", "--fault", "nic-down", "--seed", "1", "--out", str(out))
    assert res.returncode == 0, res.stderr
    res = _run("analyze", str(out), "--json")
    assert res.returncode == 0, res.stderr
    diag = json.loads(res.stdout)
    assert diag["schema"] == "collscope.diagnosis/v1"
    assert diag["anomaly"] is True
    assert diag["category"] == "hang.network"
