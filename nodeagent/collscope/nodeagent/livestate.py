"""Bundle-v1 ``state`` rows straight from a live-region copy, for all communicators at once.

``ringrecords.state_records`` (the reference) decodes a ``ringstate.Snapshot`` slot by slot
into pydantic models: about 20 µs per flow, 50 times what a 10 Hz sampler of a node may spend
(bench/agent_ingest). This module computes the same rows with a fixed number of numpy
operations over ``ring.Ring.live_copies()``, straight into the bundle tables' dtypes
(``tables.STATE_DTYPE``/``FLOW_DTYPE``): per communicator the active op with the lowest serial
(ring header protocol §2), its flows (same serial, not ``free``; a torn flow only while its
counters are ordered), in (channel, send before recv, peer) order, peers mapped to global ranks,
``idle_ns`` = copy time - last progress. ``tests/unit/nodeagent/test_livestate.py`` checks it
equals the reference on real plugin rings.

Values are checked as the reference checks them: a non-torn slot outside its domain raises
``errors.RingCorrupt`` naming slot and field; a torn one is left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from collscope.nodeagent import errors, ringlayout, ringrecords, ringstate
from collscope.nodeagent.bundle import models, tables

_U64_MAX: Final = np.uint64(2**64 - 1)
_I64_MAX: Final = ringlayout.INT64_MAX
_FUNC_OK: Final = np.array([n is not None for n in ringlayout.FUNC_NAMES])
_KCH_OTHER: Final = "kch_started_other" in (ringlayout.OP_SLOT.names or ())
_NO_STATES: Final = np.zeros(0, tables.STATE_DTYPE)
_NO_FLOWS: Final = np.zeros(0, tables.FLOW_DTYPE)
_FLOW_FIELDS: Final = (
    "dir", "channel", "state", "peer", "total", "c_ready_posted", "c_sent_done",
    "c_done_consumed", "last_progress_ns",
)  # fmt: skip


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
        self._funcs = [intern(n or "") for n in ringlayout.FUNC_NAMES]
        self._tables: dict[int, npt.NDArray[np.int64]] = {}

    def learn_peer(self, comm_hash: int, comm_rank: int, rank: int) -> None:
        if self.peers.get((comm_hash, comm_rank)) != rank:
            self.peers[(comm_hash, comm_rank)] = rank
            self._tables.pop(comm_hash, None)

    def peer(self, comm_hash: int, comm_rank: int) -> int:
        """The global rank of ``comm_rank``, or ``comm_rank`` itself when unknown
        (ringrecords' rule: right for a communicator of the whole job in rank order)."""
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

    def comm(self, comm_hash: int) -> int:
        i = self._comms.get(comm_hash)
        if i is None:
            i = self._comms[comm_hash] = self._intern_comm(ringrecords.comm_hex(comm_hash))
        return i

    def func(self, code: int) -> int:
        return self._funcs[code]


def comm_records(path: str, rank: int, copies: ringstate.Copies) -> list[models.CommRecord]:
    """A ``comm`` record per live, untorn communicator slot (cheap: at most 16 slots)."""
    out = []
    for i in np.flatnonzero(copies.comms["state"] != ringlayout.COMM_FREE).tolist():
        if copies.torn_comms[i]:
            continue
        c = copies.comms[i]
        check = ringlayout.Checker(path, f"comm slot {i}", 0)
        nranks, comm_rank = check.comm_ranks(int(c["nranks"]), int(c["rank"]), int(c["nnodes"]))
        out.append(
            models.CommRecord(
                rank=rank,
                ts=check.time("init_ns", int(c["init_ns"])),
                comm=ringrecords.comm_hex(int(c["comm_hash"])),
                comm_rank=comm_rank,
                nranks=nranks,
                nnodes=int(c["nnodes"]),
                name=check.text("name", bytes(c["name"]), ringlayout.NAME_LEN),
            )
        )
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Part:
    """One ring's copy in a batch: whose it is and when it was taken."""

    path: str
    rank: int
    copies: ringstate.Copies
    taken_ns: int


def state_rows(
    path: str, rank: int, copies: ringstate.Copies, taken_ns: int, names: Names
) -> StateRows:
    """The ``state`` rows of one copy: one per communicator with an op in flight."""
    return state_rows_batch([Part(path, rank, copies, taken_ns)], names)[0]


def state_rows_batch(parts: list[Part], names: Names) -> list[StateRows]:
    """``state_rows`` of many rings in one pass (the sampler's tick): the copies are stacked
    and every step runs once for all of them, so numpy's per-call cost (a few µs, the bulk of
    the work for one ring) is paid once per tick, not once per ring.

    Speed, too: fields are read as strided views of the (rings x 16, 8) op and (rings x 16,
    128) flow arrays and only the selected slots are gathered, field by field (fancy-indexing
    a structured array copies whole slots through a slow generic path).
    """
    if not parts:
        return []
    n = ringlayout.COMM_SLOTS
    comms = _stack([p.copies.comms for p in parts])  # whole slots: ops and flows inside
    ops, flows = comms["ops"], comms["flows"]
    torn_comms = np.concatenate([p.copies.torn_comms for p in parts])
    torn_ops = np.concatenate([p.copies.torn_ops for p in parts])
    torn_flows = np.concatenate([p.copies.torn_flows for p in parts])
    taken = np.repeat(np.array([p.taken_ns for p in parts], dtype=np.int64), n)

    def where(row: int) -> tuple[str, int]:
        return parts[row // n].path, row % n

    states, flow_rows = _rows(
        comms, ops, flows, torn_comms, torn_ops, torn_flows, taken, names, where
    )
    part = states["rank"]  # the part index, replaced by the rank below
    bounds = np.searchsorted(part, np.arange(len(parts) + 1))
    out = []
    for k, p in enumerate(parts):
        st = states[bounds[k] : bounds[k + 1]]
        if len(st) == 0:
            out.append(StateRows(_NO_STATES, _NO_FLOWS))
            continue
        lo, hi = int(st["flow_lo"][0]), int(st["flow_hi"][-1])
        st["flow_lo"] -= lo
        st["flow_hi"] -= lo
        st["rank"] = p.rank
        out.append(StateRows(st, flow_rows[lo:hi]))
    return out


def _stack(arrays: list[npt.NDArray[Any]]) -> npt.NDArray[Any]:
    """Concatenate structured arrays as bytes (one memcpy; numpy's structured path is slow)."""
    if len(arrays) == 1:
        return arrays[0]
    dtype, shape = arrays[0].dtype, arrays[0].shape[1:]
    raw = np.concatenate([a.reshape(len(a), -1).view(np.uint8) for a in arrays])
    return raw.view(dtype).reshape(-1, *shape)


def _rows(  # noqa: PLR0917 - the stacked arrays of state_rows_batch, unpacked once
    comms: npt.NDArray[Any],
    ops: npt.NDArray[Any],
    fl: npt.NDArray[Any],
    torn_comms: npt.NDArray[np.bool_],
    torn_ops: npt.NDArray[np.bool_],
    torn_flows: npt.NDArray[np.bool_],
    taken: npt.NDArray[np.int64],
    names: Names,
    where: Callable[[int], tuple[str, int]],
) -> tuple[tables.Table, tables.Table]:
    """States (``rank`` = the comm row // COMM_SLOTS, the part) and their flows."""
    live = (comms["state"] != ringlayout.COMM_FREE) & ~torn_comms
    func = ops["func"]
    active = (ops["state"] == ringlayout.OP_ACTIVE) & live[:, None]
    # A torn op slot whose values are out of domain is left out, like the reference does.
    ok_func = _FUNC_OK[np.minimum(func, len(_FUNC_OK) - 1)] & (func < len(_FUNC_OK))
    sane = ok_func & (ops["seq"] <= _I64_MAX) & (ops["bytes"] <= _I64_MAX) & (ops["start_ns"] >= 0)
    bad = active & ~sane & ~torn_ops
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
        return _NO_STATES, _NO_FLOWS
    pj = pick[ci]
    in_flight = serial[np.arange(len(serial)), pick]
    # Candidates first, with the cheapest tests over every slot; every other check runs on
    # the few hundred gathered slots only.
    # Only the rows of communicators with an op in flight are scanned (gathered per field:
    # the flow region of 8 rings is 1.2 MB, most of it free slots).
    sub, col = np.nonzero(
        (fl["dir"][ci] != ringlayout.DIR_NONE)
        & (fl["serial"][ci] == in_flight[ci, None])
        & (fl["state"][ci] != ringlayout.FLOW_FREE)
    )
    row = ci[sub]
    f = {name: fl[name][row, col] for name in _FLOW_FIELDS}
    rp, sd, dc = f["c_ready_posted"], f["c_sent_done"], f["c_done_consumed"]
    good = (
        (rp >= sd)
        & (sd >= dc)
        & (f["dir"] <= ringlayout.DIR_RECV)
        & (f["state"] < len(ringlayout.FLOW_STATE_NAMES))
        & (f["peer"] >= 0)
        & (f["peer"] < comms["nranks"][row])
        & (f["last_progress_ns"] >= 0)
    )
    bad = ~torn_flows[row, col] & ~good
    if bad.any():
        i, k = int(row[bad][0]), int(col[bad][0])
        path, slot = where(i)
        raise _corrupt(path, f"comm slot {slot} flow {k}", fl[i, k], "flow counters")
    keep = np.flatnonzero(good)  # torn slots kept only while their counters are ordered
    keep = keep[np.lexsort((f["peer"][keep], f["dir"][keep], f["channel"][keep], row[keep]))]
    row = row[keep]
    f = {name: v[keep] for name, v in f.items()}
    a, b, c = f["c_ready_posted"], f["c_sent_done"], f["c_done_consumed"]
    flows = np.empty(len(row), tables.FLOW_DTYPE)
    send = f["dir"] == ringlayout.DIR_SEND
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
    states["rank"] = ci // ringlayout.COMM_SLOTS
    states["ts"] = taken[ci]
    states["comm"] = [names.comm(h) for h in comms["comm_hash"][ci].tolist()]
    states["seq"] = ops["seq"][ci, pj]
    states["op"] = [names.func(x) for x in func[ci, pj].tolist()]
    states["bytes"] = ops["bytes"][ci, pj]
    states["start"] = ops["start_ns"][ci, pj]
    states["kernel_channels"] = np.where(kernel, nch, -1)
    states["kernel_done"] = np.where(kernel, kch_done, -1)
    states["flow_lo"] = hi - counts
    states["flow_hi"] = hi
    return states, flows


def _global_peers(
    comms: npt.NDArray[Any], row: npt.NDArray[np.intp], peer: npt.NDArray[Any], names: Names
) -> npt.NDArray[np.int64]:
    """Comm ranks -> global ranks: the lookup tables of the communicators involved, laid end
    to end, and one gather (a Python step per communicator, not per flow)."""
    out = peer.astype(np.int64)
    if not names.peers or len(row) == 0:
        return out
    used = np.unique(row)
    hashes, sizes = comms["comm_hash"][used].tolist(), comms["nranks"][used].tolist()
    offset = np.zeros(len(comms), dtype=np.int64)
    tables_: list[npt.NDArray[np.int64]] = []
    at: dict[tuple[int, int], int] = {}
    end = 0
    for c, h, n in zip(used.tolist(), hashes, sizes, strict=True):
        if (h, n) not in at:
            at[(h, n)] = end
            tables_.append(names.peer_table(h, n))
            end += len(tables_[-1])
        offset[c] = at[(h, n)]
    result: npt.NDArray[np.int64] = np.concatenate(tables_)[offset[row] + out]
    return result


def _corrupt(path: str, region: str, slot: Any, what: str) -> errors.RingCorrupt:
    return errors.RingCorrupt(
        path, f"values out of their domain: {slot!r}", region=region, field=what
    )
