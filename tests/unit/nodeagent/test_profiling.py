"""The agent's profiling on demand: arm files per trace directory, and the report of each rank
(done with β/μ/sigma and its GPU/NIC use, pending, failed, no probe), with the real probe."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from collscope.nodeagent import api, errors, profiling
from collscope.nodeagent.bundle import models
from collscope.probe.site import collscope_probe as cp

NODE = "node-1"


class Hw:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def window(self, since_ns: int, until_ns: int) -> list[models.HwRecord]:
        self.calls.append((since_ns, until_ns))
        return [
            models.HwRecord(ts=since_ns, rank=0, node=NODE, device=d, metric="util", value=v)
            for d, v in (("gpu0", 0.5), ("gpu0", 0.7), ("gpu1", 0.1), ("mlx5_0/1", 0.2))
        ]


def fake(dirs: dict[int, Path], pids: dict[int, int], clock: list[int]) -> Any:
    rings = [
        SimpleNamespace(path=str(d / f"rank{r}.ring"), health="live", pod_uid=f"uid{r}",
                        identity=SimpleNamespace(rank=r, pid=pids[r]))
        for r, d in dirs.items()
    ]  # fmt: skip
    job = models.Job(world_size=2, ranks=[models.RankInfo(rank=0, node=NODE, gpu=0, nic="mlx5_0"),
                                          models.RankInfo(rank=1, node=NODE, gpu=1)])  # fmt: skip
    return SimpleNamespace(
        node=NODE, sampler=SimpleNamespace(rings=lambda: rings), clock_ns=lambda: clock[0],
        hardware=Hw(), job=lambda: job,
    )  # fmt: skip


def load_batch(stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(0.004)


def test_arm_report_done_and_no_probe(tmp_path: Path) -> None:
    d0, d1 = tmp_path / "pod0", tmp_path / "pod1"
    d0.mkdir()
    d1.mkdir()
    clock = [time.time_ns()]
    svc = fake({0: d0, 1: d1}, {0: os.getpid(), 1: 999_999}, clock)
    armed = profiling.arm(svc, api.ProfileRequest(id="d-1", window_s=0.5, hz=200, grace_s=1))
    assert armed.ranks == [0, 1] and armed.deadline_ns == clock[0] + int(1.5e9)
    doc = json.loads((d0 / cp.ARM_FILE).read_text())
    assert doc["id"] == "d-1" and doc["ranks"] == [0, 1]
    rep = profiling.report(svc, "d-1")
    assert [(r.rank, r.state) for r in rep.ranks] == [(0, "pending"), (1, "pending")]

    stop = threading.Event()
    t = threading.Thread(target=load_batch, args=(stop,), daemon=True)
    t.start()
    try:
        assert cp.Probe(str(d0), 0, main_ident=t.ident).check() == "d-1"
    finally:
        stop.set()
    clock[0] = armed.deadline_ns  # rank 1's process never answered: reported, not guessed
    rep = profiling.report(svc, "d-1")
    r0, r1 = rep.ranks
    assert r1.state == "no probe" and "deadline" in r1.reason
    assert r0.state == "done" and r0.samples > 10 and r0.pid == os.getpid()
    top = r0.patterns[0]
    assert top.fn.endswith("load_batch") and top.kind == "python" and top.rank == 0
    assert top.beta > 0.8 and top.mu < 0.3 and top.window_ns > 0.3e9
    assert {(u.device, u.metric) for u in r0.resources} == {("gpu0", "util"), ("mlx5_0/1", "util")}
    gpu = next(u for u in r0.resources if u.device == "gpu0")
    assert gpu.mean == pytest.approx(0.6) and gpu.max == 0.7 and gpu.samples == 2
    assert svc.hardware.calls == [(r0.start_ns, r0.end_ns)]  # the same window
    assert profiling.report(svc, "other").ranks == []


def test_a_failed_probe_is_reported_with_its_reason(tmp_path: Path) -> None:
    svc = fake({0: tmp_path}, {0: 41}, [time.time_ns()])
    profiling.arm(svc, api.ProfileRequest(id="d-2", ranks=[0]))
    (tmp_path / "probe.41.json").write_text(
        json.dumps({"id": "d-2", "pid": 41, "state": "failed", "reason": "CUPTI held"})
    )
    (r,) = profiling.report(svc, "d-2").ranks
    assert (r.state, r.reason) == ("failed", "CUPTI held")


def test_unknown_ranks_are_refused(tmp_path: Path) -> None:
    svc = fake({0: tmp_path}, {0: 41}, [time.time_ns()])
    with pytest.raises(errors.QueryError, match=r"rank\(s\) \[7\]"):
        profiling.arm(svc, api.ProfileRequest(id="d-3", ranks=[0, 7]))


def test_patterns_from_samples() -> None:
    ms = 1_000_000
    doc = {"start_ns": 0, "end_ns": 100 * ms, "stacks": ["m.step", "m.load"],
           "samples": [[i * 10 * ms, 0 if i <= 3 else 1, 1.0 if i <= 3 else 0.0]
                       for i in range(1, 11)]}  # fmt: skip
    pats = {p.fn: p for p in profiling.patterns(doc, 4)}
    assert pats["m.load"].beta == pytest.approx(0.7) and pats["m.load"].mu == 0.0
    assert pats["m.step"].beta == pytest.approx(0.3) and pats["m.step"].mu == 1.0


def test_torch_ops_outrank_python_on_the_critical_path() -> None:
    ms = 1_000_000
    src: dict[str, Any] = {
        "state": "done", "names": ["Memcpy HtoD", "ncclDevKernel_AllReduce"],
        "ops": [[0, "memory", 0, 20 * ms, 7], [1, "comm", 50 * ms, 60 * ms, 8]], "dropped": 0,
    }  # fmt: skip
    doc = {"start_ns": 0, "end_ns": 100 * ms, "stacks": ["m.step"],
           "samples": [[i * 10 * ms, 0, 1.0] for i in range(1, 11)], "torch": src}  # fmt: skip
    pats = {p.fn: p for p in profiling.patterns(doc, 4)}
    assert pats["Memcpy HtoD"].kind == "memory" and pats["Memcpy HtoD"].beta == pytest.approx(0.2)
    assert pats["ncclDevKernel_AllReduce"].kind == "comm"
    assert pats["m.step"].beta == pytest.approx(0.7) and pats["m.step"].kind == "python"
    off = dict(doc, torch={"state": "off", "reason": "no CUDA in this process"})
    assert {p.fn for p in profiling.patterns(off, 4)} == {"m.step"}
    bad = dict(doc, torch=dict(src, ops=[[0, "python", 0, 1, 1]]))
    with pytest.raises(ValueError, match="kind 'python'"):
        profiling.patterns(bad, 4)
