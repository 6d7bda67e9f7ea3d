"""Whether a ring's writer runs: ``/proc`` states (a tree under ``tmp_path``, and real child
processes), and the liveness records the service answers with."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from collscope.nodeagent import liveness, ring, sampler, service, settings, window
from collscope.nodeagent.ring import livestate

S = 1_000_000_000
BOOT_S = 1_700_000_000  # btime of the fake /proc: the machine booted then
TICKS = 100  # clock ticks per second of the fake /proc
RING_INIT = (BOOT_S + 500) * S  # the ring was created 500 s after boot


def proc(root: pathlib.Path, pid: int, state: str, *, nspid: str = "", start_s: int = 400) -> None:
    """``/proc/<pid>`` with ``stat`` (state, start time) and ``status`` (NSpid)."""
    d = root / str(pid)
    d.mkdir(parents=True)
    # comm with a space and a ")" in it: the fields are counted from the last ")"
    rest = " ".join(["1", str(pid), "1", "0", "-1"] + ["0"] * 13 + [str(start_s * TICKS), "0"])
    (d / "stat").write_text(f"{pid} (py thon) x) {state} {rest}\n")
    (d / "status").write_text(f"Name:\tpython\nPid:\t{pid}\nNSpid:\t{nspid or pid}\n")


@pytest.fixture
def root(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "stat").write_text(f"cpu  1 2 3\nbtime {BOOT_S}\nprocesses 9\n")
    return tmp_path


def state(root: pathlib.Path, pid: int, ns_pid: int | None = None) -> str:
    probe = liveness.ProcessProbe(root, clock_ticks=TICKS)
    return probe.state(pid, ns_pid=pid if ns_pid is None else ns_pid, ring_init_ns=RING_INIT)


@pytest.mark.parametrize(
    ("letter", "expected"),
    [("S", "running"), ("R", "running"), ("D", "running"), ("T", "stopped"),
     ("t", "stopped"), ("Z", "dead"), ("X", "dead")],
)  # fmt: skip
def test_proc_state_letters(root: pathlib.Path, letter: str, expected: str) -> None:
    proc(root, 4001, letter)
    assert state(root, 4001) == expected


def test_a_missing_or_recycled_pid_is_dead(root: pathlib.Path) -> None:
    assert state(root, 4001) == "dead"  # no /proc/4001
    proc(root, 4002, "S", nspid="4002 37")
    assert state(root, 4002, ns_pid=37) == "running"
    assert state(root, 4002, ns_pid=38) == "dead"  # another process of another container
    proc(root, 4003, "S", start_s=503)  # started 3 s after the ring was created
    assert state(root, 4003) == "dead"
    proc(root, 4004, "S", start_s=501)  # within btime's 1 s and the 2 s slack
    assert state(root, 4004) == "running"


def test_unreadable_proc_is_unknown(root: pathlib.Path) -> None:
    (root / "4005" / "stat").mkdir(parents=True)  # reading it fails, but not "no such file"
    assert state(root, 4005) == "unknown"
    (root / "4006").mkdir()
    (root / "4006" / "stat").write_text("garbage\n")
    assert state(root, 4006) == "unknown"


def test_without_btime_the_start_time_is_not_checked(tmp_path: pathlib.Path) -> None:
    proc(tmp_path, 4007, "T", start_s=10_000)
    assert state(tmp_path, 4007) == "stopped"


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    if p.poll() is None:
        p.kill()
    p.wait(10)


def _real(pid: int) -> str:
    return liveness.ProcessProbe().state(pid, ns_pid=pid, ring_init_ns=time.time_ns())


def test_real_processes_running_stopped_zombie_reaped(child: subprocess.Popen[bytes]) -> None:
    assert _real(os.getpid()) == "running"
    assert _real(child.pid) == "running"
    os.kill(child.pid, signal.SIGSTOP)
    assert _until(lambda: _real(child.pid) == "stopped")
    os.kill(child.pid, signal.SIGKILL)
    assert _until(lambda: _real(child.pid) == "dead")  # a zombie until reaped
    child.wait(10)
    assert _real(child.pid) == "dead"


def _until(cond: object, timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


# -- the service ---------------------------------------------------------------------------
def identity(rank: int, pid: int, init_ns: int) -> ring.Identity:
    return ring.Identity(
        path=f"/rings/r{rank}-{pid}.ring", pid=pid, rank=rank, local_rank=rank, world_size=4,
        hostname="h", pod_name=f"p{rank}", pod_namespace="ns", node_name="node-1",
        nccl_version="2.27.3", nccl_version_code=22703, plugin_version="0.1.0",
        activation_mask=0, init_ns=init_ns, coarse_res_ns=0, file_size=0, event_slots=64,
    )  # fmt: skip


def status(heartbeat_ns: int, *, comms_open: int = 1) -> livestate.Status:
    return livestate.Status(
        state="active" if comms_open else "idle", profiler_api=5, events_written=0,
        events_overwritten=0, events_dropped=0, comm_slots_exhausted=0,
        flow_slots_exhausted=0, op_slots_busy=0, handles_exhausted=0, pxn_foreign_events=0,
        stale_flow_events=0, heartbeat_ns=heartbeat_ns, heartbeat_count=9,
        comms_open=comms_open, comms_total=1,
    )  # fmt: skip


@dataclasses.dataclass
class Loop:
    """The part of ``sampler.Sampler`` the service reads."""

    tracked: list[sampler.Tracked]
    window: window.Window = dataclasses.field(
        default_factory=lambda: window.Window(window_s=30, memory_cap_bytes=1 << 20)
    )
    config: settings.SamplingSettings = dataclasses.field(default_factory=settings.SamplingSettings)

    def rings(self) -> list[sampler.Tracked]:
        return self.tracked


def track(
    rank: int, pid: int, init_ns: int, *, beat: int, seen: int, health: str
) -> sampler.Tracked:
    t = sampler.Tracked(f"/rings/r{rank}-{pid}.ring", None, health=health)
    t.identity, t.status, t.status_ns = identity(rank, pid, init_ns), status(beat), seen
    if health == "finalized":
        t.status = dataclasses.replace(t.status, comms_open=0)
    return t


def test_service_answers_one_record_per_rank_from_its_newest_ring(root: pathlib.Path) -> None:
    now = (BOOT_S + 900) * S
    proc(root, 11, "S")
    proc(root, 12, "T")
    proc(root, 14, "S")
    # rank 0: no /proc/10, killed; rank 3: its first process (13) closed its communicators
    # and left, its newer ring's process (14) still runs after closing its own.
    rings = [
        track(0, 10, RING_INIT, beat=now - 3 * S, seen=now, health="stale"),
        track(1, 11, RING_INIT, beat=now - S // 10, seen=now, health="live"),
        track(2, 12, RING_INIT, beat=now - 4 * S, seen=now, health="stale"),
        track(3, 13, RING_INIT, beat=now - 9 * S, seen=now, health="finalized"),
        track(3, 14, RING_INIT + S, beat=now - 8 * S, seen=now, health="finalized"),
    ]
    svc = service.Service(
        "node-1",
        Loop(rings),  # type: ignore[arg-type]
        host_pid=lambda pid, _uid: pid,
        probe=liveness.ProcessProbe(root, clock_ticks=TICKS),
        clock_ns=lambda: now,
    )
    got = [(r.rank, r.state, r.heartbeat, r.ts) for r in svc.liveness_of(None)]
    assert got == [
        (0, "dead", now - 3 * S, now),
        (1, "running", now - S // 10, now),
        (2, "stopped", now - 4 * S, now),
        (3, "running", now - 8 * S, now),
    ]
    assert [r.rank for r in svc.liveness_of([2, 0])] == [0, 2]
    rings[3:] = [track(3, 13, RING_INIT, beat=now - 9 * S, seen=now, health="finalized")]
    assert svc.liveness_of([3])[0].state == "exited"
    # The columnar window carries them; the JSON-lines form does not.
    b = svc.bundle([0, 1], None, None, with_hw=False)
    assert b.liveness["rank"].tolist() == [0, 1]
    assert '"state"' not in "".join(svc.window_lines([0, 1], None, None))


def test_without_proc_or_host_pid_the_process_is_unknown(root: pathlib.Path) -> None:
    now = (BOOT_S + 900) * S
    rings = [track(0, 10, RING_INIT, beat=now - 3 * S, seen=now, health="stale")]
    blind = service.Service("n", Loop(rings), clock_ns=lambda: now)  # type: ignore[arg-type]
    assert blind.liveness_of(None)[0].state == "unknown"
    hidden = service.Service(
        "n",
        Loop(rings),  # type: ignore[arg-type]
        host_pid=lambda _pid, _uid: None,  # not visible from the agent (no hostPID)
        probe=liveness.ProcessProbe(root, clock_ticks=TICKS),
    )
    rec = hidden.liveness_of(None)[0]
    assert (rec.state, rec.heartbeat, rec.ts) == ("unknown", now - 3 * S, now)
