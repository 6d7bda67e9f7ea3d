"""Reads a trace ring file written by the native profiler plugin, zero-copy over a read-only mmap.

The plugin (``native/``, issue 3) writes one file per training process: a header (identity and
counters), a live-state region (per communicator the ops in flight and, per (channel, peer,
direction), the cumulative chunk counters of notes/nccl-profiler.md §4) and a ring of 64-byte
completion and communicator records. ``native/include/collscope_ring.h`` is the format and its
reader protocol; ``ringlayout`` mirrors it. Usage::

    from collscope.nodeagent import ring
    with ring.open("/run/collscope/collscope-node7-pid4242-0.ring") as r:
        snap = r.snapshot()                        # live state, seqlock-consistent
        events, cursor, missed = r.events_since(0) # completion + communicator records

Distrust (STYLE habit 11): ``open`` checks magic, version, every size, count and region bound
against the header's constants and the file size; every read re-checks that the file has not
shrunk (a read past the end of a shrunk mapping would be SIGBUS, not an exception) and checks
every value it hands out (enumeration codes, ranks, times). Anything off raises
``errors.RingCorrupt`` naming file, region, offset, field and reason; an unknown layout version
raises ``errors.RingVersionMismatch``. Never ``IndexError``, never garbage.

Concurrency: the writer is live in another process. Live slots are copied under their seqlocks
(header protocol §1), retried at most ``SEQLOCK_RETRIES`` times, never waited on; events follow
protocol §3 (commit word per slot, write index in the header). The protocol's acquire loads are
plain loads here: x86-64 does not reorder loads with loads; on a weaker machine (aarch64) a
torn copy of a slot could in theory pass its seqlock check.

The pieces: ``ringlayout`` (the binary layout and value checks), ``ringstate`` (live state,
seqlock copies), ``ringevents`` (the event ring), ``ringrecords`` (bundle-v1 records).
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Self

import numpy as np
import numpy.typing as npt

from collscope.nodeagent import errors, ringevents, ringlayout, ringstate

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


def open(path: str | os.PathLike[str], *, clock: Callable[[], int] = time.time_ns) -> Ring:
    """Map ``path`` read-only and validate its header; the result is a context manager.

    ``clock`` returns CLOCK_REALTIME nanoseconds (the plugin's clock): it stamps snapshots,
    from which idle times are computed. ``OSError`` (missing file, no permission) propagates
    as it is; a file that is not a valid ring raises ``RingCorrupt``/``RingVersionMismatch``.
    """
    name = os.fspath(path)
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < ringlayout.HEADER_BYTES:
            raise errors.RingCorrupt(
                str(name),
                f"file is {size} bytes, shorter than the {ringlayout.HEADER_BYTES}-byte header",
                region="file",
            )
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    except BaseException:
        os.close(fd)
        raise
    try:
        return Ring(str(name), fd, mm, size, clock)
    except BaseException:
        with contextlib.suppress(BufferError):  # see Ring.close
            mm.close()
        os.close(fd)
        raise


@dataclasses.dataclass(frozen=True, slots=True)
class _Layout:
    file_size: int
    comm_offset: int
    event_offset: int
    event_slots: int


class Ring:
    """An open ring file. Use ``ring.open``; close it (or use ``with``) to unmap."""

    def __init__(
        self, path: str, fd: int, mm: mmap.mmap, size: int, clock: Callable[[], int]
    ) -> None:
        self.path = path
        self._fd = fd
        self._mm: mmap.mmap | None = mm
        self._clock = clock
        # Validate a copy first: a view alive in a traceback would keep mmap.close() from
        # releasing the mapping when validation fails.
        first = _copy(np.frombuffer(mm, ringlayout.HEADER, count=1, offset=0))
        self._layout = _validate_header(path, first, size)
        self.identity = _identity(path, first, self._layout)
        self._header: npt.NDArray[Any] | None = np.frombuffer(
            mm, ringlayout.HEADER, count=1, offset=0
        )
        comms = np.frombuffer(
            mm, ringlayout.COMM_SLOT, count=ringlayout.COMM_SLOTS, offset=self._layout.comm_offset
        )
        self._events: npt.NDArray[Any] | None = np.frombuffer(
            mm, ringlayout.EVENT, count=self._layout.event_slots, offset=self._layout.event_offset
        )
        self._region: ringstate.Region | None = ringstate.Region(comms)
        # The header as 64-bit words: magic and the write index read without a structured
        # field lookup (microseconds each, twice per ring per tick).
        self._words: npt.NDArray[np.uint64] | None = np.frombuffer(
            mm, "<u8", count=ringlayout.HEADER_BYTES // 8, offset=0
        )

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
        """Unmap and close the file; idempotent. Snapshots and events already read stay valid."""
        if self._mm is None:
            return
        # numpy views export the mmap's buffer: drop ours first. A view can outlive them in
        # the frames of a traceback being handled (RingCorrupt raised mid-read inside a
        # `with`): mmap then refuses to close, and the mapping goes with the last view.
        self._header = self._events = None
        self._region = self._words = None
        mm, self._mm = self._mm, None
        with contextlib.suppress(BufferError):
            mm.close()
        os.close(self._fd)

    def status(self) -> ringstate.Status:
        """The header's live fields now: ring state, API version in use, counters, heartbeat."""
        return ringstate.status(self.path, _copy(self._live()[0]))

    def snapshot(self, *, retries: int = SEQLOCK_RETRIES) -> ringstate.Snapshot:
        """A copy of the live state, consistent per slot (header protocol §1 and §2).

        Each comm identity, op slot and flow slot is taken from an attempt whose seqlock was
        even and unchanged across the copy. Slots still unstable after ``retries`` attempts
        (a writer frozen mid-write) are taken as they are and marked ``torn``; the snapshot is
        then ``consistent=False``. Never blocks, never waits for the writer.
        """
        header, region, _ = self._live()
        taken_ns = self._clock()
        status = ringstate.status(self.path, _copy(header))
        copies = ringstate.seqlock_copy(region, max(1, retries))
        return ringstate.snapshot(
            self.path, self._layout.comm_offset, copies, status=status, taken_ns=taken_ns
        )

    def live_copies(
        self, *, retries: int = SEQLOCK_RETRIES, with_status: bool = True
    ) -> tuple[ringstate.Status | None, ringstate.Copies, int]:
        """``(status, copies, taken_ns)``: what ``snapshot`` decodes, left as numpy slots.

        For readers that decode many rings in bulk (the agent's sampler, ``livestate``); the
        copies follow the same seqlock protocol, their values are not checked yet. The status
        (None unless ``with_status``) costs as much as a quarter of the copy: a 10 Hz reader
        may take it less often.
        """
        header, region, _ = self._live()
        taken_ns = self._clock()
        status = ringstate.status(self.path, _copy(header)) if with_status else None
        return status, ringstate.seqlock_copy(region, max(1, retries)), taken_ns

    def first_cursor(self) -> int:
        """The write index of the oldest record still in the ring (a cursor missing nothing)."""
        self._live()  # checks that the file is still whole
        return max(0, int(self._words_now()[_WRITTEN]) - self._layout.event_slots)

    def events_since(
        self, cursor: int, *, skip_pending: bool = False
    ) -> tuple[list[ringevents.Event], int, int]:
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
        _, _, events = self._live()
        n = self._layout.event_slots
        written = int(self._words_now()[_WRITTEN])
        if cursor > written:
            raise errors.RingCorrupt(
                self.path,
                f"write index {written} is behind the cursor {cursor}: it went backwards",
                region="header",
                offset=ringlayout.field_offset(ringlayout.HEADER, "events_written"),
                field="events_written",
            )
        missed = 0
        start = cursor
        if written - start > n:
            missed = written - n - start
            start = written - n
        if start == written:
            return [], written, missed
        records, stop, lost = ringevents.read(
            self.path, self._layout.event_offset, events, start, written, skip_pending=skip_pending
        )
        return records, stop, missed + lost

    def _words_now(self) -> npt.NDArray[np.uint64]:
        """The header's words; call after ``_live`` (which checks the file is whole)."""
        assert self._words is not None
        return self._words

    def _live(self) -> tuple[npt.NDArray[Any], ringstate.Region, npt.NDArray[Any]]:
        """The mapped views (header, live region, events), after checking the file is still
        whole (a read past EOF is SIGBUS)."""
        if (
            self._header is None
            or self._region is None
            or self._events is None
            or self._words is None
        ):
            raise ValueError(f"{self.path}: ring is closed")
        size = os.fstat(self._fd).st_size
        if size < self._layout.file_size:
            raise errors.RingCorrupt(
                self.path,
                f"file shrank to {size} bytes while open; the header says {self._layout.file_size}",
                region="file",
            )
        magic = int(self._words[_MAGIC])
        if magic != ringlayout.MAGIC:
            raise errors.RingCorrupt(
                self.path,
                f"magic changed to {magic:#x} while open",
                region="header",
                offset=0,
                field="magic",
            )
        return self._header, self._region, self._events


_MAGIC: Final = ringlayout.field_offset(ringlayout.HEADER, "magic") // 8
_WRITTEN: Final = ringlayout.field_offset(ringlayout.HEADER, "events_written") // 8


def _copy(header: npt.NDArray[Any]) -> np.void:
    """A copy of the mapped header: one memcpy (a structured copy goes field by field)."""
    record: np.void = header.view(np.uint8).copy().view(ringlayout.HEADER)[0]
    return record


def _validate_header(path: str, h: np.void, size: int) -> _Layout:
    """Header protocol §0: every format field checked against this reader's constants."""

    def corrupt(field: str, reason: str) -> errors.RingCorrupt:
        return errors.RingCorrupt(
            path,
            reason,
            region="header",
            offset=ringlayout.field_offset(ringlayout.HEADER, field),
            field=field,
        )

    def expect(field: str, want: int) -> None:
        got = int(h[field])
        if got != want:
            raise corrupt(field, f"expected {want}, got {got}")

    magic = int(h["magic"])
    if magic == 0:
        raise corrupt("magic", "is 0: the writer has not finished creating the file; retry later")
    if magic != ringlayout.MAGIC:
        raise corrupt(
            "magic", f"expected {ringlayout.MAGIC:#x}, got {magic:#x}: not a collscope ring"
        )
    if int(h["version"]) != ringlayout.VERSION:
        raise errors.RingVersionMismatch(path, int(h["version"]), ringlayout.VERSION)
    expect("header_size", ringlayout.HEADER_BYTES)
    file_size = int(h["file_size"])
    if not ringlayout.HEADER_BYTES <= file_size <= size:
        raise corrupt(
            "file_size",
            f"{file_size} is outside [{ringlayout.HEADER_BYTES}, {size}] (the file's size)",
        )
    expect("comm_slot_count", ringlayout.COMM_SLOTS)
    expect("comm_slot_size", ringlayout.COMM_SLOT.itemsize)
    expect("op_slots_per_comm", ringlayout.OPS_PER_COMM)
    expect("flow_slots_per_comm", ringlayout.FLOWS_PER_COMM)
    expect("op_slot_size", ringlayout.OP_SLOT.itemsize)
    expect("flow_slot_size", ringlayout.FLOW_SLOT.itemsize)
    expect("event_record_size", ringlayout.EVENT_BYTES)
    expect("comm_region_size", ringlayout.COMM_SLOTS * ringlayout.COMM_SLOT.itemsize)
    n = int(h["event_slot_count"])
    if n < 1:
        raise corrupt("event_slot_count", "is 0: the ring holds no records")
    expect("event_region_size", n * ringlayout.EVENT_BYTES)
    regions = []
    for name in ("comm", "event"):
        offset = int(h[f"{name}_region_offset"])
        end = offset + int(h[f"{name}_region_size"])
        if offset % 64 or offset < ringlayout.HEADER_BYTES or end > file_size:
            raise corrupt(
                f"{name}_region_offset",
                f"region [{offset}, {end}) is not 64-byte aligned inside "
                f"[{ringlayout.HEADER_BYTES}, {file_size})",
            )
        regions.append((offset, end))
    (c0, c1), (e0, e1) = regions
    if c0 < e1 and e0 < c1:
        raise corrupt(
            "event_region_offset", f"events [{e0}, {e1}) overlap communicators [{c0}, {c1})"
        )
    return _Layout(file_size=file_size, comm_offset=c0, event_offset=e0, event_slots=n)


def _identity(path: str, h: np.void, layout: _Layout) -> Identity:
    def text(field: str) -> str:
        check = ringlayout.Checker(
            path, "header", ringlayout.field_offset(ringlayout.HEADER, field)
        )
        return check.text(field, bytes(h[field]), ringlayout.field_size(ringlayout.HEADER, field))

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
        file_size=layout.file_size,
        event_slots=layout.event_slots,
    )
