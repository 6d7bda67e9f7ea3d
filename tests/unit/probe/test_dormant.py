"""The dormant probe (``site/collscope_probe.py``): armed by a file, bounded by its window and
deadline, disarmed on error with one log line, off when opted out, and live in a real Python
started with the site directory on ``PYTHONPATH``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from collscope.probe.site import collscope_probe as cp

SITE = Path(cp.__file__).resolve().parent


def slow_loader(stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(0.005)


def busy(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def _arm(d: Path, ident: str = "p1", window_s: float = 0.4, deadline_s: float = 30.0) -> None:
    doc = {"id": ident, "window_s": window_s, "deadline_ns": time.time_ns() + int(deadline_s * 1e9),
           "hz": 200}  # fmt: skip
    tmp = d / "probe.arm.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, d / cp.ARM_FILE)


def _worker(target: Any) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    t = threading.Thread(target=target, args=(stop,), daemon=True)
    t.start()
    return t, stop


def test_dormant_until_armed_then_samples_the_main_thread(tmp_path: Path) -> None:
    t, stop = _worker(busy)
    s, stop_sleeper = _worker(slow_loader)
    assert t.ident is not None and s.ident is not None
    # The kernel's CPU time of the busy thread and of a sleeping one at each of the probe's
    # clock reads: what each really ran between two samples, whatever the machine's load.
    busy_cpu = time.pthread_getcpuclockid(t.ident)
    sleeper_cpu = time.pthread_getcpuclockid(s.ident)
    reads: dict[int, tuple[int, int]] = {}

    def clock_ns() -> int:
        now = time.time_ns()
        reads[now] = (time.clock_gettime_ns(busy_cpu), time.clock_gettime_ns(sleeper_cpu))
        return now

    try:
        p = cp.Probe(str(tmp_path), 3, main_ident=t.ident, clock_ns=clock_ns)
        assert p.check() is None  # no arm file: nothing
        _arm(tmp_path)
        began = time.monotonic()
        assert p.check() == "p1"
        assert time.monotonic() - began < 2.0  # the window (0.4 s) bounds it
        assert not p.armed
        out = json.loads((tmp_path / f"probe.{os.getpid()}.json").read_text())
        assert out["state"] == "done" and out["rank"] == 3 and out["id"] == "p1"
        assert out["samples"] and out["end_ns"] > out["start_ns"]
        names = [out["stacks"][i] for _, i, _ in out["samples"] if i >= 0]
        assert sum("busy" in n for n in names) >= 0.8 * len(out["samples"])
        # A busy thread is busy: its utilisation is the CPU share it got over the window. On a
        # loaded machine that share is well below 1 (a fraction of a core, 0.12 on a 2-core CI
        # runner shared with other jobs), so it is compared with what the kernel counted for
        # the busy thread, and with a thread sleeping over the same window.
        ts = [now for now, _, _ in out["samples"]]
        first = max(r for r in reads if r < ts[0])  # the read the first sample is taken from
        wall = ts[-1] - first
        probed = sum(
            u * (b - a)
            for (_, _, u), a, b in zip(out["samples"], [first, *ts[:-1]], ts, strict=True)
        )
        busy_share = (reads[ts[-1]][0] - reads[first][0]) / wall
        sleeper_share = (reads[ts[-1]][1] - reads[first][1]) / wall
        assert busy_share > 3 * sleeper_share  # the busy thread did run in the window
        assert abs(probed / wall - busy_share) < 0.02, (
            probed / wall,
            busy_share,
        )
        assert p.check() is None  # the same arm file is not taken twice
    finally:
        stop.set()
        stop_sleeper.set()


def test_a_sleeping_function_is_named_with_low_utilisation(tmp_path: Path) -> None:
    t, stop = _worker(slow_loader)
    try:
        p = cp.Probe(str(tmp_path), 0, main_ident=t.ident)
        _arm(tmp_path)
        p.check()
        out = json.loads((tmp_path / f"probe.{os.getpid()}.json").read_text())
        assert any(s.endswith("slow_loader") for s in out["stacks"])
        utils = [u for _, _, u in out["samples"]]
        assert sum(utils) / len(utils) < 0.3
    finally:
        stop.set()


def test_an_expired_deadline_does_not_arm(tmp_path: Path) -> None:
    p = cp.Probe(str(tmp_path), 0)
    _arm(tmp_path, deadline_s=-1.0)
    assert p.check() is None
    assert not (tmp_path / f"probe.{os.getpid()}.json").exists()


def test_the_deadline_cuts_the_window(tmp_path: Path) -> None:
    p = cp.Probe(str(tmp_path), 0)
    _arm(tmp_path, window_s=60.0, deadline_s=0.3)
    began = time.monotonic()
    assert p.check() == "p1"
    assert time.monotonic() - began < 2.0


class Broken(cp.Probe):
    def sample(self, end_ns: int, period_s: float) -> dict[str, Any]:
        raise RuntimeError("CUPTI is held by another profiler")


def test_a_failure_disarms_reports_and_logs_one_line(tmp_path: Path) -> None:
    p = Broken(str(tmp_path), 1)
    _arm(tmp_path)
    assert p.check() == "p1"
    assert not p.armed
    out = json.loads((tmp_path / f"probe.{os.getpid()}.json").read_text())
    assert out["state"] == "failed" and "CUPTI" in out["reason"]
    log = (tmp_path / f"probe.{os.getpid()}.log").read_text().splitlines()
    assert len(log) == 1 and "disarmed" in log[0]
    _arm(tmp_path, ident="p2")  # and it can be armed again
    assert p.check() == "p2"


def test_malformed_arm_files_are_ignored(tmp_path: Path) -> None:
    p = cp.Probe(str(tmp_path), 0)
    (tmp_path / cp.ARM_FILE).write_text("{not json")
    assert p.check() is None
    (tmp_path / cp.ARM_FILE).write_text(json.dumps({"id": "x"}))
    os.utime(tmp_path / cp.ARM_FILE, ns=(1, 1))
    assert p.check() is None


def test_opt_out_and_no_trace_dir_start_nothing(tmp_path: Path) -> None:
    for value in ("0", "off", "false"):
        assert not cp.start({"COLLSCOPE_PROBE": value, "COLLSCOPE_TRACE_DIR": str(tmp_path)})
    assert not cp.start({"COLLSCOPE_PROBE": "dormant"})


PROGRAM = """
import time
def load_batch():
    time.sleep(0.01)
end = time.time() + 6
while time.time() < end:
    load_batch()
print("trained")
"""


def test_sitecustomize_starts_it_in_a_plain_python(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.update(COLLSCOPE_TRACE_DIR=str(tmp_path), RANK="5", COLLSCOPE_PROBE="dormant")
    env["PYTHONPATH"] = str(SITE)  # only the site directory: no collscope package needed
    proc = subprocess.Popen(
        [sys.executable, "-S", "-c", f"import sitecustomize\n{PROGRAM}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    time.sleep(1.0)
    _arm(tmp_path, window_s=1.0)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.strip() == "trained", err
    doc = json.loads((tmp_path / f"probe.{proc.pid}.json").read_text())
    assert doc["state"] == "done" and doc["rank"] == 5
    assert any(s.endswith("__main__.load_batch") for s in doc["stacks"]), doc["stacks"]
