"""Opens files inside a container's root (``/proc/<pid>/root``) the way a tenant cannot redirect.

The agent runs as root; a path it takes from a training pod (a Flight Recorder dump or pipe
named in the pod's environment) is tenant input, and so is every directory and symlink along
it. A plain ``open(root / path)`` follows a symlink to ``/etc/shadow`` of the host, blocks
forever on a FIFO, and reads a 100 GB file whole. Here instead:

- the path is walked one component at a time from a directory fd of ``root``
  (``os.open(..., dir_fd=...)`` with ``O_NOFOLLOW``); a symlinked *directory* is resolved by
  hand inside ``root`` (absolute targets restart at ``root``, ``..`` never climbs above it,
  as ``openat2(RESOLVE_IN_ROOT)`` does), at most ``MAX_SYMLINKS`` of them;
- the final component is never followed: a symlink there is refused (``ELOOP``);
- its type is checked with ``lstat`` before it is opened (a device is never opened), opened
  ``O_NONBLOCK`` (a FIFO swapped in meanwhile cannot block), and checked again with ``fstat``
  on the open descriptor (same inode, same type);
- reads stop at a size cap.

Errors are ``OSError`` with an ``errno`` and a one-line ``strerror``; callers translate them.
"""

from __future__ import annotations

import errno
import os
import pathlib
import stat
from collections.abc import Callable
from typing import Final

# Linux's own limit on symlinks followed in one lookup (MAXSYMLINKS).
MAX_SYMLINKS: Final = 40
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def read_regular(root: pathlib.Path, path: str, *, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path`` inside ``root``; ``OSError`` when it is not a
    regular file, is reached through a symlink as its last component, or exceeds ``max_bytes``."""
    fd = open_file(root, path, os.O_RDONLY, want=stat.S_ISREG, kind="a regular file")
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes ({size})", path)
        chunks: list[bytes] = []
        left = max_bytes + 1  # one more: a file growing past the cap is caught too
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", path)
    return data


def lstat(root: pathlib.Path, path: str) -> os.stat_result:
    """``lstat`` of ``path`` inside ``root`` (directories resolved in root, last one not)."""
    parent, name = _walk(root, path)
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    finally:
        os.close(parent)


def open_file(
    root: pathlib.Path,
    path: str,
    flags: int,
    *,
    want: Callable[[int], bool] = stat.S_ISREG,
    kind: str = "a regular file",
) -> int:
    """An fd of ``path`` inside ``root`` opened with ``flags`` (plus ``O_NOFOLLOW``,
    ``O_NONBLOCK``, ``O_CLOEXEC``), only if ``want(st_mode)`` holds before and after opening."""
    parent, name = _walk(root, path)
    try:
        before = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if stat.S_ISLNK(before.st_mode):
            raise OSError(errno.ELOOP, "a symbolic link: not followed", path)
        if not want(before.st_mode):
            raise OSError(errno.EINVAL, f"not {kind} ({_kind(before.st_mode)})", path)
        extra = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(name, flags | extra, dir_fd=parent)
    finally:
        os.close(parent)
    after = os.fstat(fd)
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino) or not want(after.st_mode):
        os.close(fd)
        raise OSError(errno.EAGAIN, "replaced while being opened", path)
    return fd


def _walk(root: pathlib.Path, path: str) -> tuple[int, str]:
    """A directory fd for the parent of ``path``'s last component, resolved inside ``root``,
    and that component's name. The caller closes the fd."""
    parts = [p for p in path.split("/") if p and p != "."]
    if not parts or parts[-1] == "..":
        raise OSError(errno.EINVAL, "no file name at the end of the path", path)
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    stack = [root_fd]  # open directories from root down; ".." pops, never past root
    links = 0
    try:
        while len(parts) > 1:
            name = parts.pop(0)
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            st = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
                target = os.readlink(name, dir_fd=stack[-1])
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                parts[:0] = [p for p in target.split("/") if p and p != "."]
                continue
            # O_NOFOLLOW: swapped for a symlink since the lstat, this fails (ELOOP), not follows.
            stack.append(os.open(name, _DIR_FLAGS, dir_fd=stack[-1]))
        parent = stack.pop()
    except BaseException:
        for fd in stack:
            os.close(fd)
        raise
    for fd in stack:
        os.close(fd)
    return parent, parts[0]


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISREG, "regular file"),
    ):
        if test(mode):
            return name
    return "special file"
