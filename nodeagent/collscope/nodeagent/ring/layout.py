"""The ring file's binary layout (version 2), mirrored from ``native/include/collscope_ring.h``.

The C header is the single source of truth (STYLE habit 11); this module only restates it as
numpy structured dtypes and Python constants so that ``ring`` can read the file zero-copy.
``tests/unit/nodeagent/ring/test_layout.py`` compiles a program against the header and checks
every size, offset and constant here, so a drift fails a test instead of misreading a file.

File layout (all little-endian, naturally aligned, no pointers)::

    [0, 4096)                     HEADER            format, regions, identity, counters
    [comm_region_offset, +size)   COMM_SLOT x 16    identity, per-func counters,
                                                    OP_SLOT x 8 (ops in flight),
                                                    FLOW_SLOT x 128 (chunk counters)
    [event_region_offset, +size)  EVENT x N         64-byte completion / communicator records

Strings are fixed-size ``char`` arrays, NUL-terminated by the writer (``S<n>`` here).
``Checker`` holds the value domains of the fields (enumeration codes, ranks, times): a value
outside its domain is reported as ``errors.RingCorrupt``, never passed on.

Why one module: it restates the header's fields one per line, in the header's order, to be
read side by side with it and checked against it by one test; ``Checker`` is the domains of
those same fields, and a field and its domain change together.
"""

from __future__ import annotations

import dataclasses
from typing import Final

import numpy as np

from collscope.nodeagent import errors

MAGIC: Final = 0x474E495250435343  # b"CSCPRING" read as a little-endian uint64
VERSION: Final = 2
HEADER_BYTES: Final = 4096
EVENT_BYTES: Final = 64
COMM_SLOTS: Final = 16
OPS_PER_COMM: Final = 8
FLOWS_PER_COMM: Final = 128
NAME_LEN: Final = 64
COMM_RECORD_NAME_LEN: Final = 24  # name bytes of a comm record, NUL included
FUNC_COUNT: Final = 16

# header.state
RING_STATE_INIT: Final = 0
RING_STATE_ACTIVE: Final = 1
RING_STATE_IDLE: Final = 2
RING_STATE_NAMES: Final = ("init", "active", "idle")

# comm_slot.state
COMM_FREE: Final = 0
COMM_ACTIVE: Final = 1
COMM_FINALIZED: Final = 2
COMM_STATE_NAMES: Final = ("free", "active", "finalized")

# op_slot.state
OP_EMPTY: Final = 0
OP_CLAIMING: Final = 1
OP_ACTIVE: Final = 2
OP_DONE: Final = 3
OP_STATE_NAMES: Final = ("empty", "claiming", "active", "done")

# flow_slot.dir and flow_slot.state
DIR_NONE: Final = 0
DIR_SEND: Final = 1
DIR_RECV: Final = 2
DIR_NAMES: Final = ("", "send", "recv")
FLOW_FREE: Final = 0
FLOW_QUEUED: Final = 1
FLOW_RUNNING: Final = 2
FLOW_DONE: Final = 3
FLOW_STATE_NAMES: Final = ("free", "queued", "running", "done")

# event.type
EV_NONE: Final = 0
EV_OP: Final = 1
EV_COMM_INIT: Final = 2
EV_COMM_FINALIZE: Final = 3

# op flags
OPF_P2P: Final = 0x01
OPF_KERNEL: Final = 0x02
OPF_PROXY: Final = 0x04
OPF_GPU_TIMED: Final = 0x08
OPF_END_AT_ENQUEUE: Final = 0x10
OPF_NO_CHILDREN: Final = 0x20

EVENT_IDX_BUSY: Final = 2**64 - 1  # idx of an event slot while its writer fills it
NO_SLOT: Final = 0xFF  # comm_slot of an event whose communicator got no live slot

# Names by code, as bundle-v1 records spell them. None marks a code the header leaves
# unassigned: a record carrying one is corrupt. Code 0 ("unknown") is the empty string, except
# for func, where bundle-v1 requires a non-empty op name.
FUNC_NAMES: Final[tuple[str | None, ...]] = (
    "Unknown",
    "AllReduce",
    "AllGather",
    "ReduceScatter",
    "Broadcast",
    "Reduce",
    "Send",
    "Recv",
    "AllToAll",
    "Gather",
    "Scatter",
    "AllGatherV",
    "SendRecv",
    None,
    None,
    "Other",
)
ALGO_NAMES: Final[tuple[str, ...]] = (
    "",
    "Tree",
    "Ring",
    "CollNetDirect",
    "CollNetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
)
PROTO_NAMES: Final[tuple[str, ...]] = ("", "LL", "LL128", "Simple")
DTYPE_NAMES: Final[tuple[str, ...]] = (
    "",
    "int8",
    "uint8",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bfloat16",
    "float8e4m3",
    "float8e5m2",
)

HEADER: Final = np.dtype(
    [
        ("magic", "<u8"),
        ("version", "<u4"),
        ("header_size", "<u4"),
        ("file_size", "<u8"),
        ("state", "<u4"),
        ("profiler_api", "<u4"),
        ("comm_region_offset", "<u8"),
        ("comm_region_size", "<u8"),
        ("comm_slot_count", "<u4"),
        ("comm_slot_size", "<u4"),
        ("op_slots_per_comm", "<u4"),
        ("flow_slots_per_comm", "<u4"),
        ("event_region_offset", "<u8"),
        ("event_region_size", "<u8"),
        ("event_slot_count", "<u4"),
        ("event_record_size", "<u4"),
        ("op_slot_size", "<u4"),
        ("flow_slot_size", "<u4"),
        ("pid", "<i4"),
        ("rank", "<i4"),
        ("local_rank", "<i4"),
        ("world_size", "<i4"),
        ("nccl_version_code", "<i4"),
        ("activation_mask", "<u4"),
        ("init_realtime_ns", "<i8"),
        ("init_monotonic_ns", "<i8"),
        ("coarse_res_ns", "<i8"),
        ("reserved0", "<u8", (6,)),
        ("hostname", "S128"),
        ("pod_name", "S128"),
        ("pod_namespace", "S64"),
        ("node_name", "S128"),
        ("nccl_version", "S32"),
        ("plugin_version", "S32"),
        ("reserved1", "<u8", (8,)),
        ("events_written", "<u8"),
        ("events_overwritten", "<u8"),
        ("events_dropped", "<u8"),
        ("comm_slots_exhausted", "<u8"),
        ("flow_slots_exhausted", "<u8"),
        ("op_slots_busy", "<u8"),
        ("handles_exhausted", "<u8"),
        ("pxn_foreign_events", "<u8"),
        ("heartbeat_ns", "<i8"),
        ("heartbeat_count", "<u8"),
        ("comms_open", "<u8"),
        ("comms_total", "<u8"),
        ("stale_flow_events", "<u8"),
        ("kernel_foreign_events", "<u8"),
        ("reserved2", "<u8", (2,)),
        ("pad", "u1", (HEADER_BYTES - 896,)),
    ]
)

# An op slot's seqlock covers bytes [0, 64); kch_started onwards are independent atomics
# (header protocol §1), as are a comm slot's fields from ops_started on (its seqlock covers
# the identity, [0, 128)). Each child count is the sum of a field and its ``_other`` twin
# (version 2: events on the communicator's proxy thread / on any other thread).
OP_SLOT: Final = np.dtype(
    [
        ("seqlock", "<u4"),
        ("state", "<u4"),
        ("serial", "<u8"),
        ("seq", "<u8"),
        ("bytes", "<u8"),
        ("start_ns", "<i8"),
        ("end_ns", "<i8"),
        ("func", "u1"),
        ("algo", "u1"),
        ("proto", "u1"),
        ("nchannels", "u1"),
        ("dtype", "u1"),
        ("flags", "u1"),
        ("reserved0", "<u2"),
        ("peer", "<i4"),
        ("reserved1", "<u4"),
        ("kch_started", "<u4"),
        ("kch_done", "<u4"),
        ("proxy_ops_started", "<u4"),
        ("proxy_ops_done", "<u4"),
        ("last_progress_ns", "<i8"),
        ("kch_started_other", "<u4"),
        ("kch_done_other", "<u4"),
        ("proxy_ops_started_other", "<u4"),
        ("proxy_ops_done_other", "<u4"),
        ("reserved2", "<u4", (6,)),
    ]
)

FLOW_SLOT: Final = np.dtype(
    [
        ("seqlock", "<u4"),
        ("dir", "u1"),
        ("channel", "u1"),
        ("state", "u1"),
        ("reserved0", "u1"),
        ("peer", "<i4"),
        ("reserved1", "<u4"),
        ("key", "<u8"),
        ("serial", "<u8"),
        ("total", "<u4"),
        ("started", "<u4"),
        ("c_ready_posted", "<u4"),
        ("c_sent_done", "<u4"),
        ("c_done_consumed", "<u4"),
        ("c_gpu_ready", "<u4"),
        ("last_progress_ns", "<i8"),
    ]
)

COMM_SLOT: Final = np.dtype(
    [
        ("seqlock", "<u4"),
        ("state", "<u4"),
        ("comm_hash", "<u8"),
        ("rank", "<i4"),
        ("nranks", "<i4"),
        ("nnodes", "<i4"),
        ("profiler_api", "<u4"),
        ("init_ns", "<i8"),
        ("finalize_ns", "<i8"),
        ("generation", "<u4"),
        ("reserved0", "<u4"),
        ("reserved1", "<u8"),
        ("name", f"S{NAME_LEN}"),
        ("ops_started", "<u8"),
        ("ops_completed", "<u8"),
        ("last_progress_ns", "<i8"),
        ("last_completion_ns", "<i8"),
        ("reserved2", "<u8", (12,)),
        ("enqueued", "<u8", (FUNC_COUNT,)),
        ("completed", "<u8", (FUNC_COUNT,)),
        ("ops", OP_SLOT, (OPS_PER_COMM,)),
        ("flows", FLOW_SLOT, (FLOWS_PER_COMM,)),
    ]
)


def _prefix(dtype: np.dtype[np.void], stop: str) -> np.dtype[np.void]:
    """The fields of ``dtype`` before field ``stop``, with ``stop``'s offset as the size."""
    assert dtype.names is not None and dtype.fields is not None
    names = dtype.names[: dtype.names.index(stop)]
    return np.dtype(
        {
            "names": list(names),
            "formats": [dtype.fields[n][0] for n in names],
            "offsets": [dtype.fields[n][1] for n in names],
            "itemsize": dtype.fields[stop][1],
        }
    )


# A comm slot without its flow slots ([0, 1536): identity, counters, op slots): what a reader
# copies whole for each live communicator; of the flow slots it copies only the visible ones.
# Not a C struct: a prefix of struct collscope_comm_slot, so not in STRUCTS below.
COMM_HEAD: Final = _prefix(COMM_SLOT, "flows")

OP_RECORD: Final = np.dtype(
    [
        ("idx", "<u8"),
        ("type", "u1"),
        ("func", "u1"),
        ("algo", "u1"),
        ("proto", "u1"),
        ("nchannels", "u1"),
        ("dtype", "u1"),
        ("flags", "u1"),
        ("comm_slot", "u1"),
        ("comm_hash", "<u8"),
        ("seq", "<u8"),
        ("bytes", "<u8"),
        ("start_ns", "<i8"),
        ("end_ns", "<i8"),
        ("peer", "<i4"),
        ("gpu_ns", "<u4"),
    ]
)

COMM_RECORD: Final = np.dtype(
    [
        ("idx", "<u8"),
        ("type", "u1"),
        ("profiler_api", "u1"),
        ("comm_slot", "u1"),
        ("reserved0", "u1"),
        ("rank", "<i4"),
        ("comm_hash", "<u8"),
        ("time_ns", "<i8"),
        ("nranks", "<i4"),
        ("nnodes", "<i4"),
        ("name", f"S{COMM_RECORD_NAME_LEN}"),
    ]
)

# union collscope_event: the common prefix (idx, type) and the raw bytes; a record's bytes are
# viewed as OP_RECORD or COMM_RECORD once its type is known.
EVENT: Final = np.dtype(
    {
        "names": ["idx", "type", "raw"],
        "formats": ["<u8", "u1", ("u1", (EVENT_BYTES,))],
        "offsets": [0, 8, 0],
        "itemsize": EVENT_BYTES,
    }
)

# C struct name for each dtype above: what the ABI test compiles against.
STRUCTS: Final[dict[str, np.dtype[np.void]]] = {
    "struct collscope_ring_header": HEADER,
    "struct collscope_comm_slot": COMM_SLOT,
    "struct collscope_op_slot": OP_SLOT,
    "struct collscope_flow_slot": FLOW_SLOT,
    "struct collscope_op_record": OP_RECORD,
    "struct collscope_comm_record": COMM_RECORD,
}


def field_offset(dtype: np.dtype[np.void], name: str) -> int:
    """Byte offset of field ``name`` in a struct dtype above (``offsetof`` in the header)."""
    assert dtype.fields is not None
    return int(dtype.fields[name][1])


def field_size(dtype: np.dtype[np.void], name: str) -> int:
    """Byte size of field ``name`` in a struct dtype above (``sizeof`` of the member)."""
    assert dtype.fields is not None
    return int(dtype.fields[name][0].itemsize)


# bundle-v1 stores times, sizes and sequence numbers as signed 64-bit integers.
INT64_MAX: Final = 2**63 - 1

# Plausible times (issue 15 item 3). Every time a ring hands out is CLOCK_REALTIME ns written
# by its tenant: one far from the job's life (a comm with ``init_ns = 1``) made analysis ask
# for a list of 1.8e9 ticks. A ring's times must lie between the plugin's own init time and
# the reader's clock (same machine, same clock), with this much slack either side for a clock
# step (NTP slews; a step of a minute is already an incident) and for the reader's clock being
# read just before a record it copies.
TIME_SLACK_NS: Final = 60 * 10**9
# The plugin's init time itself must be after 2020-01-01T00:00Z: no machine running this
# plugin (NCCL 2.23+, 2024) has an earlier CLOCK_REALTIME.
EPOCH_FLOOR_NS: Final = 1_577_836_800 * 10**9


@dataclasses.dataclass(frozen=True, slots=True)
class Checker:
    """Checks the values of one slot or record; ``RingCorrupt`` names file, region and field."""

    path: str
    region: str
    offset: int
    # Times outside [since_ns, until_ns] are not plausible (0 stays "not yet known").
    since_ns: int = 0
    until_ns: int = INT64_MAX

    def corrupt(self, field: str, reason: str) -> errors.RingCorrupt:
        return errors.RingCorrupt(
            self.path, reason, region=self.region, offset=self.offset, field=field
        )

    def at_most(self, field: str, value: int, limit: int) -> int:
        if not 0 <= value <= limit:
            raise self.corrupt(field, f"{value} is outside [0, {limit}]")
        return value

    def time(self, field: str, value: int) -> int:
        """A CLOCK_REALTIME time in ns: 0 (not yet known) or inside the ring's plausible span
        ``[since_ns, until_ns]``."""
        if value and not self.since_ns <= value <= self.until_ns:
            raise self.corrupt(
                field,
                f"time {value} is outside the ring's plausible span [{self.since_ns}, "
                f"{self.until_ns}] (plugin init - {TIME_SLACK_NS // 10**9} s .. reader's "
                f"clock + {TIME_SLACK_NS // 10**9} s)",
            )
        return self.at_most(field, value, INT64_MAX)

    def name(self, field: str, code: int, names: tuple[str | None, ...]) -> str:
        name = names[code] if 0 <= code < len(names) else None
        if name is None:
            raise self.corrupt(field, f"code {code} is not assigned in the header")
        return name

    def enum(self, field: str, code: int, names: tuple[str, ...]) -> str:
        return self.name(field, code, names)

    def func(self, code: int) -> str:
        return self.name("func", code, FUNC_NAMES)

    def comm_slot(self, index: int) -> int | None:
        if index == NO_SLOT:
            return None
        if not 0 <= index < COMM_SLOTS:
            raise self.corrupt("comm_slot", f"{index} is neither a slot index nor NO_SLOT")
        return index

    def peer(self, field: str, value: int, nranks: int | None) -> int:
        """A rank inside a communicator of ``nranks`` ranks (None: size unknown here)."""
        limit = (nranks if nranks is not None else 2**31) - 1
        if not 0 <= value <= limit:
            raise self.corrupt(field, f"peer rank {value} is outside [0, {limit}]")
        return value

    def comm_ranks(self, nranks: int, rank: int, nnodes: int) -> tuple[int, int]:
        if nranks < 1:
            raise self.corrupt("nranks", f"{nranks} ranks: must be >= 1")
        if nnodes < 1:
            raise self.corrupt("nnodes", f"{nnodes} nodes: must be >= 1")
        return nranks, self.peer("rank", rank, nranks)

    def text(self, field: str, raw: bytes, size: int) -> str:
        """A NUL-terminated ``char[size]``; invalid UTF-8 (a name truncated mid-character by
        the writer) is replaced, a missing terminator is corruption."""
        if len(raw) >= size:
            raise self.corrupt(field, f"string of {size} bytes has no NUL terminator")
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")
