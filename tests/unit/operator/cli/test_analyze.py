"""`collscope analyze` as a user meets it: a missing or malformed bundle is one line, exit 2."""

from __future__ import annotations

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
