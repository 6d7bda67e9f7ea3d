"""The `collscope` command as a user meets it: exit codes, one-line errors, help text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from collscope.operator.cli import main as cli
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


def test_analyze_missing_bundle_is_one_line_exit_2(tmp_path: Path) -> None:
    res = _run("analyze", str(tmp_path / "nope"))
    assert res.returncode == cli.EXIT_BAD_INPUT
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "nope" in res.stderr


def test_analyze_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "job.json").write_text('{"schema": "collscope.bundle/v1", "world_size": 2}')
    (bundle / "records.jsonl").write_text(
        '{"type": "comm", "rank": 0, "ts": 1, "comm": "0x1", "comm_rank": 0, "nranks": 2}\n'
        '{"type": "op", "rank": 0, "ts": 5, "comm": "0x1"\n'
    )
    res = _run("analyze", str(bundle))
    assert res.returncode == cli.EXIT_BAD_INPUT
    assert "Traceback" not in res.stderr
    assert "records.jsonl:2" in res.stderr


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
    assert res.returncode == cli.EXIT_BAD_INPUT
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
    assert res.returncode == cli.EXIT_BAD_INPUT and res.stdout == ""
    assert res.stderr.splitlines() == [
        "collscope demo: error: --fault process-frozen needs rank processes: the simulator "
        "has none (run it without --simulated)"
    ]


def test_ring_dump_of_a_file_that_is_not_a_ring_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "x.ring"
    bad.write_bytes(b"not a ring".ljust(8192, b"\0"))
    res = _run("ring", "dump", str(bad))
    assert res.returncode == cli.EXIT_BAD_INPUT
    assert res.stdout == ""
    assert res.stderr.splitlines() == [
        f"collscope ring: error: {bad}: header @0x0 field 'magic': expected "
        "0x474e495250435343, got 0x6972206120746f6e: not a collscope ring"
    ]


def test_ring_dump_of_a_missing_file_names_it(tmp_path: Path) -> None:
    res = _run("ring", "dump", str(tmp_path / "nope.ring"))
    assert res.returncode == cli.EXIT_BAD_INPUT
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "nope.ring" in res.stderr
