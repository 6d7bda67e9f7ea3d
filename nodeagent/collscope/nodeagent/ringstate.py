"""Live state of a trace ring: seqlock copies of the comm, op and flow slots, decoded and checked.

The live-state region holds, per communicator, its identity, the ops it has in flight and, per
(channel, peer, direction), the cumulative chunk counters of notes/nccl-profiler.md §4 (send:
ready / sent / done; recv: posted / done / consumed, as spec/bundle-v1.md ``state`` records
count them). The writer publishes each slot under a seqlock (ring header protocol §1); this
module copies them consistently (``seqlock_copy``) and turns the copies into typed records
(``snapshot``). ``ring.Ring.snapshot`` is the entry point.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from collscope.nodeagent import errors, ringlayout

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
    """Per-slot copies of the live region, each from an attempt where its seqlock held."""

    comms: npt.NDArray[Any]  # (COMM_SLOTS,) COMM_SLOT
    ops: npt.NDArray[Any]  # (COMM_SLOTS, OPS_PER_COMM) OP_SLOT
    flows: npt.NDArray[Any]  # (COMM_SLOTS, FLOWS_PER_COMM) FLOW_SLOT
    torn_comms: npt.NDArray[np.bool_]
    torn_ops: npt.NDArray[np.bool_]
    torn_flows: npt.NDArray[np.bool_]
    attempts: int


_COUNTERS = [f for f in dataclasses.fields(Status) if f.name != "state"]
# A flow slot's step counters: read as 0 while the flow is QUEUED (header protocol §2).
_STEP_COUNTERS: Final = (
    "started",
    "c_ready_posted",
    "c_sent_done",
    "c_done_consumed",
    "c_gpu_ready",
)
_OPS = ringlayout.field_offset(ringlayout.COMM_SLOT, "ops")
_FLOWS = ringlayout.field_offset(ringlayout.COMM_SLOT, "flows")


def status(path: str, h: np.void) -> Status:
    """``Status`` from a copy of the header (``ringlayout.HEADER``) of the ring at ``path``."""
    check = ringlayout.Checker(path, "header", ringlayout.field_offset(ringlayout.HEADER, "state"))
    state = check.enum("state", int(h["state"]), ringlayout.RING_STATE_NAMES)
    counters = {f.name: int(h[f.name]) for f in _COUNTERS}
    return Status(state=state, **counters)


def seqlock_copy(live: npt.NDArray[Any], retries: int) -> Copies:
    """Copy the live region ``live`` (a view of the comm slots) slot by slot under seqlocks.

    The first attempt reads every seqlock, copies the whole region in one go (152 KiB) and
    reads the seqlocks again; a slot whose two readings agree and are even is final. Later
    attempts re-read only the slots still unstable, so their window is a few microseconds.
    After ``retries`` attempts the remaining slots keep their latest copy, flagged torn.
    The copies are the protocol's values: a QUEUED flow's step counters are zeroed (header
    protocol §2, version 2: the writer leaves the previous op's there until the flow runs).
    """
    raw = live.view(np.uint8).reshape(len(live), live.dtype.itemsize)
    before = _seqlocks(live)
    copy = raw.copy()  # one memcpy; a structured copy would go field by field
    after = _seqlocks(live)
    data = copy.view(live.dtype).reshape(len(live))
    need = [(s1 != s2) | (s1 % 2 == 1) for s1, s2 in zip(before, after, strict=True)]
    # A comm slot's retry copies its identity and counters only, not its ops and flows.
    head = ringlayout.field_offset(ringlayout.COMM_SLOT, "ops")
    attempt = 1
    while attempt < retries and any(bool(n.any()) for n in need):
        attempt += 1
        if attempt > _SPIN_ATTEMPTS:
            # A writer preempted mid-write holds its seqlock odd for a scheduling quantum:
            # let it run if it shares our CPU (a yield, not a wait).
            os.sched_yield()
        idx = np.nonzero(need[0])
        if len(idx[0]):
            s1 = live["seqlock"][idx]
            copy[idx[0], :head] = raw[idx[0], :head]
            s2 = live["seqlock"][idx]
            need[0][idx[0][(s1 == s2) & (s1 % 2 == 0)]] = False
        for view, out, want in zip(
            (live["ops"], live["flows"]), (data["ops"], data["flows"]), need[1:], strict=True
        ):
            idx = np.nonzero(want)
            if not len(idx[0]):
                continue
            s1 = view["seqlock"][idx]
            out[idx] = view[idx]  # final where the seqlock held, the latest try elsewhere
            s2 = view["seqlock"][idx]
            good = (s1 == s2) & (s1 % 2 == 0)
            want[tuple(i[good] for i in idx)] = False
    flows = data["flows"]
    queued = flows["state"] == ringlayout.FLOW_QUEUED
    if queued.any():
        for name in _STEP_COUNTERS:
            flows[name][queued] = 0
    return Copies(data, data["ops"], flows, need[0], need[1], need[2], attempt)


def _seqlocks(live: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], ...]:
    return (
        live["seqlock"].copy(),
        live["ops"]["seqlock"].copy(),
        live["flows"]["seqlock"].copy(),
    )


def snapshot(
    path: str, region_offset: int, copies: Copies, *, status: Status, taken_ns: int
) -> Snapshot:
    """Decode ``copies`` into a ``Snapshot``, checking every value (protocol §2).

    A slot that fails a check raises ``RingCorrupt``, unless it was torn: then it is left out
    (its writer froze mid-write, so its bytes are half old, half new).
    """
    out: list[CommState] = []
    torn = 0
    size = ringlayout.COMM_SLOT.itemsize
    for i in (int(i) for i in np.flatnonzero(copies.comms["state"] != ringlayout.COMM_FREE)):
        c = copies.comms[i]
        base = region_offset + i * size
        check = ringlayout.Checker(path, f"comm slot {i}", base)
        code = int(c["state"])
        comm_torn = bool(copies.torn_comms[i])
        torn += comm_torn
        try:
            state = check.enum("state", code, ringlayout.COMM_STATE_NAMES)
            nranks, rank = check.comm_ranks(int(c["nranks"]), int(c["rank"]), int(c["nnodes"]))
            name = check.text("name", bytes(c["name"]), ringlayout.NAME_LEN)
        except errors.RingCorrupt:
            if comm_torn:
                continue
            raise
        ops = []
        for j, o in _rows(copies.ops[i], copies.ops[i]["state"] >= ringlayout.OP_ACTIVE):
            t = bool(copies.torn_ops[i, j])
            torn += t
            offset = base + _OPS + j * ringlayout.OP_SLOT.itemsize
            op_check = ringlayout.Checker(path, f"comm slot {i} op {j}", offset)
            try:
                ops.append(_op(op_check, j, o, nranks, t))
            except errors.RingCorrupt:
                if not t:
                    raise
        flows = []
        for k, f in _rows(copies.flows[i], copies.flows[i]["dir"] != ringlayout.DIR_NONE):
            t = bool(copies.torn_flows[i, k])
            torn += t
            offset = base + _FLOWS + k * ringlayout.FLOW_SLOT.itemsize
            flow_check = ringlayout.Checker(path, f"comm slot {i} flow {k}", offset)
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


def _op(check: ringlayout.Checker, j: int, o: dict[str, Any], nranks: int, torn: bool) -> OpState:
    state = check.enum("state", o["state"], ringlayout.OP_STATE_NAMES)
    flags = o["flags"]
    p2p = bool(flags & ringlayout.OPF_P2P)
    end = o["end_ns"]
    limit = ringlayout.INT64_MAX
    return OpState(
        slot=j,
        state=state,
        serial=o["serial"],
        seq=check.at_most("seq", o["seq"], limit),
        op=check.func(o["func"]),
        bytes=check.at_most("bytes", o["bytes"], limit),
        dtype=check.name("dtype", o["dtype"], ringlayout.DTYPE_NAMES),
        algo=check.name("algo", o["algo"], ringlayout.ALGO_NAMES),
        proto=check.name("proto", o["proto"], ringlayout.PROTO_NAMES),
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


def _flow(
    check: ringlayout.Checker, k: int, f: dict[str, Any], nranks: int, torn: bool
) -> FlowState:
    return FlowState(
        slot=k,
        dir=check.enum("dir", f["dir"], ringlayout.DIR_NAMES),
        channel=f["channel"],
        peer=check.peer("peer", f["peer"], nranks),
        state=check.enum("state", f["state"], ringlayout.FLOW_STATE_NAMES),
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
