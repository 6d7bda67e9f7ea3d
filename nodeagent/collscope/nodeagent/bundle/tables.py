"""The in-memory form of a trace bundle: columnar numpy tables, the input of analysis.

Why columnar: a bundle of a 4,096-rank job holds millions of state flows; as Python objects they
would take ten times their JSON size, as numpy rows they take about a third of it. Every table
is a structured array sorted by (rank, time); strings (communicator ids, op, algo and proto
names) are interned into two string tables and referenced by index.

Shapes (one row each):

- ``comms``  COMM_DTYPE: a ``comm`` record.
- ``ops``    OP_DTYPE: an ``op`` completion record; ``peer`` is -1 for collectives.
- ``states`` STATE_DTYPE: a ``state`` record; its flows are ``flows[flow_lo:flow_hi]``;
  ``kernel_channels`` is -1 when the record has no ``kernel`` object.
- ``flows``  FLOW_DTYPE: one (channel, peer, dir) entry of a state record. ``dir`` is
  SEND (0) or RECV (1). Send rows use ``ready``/``sent``/``done``; recv rows use
  ``posted``/``done``/``consumed``; the unused columns hold -1.
- ``hw``     HW_DTYPE: a ``hw`` record, names interned in ``strings``.
- ``liveness`` LIVENESS_DTYPE: a line of ``liveness.jsonl`` (the writer process of a rank as
  its node agent saw it); ``state`` indexes ``LIVENESS_STATES``, ``heartbeat`` is -1 when
  unknown.

``BundleBuilder`` is the one way to make a ``Bundle``: the reader feeds it parsed lines, the
simulator feeds it generated records. Both call the same ``add_*`` methods.

Why one module: the dtypes, the ``Bundle`` that reads them and the ``BundleBuilder`` that fills
them agree on every column, on the interned strings and on the (rank, time) order; a column
added to a dtype is met by its reader and its writer in the same file. The sorting and
remapping helpers at the end serve the builder only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from collscope.nodeagent import errors
from collscope.nodeagent.bundle import models

SEND = 0
RECV = 1
DIRS = ("send", "recv")

COMM_DTYPE = np.dtype(
    [
        ("rank", "i4"),
        ("ts", "i8"),
        ("comm", "i4"),
        ("comm_rank", "i4"),
        ("nranks", "i4"),
        ("nnodes", "i4"),
        ("name", "i4"),
    ]
)
OP_DTYPE = np.dtype(
    [
        ("rank", "i4"),
        ("ts", "i8"),
        ("comm", "i4"),
        ("seq", "i8"),
        ("op", "i4"),
        ("bytes", "i8"),
        ("dtype", "i4"),
        ("algo", "i4"),
        ("proto", "i4"),
        ("channels", "i4"),
        ("peer", "i4"),
        ("start", "i8"),
        ("end", "i8"),
    ]
)
STATE_DTYPE = np.dtype(
    [
        ("rank", "i4"),
        ("ts", "i8"),
        ("comm", "i4"),
        ("seq", "i8"),
        ("op", "i4"),
        ("bytes", "i8"),
        ("start", "i8"),
        ("kernel_channels", "i4"),
        ("kernel_done", "i4"),
        ("flow_lo", "i8"),
        ("flow_hi", "i8"),
    ]
)
FLOW_DTYPE = np.dtype(
    [
        ("channel", "i4"),
        ("peer", "i4"),
        ("dir", "i1"),
        ("total", "i8"),
        ("ready", "i8"),
        ("sent", "i8"),
        ("posted", "i8"),
        ("done", "i8"),
        ("consumed", "i8"),
        ("idle_ns", "i8"),
    ]
)
HW_DTYPE = np.dtype(
    [
        ("rank", "i4"),
        ("ts", "i8"),
        ("node", "i4"),
        ("device", "i4"),
        ("metric", "i4"),
        ("value", "f8"),
    ]
)

LIVENESS_DTYPE = np.dtype(
    [
        ("rank", "i4"),
        ("ts", "i8"),
        ("heartbeat", "i8"),
        ("state", "i1"),
    ]
)
# ``liveness.jsonl`` states, in the order of their codes in LIVENESS_DTYPE's ``state``.
LIVENESS_STATES = models.LIVENESS_STATES

Table = npt.NDArray[np.void]


def no_liveness() -> Table:
    """An empty liveness table (bundles written before ``liveness.jsonl`` existed)."""
    return np.zeros(0, LIVENESS_DTYPE)


class Tables(Protocol):
    """Tables with their own string tables: a ``Bundle``, or a decoded ``columnar.Part``."""

    @property
    def comm_ids(self) -> tuple[str, ...]: ...
    @property
    def strings(self) -> tuple[str, ...]: ...
    @property
    def comms(self) -> Table: ...
    @property
    def ops(self) -> Table: ...
    @property
    def states(self) -> Table: ...
    @property
    def flows(self) -> Table: ...
    @property
    def hw(self) -> Table: ...
    @property
    def liveness(self) -> Table: ...


@dataclass(frozen=True)
class Bundle:
    """A whole (or windowed) trace bundle in columnar form. Immutable once built.

    ``liveness`` comes last with a default: code that cuts or shifts tables and does not know
    it makes a bundle without it, which analyses as a bundle of before ``liveness.jsonl``.
    """

    job: models.Job
    comm_ids: tuple[str, ...]
    strings: tuple[str, ...]
    comms: Table
    ops: Table
    states: Table
    flows: Table
    hw: Table
    source: str = "<memory>"
    liveness: Table = field(default_factory=no_liveness)

    def comm_id(self, index: int) -> str:
        return self.comm_ids[index]

    def string(self, index: int) -> str:
        return self.strings[index]

    def comm_index(self, comm_id: str) -> int | None:
        """Index of a communicator id in the tables, or None when the bundle never saw it."""
        try:
            return self.comm_ids.index(comm_id)
        except ValueError:
            return None

    def string_index(self, text: str) -> int | None:
        try:
            return self.strings.index(text)
        except ValueError:
            return None

    def state_flows(self, state_row: int) -> Table:
        """The flow rows of one state record (a view, no copy)."""
        row = self.states[state_row]
        return self.flows[int(row["flow_lo"]) : int(row["flow_hi"])]

    @property
    def ranks(self) -> npt.NDArray[np.int32]:
        """Every global rank that wrote at least one record, sorted."""
        parts = [t["rank"] for t in (self.comms, self.ops, self.states) if len(t)]
        if not parts:
            return np.zeros(0, dtype=np.int32)
        return np.unique(np.concatenate(parts)).astype(np.int32)

    def time_span(self) -> tuple[int, int] | None:
        """(first, last) record timestamp in ns, or None for an empty bundle."""
        parts = [t["ts"] for t in (self.comms, self.ops, self.states, self.hw) if len(t)]
        if not parts:
            return None
        joined = np.concatenate(parts)
        return int(joined.min()), int(joined.max())

    def iter_records(
        self,
    ) -> Iterator[models.CommRecord | models.OpRecord | models.StateRecord | models.HwRecord]:
        """Every record as its pydantic model: comms, then ops, states, hw (writer, tests)."""
        s = self.strings
        for c in self.comms:
            yield models.CommRecord(
                rank=int(c["rank"]),
                ts=int(c["ts"]),
                comm=self.comm_ids[c["comm"]],
                comm_rank=int(c["comm_rank"]),
                nranks=int(c["nranks"]),
                nnodes=int(c["nnodes"]),
                name=s[c["name"]],
            )
        for o in self.ops:
            peer = int(o["peer"])
            yield models.OpRecord(
                rank=int(o["rank"]),
                ts=int(o["ts"]),
                comm=self.comm_ids[o["comm"]],
                seq=int(o["seq"]),
                op=s[o["op"]],
                bytes=int(o["bytes"]),
                dtype=s[o["dtype"]],
                algo=s[o["algo"]],
                proto=s[o["proto"]],
                channels=int(o["channels"]),
                start=int(o["start"]),
                end=int(o["end"]),
                peer=None if peer < 0 else peer,
            )
        for i, st in enumerate(self.states):
            flows: list[models.SendFlow | models.RecvFlow] = []
            for f in self.state_flows(i):
                flows.append(flow_model(f))
            kc = int(st["kernel_channels"])
            yield models.StateRecord(
                rank=int(st["rank"]),
                ts=int(st["ts"]),
                comm=self.comm_ids[st["comm"]],
                seq=int(st["seq"]),
                op=s[st["op"]],
                bytes=int(st["bytes"]),
                start=int(st["start"]),
                flows=flows,
                kernel=None
                if kc < 0
                else models.KernelProgress(channels=kc, done=int(st["kernel_done"])),
            )
        for h in self.hw:
            yield models.HwRecord(
                rank=int(h["rank"]),
                ts=int(h["ts"]),
                node=s[h["node"]],
                device=s[h["device"]],
                metric=s[h["metric"]],
                value=float(h["value"]),
            )

    def iter_liveness(self) -> Iterator[models.LivenessRecord]:
        """Every ``liveness.jsonl`` line as its model, in (rank, time) order (writer, tests)."""
        for row in self.liveness:
            beat = int(row["heartbeat"])
            yield models.LivenessRecord(
                rank=int(row["rank"]),
                ts=int(row["ts"]),
                state=LIVENESS_STATES[int(row["state"])],
                heartbeat=None if beat < 0 else beat,
            )


def flow_model(row: Any) -> models.SendFlow | models.RecvFlow:
    """One FLOW_DTYPE row as its pydantic model."""
    if int(row["dir"]) == SEND:
        return models.SendFlow(
            channel=int(row["channel"]),
            peer=int(row["peer"]),
            dir="send",
            total=int(row["total"]),
            ready=int(row["ready"]),
            sent=int(row["sent"]),
            done=int(row["done"]),
            idle_ns=int(row["idle_ns"]),
        )
    return models.RecvFlow(
        channel=int(row["channel"]),
        peer=int(row["peer"]),
        dir="recv",
        total=int(row["total"]),
        posted=int(row["posted"]),
        done=int(row["done"]),
        consumed=int(row["consumed"]),
        idle_ns=int(row["idle_ns"]),
    )


def net_flow_models(
    endpoints: Sequence[str],
    switches: Sequence[str],
    columns: tuple[npt.NDArray[np.integer[Any]], ...],
    sw_ptr: npt.NDArray[np.integer[Any]],
    sw_idx: npt.NDArray[np.integer[Any]],
) -> Iterator[models.NetFlow]:
    """Columnar flows back to ``flows.jsonl`` models, row by row (to write a window out).

    ``columns`` = (ts, src, dst, bytes, duration), one value per flow, ``src``/``dst`` indexing
    ``endpoints``; flow ``i`` crossed ``switches[sw_idx[sw_ptr[i]:sw_ptr[i + 1]]]`` (CSR).
    """
    ptr, names = sw_ptr.tolist(), [switches[j] for j in sw_idx.tolist()]
    ts, src, dst, nbytes, duration = (c.tolist() for c in columns)
    for i, (t, s, d, nb, du) in enumerate(zip(ts, src, dst, nbytes, duration, strict=True)):
        yield models.NetFlow.model_construct(
            ts=t,
            src=endpoints[s],
            dst=endpoints[d],
            bytes=nb,
            duration=du,
            switches=names[ptr[i] : ptr[i + 1]],
        )


@dataclass
class _Interner:
    values: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)

    def __call__(self, text: str) -> int:
        i = self.index.get(text)
        if i is None:
            i = len(self.values)
            self.values.append(text)
            self.index[text] = i
        return i


# Rows wait as tuples until this many accumulate, then are copied into their table's numpy
# array. A tuple row costs about three times its numpy row (a state record with 8 flows: ~1.7 KB
# as tuples, ~0.6 KB as numpy rows, ~1 KB as JSON), so the backlog is kept short: ~2 MB a table.
_CHUNK_ROWS = 8192
# A full array grows by this factor with realloc(), which extends large blocks in place
# (mremap): the peak is the table plus this margin, never the table plus a copy of it. Small,
# since in-place growth is cheap: ~100 reallocs take a table from 8k to 1G rows.
_GROWTH = 1.125


class _Rows:
    """The rows of one table: a growing numpy array plus a short backlog of tuples."""

    def __init__(self, dtype: np.dtype[np.void]) -> None:
        self.dtype = dtype
        self.buf: Table = np.empty(0, dtype=dtype)
        self.size = 0  # rows of buf in use; the rest is growth margin
        self.pending: list[tuple[Any, ...]] = []
        self.shared = False  # buf went into a Bundle: copy it before writing to it again

    def __len__(self) -> int:
        return self.size + len(self.pending)

    def append(self, row: tuple[Any, ...]) -> None:
        self.pending.append(row)
        if len(self.pending) >= _CHUNK_ROWS:
            self._flush()

    def extend(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self.pending.extend(rows)
        if len(self.pending) >= _CHUNK_ROWS:
            self._flush()

    def extend_array(self, rows: Table) -> None:
        """Append whole rows of this table's dtype, after any waiting tuples."""
        self._flush()
        need = self.size + len(rows)
        self._reserve(need)
        self.buf[self.size : need] = rows
        self.size = need

    def _flush(self) -> None:
        if not self.pending:
            return
        need = self.size + len(self.pending)
        self._reserve(need)
        self.buf[self.size : need] = self.pending
        self.size = need
        self.pending = []

    def _reserve(self, need: int) -> None:
        if self.shared:
            self.buf = self.buf[: self.size].copy()
            self.shared = False
        if need > len(self.buf):
            self.buf.resize(
                max(need, int(len(self.buf) * _GROWTH), _CHUNK_ROWS), refcheck=False
            )  # buf owns its data and no view of it exists

    def array(self) -> Table:
        """Every row as one array, without the growth margin (shrunk in place, not copied)."""
        self._flush()
        if len(self.buf) != self.size:
            self.buf.resize(self.size, refcheck=False)
        self.shared = True
        return self.buf


# A flow as the builder takes it: (channel, peer, dir, total, ready, sent, posted, done,
# consumed, idle_ns), dir SEND/RECV, unused counts -1. Tuples, not models: the simulator emits
# millions of them.
FlowTuple = tuple[int, int, int, int, int, int, int, int, int, int]


class BundleBuilder:
    """Accumulates records row by row and turns them into a sorted ``Bundle``.

    Rows wait as Python tuples in a short backlog (``_CHUNK_ROWS``), then go into one growing
    numpy array per table, so memory follows the numpy size; callers that stream (the reader)
    filter before adding, so only the window they asked for is ever held.
    """

    def __init__(self, job: models.Job, *, source: str = "<memory>") -> None:
        self.job = job
        self.source = source
        self._comm = _Interner()
        self._str = _Interner()
        self._str("")  # index 0 is the empty string: absent algo/proto/dtype/name
        self._comms = _Rows(COMM_DTYPE)
        self._ops = _Rows(OP_DTYPE)
        self._states = _Rows(STATE_DTYPE)
        self._flows = _Rows(FLOW_DTYPE)
        self._hw = _Rows(HW_DTYPE)
        self._liveness = _Rows(LIVENESS_DTYPE)

    def add_comm(
        self,
        *,
        rank: int,
        ts: int,
        comm: str,
        comm_rank: int,
        nranks: int,
        nnodes: int = 1,
        name: str = "",
    ) -> None:
        self._comms.append((rank, ts, self._comm(comm), comm_rank, nranks, nnodes, self._str(name)))

    def add_op(
        self,
        *,
        rank: int,
        ts: int,
        comm: str,
        seq: int,
        op: str,
        nbytes: int,
        start: int,
        end: int,
        dtype: str = "",
        algo: str = "",
        proto: str = "",
        channels: int = 0,
        peer: int | None = None,
    ) -> None:
        self._ops.append(
            (
                rank,
                ts,
                self._comm(comm),
                seq,
                self._str(op),
                nbytes,
                self._str(dtype),
                self._str(algo),
                self._str(proto),
                channels,
                -1 if peer is None else peer,
                start,
                end,
            )
        )

    def add_state(
        self,
        *,
        rank: int,
        ts: int,
        comm: str,
        seq: int,
        op: str,
        nbytes: int,
        start: int,
        flows: Sequence[FlowTuple] = (),
        kernel: tuple[int, int] | None = None,
    ) -> None:
        lo = len(self._flows)
        self._flows.extend(flows)
        kc, kd = kernel if kernel is not None else (-1, -1)
        self._states.append(
            (
                rank,
                ts,
                self._comm(comm),
                seq,
                self._str(op),
                nbytes,
                start,
                kc,
                kd,
                lo,
                len(self._flows),
            )
        )

    def add_hw(
        self, *, rank: int, ts: int, node: str, device: str, metric: str, value: float
    ) -> None:
        self._hw.append((rank, ts, self._str(node), self._str(device), self._str(metric), value))

    def add_liveness(
        self, *, rank: int, ts: int, state: models.LivenessState, heartbeat: int | None = None
    ) -> None:
        """One ``liveness.jsonl`` line (``heartbeat`` None: unknown)."""
        code = LIVENESS_STATES.index(state)
        self._liveness.append((rank, ts, -1 if heartbeat is None else heartbeat, code))

    def add_record(
        self, rec: models.CommRecord | models.OpRecord | models.StateRecord | models.HwRecord
    ) -> None:
        """Add one validated record model (the reader's slow path, tests)."""
        if isinstance(rec, models.CommRecord):
            self.add_comm(
                rank=rec.rank,
                ts=rec.ts,
                comm=rec.comm,
                comm_rank=rec.comm_rank,
                nranks=rec.nranks,
                nnodes=rec.nnodes,
                name=rec.name,
            )
        elif isinstance(rec, models.OpRecord):
            self.add_op(
                rank=rec.rank,
                ts=rec.ts,
                comm=rec.comm,
                seq=rec.seq,
                op=rec.op,
                nbytes=rec.bytes,
                start=rec.start,
                end=rec.end,
                dtype=rec.dtype,
                algo=rec.algo,
                proto=rec.proto,
                channels=rec.channels,
                peer=rec.peer,
            )
        elif isinstance(rec, models.StateRecord):
            self.add_state(
                rank=rec.rank,
                ts=rec.ts,
                comm=rec.comm,
                seq=rec.seq,
                op=rec.op,
                nbytes=rec.bytes,
                start=rec.start,
                flows=[flow_tuple(f) for f in rec.flows],
                kernel=None if rec.kernel is None else (rec.kernel.channels, rec.kernel.done),
            )
        else:
            self.add_hw(
                rank=rec.rank,
                ts=rec.ts,
                node=rec.node,
                device=rec.device,
                metric=rec.metric,
                value=rec.value,
            )

    def add_tables(self, part: Tables) -> None:
        """Add every row of ``part`` at once, as adding its records one by one in the order of
        ``Bundle.iter_records()`` would (the same interning order, so the same tables).

        Trusts ``part``: it comes validated (``columnar.decode``, a ``Bundle``).
        """
        ops, states, hw = part.ops, part.states, part.hw
        comm = _remap(self._comm, part.comm_ids, [part.comms["comm"], ops["comm"], states["comm"]])
        names = [part.comms["name"], _interleaved(ops, ("op", "dtype", "algo", "proto"))]
        names += [states["op"], _interleaved(hw, ("node", "device", "metric"))]
        text = _remap(self._str, part.strings, names)
        comms = part.comms.copy()
        comms["comm"], comms["name"] = comm[comms["comm"]], text[comms["name"]]
        ops = ops.copy()
        ops["comm"] = comm[ops["comm"]]
        for col in ("op", "dtype", "algo", "proto"):
            ops[col] = text[ops[col]]
        states, flows = contiguous_flows(states, part.flows)
        states = states.copy()
        states["comm"], states["op"] = comm[states["comm"]], text[states["op"]]
        base = len(self._flows)
        states["flow_lo"] += base
        states["flow_hi"] += base
        hw = hw.copy()
        for col in ("node", "device", "metric"):
            hw[col] = text[hw[col]]
        self._comms.extend_array(comms)
        self._ops.extend_array(ops)
        self._states.extend_array(states)
        self._flows.extend_array(flows)
        self._hw.extend_array(hw)
        self._liveness.extend_array(part.liveness)

    def build(self) -> Bundle:
        """Sort every table by (rank, time) and return the immutable ``Bundle``."""
        comms = _sorted(self._comms.array(), ("rank", "comm"))
        ops = _sorted(self._ops.array(), ("rank", "end", "comm"))
        states = self._states.array()
        flows = self._flows.array()
        order = np.lexsort((states["comm"], states["ts"], states["rank"]))
        if len(order) and not np.all(order[1:] > order[:-1]):
            states, flows = _reorder_states(states, flows, order)
        hw = _sorted(self._hw.array(), ("rank", "ts"))
        liveness = _sorted(self._liveness.array(), ("rank", "ts"))
        _check_span(self.source, {"comm": comms, "op": ops, "state": states, "hw": hw})
        return Bundle(
            job=self.job,
            comm_ids=tuple(self._comm.values),
            strings=tuple(self._str.values),
            comms=comms,
            ops=ops,
            states=states,
            flows=flows,
            hw=hw,
            source=self.source,
            liveness=liveness,
        )


# A bundle is a window of one job's life (minutes), plus the communicator records of the job,
# which keep their init times: a job's communicators are older than its last restart, and
# jobs restart within weeks. A record further than this from the bundle's median time is
# not of this job (issue 15 item 3: ``init_ns = 1`` made analysis ask for 1.8e9 ticks).
MAX_SPAN_NS: Final = 90 * 86_400 * 10**9


def _check_span(source: str, tables_: dict[str, Table]) -> None:
    """``BundleFormatError`` naming the record furthest from the median time when the
    records do not fit in ``MAX_SPAN_NS`` around it (liveness rows are the collector's)."""
    parts = [t["ts"] for t in tables_.values() if len(t)]
    if not parts:
        return
    ts = np.concatenate(parts)
    lo, hi = int(ts.min()), int(ts.max())
    if hi - lo <= MAX_SPAN_NS:
        return
    mid = int(np.median(ts))
    far = lo if mid - lo >= hi - mid else hi
    if abs(far - mid) <= MAX_SPAN_NS:
        return
    kind, table = next((k, t) for k, t in tables_.items() if len(t) and (t["ts"] == far).any())
    row = table[int(np.flatnonzero(table["ts"] == far)[0])]
    days = abs(far - mid) / 86_400e9
    raise errors.BundleFormatError(
        source,
        f"{kind} record of rank {int(row['rank'])} at {far} ns is {days:.0f} days from the "
        f"bundle's median time {mid}: outside the job's plausible span "
        f"(at most {MAX_SPAN_NS // 86_400 // 10**9} days either side)",
        field="ts",
    )


def flow_tuple(f: models.SendFlow | models.RecvFlow) -> FlowTuple:
    if isinstance(f, models.SendFlow):
        return (f.channel, f.peer, SEND, f.total, f.ready, f.sent, -1, f.done, -1, f.idle_ns)
    return (f.channel, f.peer, RECV, f.total, -1, -1, f.posted, f.done, f.consumed, f.idle_ns)


def contiguous_flows(states: Table, flows: Table) -> tuple[Table, Table]:
    """``states`` and the flows they index, laid out so state ``i``'s flows follow state
    ``i - 1``'s from row 0 (``flow_lo[0] == 0``); the inputs themselves when already so."""
    lo, hi = states["flow_lo"], states["flow_hi"]
    if not len(states):
        return states, flows[:0]
    if int(lo[0]) == 0 and np.array_equal(lo[1:], hi[:-1]):
        return states, flows[: int(hi[-1])]
    n = hi - lo
    new_hi = np.cumsum(n)
    take = np.arange(int(new_hi[-1]), dtype=np.int64) + np.repeat(lo - (new_hi - n), n)
    states = states.copy()
    states["flow_lo"], states["flow_hi"] = new_hi - n, new_hi
    return states, flows[take.astype(np.intp)]


def _interleaved(table: Table, cols: tuple[str, ...]) -> npt.NDArray[np.int64]:
    """``cols`` of every row, row after row: the order records intern their names in."""
    if not len(table):
        return np.zeros(0, np.int64)
    return np.stack([table[c].astype(np.int64) for c in cols], axis=1).ravel()


def _remap(
    interner: _Interner, values: Sequence[str], used: Sequence[npt.NDArray[Any]]
) -> npt.NDArray[np.int32]:
    """Local index -> index in ``interner``, interning the used ``values`` in the order their
    first use appears in ``used`` (unused ones are not interned, as records never name them)."""
    out = np.full(len(values), -1, np.int32)
    seq = np.concatenate([np.zeros(0, np.int64), *(u.astype(np.int64) for u in used)])
    if len(seq):
        uniq, first = np.unique(seq, return_index=True)
        for local in uniq[np.argsort(first, kind="stable")].tolist():
            out[local] = interner(values[local])
    return out


def _sorted(table: Table, keys: tuple[str, ...]) -> Table:
    if len(table) == 0:
        return table
    order = np.lexsort(tuple(table[k] for k in reversed(keys)))
    if np.all(order[1:] > order[:-1]):
        return table  # already sorted (a bundle the writer wrote): no copy
    return table[order]


def _reorder_states(
    states: Table, flows: Table, order: npt.NDArray[np.intp]
) -> tuple[Table, Table]:
    """Reorder state rows and lay their flows out again so each state's flows stay contiguous."""
    states = states[order]
    lengths = states["flow_hi"] - states["flow_lo"]
    hi = np.cumsum(lengths)
    # Flow k of the new layout belongs to the state whose new range holds k; it comes from that
    # state's old range at the same offset. Vectorised: one arange plus a per-state shift.
    shift = np.repeat(states["flow_lo"] - (hi - lengths), lengths)
    take = np.arange(len(shift), dtype=np.int64) + shift
    flows = flows[take.astype(np.intp)]
    states = states.copy()
    states["flow_lo"] = hi - lengths
    states["flow_hi"] = hi
    return states, flows
