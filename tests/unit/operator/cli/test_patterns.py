"""`collscope simulate --kind patterns` and `collscope analyze` on functions.jsonl bundles."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from collscope.operator.cli import exits
from collscope.operator.cli import main as cli
from collscope.operator.simulator.patterns import engine as pattern_sim


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collscope.operator.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _simulate(out: Path, case: str, workers: int = 400, seed: int = 1) -> dict[str, object]:
    res = _run(
        "simulate",
        "--kind",
        "patterns",
        "--workers",
        str(workers),
        "--pattern-case",
        case,
        "--seed",
        str(seed),
        "--out",
        str(out),
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # no progress bar: stderr is not a terminal
    assert f"case: {case}" in res.stdout
    truth: dict[str, object] = json.loads((out / "truth.json").read_text())
    return truth


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_simulate_patterns_draws_progress_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    args = ["simulate", "--kind", "patterns", "--workers", "400", "--seed", "1"]
    assert cli.main([*args, "--out", str(tmp_path / "b")]) == 0
    assert err.getvalue().startswith("\rsimulating 400 workers [")
    last = err.getvalue().rsplit("\r", 1)[-1]
    assert "[####################] 100%" in last and last.endswith("\n")


def test_pattern_writer_reports_each_step(tmp_path: Path) -> None:
    seen: list[float] = []
    # 8,000 workers make 88,000 functions.jsonl lines: one report from inside the text
    pattern_sim.write("healthy", 8000, 1, tmp_path / "b", progress=seen.append)
    shares = pattern_sim.SHARES
    assert seen == sorted(seen) and seen[0] == shares["patterns"] and seen[-1] == 1.0
    assert any(shares["patterns"] < f < shares["lines"] for f in seen)
    assert shares["lines"] in seen and shares["job"] in seen


def test_help_lists_pattern_cases() -> None:
    out = _run("simulate", "--help").stdout
    for word in ("patterns", "--workers", "--pattern-case", "nic-down", "load-imbalance"):
        assert word in out


@pytest.mark.parametrize(
    ("case", "category"),
    [("nic-down", "slow.network"), ("pin-memory", "slow.host"), ("gpu-throttle", "slow.compute")],
)
def test_simulated_case_is_localised(tmp_path: Path, case: str, category: str) -> None:
    truth = _simulate(tmp_path / "b", case)
    res = _run("analyze", str(tmp_path / "b"), "--json")
    assert res.returncode == exits.OK, res.stderr
    d = json.loads(res.stdout)
    assert d["anomaly"] and d["category"] == category == truth["expected_category"]
    culprit_ranks = truth["culprit_ranks"]
    assert isinstance(culprit_ranks, list)
    assert d["culprits"][0]["rank"] in culprit_ranks
    assert d["culprits"][0]["function"] in truth["culprit_fns"]  # type: ignore[operator]


def test_healthy_bundle_prints_no_anomaly(tmp_path: Path) -> None:
    _simulate(tmp_path / "b", "healthy")
    res = _run("analyze", str(tmp_path / "b"))
    assert res.returncode == exits.OK
    assert "no anomaly found" in res.stdout and "patterns: 4,400 patterns" in res.stdout


def test_functions_beside_collective_records_are_folded_in(tmp_path: Path) -> None:
    res = _run(
        "simulate", "--ranks", "16", "--duration", "4", "--onset", "2", "--out", str(tmp_path / "c")
    )
    assert res.returncode == 0, res.stderr
    _simulate(tmp_path / "p", "pin-memory", workers=16, seed=2)
    shutil.copy(tmp_path / "p" / "functions.jsonl", tmp_path / "c" / "functions.jsonl")
    res = _run("analyze", str(tmp_path / "c"), "--json")
    assert res.returncode == exits.OK, res.stderr
    d = json.loads(res.stdout)
    assert d["anomaly"]  # only the patterns show one: they lead
    assert d["culprits"][0]["function"] == "pin_memory"
    assert any(e.startswith("other: ") for e in d["evidence"])


def test_malformed_functions_line_is_one_line_exit_2(tmp_path: Path) -> None:
    _simulate(tmp_path / "b", "healthy", workers=16)
    with (tmp_path / "b" / "functions.jsonl").open("a") as f:
        f.write(
            '{"rank": 3, "fn": "x", "kind": "gpu", "beta": 0.1, "mu": 0, "sigma": 0, '
            '"window_ns": 1}\n'
        )
    res = _run("analyze", str(tmp_path / "b"))
    assert res.returncode == exits.BAD_INPUT
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "functions.jsonl" in res.stderr and "kind" in res.stderr
