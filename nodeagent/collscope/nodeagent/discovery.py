"""Finds the ring files on this node: in kubelet emptyDirs, or in any directory tree.

Kubelet mode (docs/design.md, "Pod contract"): a training pod's emptyDir lives on the host at::

    <kubelet_pods_dir>/<pod uid>/volumes/kubernetes.io~empty-dir/<volume>/<name>.ring

so the pod uid comes from the path, and a ring vanishes with its pod when the kubelet removes
the directory. Directory mode: every ``*.ring`` below a root (standalone nodes, tests); a pod
uid is still taken from the path when the tree has the kubelet shape.

Workload: what the agent keys a ring's data by, with its rank (two jobs on one node both have a
rank 0). It is the pod uid, taken from the path the kubelet made (never from the ring header,
which the tenant writes); a ring outside any pod directory gets ``dir-<16 hex>``, a hash of its
directory, so the rings of one directory are one workload, stable across agent restarts.

``Discovery.scan()`` lists what is there now; ``changes()`` diffs it against the previous scan.
Discovery never opens a file: a ring being created (magic 0) or corrupt is the sampler's
business. Unreadable directories are skipped (a pod dir removed mid-scan is normal).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import re
from typing import Final

from collscope.nodeagent import ids, settings

EMPTY_DIR: Final = "kubernetes.io~empty-dir"  # plugin name with '/' escaped
SUFFIX: Final = ".ring"
_POD_PATH = re.compile(r"(?:^|/)pods/([0-9a-fA-F-]{8,64})/volumes/")
DIR_PREFIX: Final = "dir-"
# 16 hex digits (64 bits) of the directory's hash: no two directories of a node collide by chance.
_DIR_HEX = 16


@dataclasses.dataclass(frozen=True, slots=True)
class Found:
    """One ring file: its path, the uid of the pod whose emptyDir holds it (None: unknown) and
    its workload (``workload_of``)."""

    path: str
    pod_uid: ids.PodUID | None

    @property
    def workload(self) -> ids.Workload:
        return workload_of(self.path, self.pod_uid)


@dataclasses.dataclass(frozen=True, slots=True)
class Changes:
    added: tuple[Found, ...]
    removed: tuple[str, ...]


def pod_uid_of(path: str) -> ids.PodUID | None:
    """The pod uid in a kubelet-shaped path, e.g. ``.../pods/<uid>/volumes/...``."""
    m = _POD_PATH.search(path)
    return ids.PodUID(m.group(1)) if m else None


def workload_of(path: str, pod_uid: ids.PodUID | None) -> ids.Workload:
    """The pod uid, or ``dir-<hash of the ring's directory>`` for a ring in no pod."""
    if pod_uid:
        return ids.Workload(pod_uid)
    digest = hashlib.sha256(os.path.dirname(path).encode(errors="surrogateescape")).hexdigest()
    return ids.Workload(DIR_PREFIX + digest[:_DIR_HEX])


class Discovery:
    """Scans the configured place for rings; stateful only to report changes."""

    def __init__(self, config: settings.DiscoverySettings) -> None:
        self.config = config
        self._known: dict[str, Found] = {}

    def scan(self) -> list[Found]:
        """Every ring file there now, sorted by path."""
        if self.config.mode == "kubelet":
            paths = _kubelet(pathlib.Path(self.config.kubelet_pods_dir), self.config.ring_volume)
        else:
            paths = _tree(self.config.trace_root)
        return [Found(p, pod_uid_of(p)) for p in sorted(paths)]

    def changes(self) -> Changes:
        """What appeared and what vanished since the previous call."""
        now = {f.path: f for f in self.scan()}
        added = tuple(f for p, f in now.items() if p not in self._known)
        removed = tuple(p for p in self._known if p not in now)
        self._known = now
        return Changes(added, removed)


def _kubelet(pods: pathlib.Path, volume: str) -> list[str]:
    out: list[str] = []
    for pod in _entries(str(pods)):
        if not pod.is_dir(follow_symlinks=False):
            continue
        vol = os.path.join(pod.path, "volumes", EMPTY_DIR, volume)
        out += [e.path for e in _entries(vol) if _is_ring(e)]
    return out


def _tree(root: str) -> list[str]:
    out: list[str] = []
    stack = [root]
    while stack:
        for e in _entries(stack.pop()):
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
            elif _is_ring(e):
                out.append(e.path)
    return out


def _is_ring(e: os.DirEntry[str]) -> bool:
    return e.name.endswith(SUFFIX) and e.is_file(follow_symlinks=False)


def _entries(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []
