"""Container pids -> host pids through /proc: NSpid chains, disambiguated by pod uid."""

from __future__ import annotations

import os
import pathlib

from collscope.nodeagent import procs

UID = "1a2b3c4d-0000-1111-2222-333344445555"


def proc(root: pathlib.Path, pid: int, nspid: str, cgroup: str = "0::/\n") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text(f"Name:\tpython\nPid:\t{pid}\nNSpid:\t{nspid}\nPPid:\t1\n")
    (d / "cgroup").write_text(cgroup)


def test_pod_uid_picks_among_equal_container_pids(tmp_path: pathlib.Path) -> None:
    proc(tmp_path, 4001, "4001 37", f"0::/kubepods/burstable/pod{UID}/cri-containerd-aa\n")
    systemd = UID.replace("-", "_")
    proc(tmp_path, 4002, "4002 37", "0::/kubepods.slice/kubepods-podffff.slice/x\n")
    proc(tmp_path, 4003, "4003 12", f"0::/kubepods-pod{systemd}.slice/cri-containerd-bb.scope\n")
    assert procs.host_pid(37, UID, proc_root=tmp_path) == 4001
    assert procs.host_pid(12, UID, proc_root=tmp_path) == 4003  # systemd driver: underscores
    assert procs.host_pid(37, None, proc_root=tmp_path) is None  # ambiguous without a uid
    assert procs.host_pid(99, UID, proc_root=tmp_path) is None


def test_same_namespace_and_single_matches(tmp_path: pathlib.Path) -> None:
    proc(tmp_path, 500, "500")
    proc(tmp_path, 4001, "4001 500")
    assert procs.host_pid(500, None, proc_root=tmp_path) == 500  # our namespace wins the tie
    proc(tmp_path, 4002, "4002 7")
    assert procs.host_pid(7, None, proc_root=tmp_path) == 4002
    (tmp_path / "self").mkdir()  # non-numeric entries are ignored
    assert procs.host_pid(7, None, proc_root=tmp_path / "missing") is None


def test_real_proc_finds_this_process() -> None:
    assert procs.host_pid(os.getpid(), None) == os.getpid()
