"""The whole data path, end to end: rank processes through the real plugin, real rings, real
agents, the real operator (kopf) against kmock.

Each scenario starts the 8-rank job healthy, arms its fault ``HEALTHY_S`` later (the trigger's
baselines need a few healthy ticks first) and waits for the Diagnosis the operator creates,
analyses and remediates. Remediation runs with the shipped policy: hardware categories above
confidence 0.7 cordon the culprit node, software and host categories never do.
"""

from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

pytest.importorskip("kmock")
pytest.importorskip("pytest_asyncio")

from collscope.operator.domain import policy
from collscope.operator.onebox import faults

# kmock 0.8's load_bundled() uses importlib.resources.read_binary, deprecated in Python 3.11.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning"),
]
E2E = Any  # conftest.E2E: conftest modules cannot be imported under --import-mode=importlib

# Healthy training before the fault. A hang needs only the stall threshold's floor (1.5 s) and
# the operator's discovery tick; a slowdown needs TriggerSettings.normal_min_ticks (3) healthy
# ticks, CCL-D's 3 s Tbase span and the engine's 4 s slow_baseline_s inside the pulled window.
HEALTHY_S = {"hang": 3.0, "slow": 5.0}
# From onset to Diagnosed + remediation: hangs ~2 s (1.5 s stall threshold), slowdowns ~5 s
# (three consecutive slow ticks), evidence collection (py-spy, Flight Recorder) <= 2 s more.
DIAGNOSED_S = 25.0
# Seed 7 puts every single-rank fault on rank 5 of node-1 (faults.choose).
SEED = 7


def _inject(e2e: E2E, kind: str | None) -> faults.Injection | None:
    inj = None
    if kind is not None:
        inj = faults.choose(
            kind, seed=SEED, ranks_by_node=e2e.box.layout.ranks_by_node(), onset_s=0.0
        )
    e2e.box.start(inj)
    e2e.box.arm(time.time() + _healthy_s(kind))
    return inj


def _healthy_s(kind: str | None) -> float:
    return HEALTHY_S["hang" if kind is None or kind in faults.HANGS else "slow"]


# The shipped policy's confidence threshold: below it a hardware verdict is a suspect.
THRESHOLD = policy.RemediationPolicy().confidence_threshold
# fault -> may cordon? (policy: hardware categories only, and only above THRESHOLD)
FAMILIES = {
    "nic-down": True,  # hang.network (CCL-D H3, network)
    "gpu-hang": True,  # hang.gpu (CCL-D H3, GPU)
    "not-entered": False,  # hang.not_entered (CCL-D H1): software, never cordons
    "inconsistent": False,  # hang.inconsistent (CCL-D H2): software
    "gpu-power-limit": True,  # slow.compute (Mycroft #4): a late-starting straggler
    "proxy-delay": False,  # slow.host (Mycroft #7): bursty proxy stalls
    "process-killed": False,  # hang.process: the rank SIGKILLs itself mid-AllReduce
    "process-frozen": False,  # hang.process: the rank SIGSTOPs itself mid-AllReduce
}


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", sorted(FAMILIES))
@pytest.mark.timeout(90)
async def test_fault_family_gives_its_diagnosis(e2e: E2E, kind: str) -> None:
    inj = _inject(e2e, kind)
    assert inj is not None
    e2e.cluster()
    async with e2e.operator():
        done = await e2e.harness.until(e2e.finished, timeout_s=_healthy_s(kind) + DIAGNOSED_S)
        st = done["status"]
        assert st.get("category") == faults.expected_category(kind), st
        assert st["culpritRank"] in inj.ranks and st["culpritNode"] == inj.node, st["result"]
        cordoned = bool(e2e.node(inj.node)["spec"].get("unschedulable"))
        # A two-sided network verdict's confidence depends on where the chunk stopped (0.5 to
        # 0.75 here): the policy decides, and so does this check.
        expected = FAMILIES[kind] and float(st["result"]["confidence"]) >= THRESHOLD
        assert cordoned is expected, (st["actions"], st["result"])
        assert st["phase"] == ("Remediated" if expected else "Diagnosed")
        other = "node-0" if inj.node == "node-1" else "node-1"
        assert not e2e.node(other)["spec"].get("unschedulable")
        assert len(e2e.diagnoses()) == 1


# No fault, no Diagnosis: the "several minutes of simulated training". At ~15
# AllReduces per rank per second that is ~2,700 operations per rank and 180 operator ticks,
# many times every trigger window (hang threshold 1.5 s, slow streak of 3 ticks, episode 8 s).
HEALTHY_RUN_S = 180.0
CHECK_EVERY_S = 30.0


@pytest.mark.asyncio
@pytest.mark.timeout(HEALTHY_RUN_S + 60)
async def test_healthy_run_opens_no_diagnosis(e2e: E2E) -> None:
    _inject(e2e, None)
    e2e.cluster()
    async with e2e.operator() as memo:
        await e2e.harness.until(lambda: e2e.tj_status().get("health") == "Healthy", 15)
        for _ in range(round(HEALTHY_RUN_S / CHECK_EVERY_S)):
            await asyncio.sleep(CHECK_EVERY_S)
            assert e2e.diagnoses() == []
            # the job really trains all along: every rank keeps completing AllReduces
            recent = await _completed(e2e, window_s=10.0)
            assert sorted(recent) == list(range(8)) and min(recent.values()) >= 50, recent
        assert memo.metrics.value("collscope_operator_triggers_total", {"kind": "hang"}) == 0
        assert memo.metrics.value("collscope_operator_triggers_total", {"kind": "slow"}) == 0
        st = e2e.tj_status()
        assert st["health"] == "Healthy" and st["rankCount"] == 8


async def _completed(e2e: E2E, window_s: float) -> dict[int, int]:
    """rank -> AllReduces it completed in the last ``window_s``, as its agent reports."""
    out: dict[int, int] = {}
    async with httpx.AsyncClient(timeout=2.0) as client:
        for node, ranks in e2e.box.layout.ranks_by_node().items():
            url = f"{e2e.box.agent_url(node)}/v1/summaries"
            q = {"ranks": ",".join(map(str, ranks)), "window_s": str(window_s)}
            got = await client.get(url, params=q)
            assert got.status_code == 200, got.text
            for summary in got.json()["summaries"]:
                out[int(summary["rank"])] = int(summary["completed_ops"])
    return out


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_agent_killed_and_restarted_mid_run(e2e: E2E) -> None:
    inj = faults.choose(
        "nic-down", seed=SEED, ranks_by_node=e2e.box.layout.ranks_by_node(), onset_s=0.0
    )
    e2e.box.start(inj)  # not armed yet: healthy until the agent is back
    e2e.cluster()
    async with e2e.operator():
        await e2e.harness.until(lambda: e2e.tj_status().get("health") == "Healthy", 15)
        e2e.box.stop_agent("node-1")

        def reported() -> bool:
            conds = {c["type"]: c for c in e2e.tj_status().get("conditions", [])}
            c = conds.get("AgentsReachable", {})
            return c.get("status") == "False" and "node-1" in c.get("message", "")

        await e2e.harness.until(reported, 10)
        assert e2e.diagnoses() == []  # an unreachable agent is no fault of the job
        e2e.box.start_agent("node-1")

        def back() -> bool:
            conds = {c["type"]: c for c in e2e.tj_status().get("conditions", [])}
            return bool(conds.get("AgentsReachable", {}).get("status") == "True")

        await e2e.harness.until(back, 20)
        # The restarted agent reads the rings again from the start: a fault now is still
        # diagnosed to the right rank (it rebuilt its window from the live rings).
        e2e.box.arm(time.time())
        done = await e2e.harness.until(e2e.finished, timeout_s=DIAGNOSED_S)
        st = done["status"]
        assert st["category"] == "hang.network" and st["culpritRank"] in inj.ranks


async def _process_stopped_from_outside(e2e: E2E, stop: str) -> dict[str, Any]:
    """Train healthy, then ``stop`` (``kill``: SIGKILL and reap; ``freeze``: SIGSTOP) rank 5
    from outside, mid-AllReduce; the finished Diagnosis."""
    e2e.box.start(None)
    e2e.cluster()
    async with e2e.operator():
        await e2e.harness.until(lambda: e2e.tj_status().get("health") == "Healthy", 15)
        await asyncio.sleep(2.0)  # a few healthy ticks: baselines
        if stop == "kill":
            e2e.box.kill_rank(5)  # no finalize: the ring stays as it was, /proc/<pid> goes
        else:
            e2e.box.freeze_rank(5)  # alive, every thread stopped (heartbeat included)
        done = await e2e.harness.until(e2e.finished, timeout_s=DIAGNOSED_S)
    return dict(done)


def _no_cordon(e2e: E2E, st: dict[str, Any]) -> None:
    assert st["phase"] == "Diagnosed", st.get("actions")
    for node in e2e.box.layout.node_names():
        assert not e2e.node(node)["spec"].get("unschedulable"), (node, st.get("actions"))
    assert len(e2e.diagnoses()) == 1


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_killed_training_process_last_state_is_read(e2e: E2E) -> None:
    """Issue 12: a SIGKILLed rank is not a network fault (it was hang.network, cordoning a
    healthy node, in 1 of 2 runs): its process is gone, its heartbeat stopped, its peers beat."""
    st = (await _process_stopped_from_outside(e2e, "kill"))["status"]
    assert st["category"] == "hang.process", st["result"]
    assert st["culpritRank"] == 5 and st["culpritNode"] == "node-1", st["result"]
    top = st["result"]["culprits"][0]
    assert (top["rank"], top["component"]) == (5, "host")
    assert [c["rank"] for c in st["result"]["culprits"]] == [5]
    # GPU 1: the one-box agents map rank 5 to its simulated GPU (onebox/hardware.py)
    evidence = st["result"]["evidence"]
    assert any("rank 5 (node-1, GPU 1): its process is gone" in e for e in evidence)
    _no_cordon(e2e, st)


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_frozen_training_process_is_a_process_hang(e2e: E2E) -> None:
    st = (await _process_stopped_from_outside(e2e, "freeze"))["status"]
    assert st["category"] == "hang.process", st["result"]
    assert st["culpritRank"] == 5 and st["culpritNode"] == "node-1", st["result"]
    assert [c["rank"] for c in st["result"]["culprits"]] == [5]
    # GPU 1: the one-box agents map rank 5 to its simulated GPU (onebox/hardware.py)
    evidence = st["result"]["evidence"]
    assert any("rank 5 (node-1, GPU 1): its process is stopped" in e for e in evidence)
    _no_cordon(e2e, st)


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_lost_node_is_a_node_hang(e2e: E2E) -> None:
    """Node 1 goes (power, kernel): its agent stops answering and its four ranks die."""
    e2e.box.start(None)
    e2e.cluster()
    async with e2e.operator():
        await e2e.harness.until(lambda: e2e.tj_status().get("health") == "Healthy", 15)
        await asyncio.sleep(2.0)
        e2e.box.stop_agent("node-1")
        for r in e2e.box.layout.ranks_by_node()["node-1"]:
            e2e.box.kill_rank(r)
        done = await e2e.harness.until(e2e.finished, timeout_s=DIAGNOSED_S)
        st = done["status"]
        assert st["category"] == "hang.node", st["result"]
        assert st["culpritNode"] == "node-1" and st["culpritRank"] == 4, st["result"]
        assert [c["rank"] for c in st["result"]["culprits"]] == [4, 5, 6, 7]
        assert st["result"]["precision"] == "node"
        _no_cordon(e2e, st)


@pytest.mark.timeout(60)
def test_demo_command(plugin: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """What CI runs: `collscope demo --seed 7 --fault nic-down --out DIR` exits 0 (diagnosis
    matches the injection) and writes the bundle and a self-contained HTML report."""
    import os
    import xml.etree.ElementTree as ET

    out = tmp_path / "bundle"
    res = subprocess.run(
        [sys.executable, "-m", "collscope.operator.cli", "demo", "--seed", "7", "--fault",
         "nic-down", "--out", str(out)],
        capture_output=True, text=True, timeout=55, check=False,
        env={**os.environ, "COLLSCOPE_PLUGIN": str(plugin)},
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert "hang.network" in res.stdout and "CORRECT" in res.stdout
    page = (tmp_path / "bundle-report.html").read_text()
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")  # no assets
    for svg in page.split("<svg")[1:]:
        ET.fromstring("<svg" + svg.split("</svg>")[0] + "</svg>")  # well-formed
    assert (out / "job.json").is_file() and (out / "truth.json").is_file()


def test_missing_plugin_says_how_to_build_it(tmp_path: pathlib.Path) -> None:
    import os

    res = subprocess.run(
        [sys.executable, "-m", "collscope.operator.cli", "demo", "--fault", "nic-down"],
        capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, "COLLSCOPE_PLUGIN": str(tmp_path / "nope.so")},
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"collscope demo: error: COLLSCOPE_PLUGIN={tmp_path / 'nope.so'}: no such file"
    ]


def test_occupied_out_is_refused_before_the_run(
    plugin: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    import os

    (tmp_path / "mine.txt").write_text("keep")
    res = subprocess.run(
        [sys.executable, "-m", "collscope.operator.cli", "demo", "--fault", "nic-down",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, "COLLSCOPE_PLUGIN": str(plugin)},
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert "exists and is neither empty nor a bundle directory" in res.stderr
    assert "trigger tick" not in res.stdout  # nothing was started
    assert (tmp_path / "mine.txt").read_text() == "keep"
