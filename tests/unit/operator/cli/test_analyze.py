"""`collscope analyze` as a user meets it: a missing or malformed bundle is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


def test_analyze_missing_bundle_is_one_line_exit_2(tmp_path: Path) -> None:
    res = _run("analyze", str(tmp_path / "nope"))
    assert res.returncode == exits.BAD_INPUT
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
    assert res.returncode == exits.BAD_INPUT
    assert "Traceback" not in res.stderr
    assert "records.jsonl:2" in res.stderr


def test_analyze_judges_hangs_with_every_ranks_summary_row_by_default(tmp_path: Path) -> None:
    # Issue 12: the live operator pulls every rank's /v1/summaries row each tick; analyze
    # replays that pull (analysis/summaries.py), --sampled-only the sampled ranks' windows
    # alone. 32 ranks (4 nodes) leave ranks unsampled; the job-wide rows may only detect the
    # hang earlier, never later, and must not change the verdict.
    bundle = tmp_path / "hang"
    made = _run(
        "simulate", "--ranks", "32", "--duration", "8", "--onset", "4", "--fault", "gpu-hang",
        "--seed", "0", "--out", str(bundle),
    )  # fmt: skip
    assert made.returncode == exits.OK, made.stderr
    got = {}
    for mode in ("jobwide", "--sampled-only"):
        res = _run("analyze", str(bundle), "--json", *([mode] if mode.startswith("--") else []))
        assert res.returncode == exits.OK, res.stderr
        got[mode] = json.loads(res.stdout)
    wide, sampled = got["jobwide"], got["--sampled-only"]
    truth = json.loads((bundle / "truth.json").read_text())
    assert wide["anomaly"] and sampled["anomaly"]
    assert wide["category"] == sampled["category"] == "hang.gpu"
    assert wide["culprits"][0]["rank"] == sampled["culprits"][0]["rank"]
    assert wide["culprits"][0]["rank"] in truth["culprit_ranks"]
    assert truth["onset"] <= wide["detected_at"] <= sampled["detected_at"]


def test_analyze_help_documents_sampled_only() -> None:
    out = _run("analyze", "--help").stdout
    assert "--sampled-only" in out and "summaries" in out
