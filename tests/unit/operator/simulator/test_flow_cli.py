"""`collscope simulate --kind flows` and `collscope analyze` on flows-only and mixed bundles."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from collscope.nodeagent.bundle import writer
from collscope.operator.cli import exits
from collscope.operator.cli import main as cli
from collscope.operator.simulator import config
from collscope.operator.simulator import engine as collective_sim
from collscope.operator.simulator.flows import config as flow_config
from collscope.operator.simulator.flows import engine as flow_sim


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # a real subprocess: no traceback may reach the user's terminal
    return subprocess.run(
        [sys.executable, "-m", "collscope.operator.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_simulate_flows_then_analyze_json(tmp_path: Path) -> None:
    out = tmp_path / "fabric"
    res = _run(
        "simulate", "--kind", "flows", "--gpus", "128", "--duration", "60", "--onset", "30",
        "--flow-fault", "slow-job@train-01", "--seed", "4", "--out", str(out),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # no progress bar: stderr is not a terminal
    assert "slow-job on train-01" in res.stdout
    res = _run("analyze", str(out), "--json")
    assert res.returncode == 0, res.stderr
    diag = json.loads(res.stdout)
    assert diag["anomaly"] is True and diag["category"] == "slow.compute"
    assert diag["culprits"][0]["job"].startswith("job-") and diag["culprits"][0]["rank"] is None
    truth = json.loads((out / "truth.json").read_text())
    assert truth["faults"][0]["culprit"] == "train-01"


def test_analyze_flows_summary_names_the_switch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = flow_config.preset(
        128,
        seed=4,
        duration_s=60.0,
        faults=(flow_config.FlowFault("congested-switch", "leaf-01", 30.0),),
    )
    path = flow_sim.simulate(cfg).write(tmp_path / "b.tar.gz")
    assert cli.main(["analyze", str(path)]) == exits.OK
    out = capsys.readouterr().out
    assert "slow.network" in out and "switch leaf-01  component=link" in out


def test_mixed_bundle_lets_collectives_lead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    coll = collective_sim.simulate(
        config.SimConfig(ranks=16, tp=8, pp=1, dp=2, duration_s=4.0, onset_s=2.0)
    )
    flows = flow_sim.simulate(flow_config.preset(64, seed=1, duration_s=30.0))
    path = writer.write(coll.bundle, tmp_path / "mixed", net_flows=flows.net_flows())
    assert cli.main(["analyze", str(path), "--json"]) == exits.OK
    diag = json.loads(capsys.readouterr().out)
    assert diag["anomaly"] is False  # neither the healthy job nor the healthy fabric alarms
    assert any(e.startswith("flows: ") for e in diag["evidence"])
    assert not any(e.startswith("flows: ") for e in diag["evidence"][:1])


def test_flow_options_are_documented_and_checked(tmp_path: Path) -> None:
    text = _run("simulate", "--help").stdout
    for word in ("--kind", "--gpus", "--flow-fault", "congested-switch", "slow-group", "slow-job"):
        assert word in text
    res = _run("simulate", "--kind", "flows", "--flow-fault", "meltdown", "--out", str(tmp_path))
    assert res.returncode == exits.BAD_INPUT and "unknown flow fault" in res.stderr
    res = _run("simulate", "--kind", "flows", "--fault", "nic-down", "--out", str(tmp_path / "x"))
    assert res.returncode == exits.BAD_INPUT and "--flow-fault" in res.stderr
    assert "Traceback" not in res.stderr


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_simulate_flows_draws_progress_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    args = ["simulate", "--kind", "flows", "--gpus", "64", "--duration", "20", "--seed", "1"]
    assert cli.main([*args, "--out", str(tmp_path / "f")]) == 0
    sim, write, rest = err.getvalue().split("\n")  # each bar ends its line at 100 %
    assert sim.rsplit("\r", 1)[-1].startswith("simulating 64 GPUs [####################] 100%")
    last = write.rsplit("\r", 1)[-1]
    assert last.startswith("writing ") and "flows [####################] 100%" in last
    assert rest == ""


def test_flow_simulator_reports_jobs_then_flows(tmp_path: Path) -> None:
    cfg = flow_config.preset(64, seed=1, duration_s=20.0)
    ran: list[float] = []
    res = flow_sim.simulate(cfg, progress=ran.append)
    assert ran == [(k + 1) / len(cfg.jobs) for k in range(len(cfg.jobs))]
    written: list[float] = []
    res.write(tmp_path / "f", progress=written.append)
    assert written == sorted(written) and written[-1] == 1.0
