"""py-spy stacks of real Python processes the test starts, grouped; and every failure mode."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
from pydantic import BaseModel

from collscope.nodeagent import stacks

PYSPY = pathlib.Path(sys.executable).parent / "py-spy"
# A target that reports when it is inside the function whose frame the test looks for.
TARGET = textwrap.dedent(
    """
    import sys, time
    def {fn}():
        print("ready", flush=True)
        time.sleep(60)
    {fn}()
    """
)


def start(fn: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", TARGET.format(fn=fn)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def targets() -> Iterator[list[subprocess.Popen[str]]]:
    procs = [start("waiting_for_allreduce"), start("waiting_for_allreduce"), start("stuck_in_io")]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.communicate(timeout=10)


def script(tmp_path: pathlib.Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.skipif(not PYSPY.exists(), reason=f"py-spy not installed at {PYSPY}")
def test_real_processes_grouped_by_identical_stack(targets: list[subprocess.Popen[str]]) -> None:
    pids = [p.pid for p in targets]
    report = stacks.dump(pids, pyspy=str(PYSPY), timeout_s=20)
    if report.errors and "ptrace not permitted" in report.errors[0].reason:
        pytest.skip(f"this machine forbids ptrace: {report.errors[0].reason}")
    assert report.errors == []
    assert len(report.groups) == 2
    same, odd = report.groups  # largest group first
    assert same.pids == sorted(pids[:2])
    assert odd.pids == [pids[2]]
    assert same.frames[0].startswith("waiting_for_allreduce (<string>:5)")
    assert odd.frames[0].startswith("stuck_in_io (<string>:5)")
    assert same.frames[-1].startswith("<module> (<string>:6)"), "innermost frame first"
    assert same.thread_names == ["MainThread"]
    for p in targets:
        assert p.poll() is None, "py-spy must leave the target running"
        with open(f"/proc/{p.pid}/stat") as f:
            assert f.read().split(") ")[1][0] in "SR", "target left stopped"


@pytest.mark.skipif(not PYSPY.exists(), reason=f"py-spy not installed at {PYSPY}")
def test_ptrace_not_permitted_is_a_clear_error(
    targets: list[subprocess.Popen[str]], tmp_path: pathlib.Path
) -> None:
    # Inside a new user namespace py-spy has no capability over the test's processes: the
    # same refusal a container without CAP_SYS_PTRACE gets.
    userns = script(tmp_path, "userns-py-spy", f'exec unshare -r {PYSPY} "$@"')
    if subprocess.run(["unshare", "-r", "true"], check=False).returncode != 0:
        pytest.skip("no user namespaces here (unshare -r fails)")
    report = stacks.dump([targets[0].pid], pyspy=userns, timeout_s=20)
    assert report.groups == []
    (err,) = report.errors
    assert err.pid == targets[0].pid
    assert err.reason.startswith("ptrace not permitted"), err.reason
    assert "Stack backtrace" not in err.reason


def test_missing_pyspy_is_a_clear_error() -> None:
    report = stacks.dump([os.getpid(), 1], pyspy="/nonexistent/py-spy")
    assert [e.pid for e in report.errors] == [os.getpid(), 1]
    assert report.errors[0].reason == "py-spy not found: '/nonexistent/py-spy'"


@pytest.mark.skipif(not PYSPY.exists(), reason=f"py-spy not installed at {PYSPY}")
def test_no_such_process() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    (err,) = stacks.dump([gone.pid], pyspy=str(PYSPY), timeout_s=20).errors
    assert err.reason.startswith("no such process"), err.reason


def test_hung_pyspy_is_killed_at_the_deadline_concurrently(tmp_path: pathlib.Path) -> None:
    hang = script(tmp_path, "hung-py-spy", "exec sleep 60")
    t0 = time.monotonic()
    report = stacks.dump([os.getpid(), 1, 2, 3], pyspy=hang, timeout_s=0.3)
    elapsed = time.monotonic() - t0
    assert [e.reason for e in report.errors] == ["py-spy timed out after 0.3 s (killed)"] * 4
    assert elapsed < 1.2, f"4 processes dumped one after another? {elapsed:.2f} s"


def test_unreadable_output(tmp_path: pathlib.Path) -> None:
    bad = script(tmp_path, "bad-py-spy", 'echo \'{"not": "a list"}\'')
    (err,) = stacks.dump([1], pyspy=bad).errors
    assert err.reason == "unreadable py-spy output: expected a JSON list of threads"


def test_parse_and_group_canned_output() -> None:
    def thread(pid: int, name: str, *frames: str) -> dict[str, object]:
        return {
            "pid": pid,
            "thread_id": pid * 10,
            "thread_name": name,
            "os_thread_id": pid,
            "frames": [
                {"name": f, "filename": f"/src/{f}.py", "short_filename": f"{f}.py", "line": 7}
                for f in frames
            ],
        }

    outputs = {
        11: [thread(11, "MainThread", "wait", "step"), thread(11, "pin", "loop")],
        12: [thread(12, "MainThread", "wait", "step")],
        13: [thread(13, "MainThread", "save", "step")],
    }
    per_pid = {pid: stacks.parse(json.dumps(out)) for pid, out in outputs.items()}
    groups = stacks.group(per_pid)
    assert [(g.frames[0], g.pids) for g in groups] == [
        ("wait (wait.py:7)", [11, 12]),
        ("loop (loop.py:7)", [11]),
        ("save (save.py:7)", [13]),
    ]
    assert stacks.dump([]) == stacks.StacksReport()


@pytest.mark.skipif(not PYSPY.exists(), reason=f"py-spy not installed at {PYSPY}")
def test_bare_name_found_beside_the_interpreter_without_path(
    targets: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # as when the agent's venv is not activated
    report = stacks.dump([targets[2].pid], timeout_s=20)
    if report.errors and "ptrace not permitted" in report.errors[0].reason:
        pytest.skip(f"this machine forbids ptrace: {report.errors[0].reason}")
    assert report.errors == []
    assert report.groups[0].frames[0].startswith("stuck_in_io")


def test_guarded_never_runs_pyspy_against_a_refused_pid(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "runs"
    fake = script(tmp_path, "py-spy", f'echo "$4" >> {log}; echo "[]"')  # $4: the --pid value

    def dumper(pids: Sequence[int], timeout_s: float) -> BaseModel:
        return stacks.dump(pids, pyspy=fake, timeout_s=timeout_s)

    def refusal(pid: int) -> str | None:
        return None if pid == 10 else f"refused: pid {pid} is not in a training pod"

    report = stacks.guarded(dumper, refusal)([10, 4242, 10], 5.0)
    assert isinstance(report, stacks.StacksReport)
    assert report.errors == [
        stacks.StackError(pid=4242, reason="refused: pid 4242 is not in a training pod")
    ]
    assert log.read_text().split() == ["10"]
    report = stacks.guarded(dumper, refusal)([1], 5.0)
    assert isinstance(report, stacks.StacksReport) and [e.pid for e in report.errors] == [1]
    assert log.read_text().split() == ["10"]  # py-spy never ran for pid 1


def test_slots_cap_pyspy_runs_across_requests(tmp_path: pathlib.Path) -> None:
    fake = script(tmp_path, "py-spy", 'echo "[]"')
    slots = threading.BoundedSemaphore(1)
    assert slots.acquire()  # another request's py-spy holds the only slot
    t0 = time.monotonic()
    report = stacks.dump([10], pyspy=fake, timeout_s=0.2, slots=slots)
    assert [e.reason for e in report.errors] == ["busy: no py-spy slot free within 0.2 s"]
    assert time.monotonic() - t0 < 1
    slots.release()
    assert stacks.dump([10], pyspy=fake, timeout_s=5, slots=slots).errors == []
