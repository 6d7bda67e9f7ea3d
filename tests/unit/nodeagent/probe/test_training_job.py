"""The probe in a real (CPU, gloo) training job, end to end: injected by sitecustomize,
detects iterations and degradation, profiles every rank at the same iteration, summarises
patterns, and the operator's localisation names each injected fault's function and rank.

Needs CPU PyTorch (``pip install torch==2.13.0``, see the README); skipped without it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from collscope.nodeagent.bundle import models, tables, writer
from collscope.nodeagent.probe import collect
from collscope.operator import cli
from collscope.operator.analysis.patterns import engine, table

pytest.importorskip("torch", reason="CPU PyTorch is needed to run a training job under the probe")

ROOT = Path(__file__).resolve().parents[4]
SITE = ROOT / "nodeagent" / "collscope" / "nodeagent" / "probe" / "site"
JOB = Path(__file__).with_name("train_job.py")
WORLD = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(trace: Path, rank: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(SITE), env.get("PYTHONPATH", "")]),
        COLLSCOPE_PROBE="1",
        COLLSCOPE_TRACE_DIR=str(trace),
        COLLSCOPE_PROBE_ITERATIONS="20",
        COLLSCOPE_PROBE_POLL_S="0.05",
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    return env


@pytest.mark.slow
def test_probe_localises_each_injected_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(JOB)],
            env=_env(tmp_path, r, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(WORLD)
    ]
    outs = [p.communicate(timeout=100)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * WORLD, outs
    request = json.loads((tmp_path / "profile-request.json").read_text())
    assert "iterations" in request["reason"] or "blocked" in request["reason"]
    assert not list(tmp_path.glob("probe.*.log")), [
        p.read_text() for p in tmp_path.glob("probe.*.log")
    ]
    got = collect.collect([str(tmp_path)])
    assert got.files == WORLD and got.bad_lines == 0
    t = table.PatternTable.from_patterns(got.patterns)
    assert t.workers == WORLD
    report = engine.analyze(t)
    for name, rank in (("slow_load", 1), ("gc_pause", 2), ("slow_compute", 3)):
        hits = [f for f in report.findings if name in f.fn]
        assert hits, (name, [f.fn for f in report.findings])
        for f in hits:
            assert f.ranks.tolist() == [rank], (f.fn, f.ranks)

    # the same patterns as a bundle, through `collscope analyze`
    empty = tables.BundleBuilder(models.Job(world_size=WORLD), source="probe").build()
    bundle = writer.write(empty, tmp_path / "bundle", extra_files={"functions.jsonl": got.lines()})
    capsys.readouterr()
    assert cli.main(["analyze", str(bundle), "--json"]) == cli.EXIT_OK
    d = json.loads(capsys.readouterr().out)
    assert d["anomaly"] and {c["rank"] for c in d["culprits"]} >= {1, 2, 3}
