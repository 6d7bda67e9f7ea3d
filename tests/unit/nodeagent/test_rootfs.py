"""Tenant paths opened inside a container root: no symlink out, no FIFO wait, no huge read."""

from __future__ import annotations

import errno
import os
import pathlib
import stat
import time

import pytest

from collscope.nodeagent import rootfs


@pytest.fixture
def root(tmp_path: pathlib.Path) -> pathlib.Path:
    """A container root beside a 'host' file it must never reach."""
    (tmp_path / "host-secret").write_text("host")
    r = tmp_path / "root"
    (r / "tmp").mkdir(parents=True)
    (r / "etc").mkdir()
    (r / "etc" / "hostname").write_text("pod")
    return r


def test_reads_a_regular_file(root: pathlib.Path) -> None:
    (root / "tmp" / "dump").write_bytes(b"abc")
    assert rootfs.read_regular(root, "/tmp/dump", max_bytes=10) == b"abc"
    assert rootfs.read_regular(root, "tmp/./dump", max_bytes=3) == b"abc"


def test_symlink_as_last_component_is_refused(root: pathlib.Path) -> None:
    (root / "tmp" / "dump").symlink_to("/etc/hostname")  # would be the host's outside a root
    with pytest.raises(OSError, match="symbolic link") as e:
        rootfs.read_regular(root, "/tmp/dump", max_bytes=100)
    assert e.value.errno == errno.ELOOP


def test_symlinked_directories_resolve_inside_the_root(root: pathlib.Path) -> None:
    host = root.parent
    (root / "tmp" / "abs").symlink_to("/etc")  # absolute: the root's /etc, not the host's
    assert rootfs.read_regular(root, "/tmp/abs/hostname", max_bytes=10) == b"pod"
    (root / "tmp" / "up").symlink_to("../../../../../../..")  # ".." stops at the root
    assert rootfs.read_regular(root, "/tmp/up/etc/hostname", max_bytes=10) == b"pod"
    with pytest.raises(FileNotFoundError):
        rootfs.read_regular(root, "/tmp/up/host-secret", max_bytes=10)
    with pytest.raises(FileNotFoundError):
        rootfs.read_regular(root, "/../../host-secret", max_bytes=10)
    (root / "tmp" / "out").symlink_to(host)  # the host path, taken inside the root: absent
    with pytest.raises(FileNotFoundError):
        rootfs.read_regular(root, "/tmp/out/host-secret", max_bytes=10)


def test_symlink_loops_end(root: pathlib.Path) -> None:
    (root / "tmp" / "a").symlink_to("b")
    (root / "tmp" / "b").symlink_to("a")
    with pytest.raises(OSError, match="too many levels") as e:
        rootfs.read_regular(root, "/tmp/a/x", max_bytes=10)
    assert e.value.errno == errno.ELOOP


def test_fifo_is_refused_without_blocking(root: pathlib.Path) -> None:
    os.mkfifo(root / "tmp" / "dump")  # nobody ever writes it
    start = time.monotonic()
    with pytest.raises(OSError, match=r"not a regular file \(FIFO\)"):
        rootfs.read_regular(root, "/tmp/dump", max_bytes=10)
    assert time.monotonic() - start < 1


def test_directory_and_oversized_files_are_refused(root: pathlib.Path) -> None:
    with pytest.raises(OSError, match=r"not a regular file \(directory\)"):
        rootfs.read_regular(root, "/tmp", max_bytes=10)
    (root / "tmp" / "big").write_bytes(b"x" * 11)
    with pytest.raises(OSError, match="larger than 10 bytes") as e:
        rootfs.read_regular(root, "/tmp/big", max_bytes=10)
    assert e.value.errno == errno.EFBIG
    with pytest.raises(OSError, match="no file name"):
        rootfs.read_regular(root, "/tmp/..", max_bytes=10)


def test_open_file_checks_the_wanted_type(root: pathlib.Path) -> None:
    os.mkfifo(root / "tmp" / "pipe")
    reader = os.open(root / "tmp" / "pipe", os.O_RDONLY | os.O_NONBLOCK)
    try:
        fd = rootfs.open_file(root, "/tmp/pipe", os.O_WRONLY, want=stat.S_ISFIFO, kind="a FIFO")
        os.close(fd)
    finally:
        os.close(reader)
    with pytest.raises(OSError, match=r"not a FIFO \(regular file\)"):
        rootfs.open_file(root, "/etc/hostname", os.O_WRONLY, want=stat.S_ISFIFO, kind="a FIFO")
    assert (root / "etc" / "hostname").read_text() == "pod"  # never opened for writing
    assert stat.S_ISDIR(rootfs.lstat(root, "/tmp").st_mode)
