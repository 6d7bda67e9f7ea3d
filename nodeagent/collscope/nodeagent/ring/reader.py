"""Reads a trace ring file written by the native profiler plugin, with ``pread``, never a mapping.

The plugin (``native/``, issue 3) writes one file per training process: a header (identity and
counters), a live-state region (per communicator the ops in flight and, per (channel, peer,
direction), the cumulative chunk counters of notes/nccl-profiler.md §4) and a ring of 64-byte
completion and communicator records. ``native/include/collscope_ring.h`` is the format and its
reader protocol; ``layout`` mirrors it. Usage::

    from collscope.nodeagent import ring
    with ring.open("/run/collscope/collscope-node7-pid4242-0.ring") as r:
        snap = r.snapshot()                        # live state, seqlock-consistent
        events, cursor, missed = r.events_since(0) # completion + communicator records

Distrust (STYLE habit 11, issue 15 item 3: the file belongs to a tenant who may be hostile):
``open`` takes only a regular file (no symlink, no FIFO, at most ``MAX_FILE_BYTES``) and checks
magic, version, every size, count and region bound against the header's constants and the
file size. Every read is a ``pread`` into a private copy: a file truncated while the agent
reads it gives a short read, a ``RingCorrupt`` for that ring (a mapping gave SIGBUS: the
size check and the copy cannot be made atomic). Every value handed out is checked
(enumeration codes, ranks, and times: inside ``[plugin init, reader's clock]`` with
``layout.TIME_SLACK_NS`` either side). Anything off raises
``errors.RingCorrupt`` naming file, region, offset, field and reason; an unknown layout version
raises ``errors.RingVersionMismatch``. Never ``IndexError``, never garbage.

Concurrency: the writer is live in another process. Live slots are copied under their seqlocks
(header protocol §1), retried at most ``SEQLOCK_RETRIES`` times, never waited on; events follow
protocol §3 (commit word per slot, write index in the header). An attempt is three ``pread``s
(seqlocks or commit words before, the copy, seqlocks after): the loads of one read are not
ordered among themselves, those of successive reads are (each a system call after the other's
return; x86-64 does not reorder loads with loads). On a weaker machine (aarch64) a torn copy of
a slot could in theory pass its seqlock check.

The pieces: ``layout`` (the binary layout and value checks), ``livestate`` (live state,
seqlock copies), ``eventlog`` (the event ring), ``records`` (bundle-v1 records).

Why one module: what is left here after those pieces moved out is the distrustful ``open``,
the header's validation and the ``Ring`` that reads through the layout it validated; each
read of ``Ring`` relies on the bounds ``_validate_header`` established, so they stay side by
side. Most of the length is the protocol's explanation above.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Self

import numpy as np
import numpy.typing as npt

from collscope.nodeagent import errors
from collscope.nodeagent.ring import eventlog, layout, livestate

# Header protocol §1 suggests about 100. The first attempt copies the live communicators
# (their identities and op slots, and their visible flow slots: ~20 µs), the others only the
# slots still unstable (a few µs each), so even a writer frozen in the middle of a write
# (seqlock odd forever) costs about a millisecond per snapshot, never a spin.
SEQLOCK_RETRIES: Final = 100


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """Who wrote the ring: written once by the plugin when it created the file.

    ``rank``, ``local_rank`` and ``world_size`` are ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` of
    the process, None where unset; pod fields come from the downward API (empty when unset).
    """

    path: str
    pid: int
    rank: int | None
    local_rank: int | None
    world_size: int | None
    hostname: str
    pod_name: str
    pod_namespace: str
    node_name: str
    nccl_version: str
    nccl_version_code: int
    plugin_version: str
    activation_mask: int
    init_ns: int
    coarse_res_ns: int
    file_size: int
    event_slots: int


# The plugin clamps its ring to COLLSCOPE_RING_BYTES_MAX (native/include/collscope_ring.h): a
# larger file is not one it wrote, and its event region would be read whole on the first pass.
MAX_FILE_BYTES: Final = 256 * 2**20


def open(path: str | os.PathLike[str], *, clock: Callable[[], int] = time.time_ns) -> Ring:
    """Open ``path`` and validate its header; the result is a context manager.

    ``clock`` returns CLOCK_REALTIME nanoseconds (the plugin's clock): it stamps snapshots,
    from which idle times are computed, and bounds the times the ring may hold. The file is
    under its tenant's control: it is opened without following a symlink and without blocking
    (a FIFO would hang the reader), and must be a regular file of at most ``MAX_FILE_BYTES``.
    ``OSError`` (missing file, no permission) propagates as it is; a symlink, a file that is
    not regular or not a valid ring raises ``RingCorrupt``/``RingVersionMismatch``.
    """
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise errors.RingCorrupt(
                name, "is a symbolic link: rings are read only as regular files", region="file"
            ) from e
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise errors.RingCorrupt(
                name,
                f"is not a regular file (mode {stat.filemode(st.st_mode)})",
                region="file",
            )
        size = st.st_size
        if size < layout.HEADER_BYTES:
            raise errors.RingCorrupt(
                name,
                f"file is {size} bytes, shorter than the {layout.HEADER_BYTES}-byte header",
                region="file",
            )
        if size > MAX_FILE_BYTES:
            raise errors.RingCorrupt(
                name,
                f"file is {size} bytes, larger than a plugin writes ({MAX_FILE_BYTES})",
                region="file",
            )
        return Ring(name, fd, size, clock)
    except BaseException:
        os.close(fd)
        raise


@dataclasses.dataclass(frozen=True, slots=True)
class _Layout:
    file_size: int
    comm_offset: int
    event_offset: int
    event_slots: int


class Ring:
    """An open ring file. Use ``ring.open``; close it (or use ``with``) to close the file.

    Every read is a ``pread`` into a private copy, never a mapping: the tenant can truncate
    its file at any instant, and a mapped page past the new end is SIGBUS (the whole agent
    dies), where a short ``pread`` is a ``RingCorrupt`` for this ring.
    """

    def __init__(self, path: str, fd: int, size: int, clock: Callable[[], int]) -> None:
        self.path = path
        self._fd: int | None = fd
        self._clock = clock
        first = self._header()
        self._layout = _validate_header(path, first, size)
        self.identity = _identity(path, first, self._layout)
        init = self.identity.init_ns
        until = clock() + layout.TIME_SLACK_NS
        if not layout.EPOCH_FLOOR_NS <= init <= until:
            raise errors.RingCorrupt(
                path,
                f"plugin init time {init} is outside [{layout.EPOCH_FLOOR_NS}, {until}] "
                "(2020-01-01 .. the reader's clock + "
                f"{layout.TIME_SLACK_NS // 10**9} s)",
                region="header",
                offset=layout.field_offset(layout.HEADER, "init_realtime_ns"),
                field="init_realtime_ns",
            )
        # Times before this are not plausible: the plugin writes none before its own init.
        self._floor_ns = init - layout.TIME_SLACK_NS

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the file; idempotent. Snapshots and events already read stay valid."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def status(self) -> livestate.Status:
        """The header's live fields now: ring state, API version in use, counters, heartbeat."""
        return livestate.status(self.path, self._live())

    def snapshot(self, *, retries: int = SEQLOCK_RETRIES) -> livestate.Snapshot:
        """A copy of the live state, consistent per slot (header protocol §1 and §2).

        Each comm identity, op slot and flow slot is taken from an attempt whose seqlock was
        even and unchanged across the copy. Slots still unstable after ``retries`` attempts
        (a writer frozen mid-write) are taken as they are and marked ``torn``; the snapshot is
        then ``consistent=False``. Never blocks, never waits for the writer.
        """
        header = self._live()
        taken_ns = self._clock()
        status = livestate.status(self.path, header)
        copies = livestate.seqlock_copy(
            self._comm_slots, max(1, retries), span=self._span(taken_ns)
        )
        return livestate.snapshot(
            self.path, self._layout.comm_offset, copies, status=status, taken_ns=taken_ns
        )

    def live_copies(
        self, *, retries: int = SEQLOCK_RETRIES, with_status: bool = True
    ) -> tuple[livestate.Status | None, livestate.Copies, int]:
        """``(status, copies, taken_ns)``: what ``snapshot`` decodes, left as numpy slots.

        For readers that decode many rings in bulk (the agent's sampler, ``staterows``); the
        copies follow the same seqlock protocol, their values are not checked yet. The status
        (None unless ``with_status``) costs as much as a quarter of the copy: a 10 Hz reader
        may take it less often.
        """
        header = self._live()
        taken_ns = self._clock()
        status = livestate.status(self.path, header) if with_status else None
        copies = livestate.seqlock_copy(
            self._comm_slots, max(1, retries), span=self._span(taken_ns)
        )
        return status, copies, taken_ns

    def first_cursor(self) -> int:
        """The write index of the oldest record still in the ring (a cursor missing nothing)."""
        written = int(self._live()["events_written"])
        return max(0, written - self._layout.event_slots)

    def events_since(
        self, cursor: int, *, skip_pending: bool = False
    ) -> tuple[list[eventlog.Event], int, int]:
        """Records with write index >= ``cursor``: ``(records, new_cursor, missed)``.

        Follows header protocol §3. ``missed`` counts the records in ``[cursor, new_cursor)``
        that were overwritten before they could be read (ring full) or while being read;
        delivered + missed == new_cursor - cursor. A record reserved but not yet committed
        stops the read there: the next call resumes at it (``new_cursor``). A process that
        died in the middle of an append leaves such a record for ever and would hide all that
        follows: post-mortem readers pass ``skip_pending`` to count it as missed and go on.
        """
        if cursor < 0:
            raise ValueError(f"cursor must be >= 0 (got {cursor})")
        n = self._layout.event_slots
        written = int(self._live()["events_written"])
        if cursor > written:
            raise errors.RingCorrupt(
                self.path,
                f"write index {written} is behind the cursor {cursor}: it went backwards",
                region="header",
                offset=layout.field_offset(layout.HEADER, "events_written"),
                field="events_written",
            )
        missed = 0
        start = cursor
        if written - start > n:
            missed = written - n - start
            start = written - n
        if start == written:
            return [], written, missed
        records, stop, lost = eventlog.read(
            self.path,
            self._event_records,
            start,
            written,
            region_offset=self._layout.event_offset,
            slot_count=n,
            skip_pending=skip_pending,
            span=self._span(self._clock()),
        )
        return records, stop, missed + lost

    def _span(self, now_ns: int) -> tuple[int, int]:
        """The times this ring may hold when read at ``now_ns`` (ns, inclusive)."""
        return self._floor_ns, now_ns + layout.TIME_SLACK_NS

    def _pread(self, size: int, offset: int, region: str) -> bytes:
        """``size`` bytes at ``offset``, or ``RingCorrupt`` when the file ends before them."""
        if self._fd is None:
            raise ValueError(f"{self.path}: ring is closed")
        data = os.pread(self._fd, size, offset)
        if len(data) < size:
            raise errors.RingCorrupt(
                self.path,
                f"file ends inside a read of {size} bytes at {offset} (got {len(data)}): "
                "truncated while open",
                region=region,
                offset=offset,
            )
        return data

    def _header(self) -> np.void:
        record: np.void = np.frombuffer(
            self._pread(layout.HEADER_BYTES, 0, "header"), layout.HEADER
        )[0]
        return record

    def _live(self) -> np.void:
        """The header now, after checking that the file is still whole and its magic still
        the plugin's. The size check says early and the same way for every read that the
        file shrank; it cannot be atomic with the reads that follow, whose short reads are
        what keeps a later truncation from doing harm."""
        h = self._header()
        assert self._fd is not None  # _header checked it
        size = os.fstat(self._fd).st_size
        if size < self._layout.file_size:
            raise errors.RingCorrupt(
                self.path,
                f"file shrank to {size} bytes while open; the header says {self._layout.file_size}",
                region="file",
            )
        magic = int(h["magic"])
        if magic != layout.MAGIC:
            raise errors.RingCorrupt(
                self.path,
                f"magic changed to {magic:#x} while open",
                region="header",
                offset=0,
                field="magic",
            )
        return h

    def _comm_slots(self, lo: int, hi: int) -> livestate.Region:
        """A copy of comm slots ``[lo, hi)`` (``livestate.Read``)."""
        size = layout.COMM_SLOT.itemsize
        data = self._pread((hi - lo) * size, self._layout.comm_offset + lo * size, "comms")
        return livestate.Region(np.frombuffer(data, layout.COMM_SLOT))

    def _event_records(self, first: int, count: int) -> npt.NDArray[Any]:
        """A copy of the records of write indices ``[first, first + count)`` in index order
        (``eventlog.Fetch``): one read, two where the window wraps past the last slot."""
        n, at = self._layout.event_slots, self._layout.event_offset
        size = layout.EVENT_BYTES
        s = first % n
        head = min(count, n - s)
        data = self._pread(head * size, at + s * size, "events")
        if count > head:
            data += self._pread((count - head) * size, at, "events")
        return np.frombuffer(data, layout.EVENT)


def _validate_header(path: str, h: np.void, size: int) -> _Layout:
    """Header protocol §0: every format field checked against this reader's constants."""

    def corrupt(field: str, reason: str) -> errors.RingCorrupt:
        return errors.RingCorrupt(
            path,
            reason,
            region="header",
            offset=layout.field_offset(layout.HEADER, field),
            field=field,
        )

    def expect(field: str, want: int) -> None:
        got = int(h[field])
        if got != want:
            raise corrupt(field, f"expected {want}, got {got}")

    magic = int(h["magic"])
    if magic == 0:
        raise corrupt("magic", "is 0: the writer has not finished creating the file; retry later")
    if magic != layout.MAGIC:
        raise corrupt("magic", f"expected {layout.MAGIC:#x}, got {magic:#x}: not a collscope ring")
    if int(h["version"]) != layout.VERSION:
        raise errors.RingVersionMismatch(path, int(h["version"]), layout.VERSION)
    expect("header_size", layout.HEADER_BYTES)
    file_size = int(h["file_size"])
    if not layout.HEADER_BYTES <= file_size <= size:
        raise corrupt(
            "file_size",
            f"{file_size} is outside [{layout.HEADER_BYTES}, {size}] (the file's size)",
        )
    expect("comm_slot_count", layout.COMM_SLOTS)
    expect("comm_slot_size", layout.COMM_SLOT.itemsize)
    expect("op_slots_per_comm", layout.OPS_PER_COMM)
    expect("flow_slots_per_comm", layout.FLOWS_PER_COMM)
    expect("op_slot_size", layout.OP_SLOT.itemsize)
    expect("flow_slot_size", layout.FLOW_SLOT.itemsize)
    expect("event_record_size", layout.EVENT_BYTES)
    expect("comm_region_size", layout.COMM_SLOTS * layout.COMM_SLOT.itemsize)
    n = int(h["event_slot_count"])
    if n < 1:
        raise corrupt("event_slot_count", "is 0: the ring holds no records")
    expect("event_region_size", n * layout.EVENT_BYTES)
    regions = []
    for name in ("comm", "event"):
        offset = int(h[f"{name}_region_offset"])
        end = offset + int(h[f"{name}_region_size"])
        if offset % 64 or offset < layout.HEADER_BYTES or end > file_size:
            raise corrupt(
                f"{name}_region_offset",
                f"region [{offset}, {end}) is not 64-byte aligned inside "
                f"[{layout.HEADER_BYTES}, {file_size})",
            )
        regions.append((offset, end))
    (c0, c1), (e0, e1) = regions
    if c0 < e1 and e0 < c1:
        raise corrupt(
            "event_region_offset", f"events [{e0}, {e1}) overlap communicators [{c0}, {c1})"
        )
    return _Layout(file_size=file_size, comm_offset=c0, event_offset=e0, event_slots=n)


def _identity(path: str, h: np.void, regions: _Layout) -> Identity:
    def text(field: str) -> str:
        check = layout.Checker(path, "header", layout.field_offset(layout.HEADER, field))
        return check.text(field, bytes(h[field]), layout.field_size(layout.HEADER, field))

    def optional(field: str) -> int | None:
        v = int(h[field])
        return None if v < 0 else v

    return Identity(
        path=path,
        pid=int(h["pid"]),
        rank=optional("rank"),
        local_rank=optional("local_rank"),
        world_size=optional("world_size"),
        hostname=text("hostname"),
        pod_name=text("pod_name"),
        pod_namespace=text("pod_namespace"),
        node_name=text("node_name"),
        nccl_version=text("nccl_version"),
        nccl_version_code=int(h["nccl_version_code"]),
        plugin_version=text("plugin_version"),
        activation_mask=int(h["activation_mask"]),
        init_ns=int(h["init_realtime_ns"]),
        coarse_res_ns=int(h["coarse_res_ns"]),
        file_size=regions.file_size,
        event_slots=regions.event_slots,
    )
