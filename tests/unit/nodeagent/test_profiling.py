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
from collscope.nodeagent.hardware import source
from collscope.probe.site import collscope_probe as cp

NODE = "node-1"


class Hw:
    def __init__(
        self,
        records: list[tuple[int, str, str, float]] | None = None,
        down: dict[str, str] | None = None,
    ) -> None:
        self.calls: list[tuple[int, int]] = []
        self.records = records  # (ts, device, metric, value); None: four "util" at the end
        self.down = down or {}

    def window(self, since_ns: int, until_ns: int) -> list[models.HwRecord]:
        self.calls.append((since_ns, until_ns))
        rows = (
            self.records
            if self.records is not None
            else [
                (until_ns, d, "util", v)
                for d, v in (("gpu0", 0.5), ("gpu0", 0.7), ("gpu1", 0.1), ("mlx5_0/1", 0.2))
            ]
        )
        return [
            models.HwRecord(ts=ts, rank=0, node=NODE, device=d, metric=m, value=v)
            for ts, d, m, v in rows
            if since_ns <= ts <= until_ns
        ]

    def statuses(self) -> list[source.SourceStatus]:
        return [
            source.SourceStatus(name=n, available=False, reason=w) for n, w in self.down.items()
        ]


def fake(dirs: dict[int, Path], pids: dict[int, int], clock: list[int], hw: Any = None) -> Any:
    rings = [
        SimpleNamespace(path=str(d / f"rank{r}.ring"), health="live", pod_uid=f"uid{r}",
                        identity=SimpleNamespace(rank=r, pid=pids[r]))
        for r, d in dirs.items()
    ]  # fmt: skip
    job = models.Job(world_size=2, ranks=[models.RankInfo(rank=0, node=NODE, gpu=0, nic="mlx5_0"),
                                          models.RankInfo(rank=1, node=NODE, gpu=1)])  # fmt: skip
    return SimpleNamespace(
        node=NODE, sampler=SimpleNamespace(rings=lambda: rings), clock_ns=lambda: clock[0],
        hardware=Hw() if hw is None else hw, job=lambda: job,
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
    # the same window, and HOLD_NS before it for the readings that still hold at its start
    assert r0.start_ns is not None
    assert svc.hardware.calls == [(r0.start_ns - profiling.HOLD_NS, r0.end_ns)]
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


MS = 1_000_000
S = 1_000 * profiling.HOLD_NS  # the probe's window start


def done_doc(req: str, pid: int) -> dict[str, Any]:
    """A probe's output: the training thread in m.step, two GEMMs and one all-reduce."""
    src = {"state": "done", "names": ["gemm", "ncclDevKernel_AllReduce"], "dropped": 0,
           "ops": [[0, "kernel", S + 10 * MS, S + 20 * MS, 7],
                   [0, "kernel", S + 50 * MS, S + 60 * MS, 7],
                   [1, "comm", S + 70 * MS, S + 80 * MS, 8]]}  # fmt: skip
    return {"id": req, "pid": pid, "state": "done", "start_ns": S, "end_ns": S + 100 * MS,
            "stacks": ["m.step"], "samples": [[S + i * 10 * MS, 0, 1.0] for i in range(1, 11)],
            "torch": src}  # fmt: skip


def profiled(tmp_path: Path, hw: Hw) -> dict[int, api.RankProfile]:
    d0, d1 = tmp_path / "pod0", tmp_path / "pod1"
    d0.mkdir()
    d1.mkdir()
    svc = fake({0: d0, 1: d1}, {0: 41, 1: 42}, [S], hw)
    profiling.arm(svc, api.ProfileRequest(id="d-hw", window_s=0.1))
    for d, pid in ((d0, 41), (d1, 42)):
        (d / f"probe.{pid}.json").write_text(json.dumps(done_doc("d-hw", pid)))
    return {r.rank: r for r in profiling.report(svc, "d-hw").ranks}


def test_kernels_on_a_gpu_at_half_clock_have_half_the_mu_of_a_peer(tmp_path: Path) -> None:
    before, inside = S - 500 * MS, S + 40 * MS  # a reading before the window holds into it
    rows = [
        (ts, d, m, v)
        for ts in (before, inside)
        for d, m, v in (
            ("gpu0", "sm_clock_mhz", 705.0),  # rank 0's GPU, power-capped to half
            ("gpu0", "sm_clock_max_mhz", 1410.0),
            ("gpu1", "sm_clock_mhz", 1410.0),  # rank 1's, at full clock (its records say rank 0)
            ("gpu1", "sm_clock_max_mhz", 1410.0),
            ("gpu2", "sm_clock_mhz", 100.0),  # no rank of this job's
            ("gpu2", "sm_clock_max_mhz", 1410.0),
            ("mlx5_0/1", "nic_tx_bytes_per_second", 12.5e9),  # 100 Gb/s
            ("mlx5_0/1", "nic_link_speed_gbps", 400.0),
        )
    ]
    got = profiled(tmp_path, Hw(rows))
    p0 = {p.fn: p for p in got[0].patterns}
    p1 = {p.fn: p for p in got[1].patterns}
    assert p0["gemm"].mu == pytest.approx(0.5) and p0["gemm"].sigma == 0.0
    assert p1["gemm"].mu == pytest.approx(1.0)
    assert p0["ncclDevKernel_AllReduce"].mu == pytest.approx(0.25)
    assert got[0].reason == ""
    # rank 1 has no NIC in the device map: its all-reduce keeps 0 and its report says why
    assert p1["ncclDevKernel_AllReduce"].mu == 0.0
    assert got[1].reason == "comm mu, sigma = 0: the rank's NIC is unknown"
    # the resources reported are still the window's own (not the held reading before it)
    gpu0 = {u.metric: u for u in got[0].resources if u.device == "gpu0"}
    assert gpu0["sm_clock_mhz"].samples == 1


def test_no_gpu_samples_leave_mu_0_and_say_why(tmp_path: Path) -> None:
    hw = Hw([], down={"nvml": "NVML unavailable: libnvidia-ml.so.1 not found"})
    got = profiled(tmp_path, hw)
    for rank in (0, 1):
        pats = {p.fn: p for p in got[rank].patterns}
        assert pats["gemm"].mu == 0.0 and pats["gemm"].sigma == 0.0
        assert pats["gemm"].beta == pytest.approx(0.2)  # β does not need the hardware
    assert got[0].reason == (
        "comm mu, sigma = 0: no record of the rank's NIC; kernel mu, sigma = 0: no sm_clock_mhz "
        "record of gpu0 in the window (nvml: NVML unavailable: libnvidia-ml.so.1 not found)"
    )


def test_no_hardware_sampler(tmp_path: Path) -> None:
    d0 = tmp_path / "pod0"
    d0.mkdir()
    svc = fake({0: d0}, {0: 41}, [S])
    svc.hardware = None
    profiling.arm(svc, api.ProfileRequest(id="d-hw", window_s=0.1))
    (d0 / "probe.41.json").write_text(json.dumps(done_doc("d-hw", 41)))
    (r,) = profiling.report(svc, "d-hw").ranks
    assert r.state == "done" and r.resources == []
    assert "kernel mu, sigma = 0: no hardware sampler on this agent" in r.reason


def hw(ts: int, device: str, metric: str, value: float, rank: int = 0) -> models.HwRecord:
    return models.HwRecord(ts=ts, rank=rank, node=NODE, device=device, metric=metric, value=value)


def test_hw_samples_join_by_device_and_sum_a_nics_ports() -> None:
    recs = [
        hw(10, "gpu3", "sm_clock_mhz", 1500.0),  # above the max (boost): clipped to 1
        hw(10, "gpu3", "sm_clock_max_mhz", 1410.0),
        hw(20, "gpu3", "sm_clock_mhz", 705.0),
        hw(10, "gpu1", "sm_clock_mhz", 100.0, rank=5),  # the same rank, another GPU: not read
        hw(10, "mlx5_0/1", "nic_tx_bytes_per_second", 25e9),  # 200 Gb/s of 400
        hw(10, "mlx5_0/1", "nic_link_speed_gbps", 400.0),
        hw(10, "mlx5_0/2", "nic_tx_bytes_per_second", 0.0),  # the other port idle
        hw(10, "mlx5_0/2", "nic_link_speed_gbps", 400.0),
    ]
    got, missing = profiling.hw_samples(recs, gpu="gpu3", nics=["mlx5_0/1", "mlx5_0/2"])
    assert missing == {}
    assert list(got["sm"].ts_ns) == [10, 20] and list(got["sm"].value) == [1.0, 0.5]
    assert list(got["nic"].value) == [0.25]
    assert got["sm"].hold_ns == profiling.HOLD_NS


def test_hw_samples_say_which_record_is_missing() -> None:
    got, missing = profiling.hw_samples(
        [hw(10, "gpu0", "sm_clock_mhz", 705.0), hw(10, "eth0", "nic_tx_bytes_per_second", 1e9)],
        gpu="gpu0",
        nics=["eth0"],
        down={"netlink": "no namespace 1234"},
    )
    assert got == {}
    assert missing == {
        "sm": "no sm_clock_max_mhz record of gpu0 in the window",
        "nic": "no nic_link_speed_gbps record of eth0 in the window (netlink: no namespace 1234)",
    }
    got, missing = profiling.hw_samples(
        [hw(10, "gpu0", "sm_clock_mhz", 705.0)], gpu=None, nics=[], nic_known=False,
        unresolved="gpu: no NVML; nic: no RDMA device",
    )  # fmt: skip
    assert got == {}
    assert missing["sm"] == "the rank's GPU is unknown (gpu: no NVML; nic: no RDMA device)"
    assert missing["nic"] == "the rank's NIC is unknown (gpu: no NVML; nic: no RDMA device)"
