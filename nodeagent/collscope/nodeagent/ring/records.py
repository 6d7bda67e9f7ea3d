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

``dump`` does all of it for the rings of one job (``collscope ring dump``): each ring's records,
peers mapped across all of them, and a summary of the ring for a person.

A value the models reject (e.g. ``sent > ready`` from a faulty writer) raises
``errors.RingCorrupt`` naming the slot or record, ``from`` pydantic's error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pydantic

from collscope.nodeagent import errors
from collscope.nodeagent.bundle import models
from collscope.nodeagent.ring import eventlog, livestate, reader

PeerMap = Mapping[tuple[int, int], int]
_M = TypeVar("_M", bound=pydantic.BaseModel)


def comm_hex(comm_hash: int) -> str:
    """The communicator id as bundle-v1 writes it: lowercase hex with ``0x``."""
    return f"{comm_hash:#x}"


def peer_ranks(
    rank: int, snapshot: livestate.Snapshot, events: Iterable[eventlog.Event] = ()
) -> dict[tuple[int, int], int]:
    """(comm hash, comm rank) -> ``rank`` for every communicator the ring of ``rank`` knows."""
    out = {(c.comm_hash, c.rank): rank for c in snapshot.comms}
    for e in events:
        if isinstance(e, eventlog.CommEvent):
            out[(e.comm_hash, e.rank)] = rank
    return out


def untranslated(
    snapshot: livestate.Snapshot, events: Iterable[eventlog.Event], peers: PeerMap
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
        if isinstance(e, eventlog.OpEvent) and e.peer is not None
    }
    return {key for key in wanted if key not in peers}


def comm_records(
    rank: int, snapshot: livestate.Snapshot, events: Iterable[eventlog.Event] = ()
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
        if isinstance(e, eventlog.CommEvent) and e.kind == "init":
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
    rank: int, path: str, events: Iterable[eventlog.Event], peers: PeerMap
) -> list[models.OpRecord]:
    """One ``op`` record per completion record, written at its end (``ts`` = ``end``)."""
    out = []
    for e in events:
        if not isinstance(e, eventlog.OpEvent):
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
    rank: int, snapshot: livestate.Snapshot, peers: PeerMap
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


@dataclasses.dataclass(frozen=True, slots=True)
class Dump:
    """One ring as bundle-v1 records: its ``comm`` records, then ``op``, then ``state``.

    ``events`` records were read and ``missed`` were overwritten before they could be;
    ``unknown`` holds the (comm hash, comm rank) of peers left as communicator ranks.
    """

    identity: reader.Identity
    rank: int
    snapshot: livestate.Snapshot
    records: list[models.CommRecord | models.OpRecord | models.StateRecord]
    events: int
    missed: int
    unknown: set[tuple[int, int]]

    def summary(self) -> str:
        """A few lines for a person: who wrote the ring, its counters, what is live in it."""
        i, st = self.identity, self.snapshot.status
        age_s = (self.snapshot.taken_ns - st.heartbeat_ns) / 1e9
        comms = ", ".join(
            f"{comm_hex(c.comm_hash)} rank {c.rank}/{c.nranks} {c.state}"
            + (f" '{c.name}'" if c.name else "")
            for c in self.snapshot.comms
        )
        lines = [
            f"{i.path}: pid {i.pid}, rank {self.rank} (local {_unset(i.local_rank)}, world "
            f"{_unset(i.world_size)}), "
            f"host {i.hostname or '?'}, pod {i.pod_namespace or '?'}/{i.pod_name or '?'}, "
            f"node {i.node_name or '?'}",
            f"  NCCL {i.nccl_version or '?'}, plugin {i.plugin_version}, profiler API "
            f"v{st.profiler_api}, ring {st.state}, heartbeat {age_s:.1f}s ago, "
            f"{st.comms_open} of {st.comms_total} communicators open",
            f"  events: {st.events_written} written, {self.events} read, {self.missed} "
            f"overwritten before read (ring of {i.event_slots}), {st.events_dropped} "
            "completions dropped",
            f"  exhausted: comm slots {st.comm_slots_exhausted}, flow slots "
            f"{st.flow_slots_exhausted}, op slots busy {st.op_slots_busy}, handles "
            f"{st.handles_exhausted}; PXN foreign {st.pxn_foreign_events}, stale flow events "
            f"{st.stale_flow_events}",
            f"  live: {comms or 'no communicator'}; snapshot "
            + (
                "consistent"
                if self.snapshot.consistent
                else f"INCONSISTENT ({self.snapshot.torn} torn slots)"
            ),
        ]
        if self.unknown:
            lines.append(
                f"  {len(self.unknown)} peer(s) left as communicator ranks (their rings were "
                "not given)"
            )
        return "\n".join(lines)


def dump(paths: Sequence[str], *, rank: int | None = None) -> Iterator[Dump]:
    """The rings at ``paths`` (those of one job) as records, one ``Dump`` per ring, in order.

    Every ring is read before the first is yielded: the peers of each are mapped to global
    ranks with what all of them know. The records of a ring are made when it is yielded, so a
    defect in the third ring raises after the first two were handed out. ``rank`` stands in for
    a ring whose writer had no ``RANK``; without it such a ring raises ``errors.RingRankUnset``.
    Besides, what ``reader.open`` raises, and ``errors.RingCorrupt`` for a value the models
    reject.
    """
    read = []
    for path in paths:
        with reader.open(path) as r:
            ring_rank = r.identity.rank if r.identity.rank is not None else rank
            if ring_rank is None:
                raise errors.RingRankUnset(path)
            snap = r.snapshot()
            # a dump is often a post-mortem: an append cut short by death must not hide the rest
            events, _, missed = r.events_since(0, skip_pending=True)
            read.append((r.identity, ring_rank, snap, events, missed))
    peers: dict[tuple[int, int], int] = {}
    for _, ring_rank, snap, events, _ in read:
        peers |= peer_ranks(ring_rank, snap, events)
    for identity, ring_rank, snap, events, missed in read:
        yield Dump(
            identity=identity,
            rank=ring_rank,
            snapshot=snap,
            records=[
                *comm_records(ring_rank, snap, events),
                *op_records(ring_rank, identity.path, events, peers),
                *state_records(ring_rank, snap, peers),
            ],
            events=len(events),
            missed=missed,
            unknown=untranslated(snap, events, peers),
        )


def _flows(c: livestate.CommState, op: livestate.OpState) -> list[livestate.FlowState]:
    # A slot in state "free" is claimed but not yet given to an op: its serial is stale. A torn
    # slot (writer frozen mid-write) is kept when its counters are still ordered: it is the
    # flow a hang analysis most wants.
    return sorted(
        (f for f in c.flows_of(op) if f.state != "free" and (not f.torn or _ordered(f))),
        key=lambda f: (f.channel, f.dir != "send", f.peer),
    )


def _ordered(f: livestate.FlowState) -> bool:
    return f.ready_posted >= f.sent_done >= f.done_consumed


def _flow(f: livestate.FlowState, comm: int, now_ns: int, peers: PeerMap) -> dict[str, Any]:
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


def _unset(value: int | None) -> str:
    return "?" if value is None else str(value)
