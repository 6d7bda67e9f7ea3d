"""`collscope demo --simulated`: a fixed fault diagnosed; process faults refused in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from collscope.operator.cli import exits


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # A real subprocess: checks that no traceback ever reaches the user's terminal.
    return subprocess.run(
        [sys.executable, "-m", "collscope.operator.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.timeout(240)
def test_demo_diagnoses_fixed_fault(tmp_path: Path) -> None:
    res = _run(
        "demo", "--simulated", "--seed", "3", "--fault", "gpu-power-limit",
        "--out", str(tmp_path / "demo"),
    )  # fmt: skip
    assert "Traceback" not in res.stderr
    assert "verdict:" in res.stdout
    assert res.returncode == 0, res.stdout + res.stderr
    assert "CATEGORY" in res.stdout and "slow.compute" in res.stdout


def test_simulated_demo_refuses_process_faults_in_one_line() -> None:
    res = _run("demo", "--help")
    assert "process-killed" in res.stdout and "process-frozen" in res.stdout
    res = _run("demo", "--simulated", "--fault", "process-frozen")
    assert res.returncode == exits.BAD_INPUT and res.stdout == ""
    assert res.stderr.splitlines() == [
        "collscope demo: error: --fault process-frozen needs rank processes: the simulator "
        "has none (run it without --simulated)"
    ]
