"""Maps a ring writer's pid (its own PID namespace) to the host pid, through ``/proc``.

The plugin stamps ``getpid()`` into the ring header: inside a container that is the pid in the
container's namespace (often 1 or a small number), while py-spy, Flight Recorder pipes under
``/proc/<pid>/root`` and NVML's process list all need the host pid. An agent with
``hostPID: true`` sees every process; ``/proc/<pid>/status`` lists the process's pid in each
nested namespace, outermost first::

    NSpid:  48213   37

so host pid 48213 is pid 37 in its container. Several containers have a pid 37, and the pid in
a ring header is written by the tenant: with a pod uid (the pod whose volume holds the ring)
only a process whose ``/proc/<pid>/cgroup`` places it in that pod counts, and nothing outside
the pod is ever returned. The cgroup path names the pod in one of two forms (docs/design.md,
"Data path" 3)::

    0::/kubepods/burstable/pod1a2b3c4d-0000-1111-2222-333344445555/cri-containerd-ab12...
    0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_0000_1111_2222\
       _333344445555.slice/cri-containerd-ab12....scope

(cgroupfs driver: dashes, a directory ``pod<uid>``; systemd driver: underscores, a slice
``kubepods[-<qos>]-pod<uid>.slice``); cgroup v1 lists one such line per hierarchy, v2 one
``0::`` line. A process whose lines name two different pods belongs to none. Without a uid
(directory mode, an operator-configured trace root) a single match wins; a process in the
agent's own namespace (one NSpid entry) maps to itself.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Callable, Collection

# One path component naming a pod: "pod<uid>" (cgroupfs) or "kubepods[-qos]-pod<uid>.slice"
# (systemd, '-' in the uid escaped as '_'). UIDs: 36-char UUIDs, or 32 hex for static pods.
_POD_COMPONENT = re.compile(r"^(?:pod|kubepods(?:-[a-z]+)?-pod)([0-9a-fA-F_-]{32,36})(?:\.slice)?$")


def host_pid(
    pid: int, pod_uid: str | None, *, proc_root: pathlib.Path = pathlib.Path("/proc")
) -> int | None:
    """The host pid of the process that is ``pid`` in its own namespace; None if not found
    or ambiguous."""
    matches: list[tuple[int, bool]] = []  # (host pid, in the agent's own namespace)
    for entry in _pids(proc_root):
        chain = _nspid(proc_root / entry / "status")
        if chain and chain[-1] == pid:
            matches.append((int(entry), len(chain) == 1))
    if pod_uid:
        # The pod's processes only, or nothing: the pid is the tenant's word (module docstring).
        in_pod = [p for p, _ in matches if pod_of(p, proc_root=proc_root) == _norm(pod_uid)]
        return in_pod[0] if len(in_pod) == 1 else None
    if len(matches) == 1:
        return matches[0][0]
    own = [p for p, same_ns in matches if same_ns]
    return own[0] if len(own) == 1 else None


def nspid_chain(status: pathlib.Path) -> list[int]:
    """A process's pid in each nested PID namespace, outermost first (``NSpid:`` of its
    ``/proc/<pid>/status``); empty when unreadable."""
    return _nspid(status)


def _pids(proc_root: pathlib.Path) -> list[str]:
    try:
        return [e for e in os.listdir(proc_root) if e.isdigit()]
    except OSError:
        return []


def _nspid(status: pathlib.Path) -> list[int]:
    try:
        text = status.read_text()
    except OSError:  # exited, or not ours to read
        return []
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            try:
                return [int(x) for x in line.split()[1:]]
            except ValueError:
                return []
    return []


def pod_of(pid: int, *, proc_root: pathlib.Path = pathlib.Path("/proc")) -> str | None:
    """The uid (lower case, with dashes) of the pod whose cgroup holds host process ``pid``;
    None when it is in no pod, in two, or gone."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:  # exited, or not ours to read
        return None
    pods = set()
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for part in path.split("/"):
            m = _POD_COMPONENT.match(part)
            if m:
                pods.add(_norm(m.group(1)))
    return pods.pop() if len(pods) == 1 else None


def in_pods(pid: int, pod_uids: Collection[str], *, proc_root: pathlib.Path) -> bool:
    """Whether host process ``pid`` is in one of the pods ``pod_uids``."""
    pod = pod_of(pid, proc_root=proc_root)
    return pod is not None and pod in {_norm(u) for u in pod_uids}


def _norm(uid: str) -> str:
    return uid.replace("_", "-").lower()


class TrainingProcesses:
    """Which host processes stacks (py-spy, which pauses its target) and Flight Recorder may
    touch: a process in a pod that holds a discovered ring (its cgroup names the pod's uid,
    read afresh at each check, so a recycled pid is not trusted), or, for a ring found outside
    any pod (directory mode), the writer whose ``NSpid`` still ends in the ring's pid.

    ``pods`` and ``writers`` are read at each check: the uids of the pods with a live ring, and
    ``(host pid, pid in its namespace)`` of the pod-less rings' writers.
    """

    def __init__(
        self,
        pods: Callable[[], Collection[str]],
        writers: Callable[[], Collection[tuple[int, int]]],
        *,
        proc_root: pathlib.Path | None = pathlib.Path("/proc"),
    ) -> None:
        self.pods = pods
        self.writers = writers
        self.proc_root = proc_root

    def refusal(self, pid: int) -> str | None:
        """None when ``pid`` may be targeted, else why not (one line, for the API)."""
        if pid <= 0:
            return f"refused: pid {pid} is not a process"
        for host, ns_pid in self.writers():
            if host == pid and (self.proc_root is None or self._still(pid, ns_pid)):
                return None
        if self.proc_root is not None:
            pod = pod_of(pid, proc_root=self.proc_root)
            if pod is not None and pod in {_norm(u) for u in self.pods()}:
                return None
            if pod is None and not (self.proc_root / str(pid)).exists():
                return f"refused: no process {pid} on this node"
        return f"refused: pid {pid} is not in a training pod discovered on this node"

    def _still(self, pid: int, ns_pid: int) -> bool:
        assert self.proc_root is not None
        chain = _nspid(self.proc_root / str(pid) / "status")
        return bool(chain) and chain[-1] == ns_pid
