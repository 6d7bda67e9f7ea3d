"""Bundle-v1 ``state`` rows straight from a live-region copy, for all communicators at once.

``records.state_records`` (the reference) decodes a ``livestate.Snapshot`` slot by slot
into pydantic models: about 20 µs per flow, 50 times what a 10 Hz sampler of a node may spend
(bench/agent_ingest). This module computes the same rows with a fixed number of numpy
operations over ``ring.Ring.live_copies()``, straight into the bundle tables' dtypes
(``tables.STATE_DTYPE``/``FLOW_DTYPE``): per communicator the active op with the lowest serial
(ring header protocol §2), its flows (same serial, not ``free``; a torn flow only while its
counters are ordered), in (channel, send before recv, peer) order, peers mapped to global ranks,
``idle_ns`` = copy time - last progress. ``tests/unit/nodeagent/ring/test_staterows.py`` checks it
equals the reference on real plugin rings.

Values are checked as the reference checks them: a non-torn slot outside its domain raises
``errors.RingCorrupt`` naming slot and field; a torn one is left out.

Why one module: it is one computation, the vectorised twin of ``records.state_records``, and
is tested as one against it; the lookups of ``Names`` (global ranks, interned ids) live with
the rows that use them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from collscope.nodeagent import errors
from collscope.nodeagent.bundle import models, tables
from collscope.nodeagent.ring import layout, livestate, records

_U64_MAX: Final = np.uint64(2**64 - 1)
_I64_MAX: Final = layout.INT64_MAX
# Whether a func code is assigned, for every u1 value (one lookup, no range check)
_FUNC_OK: Final = np.zeros(256, dtype=bool)
_FUNC_OK[: len(layout.FUNC_NAMES)] = [n is not None for n in layout.FUNC_NAMES]
_KCH_OTHER: Final = "kch_started_other" in (layout.OP_SLOT.names or ())
_NO_STATES: Final = np.zeros(0, tables.STATE_DTYPE)
_NO_FLOWS: Final = np.zeros(0, tables.FLOW_DTYPE)


@dataclasses.dataclass(frozen=True, slots=True)
class StateRows:
    """``states`` (STATE_DTYPE, ``flow_lo``/``flow_hi`` index ``flows``) and ``flows``."""

    states: tables.Table
    flows: tables.Table


EMPTY: Final = StateRows(_NO_STATES, _NO_FLOWS)


class Names:
    """What rows refer to: global ranks of communicator peers, and the window's interned
    communicator ids and op names (cached here: the hot loop asks for the same few)."""

    def __init__(self, intern_comm: Callable[[str], int], intern: Callable[[str], int]) -> None:
        self.peers: dict[tuple[int, int], int] = {}
        self._intern_comm = intern_comm
        self._intern = intern
        self._comms: dict[int, int] = {}
        self._funcs = [intern(n or "") for n in layout.FUNC_NAMES]
        self._func_ids = np.array(self._funcs, dtype=np.int64)
        # _comms as sorted arrays, for one searchsorted per tick (``comm_ids``)
        self._comm_keys = np.zeros(0, np.uint64)
        self._comm_vals = np.zeros(0, np.int64)
        self._tables: dict[int, npt.NDArray[np.int64]] = {}
        # Every table above laid end to end, for one gather per tick (``rank_tables``):
        # communicator hashes sorted, and the start and length of each one's table.
        self._keys = np.zeros(0, np.uint64)
        self._starts = np.zeros(0, np.int64)
        self._sizes = np.zeros(0, np.int64)
        self._cat = np.zeros(0, np.int64)

    def learn_peer(self, comm_hash: int, comm_rank: int, rank: int) -> None:
        if self.peers.get((comm_hash, comm_rank)) != rank:
            self.peers[(comm_hash, comm_rank)] = rank
            self._tables.pop(comm_hash, None)
            self._keys, self._sizes = self._keys[:0], self._sizes[:0]  # rebuilt when next asked

    def peer(self, comm_hash: int, comm_rank: int) -> int:
        """The global rank of ``comm_rank``, or ``comm_rank`` itself when unknown
        (records' rule: right for a communicator of the whole job in rank order)."""
        return self.peers.get((comm_hash, comm_rank), comm_rank)

    def peer_table(self, comm_hash: int, nranks: int) -> npt.NDArray[np.int64]:
        t = self._tables.get(comm_hash)
        if t is None or len(t) < nranks:
            t = np.arange(nranks, dtype=np.int64)
            for (h, r), g in self.peers.items():
                if h == comm_hash and r < nranks:
                    t[r] = g
            self._tables[comm_hash] = t
        return t

    def rank_tables(
        self, hashes: npt.NDArray[np.uint64], nranks: npt.NDArray[Any]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(table, base)``: the global rank of comm rank ``r`` of communicator row ``i``
        (hash ``hashes[i]``, ``nranks[i]`` ranks) is ``table[base[i] + r]``, for every
        ``0 <= r < nranks[i]``. The tables are rebuilt only when a peer is learnt or a
        communicator (or a larger size) is seen for the first time."""
        pos = self._find(hashes, nranks)
        if pos is None:
            sizes = dict(zip(self._keys.tolist(), self._sizes.tolist(), strict=True))
            for h, n in zip(hashes.tolist(), nranks.tolist(), strict=True):
                sizes[h] = max(sizes.get(h, 0), n)
            keys = sorted(sizes)
            parts = [self.peer_table(h, sizes[h]) for h in keys]
            self._keys = np.array(keys, dtype=np.uint64)
            self._sizes = np.array([len(t) for t in parts], dtype=np.int64)
            self._starts = np.cumsum(self._sizes) - self._sizes
            self._cat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
            pos = self._find(hashes, nranks)
            assert pos is not None
        return self._cat, self._starts[pos]

    def _find(
        self, hashes: npt.NDArray[np.uint64], nranks: npt.NDArray[Any]
    ) -> npt.NDArray[np.intp] | None:
        """Each hash's index in ``_keys``, None when one is missing or its table too short."""
        if not len(self._keys):
            return None if len(hashes) else np.zeros(0, np.intp)
        pos = np.minimum(np.searchsorted(self._keys, hashes), len(self._keys) - 1)
        if not ((self._keys[pos] == hashes) & (self._sizes[pos] >= nranks)).all():
            return None
        return pos

    def comm(self, comm_hash: int) -> int:
        i = self._comms.get(comm_hash)
        if i is None:
            i = self._comms[comm_hash] = self._intern_comm(records.comm_hex(comm_hash))
        return i

    def func(self, code: int) -> int:
        return self._funcs[code]

    def comm_ids(self, hashes: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """``comm`` of every hash, vectorised: a Python call per row costs more than the
        numpy lookup at a few hundred rows a tick."""
        keys = self._comm_keys
        pos = np.minimum(np.searchsorted(keys, hashes), max(len(keys) - 1, 0))
        if not len(keys) or not (keys[pos] == hashes).all():
            for h in hashes.tolist():  # in row order: ids as a row-by-row interning gives
                self.comm(h)
            order = sorted(self._comms)
            self._comm_keys = keys = np.array(order, dtype=np.uint64)
            self._comm_vals = np.array([self._comms[h] for h in order], dtype=np.int64)
            pos = np.searchsorted(keys, hashes)
        found: npt.NDArray[np.int64] = self._comm_vals[pos]
        return found

    def func_ids(self, codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
        """``func`` of every code (codes already checked to be assigned)."""
        found: npt.NDArray[np.int64] = self._func_ids[codes]
        return found


def comm_records(path: str, rank: int, copies: livestate.Copies) -> list[models.CommRecord]:
    """A ``comm`` record per live, untorn communicator slot (cheap: at most 16 slots)."""
    out = []
    for i in np.flatnonzero(copies.comms["state"] != layout.COMM_FREE).tolist():
        if copies.torn_comms[i]:
            continue
        c = copies.comms[i]
        check = layout.Checker(
            path, f"comm slot {copies.slots[i]}", 0, copies.since_ns, copies.until_ns
        )
        nranks, comm_rank = check.comm_ranks(int(c["nranks"]), int(c["rank"]), int(c["nnodes"]))
        out.append(
            models.CommRecord(
                rank=rank,
                ts=check.time("init_ns", int(c["init_ns"])),
                comm=records.comm_hex(int(c["comm_hash"])),
                comm_rank=comm_rank,
                nranks=nranks,
                nnodes=int(c["nnodes"]),
                name=check.text("name", bytes(c["name"]), layout.NAME_LEN),
            )
        )
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Part:
    """One ring's copy in a batch: whose it is and when it was taken."""

    path: str
    rank: int
    copies: livestate.Copies
    taken_ns: int


def state_rows(
    path: str, rank: int, copies: livestate.Copies, taken_ns: int, names: Names
) -> StateRows:
    """The ``state`` rows of one copy: one per communicator with an op in flight."""
    return state_rows_batch([Part(path, rank, copies, taken_ns)], names)[0]


def state_rows_batch(parts: list[Part], names: Names) -> list[StateRows]:
    """``state_rows`` of many rings in one pass (the sampler's tick): the copies are stacked
    and every step runs once for all of them, so numpy's per-call cost (a few µs, the bulk of
    the work for one ring) is paid once per tick, not once per ring.

    The copies hold only live communicators and their visible flow slots (``livestate.Copies``),
    so every step sees a few hundred rows, not the whole (rings x 16 x 128) flow region.
    """
    if not parts:
        return []
    sizes = np.array([len(p.copies.slots) for p in parts])
    comms = _stack([p.copies.comms for p in parts])  # identity, counters and op slots
    flows = _stack([p.copies.flows for p in parts])
    # A flow's comm row in the stacked comms: its row in its part + the rows of the parts before.
    nflows = np.array([len(p.copies.flow_comm) for p in parts])
    flow_row = _concat([p.copies.flow_comm for p in parts])
    if len(parts) > 1:
        flow_row = flow_row + np.repeat(np.cumsum(sizes) - sizes, nflows)
    part_of = np.repeat(np.arange(len(parts)), sizes)
    taken = np.repeat(np.array([p.taken_ns for p in parts], dtype=np.int64), sizes)
    # Each ring's plausible times, per comm row (layout.TIME_SLACK_NS): 0 is "not known".
    since = np.repeat(np.array([p.copies.since_ns for p in parts], dtype=np.int64), sizes)
    until = np.repeat(np.array([p.copies.until_ns for p in parts], dtype=np.int64), sizes)
    slot_of = _concat([p.copies.slots for p in parts])

    def where(row: int) -> tuple[str, int]:
        return parts[int(part_of[row])].path, int(slot_of[row])

    states, flow_rows = _rows(
        comms,
        _Flows(
            flows,
            flow_row,
            _concat([p.copies.flow_slot for p in parts]),
            _concat([p.copies.torn_flows for p in parts]),
        ),
        _concat([p.copies.torn_comms for p in parts]),
        _concat([p.copies.torn_ops for p in parts]),
        taken,
        (since, until),
        names,
        where,
    )
    # Split by part: states are in comm row order, so by part, and so are their flows.
    part = part_of[states["rank"]]  # states["rank"] is the comm row
    bounds = np.searchsorted(part, np.arange(len(parts) + 1))
    flow_bounds = np.concatenate(([0], states["flow_hi"]))[bounds]
    shift = flow_bounds[part]
    states["flow_lo"] -= shift
    states["flow_hi"] -= shift
    states["rank"] = np.array([p.rank for p in parts])[part]
    b, fb = bounds.tolist(), flow_bounds.tolist()
    return [
        StateRows(states[b[k] : b[k + 1]], flow_rows[fb[k] : fb[k + 1]])
        if b[k] < b[k + 1]
        else EMPTY
        for k in range(len(parts))
    ]


def _stack(arrays: list[npt.NDArray[Any]]) -> npt.NDArray[Any]:
    """Concatenate 1-d structured arrays as bytes (one memcpy; numpy's structured path is
    slow)."""
    if len(arrays) == 1:
        return arrays[0]
    # frombuffer, not .view(): the same bytes without view()'s per-call dtype checks
    raw = np.concatenate([np.frombuffer(a, np.uint8) for a in arrays])
    return np.frombuffer(raw, arrays[0].dtype)


def _concat(arrays: list[npt.NDArray[Any]]) -> npt.NDArray[Any]:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


@dataclasses.dataclass(frozen=True, slots=True)
class _Flows:
    """The stacked flow copies: slots, their comm row and slot index, torn flags."""

    slots: npt.NDArray[Any]  # (k,) FLOW_SLOT
    row: npt.NDArray[np.intp]
    col: npt.NDArray[np.intp]
    torn: npt.NDArray[np.bool_]


def _rows(  # noqa: PLR0917 - the stacked arrays of state_rows_batch, unpacked once
    comms: npt.NDArray[Any],
    fl: _Flows,
    torn_comms: npt.NDArray[np.bool_],
    torn_ops: npt.NDArray[np.bool_],
    taken: npt.NDArray[np.int64],
    span: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
    names: Names,
    where: Callable[[int], tuple[str, int]],
) -> tuple[tables.Table, tables.Table]:
    """States (``rank`` = the comm row, mapped to its part by the caller) and their flows.
    ``span``: the plausible times of each comm row's ring (since, until; ns)."""
    picked = _in_flight(comms, torn_comms, torn_ops, span, where)
    if picked is None:
        return _NO_STATES, _NO_FLOWS
    has, in_flight, ci, pj = picked
    row, flows = _flow_rows(
        comms, fl, has=has, in_flight=in_flight, taken=taken, span=span, names=names, where=where
    )
    states = _state_rows(comms, ci, pj, row=row, taken=taken, names=names, where=where)
    return states, flows


def _in_flight(
    comms: npt.NDArray[Any],
    torn_comms: npt.NDArray[np.bool_],
    torn_ops: npt.NDArray[np.bool_],
    span: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
    where: Callable[[int], tuple[str, int]],
) -> (
    tuple[npt.NDArray[np.bool_], npt.NDArray[Any], npt.NDArray[np.intp], npt.NDArray[np.intp]]
    | None
):
    """Per comm row, the active op with the lowest serial (ring header protocol §2): whether
    the row has one, its serial, and the rows that have one with its op slot; None if none."""
    ops = comms["ops"]
    live = (comms["state"] != layout.COMM_FREE) & ~torn_comms
    func = ops["func"]
    active = (ops["state"] == layout.OP_ACTIVE) & live[:, None]
    # A torn op slot whose values are out of domain is left out, like the reference does.
    # (seq | bytes) <= INT64_MAX: both are (the top bit of neither is set)
    since, until = span
    sane = (
        _FUNC_OK[func]
        & ((ops["seq"] | ops["bytes"]) <= _I64_MAX)
        & _plausible(ops["start_ns"], since[:, None], until[:, None])
    )
    bad = active & ~(sane | torn_ops)
    if bad.any():
        i, j = (int(x[0]) for x in np.nonzero(bad))
        path, slot = where(i)
        raise _corrupt(path, f"comm slot {slot} op {j}", ops[i, j], "func/seq/bytes/start_ns")
    active &= sane
    serial = np.where(active, ops["serial"], _U64_MAX)
    pick = np.argmin(serial, axis=1)
    has = active.any(axis=1)
    ci = np.flatnonzero(has)
    if len(ci) == 0:
        return None
    pj = pick[ci]
    in_flight = serial.min(axis=1)  # the serial at ``pick``
    return has, in_flight, ci, pj


def _flow_rows(
    comms: npt.NDArray[Any],
    fl: _Flows,
    *,
    has: npt.NDArray[np.bool_],
    in_flight: npt.NDArray[Any],
    taken: npt.NDArray[np.int64],
    span: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
    names: Names,
    where: Callable[[int], tuple[str, int]],
) -> tuple[npt.NDArray[np.intp], tables.Table]:
    """The flows of the ops in flight, in (comm row, channel, send before recv, peer) order,
    with the comm row of each."""
    since, until = span
    # Candidates first, with the cheapest tests over every copied flow; every other check
    # runs on the gathered candidates only.
    s = fl.slots
    (cand,) = np.nonzero(
        has[fl.row]
        & (s["serial"] == in_flight[fl.row])
        & (s["dir"] != layout.DIR_NONE)
        & (s["state"] != layout.FLOW_FREE)
    )
    row, col = fl.row[cand], fl.col[cand]
    # Whole slots in one gather: ``take`` copies them as bytes (a fancy index on a structured
    # array goes field by field through a slow generic path); fields are then plain views.
    f = s.take(cand)
    rp, sd, dc = f["c_ready_posted"], f["c_sent_done"], f["c_done_consumed"]
    good = (
        (rp >= sd)
        & (sd >= dc)
        & (f["dir"] <= layout.DIR_RECV)
        & (f["state"] < len(layout.FLOW_STATE_NAMES))
        & (f["peer"] >= 0)
        & (f["peer"] < comms["nranks"][row])
        & _plausible(f["last_progress_ns"], since[row], until[row])
    )
    bad = ~(fl.torn[cand] | good)
    if bad.any():
        n = int(np.flatnonzero(bad)[0])
        path, slot = where(int(row[n]))
        raise _corrupt(path, f"comm slot {slot} flow {int(col[n])}", s[cand[n]], "flow counters")
    keep = np.flatnonzero(good)  # torn slots kept only while their counters are ordered
    keep = keep[np.argsort(_order(row, f)[keep], kind="stable")]
    row = row[keep]
    f = f.take(keep)
    a, b, c = f["c_ready_posted"], f["c_sent_done"], f["c_done_consumed"]
    flows = np.empty(len(row), tables.FLOW_DTYPE)
    send = f["dir"] == layout.DIR_SEND
    flows["channel"] = f["channel"]
    flows["peer"] = _global_peers(comms, row, f["peer"], names)
    flows["dir"] = np.where(send, tables.SEND, tables.RECV)
    flows["total"] = f["total"]
    flows["ready"] = np.where(send, a, -1)
    flows["sent"] = np.where(send, b, -1)
    flows["posted"] = np.where(send, -1, a)
    flows["done"] = np.where(send, c, b)
    flows["consumed"] = np.where(send, -1, c)
    flows["idle_ns"] = np.maximum(0, taken[row] - f["last_progress_ns"])
    return row, flows


def _state_rows(
    comms: npt.NDArray[Any],
    ci: npt.NDArray[np.intp],
    pj: npt.NDArray[np.intp],
    *,
    row: npt.NDArray[np.intp],
    taken: npt.NDArray[np.int64],
    names: Names,
    where: Callable[[int], tuple[str, int]],
) -> tables.Table:
    """One state per comm row ``ci`` with an op in flight (op slot ``pj``), pointing at its
    flows (``row``: the comm row of each flow, in order)."""
    ops = comms["ops"]
    counts = np.bincount(row, minlength=len(comms))[ci]
    hi = np.cumsum(counts)
    # Signed before any np.where with -1: NumPy keeps an unsigned dtype there and -1 would wrap
    # to 255 in the u1 channel count (a state with no kernel read as one with 255 channels).
    nch = ops["nchannels"][ci, pj].astype(np.int64)
    kch_started = ops["kch_started"][ci, pj].astype(np.int64)
    kch_done = ops["kch_done"][ci, pj].astype(np.int64)
    if _KCH_OTHER:  # layout version 2: the totals are the sums with the `_other` twins
        kch_started = kch_started + ops["kch_started_other"][ci, pj]
        kch_done = kch_done + ops["kch_done_other"][ci, pj]
    kernel = kch_started > 0
    if (kernel & (kch_done > nch)).any():
        a0 = int(np.flatnonzero(kernel & (kch_done > nch))[0])
        path, slot = where(int(ci[a0]))
        raise _corrupt(path, f"comm slot {slot} op {int(pj[a0])}", ops[ci[a0], pj[a0]], "kch_done")
    states = np.empty(len(ci), tables.STATE_DTYPE)
    states["rank"] = ci
    states["ts"] = taken[ci]
    states["comm"] = names.comm_ids(comms["comm_hash"][ci])
    states["seq"] = ops["seq"][ci, pj]
    states["op"] = names.func_ids(ops["func"][ci, pj])
    states["bytes"] = ops["bytes"][ci, pj]
    states["start"] = ops["start_ns"][ci, pj]
    states["kernel_channels"] = np.where(kernel, nch, -1)
    states["kernel_done"] = np.where(kernel, kch_done, -1)
    states["flow_lo"] = hi - counts
    states["flow_hi"] = hi
    return states


def _plausible(t: npt.NDArray[Any], since: Any, until: Any) -> npt.NDArray[np.bool_]:
    """Whether times are 0 ("not known") or inside their ring's plausible span (both
    bounds within int64, so an unsigned time above it is implausible, not wrapped)."""
    ok: npt.NDArray[np.bool_] = (t == 0) | ((t >= since) & (t <= until))
    return ok


def _order(row: npt.NDArray[np.intp], f: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """One int64 key per flow ordering (comm row, channel, dir, peer), for one argsort (four
    keys through ``np.lexsort`` cost five times as much). Fields: row < 2**21 (16 slots per
    ring), channel u1, dir <= 2 (2 bits), peer; only rows with 0 <= peer < 2**31 are sorted."""
    key = row.astype(np.int64) << 42
    key |= f["channel"].astype(np.int64) << 34
    key |= f["dir"].astype(np.int64) << 32
    key |= f["peer"].astype(np.int64) & 0xFFFF_FFFF
    return key


def _global_peers(
    comms: npt.NDArray[Any], row: npt.NDArray[np.intp], peer: npt.NDArray[Any], names: Names
) -> npt.NDArray[np.int64]:
    """Comm ranks -> global ranks: the lookup tables of every communicator, laid end to end
    (``Names.rank_tables``), and one gather. ``peer`` is in ``[0, nranks)`` of its row."""
    out = peer.astype(np.int64)
    if not names.peers or len(row) == 0:
        return out
    table, base = names.rank_tables(comms["comm_hash"], comms["nranks"])
    result: npt.NDArray[np.int64] = table[base[row] + out]
    return result


def _corrupt(path: str, region: str, slot: Any, what: str) -> errors.RingCorrupt:
    return errors.RingCorrupt(
        path, f"values out of their domain: {slot!r}", region=region, field=what
    )
