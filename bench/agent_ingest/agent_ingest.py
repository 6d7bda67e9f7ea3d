"""Node agent ingest: rings -> windows throughput, CPU share at 10 Hz, memory at the default cap.

Reproduce (from the repository root, after the README's set-up)::

    .venv/bin/python bench/agent_ingest/agent_ingest.py               # ~35 s
    .venv/bin/python bench/agent_ingest/agent_ingest.py --duration-s 5 --quick

The rings are written here, in the plugin's binary layout (``layout`` dtypes, the same the
reader is checked against), not by the plugin: no compiler needed, and the numbers measure the
reader side only. Scenario: ``--rings`` rings (8) x ``--comms`` communicators (8) x ``--flows``
flows (32) per in-flight op, every op in flight, plus ``--ops-per-tick`` completions (8) per
ring appended between ticks. Three measurements:

1. ingest: ``Sampler.tick()`` back to back; state-flow entries per second of CPU
   (``time.process_time``: one core, the loop is single-threaded). Target >= 1 M/s/core.
2. CPU share: the sampler thread at 10 Hz for ``--duration-s`` wall seconds, after one tick
   off the clock (it opens the rings and reads the records the earlier stages left in them);
   CPU seconds of the process / wall seconds. Target <= 2 % of one core.
3. memory: one window at the default cap (256 MiB) filled with chunks from the same rings with
   a simulated clock until it evicts for memory; resident set growth vs the window's estimate.
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

from collscope.nodeagent import discovery, ring, sampler, settings, window
from collscope.nodeagent.ring import layout, staterows

T0 = 1_732_001_234_000_000_000
EVENT_SLOTS = 4096


class SyntheticRing:
    """A ring file mapped read-write; the bench plays the writer (no seqlock races)."""

    def __init__(self, path: pathlib.Path, rank: int, comms: int, flows: int) -> None:
        comm_off = layout.HEADER_BYTES
        ev_off = comm_off + layout.COMM_SLOTS * layout.COMM_SLOT.itemsize
        size = ev_off + EVENT_SLOTS * layout.EVENT_BYTES
        path.write_bytes(b"\0" * size)
        self.header = np.memmap(path, layout.HEADER, "r+", 0, (1,))
        self.comms = np.memmap(path, layout.COMM_SLOT, "r+", comm_off, (layout.COMM_SLOTS,))
        self.events = np.memmap(path, layout.EVENT, "r+", ev_off, (EVENT_SLOTS,))
        h = self.header[0]
        for name, value in {
            "magic": layout.MAGIC, "version": layout.VERSION,
            "header_size": layout.HEADER_BYTES, "file_size": size, "state": 1,
            "profiler_api": 5, "comm_region_offset": comm_off,
            "comm_region_size": layout.COMM_SLOTS * layout.COMM_SLOT.itemsize,
            "comm_slot_count": layout.COMM_SLOTS,
            "comm_slot_size": layout.COMM_SLOT.itemsize,
            "op_slots_per_comm": layout.OPS_PER_COMM,
            "flow_slots_per_comm": layout.FLOWS_PER_COMM, "event_region_offset": ev_off,
            "event_region_size": EVENT_SLOTS * layout.EVENT_BYTES,
            "event_slot_count": EVENT_SLOTS, "event_record_size": layout.EVENT_BYTES,
            "op_slot_size": layout.OP_SLOT.itemsize,
            "flow_slot_size": layout.FLOW_SLOT.itemsize,
            "pid": 1000 + rank, "rank": rank, "local_rank": rank, "world_size": 64,
            "init_realtime_ns": T0, "heartbeat_ns": time.time_ns(),
        }.items():  # fmt: skip
            h[name] = value
        for c in range(comms):
            s = self.comms[c]
            s["state"], s["comm_hash"], s["rank"], s["nranks"], s["nnodes"] = (
                1,
                0xC0 + c,
                rank,
                64,
                8,
            )
            s["init_ns"], s["generation"], s["name"] = T0, 1, f"comm{c}".encode()
            op = s["ops"][0]
            op["state"], op["serial"], op["seq"], op["func"] = layout.OP_ACTIVE, 5, 5, 1
            op["bytes"], op["start_ns"], op["nchannels"] = 1 << 22, T0, flows // 2
            fl = s["flows"][:flows]
            fl["dir"] = np.where(np.arange(flows) % 2 == 0, layout.DIR_SEND, layout.DIR_RECV)
            fl["channel"] = np.arange(flows) // 2
            # A ring all-reduce: send to the next rank, receive from the previous one.
            fl["peer"] = np.where(fl["dir"] == layout.DIR_SEND, (rank + 1) % 64, (rank - 1) % 64)
            fl["state"], fl["serial"], fl["total"] = layout.FLOW_RUNNING, 5, 64
            fl["c_ready_posted"], fl["c_sent_done"], fl["c_done_consumed"] = 40, 30, 20
            fl["last_progress_ns"] = T0
        self.written = 0

    def complete(self, n: int) -> None:
        """Append ``n`` committed op records (AllReduce on comm 0)."""
        for _ in range(n):
            i = self.written
            r = np.zeros(1, layout.OP_RECORD)[0]
            r["type"], r["func"], r["comm_slot"], r["comm_hash"], r["seq"] = 1, 1, 0, 0xC0, i
            r["bytes"], r["start_ns"], r["end_ns"], r["peer"], r["idx"] = (
                1 << 22,
                T0 + i,
                T0 + i + 9,
                -1,
                i,
            )
            self.events[i % EVENT_SLOTS]["raw"] = np.frombuffer(r.tobytes(), np.uint8)
            self.written += 1
        self.header[0]["events_written"] = self.written
        self.header[0]["heartbeat_ns"] = time.time_ns()


def make_sampler(root: pathlib.Path, interval_s: float, cap: int) -> sampler.Sampler:
    d = settings.DiscoverySettings(mode="directory", trace_root=str(root))
    w = window.Window(window_s=120, memory_cap_bytes=cap)
    s = settings.SamplingSettings(sample_interval_s=interval_s, stale_after_s=3600)
    return sampler.Sampler(discovery.Discovery(d), w, s, rescan_interval_s=0.5)


def rss_bytes() -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rings", type=int, default=8)
    p.add_argument("--comms", type=int, default=8)
    p.add_argument("--flows", type=int, default=32)
    p.add_argument("--ops-per-tick", type=int, default=8)
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--quick", action="store_true", help="fewer ingest ticks, smaller memory fill")
    a = p.parse_args(argv)
    print(f"$ {sys.executable} {' '.join(sys.argv)}")
    with tempfile.TemporaryDirectory(prefix="collscope-bench-") as tmp:
        root = pathlib.Path(tmp)
        rings = [SyntheticRing(root / f"r{k}.ring", k, a.comms, a.flows) for k in range(a.rings)]
        flows_per_tick = a.rings * a.comms * a.flows
        # 1. ingest, back to back: live state only, then with completions
        ticks = 50 if a.quick else 300
        base = ingest(root, rings, 0, ticks, flows_per_tick)
        with_ops = ingest(root, rings, a.ops_per_tick, ticks, flows_per_tick)
        n_ops = a.rings * a.ops_per_tick
        print(
            f"ingest: {flows_per_tick} state-flow entries per tick ({a.rings} rings x {a.comms} "
            f"comms x {a.flows} flows), {ticks} ticks back to back: {base / ticks * 1e3:.2f} ms "
            f"CPU per tick, {ticks * flows_per_tick / base / 1e6:.2f} M flow entries/s per core"
        )
        if n_ops:
            print(
                f"ingest with {n_ops} op completions per tick: {with_ops / ticks * 1e3:.2f} ms "
                f"CPU per tick, {(with_ops - base) / ticks / n_ops * 1e6:.1f} us per op record"
            )
        # 2. CPU share at 10 Hz: live state only (the target's scenario), then with completions
        for ops in (0, a.ops_per_tick):
            cpu_share(root, rings, ops, a.duration_s)
        # 3. memory at the default cap
        fill(rings, a, root)
    return 0


def ingest(
    root: pathlib.Path, rings: list[SyntheticRing], ops: int, ticks: int, flows_per_tick: int
) -> float:
    """CPU seconds of ``ticks`` sampler ticks (the bench's writer excluded)."""
    s = make_sampler(root, 0.1, 256 << 20)
    s.tick()  # opens the rings
    per_tick = []
    for _ in range(ticks):
        for r in rings:
            r.complete(ops)
        t = time.process_time()
        s.tick()
        per_tick.append(time.process_time() - t)
    assert s.window.counters.flows >= ticks * flows_per_tick, s.window.counters
    assert s.window.counters.ops >= ticks * ops * len(rings), s.window.counters
    s.stop()
    # On a shared machine other processes inflate CPU time (caches, SMT siblings): the
    # fastest decile shows what a tick costs on a quiet core.
    fast = float(np.percentile(per_tick, 10))
    print(
        f"  ({ops} completions/ring/tick) CPU per tick: mean {np.mean(per_tick) * 1e3:.2f} ms, "
        f"median {np.median(per_tick) * 1e3:.2f} ms, p10 {fast * 1e3:.2f} ms "
        f"= {flows_per_tick / fast / 1e6:.2f} M flow entries/s per core at p10"
    )
    return float(np.sum(per_tick))


def cpu_share(root: pathlib.Path, rings: list[SyntheticRing], ops: int, duration_s: float) -> None:
    s = make_sampler(root, 0.1, 256 << 20)
    # Warm up off the clock: the first tick opens the rings and reads the completion records
    # the earlier stages left in them (thousands: ~30 ms, 0.6 % of a 5 s run), a start-up
    # cost, not the steady state that the 10 Hz share is about.
    s.tick()
    stop = threading.Event()
    writer_cpu = [0.0]

    def writer() -> None:  # ops complete in the background, as training does
        start = time.thread_time()
        while not stop.wait(0.1):
            for r in rings:
                r.complete(ops)
        writer_cpu[0] = time.thread_time() - start

    w = threading.Thread(target=writer)
    s.start()
    w.start()
    c0, t0 = time.process_time(), time.monotonic()
    time.sleep(duration_s)
    c1, t1 = time.process_time(), time.monotonic()
    stop.set()
    w.join()
    s.stop()
    agent_cpu = c1 - c0 - writer_cpu[0]  # the bench's writer plays the training processes
    print(
        f"cpu at 10 Hz, {ops} completions/ring/tick: {s.stats.ticks} ticks in {t1 - t0:.1f} s, "
        f"{agent_cpu:.3f} CPU s in the agent ({writer_cpu[0]:.3f} s in the bench's writer, "
        f"excluded): {agent_cpu / (t1 - t0) * 100:.2f} % of one core"
    )


def fill(rings: list[Any], a: argparse.Namespace, root: pathlib.Path) -> None:
    cap = settings.WindowSettings().memory_cap_bytes
    if a.quick:
        cap //= 8
    w = window.Window(window_s=1e9, memory_cap_bytes=cap)
    opened = [ring.open(root / f"r{k}.ring") for k in range(a.rings)]
    names = staterows.Names(w.comm_ids, w.strings)
    before = rss_bytes()
    ts = T0
    n = 0
    while w.counters.evicted_for_memory < 1000:
        ts += 100_000_000
        for k, r in enumerate(opened):
            _, copies, _ = r.live_copies()
            rows = staterows.state_rows(r.path, k, copies, ts, names)
            w.add(k, states=rows.states, flows=rows.flows)
        n += 1
    after = rss_bytes()
    for r in opened:
        r.close()
    held_s = (w.counters.states - w.counters.evicted_records) / (a.rings * a.comms) / 10
    print(
        f"memory: cap {cap / 2**20:.0f} MiB, window estimate {w.nbytes / 2**20:.1f} MiB "
        f"(~{held_s:.0f} s of this load at 10 Hz), "
        f"resident growth {(after - before) / 2**20:.1f} MiB, "
        f"resident total {after / 2**20:.1f} MiB after {n} ticks"
    )


if __name__ == "__main__":
    raise SystemExit(main())
