"""The probe's optional torch source (``collscope_probe.TorchSource``): torch's profiler over
the armed window when the training process has imported torch. CPU operators stand in for
CUDA kernels here (the CPU wheel records no kernels); failures turn the source off with one log
line while the stack sampling goes on, and the profiler is off after every window."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from collscope.probe.site import collscope_probe as cp

torch = pytest.importorskip("torch")


def _arm(d: Path, ident: str = "t1", window_s: float = 0.4) -> None:
    doc = {"id": ident, "window_s": window_s, "deadline_ns": time.time_ns() + 30 * 10**9,
           "hz": 100}  # fmt: skip
    (d / "probe.arm.tmp").write_text(json.dumps(doc))
    os.replace(d / "probe.arm.tmp", d / cp.ARM_FILE)


def copying(stop: threading.Event) -> None:
    """A training thread whose time goes to host copies (EROICA's memory kind)."""
    x = torch.randn(256, 256)
    while not stop.is_set():
        x.to(torch.float64)


class CpuProbe(cp.Probe):
    def torch_source(self) -> cp.TorchSource:
        return cp.TorchSource(torch, cpu=True)


class FakeAutograd:
    def _profiler_enabled(self) -> bool:
        return False

    def _prepare_profiler(self, *a: Any) -> None:
        raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")


class HeldProbe(cp.Probe):
    def torch_source(self) -> cp.TorchSource:
        fake = type("T", (), {"_C": type("C", (), {"_autograd": FakeAutograd(),
                                                   "_profiler": torch._C._profiler})})  # fmt: skip
        return cp.TorchSource(fake, cpu=True)


def _run(p: cp.Probe, d: Path) -> dict[str, Any]:
    _arm(d)
    assert p.check() == "t1"
    assert not p.armed
    out: dict[str, Any] = json.loads((d / f"probe.{os.getpid()}.json").read_text())
    return out


def test_memory_operators_of_the_training_thread_are_recorded_then_the_profiler_is_off(
    tmp_path: Path,
) -> None:
    stop = threading.Event()
    t = threading.Thread(target=copying, args=(stop,), daemon=True)
    t.start()
    try:
        out = _run(CpuProbe(str(tmp_path), 2, main_ident=t.ident), tmp_path)
    finally:
        stop.set()
        t.join()
    assert out["state"] == "done" and out["samples"]
    src = out["torch"]
    assert src["state"] == "done" and src["ops"] and src["dropped"] == 0
    names = {src["names"][i] for i, *_ in src["ops"]}
    assert names <= {"aten::to", "aten::_to_copy", "aten::copy_"} and "aten::copy_" in names
    assert {k for _, k, *_ in src["ops"]} == {"memory"}
    first, last = min(o[2] for o in src["ops"]), max(o[3] for o in src["ops"])
    assert out["start_ns"] <= first and last <= out["end_ns"] + 10**8  # the same clock
    assert not torch._C._autograd._profiler_enabled()  # removed what it installed
    assert not (tmp_path / f"probe.{os.getpid()}.log").exists()


def test_without_cuda_the_source_stays_off(tmp_path: Path) -> None:
    out = _run(cp.Probe(str(tmp_path), 0), tmp_path)  # torch is imported; this wheel has no CUDA
    assert out["state"] == "done"
    assert out["torch"] == {"state": "off", "reason": "no CUDA in this process"}
    assert cp.TorchSource(None).start() == {"state": "off", "reason": "torch not imported"}


def test_a_source_that_cannot_start_is_reported_and_logged_once(tmp_path: Path) -> None:
    out = _run(HeldProbe(str(tmp_path), 1), tmp_path)
    assert out["state"] == "done" and out["samples"]  # the stacks were still sampled
    assert out["torch"]["state"] == "failed" and "MULTIPLE_SUBSCRIBERS" in out["torch"]["reason"]
    log = (tmp_path / f"probe.{os.getpid()}.log").read_text().splitlines()
    assert len(log) == 1 and "torch profiler off (t1)" in log[0]


def test_a_profiler_the_user_runs_is_left_alone(tmp_path: Path) -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        out = _run(CpuProbe(str(tmp_path), 0), tmp_path)
        assert torch._C._autograd._profiler_enabled()  # still the user's
    assert out["torch"]["state"] == "failed" and "another torch profiler" in out["torch"]["reason"]
