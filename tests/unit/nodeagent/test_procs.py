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


OTHER = "9f8e7d6c-0000-1111-2222-333344445555"
V1 = (
    "12:pids:/kubepods/burstable/pod{uid}/cri-containerd-aa\n"
    "11:memory:/kubepods/burstable/pod{uid}/cri-containerd-aa\n"
    "0::/\n"
)
V2_SYSTEMD = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
    "cri-containerd-bb.scope\n"
)


def test_pod_of_reads_both_cgroup_drivers_and_versions(tmp_path: pathlib.Path) -> None:
    proc(tmp_path, 10, "10 1", V1.format(uid=UID))  # cgroup v1, cgroupfs driver
    proc(tmp_path, 11, "11 1", V2_SYSTEMD.format(uid=UID.replace("-", "_")))  # v2, systemd
    proc(tmp_path, 12, "12 1", f"0::/kubepods/pod{UID.upper()}/x\n")  # Guaranteed QoS
    proc(tmp_path, 13, "13", "0::/user.slice/user-0.slice/session-1.scope\n")  # not in a pod
    proc(tmp_path, 14, "14 1", V1.format(uid=UID) + f"3:cpu:/kubepods/pod{OTHER}/c\n")
    assert procs.pod_of(10, proc_root=tmp_path) == UID
    assert procs.pod_of(11, proc_root=tmp_path) == UID
    assert procs.pod_of(12, proc_root=tmp_path) == UID
    assert procs.pod_of(13, proc_root=tmp_path) is None
    assert procs.pod_of(14, proc_root=tmp_path) is None  # two pods: none
    assert procs.pod_of(99, proc_root=tmp_path) is None  # gone
    assert procs.in_pods(11, [UID], proc_root=tmp_path)
    assert not procs.in_pods(11, [OTHER], proc_root=tmp_path)


def test_a_forged_ring_pid_never_leaves_the_pod(tmp_path: pathlib.Path) -> None:
    """A ring header names pid 4242 (the tenant wrote it): the only process with that pid is a
    host daemon outside the pod, which must not be returned, even though it is unique."""
    proc(tmp_path, 4242, "4242", "0::/system.slice/victim.service\n")  # host namespace
    proc(tmp_path, 5000, "5000 1", V2_SYSTEMD.format(uid=UID.replace("-", "_")))
    assert procs.host_pid(4242, UID, proc_root=tmp_path) is None
    assert procs.host_pid(1, UID, proc_root=tmp_path) == 5000
    proc(tmp_path, 6000, "6000 77", f"0::/kubepods/pod{OTHER}/c\n")  # another tenant's pid 77
    assert procs.host_pid(77, UID, proc_root=tmp_path) is None


def test_training_processes_refuse_what_is_not_a_training_pod(tmp_path: pathlib.Path) -> None:
    proc(tmp_path, 4242, "4242", "0::/system.slice/victim.service\n")
    proc(tmp_path, 5000, "5000 1", V1.format(uid=UID))
    proc(tmp_path, 5001, "5001 9", V1.format(uid=UID))  # a dataloader worker of the pod
    proc(tmp_path, 6000, "6000 1", V1.format(uid=OTHER))  # a pod without a ring
    proc(tmp_path, 700, "700")  # a directory-mode writer in the agent's namespace
    pods: list[str] = [UID]
    writers = [(700, 700)]
    t = procs.TrainingProcesses(lambda: pods, lambda: writers, proc_root=tmp_path)
    assert t.refusal(5000) is None and t.refusal(5001) is None and t.refusal(700) is None
    assert "not in a training pod" in (t.refusal(4242) or "")
    assert "not in a training pod" in (t.refusal(6000) or "")
    assert "no process 31337" in (t.refusal(31337) or "")
    assert "not a process" in (t.refusal(0) or "")
    pods.clear()  # the pod's ring is gone: so is the permission
    assert t.refusal(5000) is not None
    writers[:] = [(700, 12)]  # the writer's pid was recycled: NSpid no longer ends in 12
    assert t.refusal(700) is not None
