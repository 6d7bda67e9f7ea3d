"""The sampling loop: every ring on the node, read at 10 Hz into the window.

Each tick (Mycroft §4.2: a real-time state log beside the completion log):

1. every ``rescan_interval_s``, ``discovery`` reports new and vanished rings; new ones are
   opened (a corrupt or half-created one is skipped with a logged, counted error, and retried
   when its size or mtime changes), vanished ones are closed and marked retired: what was read
   from them stays in the window until it ages out;
2. per open ring: a seqlock copy of its live state becomes ``state`` rows (``staterows``, only
   for communicators with an op in flight), the event ring is tailed from the ring's cursor into
   ``op`` rows, and new communicators into ``comm`` records. A ring whose writer stopped beating
   (wedged or dead) is read all the same: its last state is the evidence of a hang; its events
   are then read with ``skip_pending`` (a writer that died mid-append never commits);
3. the window evicts what is older than ``window_s`` or over the memory cap.

Keys: each ring's data goes into the window under (its workload, its rank)
(``discovery.workload_of``: its pod's uid), so two jobs on one node never mix, and so do the
peer tables that map communicator ranks to global ranks (``staterows.Names``, one per
workload: a tenant's ring naming another job's communicator hash cannot rewrite that job's
peers). The rings of one workload are read in one batch per tick, as before.

Restart: a new agent starts each ring's cursor at the oldest record still in it
(``first_cursor``), so an agent restarted mid-stream recovers what the ring still holds.
A read error on one ring (truncated, corrupted while open) closes that ring only.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping

import numpy as np

from collscope.nodeagent import discovery, errors, ids, launchers, ring, settings, window
from collscope.nodeagent.bundle import tables
from collscope.nodeagent.ring import eventlog, eventrows, layout, livestate, staterows

log = logging.getLogger(__name__)
_NS = 1_000_000_000
# Header status decoded every 5th tick (0.5 s at 10 Hz): 4x under the 2 s stale threshold.
STATUS_EVERY = 5


@dataclasses.dataclass(slots=True)
class Tracked:
    """One ring file the agent knows, open or not. Mutated by the sampler thread only."""

    path: str
    pod_uid: ids.PodUID | None
    workload: str = ""  # discovery.workload_of: the window's key with the rank
    reader: ring.Ring | None = None
    identity: ring.Identity | None = None
    status: livestate.Status | None = None
    health: str = "opening"  # opening | live | stale | finalized | error | retired
    error: str = ""
    errors: int = 0
    cursor: int = 0
    missed: int = 0
    last_sample_ns: int = 0
    status_ns: int = 0  # when ``status`` was read (its heartbeat's age is measured from here)
    retired_ns: int | None = None
    failed_stat: tuple[int, int] | None = None
    comm_keys: frozenset[tuple[int, int, int]] = frozenset()
    comm_stamp: bytes = b""


@dataclasses.dataclass(slots=True)
class Stats:
    """Self-metrics of the loop."""

    ticks: int = 0
    last_tick_ns: int = 0
    last_duration_s: float = 0.0
    ring_errors: int = 0
    loop_errors: int = 0
    events_missed: int = 0


class Sampler:
    """Owns the rings and the loop; the HTTP server reads ``rings()`` and ``stats``."""

    def __init__(
        self,
        finder: discovery.Discovery,
        win: window.Window,
        config: settings.SamplingSettings,
        *,
        rescan_interval_s: float = 0.5,
        clock_ns: Callable[[], int] = time.time_ns,
        rank_env: Callable[[Tracked], Mapping[str, str] | None] | None = None,
    ) -> None:
        self.finder = finder
        # The environment of a ring's writer, for a header without RANK (``_fill_rank``).
        self._rank_env = rank_env
        self.window = win
        self.config = config
        self.rescan_ns = int(rescan_interval_s * _NS)
        self.clock_ns = clock_ns
        self.stats = Stats()
        self._tracked: dict[str, Tracked] = {}
        self._names: dict[str, staterows.Names] = {}  # workload -> its peer tables
        self._last_scan_ns: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- loop -----------------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="collscope-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        with self._lock:
            for t in self._tracked.values():
                _close(t)

    def _run(self) -> None:
        period = self.config.sample_interval_s
        deadline = time.monotonic()
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # the loop must outlive any bug in one tick
                self.stats.loop_errors += 1
                log.exception("sampling tick failed")
            deadline += period
            delay = deadline - time.monotonic()
            if delay < 0:  # overran: skip the missed ticks, do not burst
                deadline, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    def tick(self) -> None:
        """One sampling pass over every ring (public for tests and the bench)."""
        started = time.perf_counter()
        now = self.clock_ns()
        with self._lock:
            if self._last_scan_ns is None or now - self._last_scan_ns >= self.rescan_ns:
                self._last_scan_ns = now
                self._rescan(now)
            read = [(t, got) for t in self._tracked.values() if (got := self._read(t))]
            self._windows(read)
        self.window.evict(now)
        self.stats.ticks += 1
        self.stats.last_tick_ns = now
        self.stats.last_duration_s = time.perf_counter() - started

    def rings(self) -> list[Tracked]:
        """A copy of every ring's record (retired ones included while their data may be held)."""
        with self._lock:
            return [dataclasses.replace(t) for t in self._tracked.values()]

    # -- discovery ------------------------------------------------------------------------
    def _rescan(self, now: int) -> None:
        change = self.finder.changes()
        for path in change.removed:
            t = self._tracked.get(path)
            if t is not None:
                _close(t)
                t.health, t.retired_ns = "retired", now
        for f in change.added:
            old = self._tracked.get(f.path)
            if old is None or old.health == "retired":
                self._tracked[f.path] = Tracked(f.path, f.pod_uid, f.workload)
        horizon = now - self.window.window_ns
        gone = [p for p, t in self._tracked.items() if (t.retired_ns or now) < horizon]
        if gone:
            dropped = {_key(self._tracked.pop(p)) for p in gone}
            held = {_key(t) for t in self._tracked.values()}
            self.window.forget(k for k in dropped - held if k is not None)
            workloads = {t.workload for t in self._tracked.values()}
            for w in [w for w in self._names if w not in workloads]:
                del self._names[w]
        for t in self._tracked.values():
            if t.reader is None and t.health != "retired":
                self._open(t)

    def _open(self, t: Tracked) -> None:
        try:
            st = os.stat(t.path)
        except OSError:
            return  # vanished between scan and open: the next scan retires it
        stat = (st.st_size, st.st_mtime_ns)
        if t.failed_stat == stat:
            return  # unchanged since it failed: do not log it again every scan
        try:
            r = ring.open(t.path, clock=self.clock_ns)
        except (errors.RingError, OSError) as e:
            self._failed(t, e)
            t.failed_stat = stat
            return
        same = t.identity is not None and (t.identity.pid, t.identity.init_ns) == (
            r.identity.pid,
            r.identity.init_ns,
        )
        first = r.first_cursor()  # restart-safe: whatever the ring still holds
        try:
            written = r.status().events_written
        except errors.RingError as e:
            r.close()
            self._failed(t, e)
            t.failed_stat = stat
            return
        # Reopened after an error: the same writer's records already read are not read twice.
        t.cursor = max(first, t.cursor) if same and t.cursor <= written else first
        t.reader, t.identity, t.failed_stat, t.error = r, r.identity, None, ""
        t.health = "live"
        self._fill_rank(t)

    def _fill_rank(self, t: Tracked) -> None:
        """A header without a rank (launched by mpirun, srun, a PMIx launcher or an Indexed
        Job, none of which set RANK): the rank from the writer's environment
        (``launchers.resolve``); when it cannot be known, ``error`` says why and the ring is
        listed with rank None, not windowed."""
        i = t.identity
        if i is None or i.rank is not None:
            return
        env = self._rank_env(t) if self._rank_env is not None else None
        if env is None:
            t.error = "rank unknown: no rank in the ring header, writer's environment unreadable"
            return
        got = launchers.resolve(env)
        if got.rank is None:
            t.error = got.reason
            return
        t.identity = dataclasses.replace(
            i,
            rank=got.rank,
            local_rank=i.local_rank if i.local_rank is not None else got.local_rank,
            world_size=i.world_size if i.world_size is not None else got.world_size,
        )

    def _failed(self, t: Tracked, e: BaseException) -> None:
        t.errors += 1
        t.health, t.error = "error", str(e)
        self.stats.ring_errors += 1
        log.warning("ring %s skipped: %s", t.path, e)

    # -- sampling -------------------------------------------------------------------------
    def _read(self, t: Tracked) -> tuple[staterows.Part, tables.Table] | None:
        """Copy one ring's live state and tail its events; None when closed or failed."""
        r, ident = t.reader, t.identity
        if r is None or ident is None:
            return None
        try:
            # The header's status (heartbeat, counters) every STATUS_EVERY ticks: health
            # needs it at the scale of stale_after_s, not of the sampling period.
            fresh = t.status is None or self.stats.ticks % STATUS_EVERY == 0
            status, copies, taken = r.live_copies(with_status=fresh)
            if status is not None:
                t.status, t.status_ns = status, taken
            assert t.status is not None
            t.health = _health(t.status, taken, self.config.stale_after_s)
            t.last_sample_ns = taken
            self._learn_comms(t, copies, ident.rank)
            events, t.cursor, missed = r.events_since(t.cursor, skip_pending=t.health != "live")
            t.missed += missed
            self.stats.events_missed += missed
            if ident.rank is None:
                return None  # no RANK in the writer's environment: listed, not windowed
            ops = self._op_rows(t, ident.rank, events)
        except (errors.RingError, OSError, ValueError) as e:
            self._broken(t, e)
            return None
        return staterows.Part(t.path, ident.rank, copies, taken), ops

    def _windows(self, read: list[tuple[Tracked, tuple[staterows.Part, tables.Table]]]) -> None:
        """State rows of every ring read, in one batch per workload, into the window."""
        batches: dict[str, list[tuple[Tracked, tuple[staterows.Part, tables.Table]]]] = {}
        for item in read:
            batches.setdefault(item[0].workload, []).append(item)
        for workload, batch in batches.items():
            self._window(self._names_of(workload), batch)

    def _window(
        self,
        names: staterows.Names,
        read: list[tuple[Tracked, tuple[staterows.Part, tables.Table]]],
    ) -> None:
        try:
            rows = staterows.state_rows_batch([p for _, (p, _) in read], names)
        except errors.RingCorrupt:
            rows = []  # one ring's slot is out of its domain: find which, one by one
            for t, (p, _) in read:
                try:
                    rows.append(staterows.state_rows_batch([p], names)[0])
                except errors.RingCorrupt as e:
                    self._broken(t, e)
                    rows.append(staterows.EMPTY)
        for (t, (p, ops)), r in zip(read, rows, strict=True):
            w = t.workload
            if t.reader is None:
                self.window.add(p.rank, workload=w, ops=ops)  # broken just now: its ops hold
            else:
                self.window.add(p.rank, workload=w, states=r.states, flows=r.flows, ops=ops)

    def _names_of(self, workload: str) -> staterows.Names:
        names = self._names.get(workload)
        if names is None:
            names = self._names[workload] = staterows.Names(
                self.window.comm_ids, self.window.strings
            )
        return names

    def _broken(self, t: Tracked, e: BaseException) -> None:
        _close(t)
        self._failed(t, e)
        try:
            st = os.stat(t.path)
            t.failed_stat = (st.st_size, st.st_mtime_ns)
        except OSError:
            t.failed_stat = None

    def _learn_comms(self, t: Tracked, copies: livestate.Copies, rank: int | None) -> None:
        c = copies.comms
        # Slot states and generations change only at communicator init and finalize: compare
        # their bytes first, decode the keys only when they moved (most ticks: they did not).
        # Only live slots are copied: which slots they are is part of the stamp.
        stamp = b"".join(
            (
                copies.slots.tobytes(),
                c["state"].tobytes(),
                c["generation"].tobytes(),
                copies.torn_comms.tobytes(),
            )
        )
        if stamp == t.comm_stamp:
            return
        t.comm_stamp = stamp
        live = np.flatnonzero((c["state"] != layout.COMM_FREE) & ~copies.torn_comms)
        keys = frozenset(
            zip(
                c["comm_hash"][live].tolist(),
                c["rank"][live].tolist(),
                c["generation"][live].tolist(),
                strict=True,
            )
        )
        if keys == t.comm_keys:
            return
        t.comm_keys = keys
        if rank is None:
            return
        names = self._names_of(t.workload)
        for h, comm_rank, _ in keys:
            names.learn_peer(h, comm_rank, rank)
        self.window.add_comms(staterows.comm_records(t.path, rank, copies), workload=t.workload)

    def _op_rows(self, t: Tracked, rank: int, events: list[eventlog.Event]) -> tables.Table:
        names = self._names_of(t.workload)
        rows, inits = eventrows.op_rows(rank, events, names, self.window.strings)
        if inits:
            self.window.add_comms(inits, workload=t.workload, replace=False)
        return rows


def _health(status: livestate.Status, now_ns: int, stale_after_s: float) -> str:
    if status.comms_open == 0 and status.comms_total > 0:
        return "finalized"
    if now_ns - status.heartbeat_ns > stale_after_s * _NS:
        return "stale"
    return "live"


def _key(t: Tracked) -> tuple[str, int] | None:
    """The ring's window key, None while its rank is not known."""
    rank = t.identity.rank if t.identity is not None else None
    return None if rank is None else (t.workload, rank)


def _close(t: Tracked) -> None:
    if t.reader is not None:
        t.reader.close()
        t.reader = None
