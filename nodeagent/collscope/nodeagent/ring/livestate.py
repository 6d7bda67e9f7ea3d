"""Live state of a trace ring: seqlock copies of the comm, op and flow slots, decoded and checked.

The live-state region holds, per communicator, its identity, the ops it has in flight and, per
(channel, peer, direction), the cumulative chunk counters of notes/nccl-profiler.md §4 (send:
ready / sent / done; recv: posted / done / consumed, as docs/spec/bundle-v1.md ``state`` records
count them). The writer publishes each slot under a seqlock (ring header protocol §1); this
module copies them consistently (``seqlock_copy``) and turns the copies into typed records
(``snapshot``). ``ring.Ring.snapshot`` is the entry point.

Why one module: the copy takes only the live slots (the 10 Hz sampler's main cost,
bench/agent_ingest), which needs the slot geometry, plain views of the mapping and a retry
path of its own; they sit here beside the decoder that shares them.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from collscope.nodeagent import errors
from collscope.nodeagent.ring import layout

# Retries taken back to back before yielding the CPU between them: a plugin write lasts
# nanoseconds, so a slot still unstable after this many is held by a descheduled writer.
_SPIN_ATTEMPTS: Final = 8


@dataclasses.dataclass(frozen=True, slots=True)
class Status:
    """The header's live part: ring state, highest profiler API in use, counters, heartbeat."""

    state: str  # "init" | "active" | "idle"
    profiler_api: int
    events_written: int
    events_overwritten: int
    events_dropped: int
    comm_slots_exhausted: int
    flow_slots_exhausted: int
    op_slots_busy: int
    handles_exhausted: int
    pxn_foreign_events: int
    stale_flow_events: int
    heartbeat_ns: int
    heartbeat_count: int
    comms_open: int
    comms_total: int
    # KernelCh stops seen off the communicator's proxy thread (header, version 2): NCCL emits
    # none; nonzero means the plugin's one-thread-per-communicator assumption broke.
    kernel_foreign_events: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class OpState:
    """One op slot: an op enqueued and not complete (``state="active"``) or recently done.

    ``serial`` is the plugin's per-communicator op counter; ``seq`` NCCL's per-func seqNumber
    (point-to-point: this rank's own count). ``peer`` (point-to-point only) is a rank inside
    the communicator. ``kch_*``/``proxy_ops_*`` count the op's KernelCh and ProxyOp children.
    """

    slot: int
    state: str  # "active" | "done"
    serial: int
    seq: int
    op: str
    bytes: int
    dtype: str
    algo: str
    proto: str
    nchannels: int
    flags: int
    peer: int | None
    start_ns: int
    end_ns: int | None
    kch_started: int
    kch_done: int
    proxy_ops_started: int
    proxy_ops_done: int
    last_progress_ns: int
    torn: bool


@dataclasses.dataclass(frozen=True, slots=True)
class FlowState:
    """Chunk counters of one (channel, peer, direction) for the op whose ``serial`` it carries.

    Per direction (ring header, ``struct collscope_flow_slot``): send ``ready_posted`` = ready,
    ``sent_done`` = sent, ``done_consumed`` = done; recv ``ready_posted`` = posted,
    ``sent_done`` = done (arrived), ``done_consumed`` = consumed, ``gpu_ready`` = flushed.
    """

    slot: int
    dir: str  # "send" | "recv"
    channel: int
    peer: int
    state: str  # "free" | "queued" | "running" | "done"
    serial: int
    total: int
    started: int
    ready_posted: int
    sent_done: int
    done_consumed: int
    gpu_ready: int
    last_progress_ns: int
    torn: bool


@dataclasses.dataclass(frozen=True, slots=True)
class CommState:
    """One communicator with a live slot; ``enqueued``/``completed`` are indexed by func code."""

    slot: int
    state: str  # "active" | "finalized"
    generation: int
    comm_hash: int
    rank: int
    nranks: int
    nnodes: int
    profiler_api: int
    name: str
    init_ns: int
    finalize_ns: int | None
    ops_started: int
    ops_completed: int
    last_progress_ns: int
    last_completion_ns: int
    enqueued: tuple[int, ...]
    completed: tuple[int, ...]
    ops: tuple[OpState, ...]
    flows: tuple[FlowState, ...]
    torn: bool

    def in_flight(self) -> OpState | None:
        """The operation in flight: the active op with the lowest serial (protocol §2)."""
        active = [o for o in self.ops if o.state == "active"]
        return min(active, key=lambda o: o.serial) if active else None

    def flows_of(self, op: OpState) -> tuple[FlowState, ...]:
        """The flows whose counters belong to ``op`` (same serial)."""
        return tuple(f for f in self.flows if f.serial == op.serial)


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """The live state at ``taken_ns`` (CLOCK_REALTIME ns). ``torn`` counts slots copied while
    their writer was mid-write (after all retries); ``consistent`` is ``torn == 0``."""

    path: str
    taken_ns: int
    status: Status
    comms: tuple[CommState, ...]
    torn: int
    attempts: int

    @property
    def consistent(self) -> bool:
        return self.torn == 0


@dataclasses.dataclass(frozen=True, slots=True)
class Copies:
    """Per-slot copies of a ring's live communicators, each from an attempt where its seqlock
    held (or the latest attempt, flagged torn).

    Only communicator slots that are not free are copied, and of their flow slots only the
    visible ones (``dir`` not NONE): a slot left out was seen free and not being written.
    ``flows`` is flat, ordered by (communicator row, flow slot). The torn flags of a copy in
    which every seqlock held are shared read-only arrays of False.
    """

    slots: npt.NDArray[np.intp]  # (m,) comm slot index of each row, ascending
    comms: npt.NDArray[Any]  # (m,) COMM_HEAD: identity, counters and op slots
    ops: npt.NDArray[Any]  # (m, OPS_PER_COMM) OP_SLOT (a view of comms["ops"])
    flows: npt.NDArray[Any]  # (k,) FLOW_SLOT
    flow_comm: npt.NDArray[np.intp]  # (k,) row in ``comms`` of each flow
    flow_slot: npt.NDArray[np.intp]  # (k,) index of each flow among its comm's flow slots
    torn_comms: npt.NDArray[np.bool_]  # (m,)
    torn_ops: npt.NDArray[np.bool_]  # (m, OPS_PER_COMM)
    torn_flows: npt.NDArray[np.bool_]  # (k,)
    attempts: int
    # The ring's plausible span (its plugin's init time .. the reader's clock at the copy,
    # layout.TIME_SLACK_NS either side): times outside are rejected when decoded.
    since_ns: int = 0
    until_ns: int = layout.INT64_MAX

    def flow(self, comm_slot: int, flow_slot: int) -> np.void | None:
        """The copy of one flow slot, None when it was not copied (free, or a free comm)."""
        rows = np.flatnonzero(self.slots == comm_slot)
        if not len(rows):
            return None
        hit = np.flatnonzero((self.flow_comm == rows[0]) & (self.flow_slot == flow_slot))
        return self.flows[hit[0]] if len(hit) else None


_COUNTERS = [f for f in dataclasses.fields(Status) if f.name != "state"]


def _fields_struct(dtype: np.dtype[np.void], names: list[str]) -> tuple[struct.Struct, int]:
    """A ``struct`` reading the integer fields ``names`` of ``dtype`` in one call, and the
    offset to read it at: one unpack instead of a structured field lookup per field."""
    codes = {"<u4": "I", "<i4": "i", "<u8": "Q", "<i8": "q"}
    at = sorted((layout.field_offset(dtype, n), n) for n in names)
    start, fmt = at[0][0], "<"
    pos = start
    for offset, n in at:
        fmt += (f"{offset - pos}x" if offset > pos else "") + codes[dtype[n].str]
        pos = offset + dtype[n].itemsize
    return struct.Struct(fmt), start


_STATUS_NAMES: Final = sorted(
    ["state", *(f.name for f in _COUNTERS)],
    key=lambda n: layout.field_offset(layout.HEADER, n),
)
_STATUS, _STATUS_AT = _fields_struct(layout.HEADER, _STATUS_NAMES)
_OPS = layout.field_offset(layout.COMM_SLOT, "ops")
_FLOWS = layout.field_offset(layout.COMM_SLOT, "flows")
_OP_BYTES = layout.OP_SLOT.itemsize
_FLOW_BYTES = layout.FLOW_SLOT.itemsize
# The u32 columns of a comm slot holding its seqlock (identity) and its op slots' seqlocks.
_SEQ_COLS: Final = np.array(
    [0] + [(_OPS + j * _OP_BYTES) // 4 for j in range(layout.OPS_PER_COMM)], dtype=np.intp
)
# A comm slot's head and op slots seen as units of one op slot's size: the identity and
# counters are units [0, 4), op slot j is unit 4 + j; _UNIT_COL maps a unit to its seqlock's
# column in _SEQ_COLS (a retry copies the units whose seqlock did not hold).
_UNITS = _FLOWS // _OP_BYTES
_UNIT_COL: Final = np.array(
    [0] * (_OPS // _OP_BYTES) + list(range(1, layout.OPS_PER_COMM + 1)), dtype=np.intp
)
# The first 8 bytes of a comm slot are seqlock | state << 32 and of a flow slot seqlock |
# dir << 32 | ...: one aligned 8-byte load reads a slot's seqlock and its "in use" field at
# the same instant. Masks: in use, or seqlock odd (a write in progress).
_COMM_IN_USE: Final = np.uint64(
    (0xFFFF_FFFF << 8 * layout.field_offset(layout.COMM_SLOT, "state")) | 1
)
_FLOW_IN_USE: Final = np.uint64((0xFF << 8 * layout.field_offset(layout.FLOW_SLOT, "dir")) | 1)
# A flow slot's step counters (started, c_ready_posted ... c_gpu_ready: contiguous bytes),
# read as 0 while the flow is QUEUED (header protocol §2).
_STEPS = slice(
    layout.field_offset(layout.FLOW_SLOT, "started"),
    layout.field_offset(layout.FLOW_SLOT, "c_gpu_ready") + 4,
)
_FLOW_STATE = layout.field_offset(layout.FLOW_SLOT, "state")
# Torn flags of copies where every seqlock held (read-only: shared by every such copy).
_CLEAN_HEADS: Final = np.zeros((layout.COMM_SLOTS, len(_SEQ_COLS)), dtype=bool)
_CLEAN_FLOWS: Final = np.zeros(layout.COMM_SLOTS * layout.FLOWS_PER_COMM, dtype=bool)
_CLEAN_HEADS.flags.writeable = _CLEAN_FLOWS.flags.writeable = False
assert _OPS % _OP_BYTES == 0 and _FLOWS == _OPS + layout.OPS_PER_COMM * _OP_BYTES
assert _STEPS.stop - _STEPS.start == 4 * 5


class Region:
    """Plain views of a copy of comm slots (``(n,) COMM_SLOT``). A structured field view costs
    microseconds to make; each read of an attempt uses a few plain views, made when asked."""

    __slots__ = ("raw", "u32")

    def __init__(self, live: npt.NDArray[Any]) -> None:
        self.raw = live.view(np.uint8).reshape(len(live), live.dtype.itemsize)
        self.u32 = self.raw.view("<u4")  # (n, slot bytes / 4): seqlocks by column

    @property
    def word(self) -> npt.NDArray[np.uint64]:
        """(n,) seqlock | state << 32 of each comm slot."""
        word: npt.NDArray[np.uint64] = self.raw[:, :8].view("<u8")[:, 0]
        return word

    @property
    def heads(self) -> npt.NDArray[np.uint8]:
        """(n, units, OP_SLOT bytes): identity and counters, then the op slots."""
        return self.raw[:, :_FLOWS].reshape(len(self.raw), _UNITS, _OP_BYTES)

    @property
    def flows(self) -> npt.NDArray[np.uint8]:
        """(n, FLOWS_PER_COMM, FLOW_SLOT bytes)."""
        return self.raw[:, _FLOWS:].reshape(len(self.raw), layout.FLOWS_PER_COMM, _FLOW_BYTES)

    @property
    def flow_word(self) -> npt.NDArray[np.uint64]:
        """(n, FLOWS_PER_COMM) seqlock | dir << 32 ... of each flow slot."""
        word: npt.NDArray[np.uint64] = self.flows[:, :, :8].view("<u8")[:, :, 0]
        return word

    @property
    def flow_seq(self) -> npt.NDArray[np.uint32]:
        """(n, FLOWS_PER_COMM) seqlock of each flow slot."""
        seq: npt.NDArray[np.uint32] = self.flows[:, :, :4].view("<u4")[:, :, 0]
        return seq


def status(path: str, h: np.void) -> Status:
    """``Status`` from a copy of the header (``layout.HEADER``) of the ring at ``path``."""
    values = dict(zip(_STATUS_NAMES, _STATUS.unpack_from(h.tobytes(), _STATUS_AT), strict=True))
    check = layout.Checker(path, "header", layout.field_offset(layout.HEADER, "state"))
    state = check.enum("state", values.pop("state"), layout.RING_STATE_NAMES)
    return Status(state=state, **values)


# Reads comm slots ``[lo, hi)`` of the ring now, into a private copy (``ring.Ring`` preads
# them: a read of a file the tenant truncated is an error, where a mapping would be SIGBUS).
Read = Callable[[int, int], Region]


def seqlock_copy(
    read: Read, retries: int, *, span: tuple[int, int] = (0, layout.INT64_MAX)
) -> Copies:
    """Copy the live communicators under seqlocks (protocol §1), through ``read``.

    Which slots: a comm slot whose first word shows an even seqlock and state FREE is free at
    that instant and left out; every other comm slot is copied (identity, counters and op
    slots: 1.5 KiB), and of its flow slots those whose first word shows dir != NONE or an odd
    seqlock (a visible flow or one being written), 64 B each. At 8 communicators with 32 flows
    that is 28 KiB of the 152 KiB region, and the decode sees only those slots.

    "Shows": the first 8 bytes of a slot are its seqlock and its state (comm) or dir (flow),
    copied as one aligned 8-byte word, so both come from the same instant.

    An attempt is three reads, each a private copy of the file: the seqlocks before (the
    whole region: it also says which slots are live), the slots (from the first to the last
    live comm slot), the seqlocks after. Three, not two: a read's loads are ordered with the
    next read's (one system call after another) but not necessarily among themselves (the
    kernel's fast-string copy), so a slot's seqlock and its data are never taken from the
    same read. A slot whose readings agree and are even is final. Later attempts re-read only
    the slots still unstable. After ``retries`` attempts the remaining slots keep their latest
    copy, flagged torn. The copies are the protocol's values: a QUEUED flow's step counters
    are zeroed (header protocol §2, version 2: the writer leaves the previous op's there until
    the flow runs). ``span`` (the ring's plausible times, ns) travels with them.
    """
    a = read(0, layout.COMM_SLOTS)
    sel = np.flatnonzero(a.word & _COMM_IN_USE)
    fr, fc = np.nonzero(a.flow_word[sel] & _FLOW_IN_USE)
    frow = sel[fr]
    before = a.u32[sel[:, None], _SEQ_COLS]  # (m, 1 + OPS_PER_COMM)
    f1 = a.flow_seq[frow, fc]
    if len(sel):
        lo = int(sel[0])
        b = read(lo, int(sel[-1]) + 1)
        c = read(lo, int(sel[-1]) + 1)
    else:
        lo, b, c = 0, a, a
    # rows of b and c (the first live slot is slot 0 but for a job that freed some)
    brow, bfrow = (sel, frow) if lo == 0 else (sel - lo, frow - lo)
    head = b.raw[brow, :_FLOWS]  # one gather: identity, counters, op slots
    flows = b.flows[bfrow, fc]  # (k, 64)
    after = c.u32[brow[:, None], _SEQ_COLS]
    f2 = c.flow_seq[bfrow, fc]
    if _held(before, after) and _held(f1, f2):  # the usual case: nothing was being written
        need, fneed, attempt = _CLEAN_HEADS[: len(sel)], _CLEAN_FLOWS[: len(fr)], 1
    else:
        need = (before != after) | (before & 1).astype(bool)
        fneed = (f1 != f2) | (f1 & 1).astype(bool)
        attempt = _retry(
            read, retries, sel=sel, head=head, need=need, at=(frow, fc), flows=flows, fneed=fneed
        )
    queued = flows[:, _FLOW_STATE] == layout.FLOW_QUEUED
    if queued.any():
        flows[queued, _STEPS] = 0
    comms = np.frombuffer(head, layout.COMM_HEAD)  # a view (cheaper than .view())
    return Copies(
        slots=sel,
        comms=comms,
        ops=comms["ops"],
        flows=np.frombuffer(flows, layout.FLOW_SLOT),
        flow_comm=fr,
        flow_slot=fc,
        torn_comms=need[:, 0],
        torn_ops=need[:, 1:],
        torn_flows=fneed,
        attempts=attempt,
        since_ns=span[0],
        until_ns=span[1],
    )


def _retry(
    read: Read,
    retries: int,
    *,
    sel: npt.NDArray[np.intp],
    head: npt.NDArray[np.uint8],
    need: npt.NDArray[np.bool_],
    at: tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]],
    flows: npt.NDArray[np.uint8],
    fneed: npt.NDArray[np.bool_],
) -> int:
    """Attempts 2 .. ``retries`` on the slots whose seqlock did not hold (``need``: comm
    identities and op slots by row of ``head``; ``fneed``: flow slots at ``at``, (comm slot,
    flow slot) pairs), updating copies and flags in place; returns the attempts made. Each
    attempt reads the comm slots from the first to the last still unstable, three times."""
    frow, fc = at
    attempt = 1
    while attempt < retries and (need.any() or fneed.any()):
        attempt += 1
        if attempt > _SPIN_ATTEMPTS:
            # A writer preempted mid-write holds its seqlock odd for a scheduling quantum:
            # let it run if it shares our CPU (a yield, not a wait).
            os.sched_yield()
        ri = np.flatnonzero(need.any(axis=1))
        idx = np.flatnonzero(fneed)
        slots = np.concatenate((sel[ri], frow[idx]))
        lo, hi = int(slots.min()), int(slots.max()) + 1
        a, b, c = read(lo, hi), read(lo, hi), read(lo, hi)
        if len(ri):
            src = sel[ri] - lo
            s1 = a.u32[src[:, None], _SEQ_COLS]
            u, v = np.nonzero(need[ri][:, _UNIT_COL])
            # the latest try, held or not
            head.reshape(len(head), _UNITS, _OP_BYTES)[ri[u], v] = b.heads[src[u], v]
            s2 = c.u32[src[:, None], _SEQ_COLS]
            need[ri] &= (s1 != s2) | (s1 & 1).astype(bool)
        if len(idx):
            r, k = frow[idx] - lo, fc[idx]
            s1 = a.flow_seq[r, k]
            flows[idx] = b.flows[r, k]  # final where the seqlock held, the latest try else
            s2 = c.flow_seq[r, k]
            fneed[idx] = (s1 != s2) | (s1 & 1).astype(bool)
    return attempt


def _held(s1: npt.NDArray[np.uint32], s2: npt.NDArray[np.uint32]) -> bool:
    """Whether every seqlock read twice held: same value both times, and even. Cheaper than
    the per-slot flags when it holds (bytes compared, not a chain of numpy operations)."""
    return s1.tobytes() == s2.tobytes() and not (s1 & 1).any()


def snapshot(
    path: str, region_offset: int, copies: Copies, *, status: Status, taken_ns: int
) -> Snapshot:
    """Decode ``copies`` into a ``Snapshot``, checking every value (protocol §2).

    A slot that fails a check raises ``RingCorrupt``, unless it was torn: then it is left out
    (its writer froze mid-write, so its bytes are half old, half new).
    """
    out: list[CommState] = []
    torn = 0
    span = (copies.since_ns, copies.until_ns)
    size = layout.COMM_SLOT.itemsize
    bounds = np.searchsorted(copies.flow_comm, np.arange(len(copies.slots) + 1)).tolist()
    for row in np.flatnonzero(copies.comms["state"] != layout.COMM_FREE).tolist():
        i = int(copies.slots[row])
        c = copies.comms[row]
        base = region_offset + i * size
        check = layout.Checker(path, f"comm slot {i}", base, *span)
        code = int(c["state"])
        comm_torn = bool(copies.torn_comms[row])
        torn += comm_torn
        try:
            state = check.enum("state", code, layout.COMM_STATE_NAMES)
            nranks, rank = check.comm_ranks(int(c["nranks"]), int(c["rank"]), int(c["nnodes"]))
            name = check.text("name", bytes(c["name"]), layout.NAME_LEN)
        except errors.RingCorrupt:
            if comm_torn:
                continue
            raise
        ops = []
        for j, o in _rows(copies.ops[row], copies.ops[row]["state"] >= layout.OP_ACTIVE):
            t = bool(copies.torn_ops[row, j])
            torn += t
            offset = base + _OPS + j * layout.OP_SLOT.itemsize
            op_check = layout.Checker(path, f"comm slot {i} op {j}", offset, *span)
            try:
                ops.append(_op(op_check, j, o, nranks, t))
            except errors.RingCorrupt:
                if not t:
                    raise
        flows = []
        lo, hi = bounds[row], bounds[row + 1]
        mine = copies.flows[lo:hi]
        for n, f in _rows(mine, mine["dir"] != layout.DIR_NONE):
            k = int(copies.flow_slot[lo + n])
            t = bool(copies.torn_flows[lo + n])
            torn += t
            offset = base + _FLOWS + k * layout.FLOW_SLOT.itemsize
            flow_check = layout.Checker(path, f"comm slot {i} flow {k}", offset, *span)
            try:
                flows.append(_flow(flow_check, k, f, nranks, t))
            except errors.RingCorrupt:
                if not t:
                    raise
        fin = check.time("finalize_ns", int(c["finalize_ns"]))
        out.append(
            CommState(
                slot=i,
                state=state,
                generation=int(c["generation"]),
                comm_hash=int(c["comm_hash"]),
                rank=rank,
                nranks=nranks,
                nnodes=int(c["nnodes"]),
                profiler_api=int(c["profiler_api"]),
                name=name,
                init_ns=check.time("init_ns", int(c["init_ns"])),
                finalize_ns=fin or None,
                ops_started=int(c["ops_started"]),
                ops_completed=int(c["ops_completed"]),
                last_progress_ns=check.time("last_progress_ns", int(c["last_progress_ns"])),
                last_completion_ns=check.time("last_completion_ns", int(c["last_completion_ns"])),
                enqueued=tuple(c["enqueued"].tolist()),
                completed=tuple(c["completed"].tolist()),
                ops=tuple(ops),
                flows=tuple(flows),
                torn=comm_torn,
            )
        )
    return Snapshot(path, taken_ns, status, tuple(out), torn, copies.attempts)


def _rows(
    slots: npt.NDArray[Any], selected: npt.NDArray[np.bool_]
) -> list[tuple[int, dict[str, Any]]]:
    """(index, fields as Python values) of the selected slots: one conversion for all of
    them, much cheaper than reading numpy scalars field by field."""
    index = np.flatnonzero(selected)
    names = slots.dtype.names or ()
    return [
        (int(k), dict(zip(names, row, strict=True)))
        for k, row in zip(index, slots[index].tolist(), strict=True)
    ]


def _op(check: layout.Checker, j: int, o: dict[str, Any], nranks: int, torn: bool) -> OpState:
    state = check.enum("state", o["state"], layout.OP_STATE_NAMES)
    flags = o["flags"]
    p2p = bool(flags & layout.OPF_P2P)
    end = o["end_ns"]
    limit = layout.INT64_MAX
    return OpState(
        slot=j,
        state=state,
        serial=o["serial"],
        seq=check.at_most("seq", o["seq"], limit),
        op=check.func(o["func"]),
        bytes=check.at_most("bytes", o["bytes"], limit),
        dtype=check.name("dtype", o["dtype"], layout.DTYPE_NAMES),
        algo=check.name("algo", o["algo"], layout.ALGO_NAMES),
        proto=check.name("proto", o["proto"], layout.PROTO_NAMES),
        nchannels=o["nchannels"],
        flags=flags,
        peer=check.peer("peer", o["peer"], nranks) if p2p else None,
        start_ns=check.time("start_ns", o["start_ns"]),
        end_ns=check.time("end_ns", end) if state == "done" else None,
        # each count: the proxy thread's field plus its `_other` twin (header, version 2)
        kch_started=o["kch_started"] + o["kch_started_other"],
        kch_done=o["kch_done"] + o["kch_done_other"],
        proxy_ops_started=o["proxy_ops_started"] + o["proxy_ops_started_other"],
        proxy_ops_done=o["proxy_ops_done"] + o["proxy_ops_done_other"],
        last_progress_ns=check.time("last_progress_ns", o["last_progress_ns"]),
        torn=torn,
    )


def _flow(check: layout.Checker, k: int, f: dict[str, Any], nranks: int, torn: bool) -> FlowState:
    return FlowState(
        slot=k,
        dir=check.enum("dir", f["dir"], layout.DIR_NAMES),
        channel=f["channel"],
        peer=check.peer("peer", f["peer"], nranks),
        state=check.enum("state", f["state"], layout.FLOW_STATE_NAMES),
        serial=f["serial"],
        total=f["total"],
        started=f["started"],
        ready_posted=f["c_ready_posted"],
        sent_done=f["c_sent_done"],
        done_consumed=f["c_done_consumed"],
        gpu_ready=f["c_gpu_ready"],
        last_progress_ns=check.time("last_progress_ns", f["last_progress_ns"]),
        torn=torn,
    )
