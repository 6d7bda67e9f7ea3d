"""Maps a ring writer's pid (its own PID namespace) to the host pid, through ``/proc``.

The plugin stamps ``getpid()`` into the ring header: inside a container that is the pid in the
container's namespace (often 1 or a small number), while py-spy, Flight Recorder pipes under
``/proc/<pid>/root`` and NVML's process list all need the host pid. An agent with
``hostPID: true`` sees every process; ``/proc/<pid>/status`` lists the process's pid in each
nested namespace, outermost first::

    NSpid:  48213   37

so host pid 48213 is pid 37 in its container. Several containers have a pid 37: the pod uid
disambiguates, from ``/proc/<pid>/cgroup`` which names ``pod<uid>`` (dashes, or underscores with
the systemd cgroup driver; DESIGN.md §3.1). Without a uid (directory mode) a single match wins;
a process in the agent's own namespace (one NSpid entry) maps to itself.
"""

from __future__ import annotations

import os
import pathlib


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
        marks = (pod_uid, pod_uid.replace("-", "_"))
        in_pod = [p for p, _ in matches if _cgroup_has(proc_root / str(p) / "cgroup", marks)]
        if len(in_pod) == 1:
            return in_pod[0]
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


def _cgroup_has(cgroup: pathlib.Path, marks: tuple[str, ...]) -> bool:
    try:
        text = cgroup.read_text()
    except OSError:
        return False
    return any(f"pod{m}" in text for m in marks)
