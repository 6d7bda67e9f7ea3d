"""Ring contents as docs/spec/bundle-v1.md records: ``comm``, ``op`` and ``state``.

``state_records`` turns a live snapshot into one ``state`` record per communicator that has an
operation in flight (the op slot with the lowest serial, ring header protocol §2), with one flow
per (channel, peer, direction) of that op and ``idle_ns`` = snapshot time - the flow's last
progress (notes/nccl-profiler.md §4 for what each counter means). ``op_records`` turns
completion records into ``op`` records, ``comm_records`` the communicators into ``comm``
records. Sample output (one ``state`` line)::

    {"type": "state", "rank": 3, "ts": 1732001234100000000, "comm": "0x1f3a", "seq": 881,
     "op": "AllReduce", "bytes": 4194304, "start": 1732001233990000000,
     "flows": [{"channel": 3, "peer": 17, "dir": "send", "total": 64, "ready": 40,
                "sent": 40, "done": 31, "idle_ns": 2100000000}]}

Peers. The ring stores peers as ranks *inside the communicator*; bundle-v1 wants global ranks.
``peer_ranks`` learns (comm hash, comm rank) -> global rank from one ring's communicators;
merge the maps of every ring of a job and pass the result. A peer missing from the map keeps
its communicator rank (right for a communicator of the whole job in rank order, the common
case; ``untranslated`` lists the others so that a caller can say so).

A value the models reject (e.g. ``sent > ready`` from a faulty writer) raises
``errors.RingCorrupt`` naming the slot or record, ``from`` pydantic's error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import pydantic

from collscope.nodeagent import errors, ringevents, ringstate
from collscope.nodeagent.bundle import models

PeerMap = Mapping[tuple[int, int], int]
_M = TypeVar("_M", bound=pydantic.BaseModel)


def comm_hex(comm_hash: int) -> str:
    """The communicator id as bundle-v1 writes it: lowercase hex with ``0x``."""
    return f"{comm_hash:#x}"


def peer_ranks(
    rank: int, snapshot: ringstate.Snapshot, events: Iterable[ringevents.Event] = ()
) -> dict[tuple[int, int], int]:
    """(comm hash, comm rank) -> ``rank`` for every communicator the ring of ``rank`` knows."""
    out = {(c.comm_hash, c.rank): rank for c in snapshot.comms}
    for e in events:
        if isinstance(e, ringevents.CommEvent):
            out[(e.comm_hash, e.rank)] = rank
    return out


def untranslated(
    snapshot: ringstate.Snapshot, events: Iterable[ringevents.Event], peers: PeerMap
) -> set[tuple[int, int]]:
    """(comm hash, comm rank) of the peers that ``peers`` cannot map to a global rank."""
    wanted = {
        (c.comm_hash, f.peer)
        for c in snapshot.comms
        if (op := c.in_flight()) is not None
        for f in _flows(c, op)
    }
    wanted |= {
        (e.comm_hash, e.peer)
        for e in events
        if isinstance(e, ringevents.OpEvent) and e.peer is not None
    }
    return {key for key in wanted if key not in peers}


def comm_records(
    rank: int, snapshot: ringstate.Snapshot, events: Iterable[ringevents.Event] = ()
) -> list[models.CommRecord]:
    """One ``comm`` record per communicator: the live slots (full names), then the init
    records of communicators whose slot has been reused since; in time order."""
    seen: dict[tuple[int, int], models.CommRecord] = {}
    for c in snapshot.comms:
        seen[(c.comm_hash, c.rank)] = _model(
            models.CommRecord,
            snapshot.path,
            f"comm slot {c.slot}",
            rank=rank,
            ts=c.init_ns,
            comm=comm_hex(c.comm_hash),
            comm_rank=c.rank,
            nranks=c.nranks,
            nnodes=c.nnodes,
            name=c.name,
        )
    for e in events:
        if isinstance(e, ringevents.CommEvent) and e.kind == "init":
            seen.setdefault(
                (e.comm_hash, e.rank),
                _model(
                    models.CommRecord,
                    snapshot.path,
                    f"event {e.index}",
                    rank=rank,
                    ts=e.time_ns,
                    comm=comm_hex(e.comm_hash),
                    comm_rank=e.rank,
                    nranks=e.nranks,
                    nnodes=e.nnodes,
                    name=e.name,
                ),
            )
    return sorted(seen.values(), key=lambda r: (r.ts, r.comm))


def op_records(
    rank: int, path: str, events: Iterable[ringevents.Event], peers: PeerMap
) -> list[models.OpRecord]:
    """One ``op`` record per completion record, written at its end (``ts`` = ``end``)."""
    out = []
    for e in events:
        if not isinstance(e, ringevents.OpEvent):
            continue
        # Start and end are CLOCK_REALTIME readings: a clock stepped back by NTP between the
        # two would make end < start, which bundle-v1 rejects; the op then took ~0 ns.
        end = max(e.end_ns, e.start_ns)
        peer = None if e.peer is None else peers.get((e.comm_hash, e.peer), e.peer)
        out.append(
            _model(
                models.OpRecord,
                path,
                f"event {e.index}",
                rank=rank,
                ts=end,
                comm=comm_hex(e.comm_hash),
                seq=e.seq,
                op=e.op,
                bytes=e.bytes,
                dtype=e.dtype,
                algo=e.algo,
                proto=e.proto,
                channels=e.nchannels,
                start=e.start_ns,
                end=end,
                peer=peer,
            )
        )
    return out


def state_records(
    rank: int, snapshot: ringstate.Snapshot, peers: PeerMap
) -> list[models.StateRecord]:
    """One ``state`` record per communicator with an op in flight, stamped at the snapshot."""
    out = []
    for c in snapshot.comms:
        op = c.in_flight()
        if op is None:
            continue
        flows = [_flow(f, c.comm_hash, snapshot.taken_ns, peers) for f in _flows(c, op)]
        # GPU-side progress (bundle-v1 `kernel`): known once KernelCh events arrive for the op.
        kernel = {"channels": op.nchannels, "done": op.kch_done} if op.kch_started else None
        out.append(
            _model(
                models.StateRecord,
                snapshot.path,
                f"comm slot {c.slot} op {op.slot}",
                rank=rank,
                ts=snapshot.taken_ns,
                comm=comm_hex(c.comm_hash),
                seq=op.seq,
                op=op.op,
                bytes=op.bytes,
                start=op.start_ns,
                flows=flows,
                kernel=kernel,
            )
        )
    return out


def _flows(c: ringstate.CommState, op: ringstate.OpState) -> list[ringstate.FlowState]:
    # A slot in state "free" is claimed but not yet given to an op: its serial is stale. A torn
    # slot (writer frozen mid-write) is kept when its counters are still ordered: it is the
    # flow a hang analysis most wants.
    return sorted(
        (f for f in c.flows_of(op) if f.state != "free" and (not f.torn or _ordered(f))),
        key=lambda f: (f.channel, f.dir != "send", f.peer),
    )


def _ordered(f: ringstate.FlowState) -> bool:
    return f.ready_posted >= f.sent_done >= f.done_consumed


def _flow(f: ringstate.FlowState, comm: int, now_ns: int, peers: PeerMap) -> dict[str, Any]:
    flow: dict[str, Any] = {
        "channel": f.channel,
        "peer": peers.get((comm, f.peer), f.peer),
        "dir": f.dir,
        "total": f.total,
        # The plugin stamps progress with the coarse clock, which lags the precise one.
        "idle_ns": max(0, now_ns - f.last_progress_ns),
    }
    if f.dir == "send":
        flow |= {"ready": f.ready_posted, "sent": f.sent_done, "done": f.done_consumed}
    else:
        flow |= {"posted": f.ready_posted, "done": f.sent_done, "consumed": f.done_consumed}
    return flow


def _model(cls: type[_M], path: str, region: str, **fields: Any) -> _M:
    try:
        return cls(**fields)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        raise errors.RingCorrupt(
            path,
            f"not a valid bundle-v1 {cls.__name__}: {first['msg']}",
            region=region,
            field=where,
        ) from e
