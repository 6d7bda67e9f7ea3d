"""`collscope ring dump` as a user meets it: a bad or missing ring file is one line, exit 2."""

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


def test_ring_dump_of_a_file_that_is_not_a_ring_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "x.ring"
    bad.write_bytes(b"not a ring".ljust(8192, b"\0"))
    res = _run("ring", "dump", str(bad))
    assert res.returncode == exits.BAD_INPUT
    assert res.stdout == ""
    assert res.stderr.splitlines() == [
        f"collscope ring: error: {bad}: header @0x0 field 'magic': expected "
        "0x474e495250435343, got 0x6972206120746f6e: not a collscope ring"
    ]


def test_ring_dump_of_a_missing_file_names_it(tmp_path: Path) -> None:
    res = _run("ring", "dump", str(tmp_path / "nope.ring"))
    assert res.returncode == exits.BAD_INPUT
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "nope.ring" in res.stderr
