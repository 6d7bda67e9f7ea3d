"""Rings are found in kubelet emptyDirs and plain trees; changes are reported."""

from __future__ import annotations

import pathlib

from collscope.nodeagent import discovery, settings

UID = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"


def kubelet(tmp_path: pathlib.Path, volume: str = "collscope-trace") -> discovery.Discovery:
    return discovery.Discovery(
        settings.DiscoverySettings(
            mode="kubelet", kubelet_pods_dir=str(tmp_path / "pods"), ring_volume=volume
        )
    )


def emptydir(tmp_path: pathlib.Path, uid: str, volume: str = "collscope-trace") -> pathlib.Path:
    d = tmp_path / "pods" / uid / "volumes" / discovery.EMPTY_DIR / volume
    d.mkdir(parents=True)
    return d


def test_kubelet_mode_finds_rings_of_the_volume_with_pod_uids(tmp_path: pathlib.Path) -> None:
    d = emptydir(tmp_path, UID)
    (d / "a.ring").write_bytes(b"x")
    (d / "notes.txt").write_text("not a ring")
    other = emptydir(tmp_path, "11111111-2222-3333-4444-555555555555", "scratch")
    (other / "b.ring").write_bytes(b"x")  # another volume: not ours
    (tmp_path / "pods" / "stray-file").write_text("")
    found = kubelet(tmp_path).scan()
    assert found == [discovery.Found(str(d / "a.ring"), UID)]  # type: ignore[arg-type]


def test_directory_mode_walks_any_tree(tmp_path: pathlib.Path) -> None:
    (tmp_path / "x" / "y").mkdir(parents=True)
    (tmp_path / "top.ring").write_bytes(b"")
    (tmp_path / "x" / "y" / "deep.ring").write_bytes(b"")
    d = discovery.Discovery(settings.DiscoverySettings(mode="directory", trace_root=str(tmp_path)))
    assert [f.path for f in d.scan()] == [
        str(tmp_path / "top.ring"),
        str(tmp_path / "x" / "y" / "deep.ring"),
    ]
    assert all(f.pod_uid is None for f in d.scan())


def test_changes_report_new_and_vanished(tmp_path: pathlib.Path) -> None:
    d = emptydir(tmp_path, UID)
    finder = kubelet(tmp_path)
    assert finder.changes() == discovery.Changes((), ())
    (d / "a.ring").write_bytes(b"")
    c = finder.changes()
    assert [f.path for f in c.added] == [str(d / "a.ring")] and c.removed == ()
    assert finder.changes() == discovery.Changes((), ())
    (d / "a.ring").unlink()
    assert finder.changes() == discovery.Changes((), (str(d / "a.ring"),))


def test_missing_root_is_empty(tmp_path: pathlib.Path) -> None:
    assert kubelet(tmp_path / "nope").scan() == []
    assert discovery.pod_uid_of("/var/lib/kubelet/pods/" + UID + "/volumes/x/y.ring") == UID
    assert discovery.pod_uid_of("/run/collscope/a.ring") is None


def test_workload_is_the_pod_uid_else_a_hash_of_the_directory() -> None:
    """The window's key besides the rank (two jobs on a node both have a rank 0)."""
    path = f"/var/lib/kubelet/pods/{UID}/volumes/{discovery.EMPTY_DIR}/t/rank0.ring"
    assert discovery.Found(path, discovery.pod_uid_of(path)).workload == UID
    a0, a1, b0 = (
        discovery.workload_of(p, None) for p in ("/t/a/0.ring", "/t/a/1.ring", "/t/b/0.ring")
    )
    assert a0 == a1 != b0
    assert a0.startswith(discovery.DIR_PREFIX) and len(a0) == len("dir-") + 16
