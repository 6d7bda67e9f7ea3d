"""The bounded in-memory window: bundle-v1 records per (workload, rank), the last ``window_s``.

Keys: a rank alone does not name a process on a node that runs two jobs (both have a rank 0),
so everything here is keyed by ``Key = (workload, rank)``, the workload being the ring's pod
uid (``discovery.workload_of``); ``""`` is the workload of callers that hold one job only
(tests, benches). Records keep their global rank; a ``bundle`` is cut from the keys asked for,
and the caller (``service.py``) never asks for two keys of one rank in one bundle.

Storage is columnar, in the bundle tables' own dtypes (``tables.STATE_DTYPE``, ``FLOW_DTYPE``,
``OP_DTYPE``): one ``Chunk`` per sampled ring and tick, appended to its key's deque, with
communicator ids and names interned once for the whole window. A state record with 32 flows
takes about 2.1 KB this way, against ~30 KB as pydantic models.

Bounds: ``evict(now_ns)`` drops chunks that ended before ``now - window_s``, then, while the
estimated bytes (arrays + ``CHUNK_OVERHEAD_BYTES`` each) exceed ``memory_cap_bytes``, the oldest
chunk of any key (oldest first, globally). Evicted records are counted. ``comm`` records are
kept apart, per key, whatever their age: analysis needs communicator membership, and there
are only a few per rank; ``forget(keys)`` drops a key whose rings are gone.

``bundle(...)`` cuts a ``tables.Bundle`` out of the window (keys, time range), sorted as
``BundleBuilder.build`` sorts, for summaries, the HTTP window stream and exports. Thread-safe:
the sampler adds from its thread while the HTTP server reads from others.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Collection, Iterable, Mapping
from typing import Final

import numpy as np

from collscope.nodeagent.bundle import models, tables

# Python objects around a chunk's arrays: the Chunk itself, three ndarray headers, deque slot.
CHUNK_OVERHEAD_BYTES: Final = 512
_NS = 1_000_000_000
_EMPTY_STATES = np.zeros(0, tables.STATE_DTYPE)
_EMPTY_FLOWS = np.zeros(0, tables.FLOW_DTYPE)
_EMPTY_OPS = np.zeros(0, tables.OP_DTYPE)

Key = tuple[str, int]  # (workload, global rank)


class Interner:
    """Text -> stable small int, append-only (communicator ids, op/algo/proto names)."""

    def __init__(self, first: Iterable[str] = ()) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}
        for text in first:
            self(text)

    def __call__(self, text: str) -> int:
        i = self._index.get(text)
        if i is None:
            i = self._index[text] = len(self.values)
            self.values.append(text)
        return i


@dataclasses.dataclass(frozen=True, slots=True)
class Chunk:
    """What one ring gave at one tick; ``states.flow_lo/hi`` index this chunk's ``flows``."""

    rank: int
    ts_lo: int
    ts_hi: int
    states: tables.Table
    flows: tables.Table
    ops: tables.Table

    @property
    def nbytes(self) -> int:
        return self.states.nbytes + self.flows.nbytes + self.ops.nbytes + CHUNK_OVERHEAD_BYTES

    @property
    def records(self) -> int:
        return len(self.states) + len(self.ops)


@dataclasses.dataclass(slots=True)
class Counters:
    """Monotonic counters for /metrics."""

    states: int = 0
    flows: int = 0
    ops: int = 0
    evicted_records: int = 0
    evicted_bytes: int = 0
    evicted_for_memory: int = 0


class Window:
    """Per-key deques of chunks under a time bound and a global memory cap."""

    def __init__(self, *, window_s: float, memory_cap_bytes: int) -> None:
        self.window_ns = int(window_s * _NS)
        self.memory_cap_bytes = memory_cap_bytes
        self.comm_ids = Interner()
        self.strings = Interner([""])  # index 0: absent algo/proto/dtype, as tables do
        self.counters = Counters()
        self.nbytes = 0
        self._chunks: dict[Key, collections.deque[Chunk]] = {}
        self._comms: dict[Key, dict[tuple[str, int], models.CommRecord]] = {}
        self._last_end: dict[Key, int] = {}  # latest op end seen, evicted or not
        # [ops, bytes] completed since the agent started, evicted or not (/metrics).
        self._done: dict[Key, list[int]] = {}
        self._lock = threading.Lock()

    # -- writing --------------------------------------------------------------------------
    def add(
        self,
        rank: int,
        *,
        workload: str = "",
        states: tables.Table = _EMPTY_STATES,
        flows: tables.Table = _EMPTY_FLOWS,
        ops: tables.Table = _EMPTY_OPS,
    ) -> None:
        """Append one tick of one ring (rows already interned against this window)."""
        if len(states) == 0 and len(ops) == 0:
            return
        ts = np.concatenate([states["ts"], ops["ts"]])
        chunk = Chunk(rank, int(ts.min()), int(ts.max()), states, flows, ops)
        key = (workload, rank)
        with self._lock:
            self._chunks.setdefault(key, collections.deque()).append(chunk)
            if len(ops):
                end = int(ops["end"].max())
                self._last_end[key] = max(end, self._last_end.get(key, end))
                done = self._done.setdefault(key, [0, 0])
                done[0] += len(ops)
                done[1] += int(ops["bytes"].sum())
            self.nbytes += chunk.nbytes
            c = self.counters
            c.states += len(states)
            c.flows += len(flows)
            c.ops += len(ops)
            self._evict_memory()

    def add_comms(
        self, records: Iterable[models.CommRecord], *, workload: str = "", replace: bool = True
    ) -> None:
        """Remember communicators; ``replace=False`` keeps a known one (an event's name is
        truncated to 15 bytes, the live slot's is whole)."""
        with self._lock:
            for r in records:
                known = self._comms.setdefault((workload, r.rank), {})
                if replace or (r.comm, r.comm_rank) not in known:
                    known[(r.comm, r.comm_rank)] = r

    def evict(self, now_ns: int) -> None:
        """Drop what ended before ``now_ns - window_s``, then enforce the memory cap."""
        horizon = now_ns - self.window_ns
        with self._lock:
            for dq in self._chunks.values():
                while dq and dq[0].ts_hi < horizon:
                    self._drop(dq)
            self._evict_memory()

    def forget(self, keys: Iterable[Key]) -> None:
        """Drop what is held for ``keys`` (their rings are gone and their records aged out:
        otherwise their comm records would stay, one pod after another). Completion counters
        stay: they are monotonic."""
        with self._lock:
            for key in keys:
                for chunk in self._chunks.pop(key, ()):
                    self.nbytes -= chunk.nbytes
                self._comms.pop(key, None)
                self._last_end.pop(key, None)

    def _evict_memory(self) -> None:
        while self.nbytes > self.memory_cap_bytes:
            oldest = min((dq for dq in self._chunks.values() if dq), key=lambda d: d[0].ts_lo)
            self._drop(oldest)
            self.counters.evicted_for_memory += 1

    def _drop(self, dq: collections.deque[Chunk]) -> None:
        chunk = dq.popleft()
        self.nbytes -= chunk.nbytes
        self.counters.evicted_records += chunk.records
        self.counters.evicted_bytes += chunk.nbytes

    # -- reading --------------------------------------------------------------------------
    def held(self) -> list[Key]:
        """Every key with records or communicators held."""
        with self._lock:
            return sorted({k for k, dq in self._chunks.items() if dq} | set(self._comms))

    def last_completion(self, rank: int, workload: str = "") -> int | None:
        """The latest op end ever added for the key (ns), kept after its record is evicted."""
        with self._lock:
            return self._last_end.get((workload, rank))

    def completed(self) -> dict[Key, tuple[int, int]]:
        """(workload, rank) -> (ops, bytes) completed since the window was made: monotonic, for
        counters."""
        with self._lock:
            return {k: (d[0], d[1]) for k, d in self._done.items()}

    def span(self, rank: int, workload: str = "") -> tuple[int, int] | None:
        """(oldest, newest) time held for the key, ns."""
        with self._lock:
            dq = self._chunks.get((workload, rank))
            return (dq[0].ts_lo, dq[-1].ts_hi) if dq else None

    def bundle(
        self,
        job: models.Job,
        *,
        keys: Collection[Key] | None = None,
        ranks: Collection[int] | None = None,
        since_ns: int | None = None,
        until_ns: int | None = None,
        hw: Iterable[models.HwRecord] = (),
        hw_ranks: Mapping[str, int] | None = None,
        hw_others: bool = True,
        liveness: Iterable[models.LivenessRecord] = (),
    ) -> tables.Bundle:
        """The records of ``keys`` (None: the keys of ``ranks``, None: all) with ``since <= ts
        <= until`` (None: open) as a sorted ``Bundle``; comm records of those keys whatever
        their time, as the reader does. Two keys of one rank would mix in it: the caller picks.
        ``hw`` records in that time: a device in ``hw_ranks`` gets the rank given there, the
        others keep theirs, or are left out when not ``hw_others``. ``liveness`` rows (the
        writers as seen now: not held in the window) go in as given."""
        lo = -1 if since_ns is None else since_ns
        hi = 2**63 - 1 if until_ns is None else until_ns
        with self._lock:
            keep = set(self._chunks) | set(self._comms) if keys is None else set(keys)
            if keys is None and ranks is not None:
                wanted = set(ranks)
                keep = {k for k in keep if k[1] in wanted}
            chunks = [
                c
                for k in sorted(keep)
                for c in self._chunks.get(k, ())
                if c.ts_hi >= lo and c.ts_lo <= hi
            ]
            comms = [rec for k in sorted(keep) for rec in self._comms.get(k, {}).values()]
            comm_ids = tuple(self.comm_ids.values)
            strings = Interner(self.strings.values)
        states, flows = _states(chunks, lo, hi)
        ops = np.concatenate([_EMPTY_OPS, *(c.ops for c in chunks)])
        ops = ops[(ops["ts"] >= lo) & (ops["ts"] <= hi)]
        comm_index = Interner(comm_ids)
        comm_rows = np.array(
            [
                (r.rank, r.ts, comm_index(r.comm), r.comm_rank, r.nranks, r.nnodes, strings(r.name))
                for r in comms
            ],
            dtype=tables.COMM_DTYPE,
        )
        owner = hw_ranks or {}
        hw_rows = np.array(
            [
                (
                    owner.get(h.device, h.rank),
                    h.ts,
                    strings(h.node),
                    strings(h.device),
                    strings(h.metric),
                    h.value,
                )
                for h in hw
                if lo <= h.ts <= hi and (hw_others or h.device in owner)
            ],
            dtype=tables.HW_DTYPE,
        )
        return tables.Bundle(
            job=job,
            comm_ids=tuple(comm_index.values),
            strings=tuple(strings.values),
            comms=comm_rows[np.lexsort((comm_rows["comm"], comm_rows["rank"]))],
            ops=ops[np.lexsort((ops["comm"], ops["end"], ops["rank"]))],
            states=states,
            flows=flows,
            hw=hw_rows[np.lexsort((hw_rows["ts"], hw_rows["rank"]))],
            source="<agent window>",
            liveness=_liveness_rows(liveness),
        )


def _liveness_rows(records: Iterable[models.LivenessRecord]) -> tables.Table:
    rows = np.array(
        [
            (
                r.rank,
                r.ts,
                -1 if r.heartbeat is None else r.heartbeat,
                tables.LIVENESS_STATES.index(r.state),
            )
            for r in records
        ],
        dtype=tables.LIVENESS_DTYPE,
    )
    return rows[np.lexsort((rows["ts"], rows["rank"]))]


def _states(chunks: list[Chunk], lo: int, hi: int) -> tuple[tables.Table, tables.Table]:
    """Concatenated, filtered and (rank, ts, comm)-sorted states with their flows rebased."""
    if not chunks:
        return _EMPTY_STATES, _EMPTY_FLOWS
    base = np.cumsum([0] + [len(c.flows) for c in chunks[:-1]])
    states = np.concatenate([c.states for c in chunks])
    offset = np.repeat(base, [len(c.states) for c in chunks])
    flows = np.concatenate([c.flows for c in chunks])
    states["flow_lo"] += offset
    states["flow_hi"] += offset
    states = states[(states["ts"] >= lo) & (states["ts"] <= hi)]
    order = np.lexsort((states["comm"], states["ts"], states["rank"]))
    states = states[order]
    n = (states["flow_hi"] - states["flow_lo"]).astype(np.int64)
    new_hi = np.cumsum(n)
    # Flow row of each output position: its state's old start + its rank inside the state.
    pos = np.arange(int(new_hi[-1]) if len(n) else 0, dtype=np.int64)
    start = np.repeat(states["flow_lo"].astype(np.int64) - (new_hi - n), n)
    flows = flows[pos + start]
    states["flow_lo"] = new_hi - n
    states["flow_hi"] = new_hi
    return states, flows
