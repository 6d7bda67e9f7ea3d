"""The compiled plugin, driven through ctypes in NCCL's call order, read back with ring.open.

Each test loads its own copy of libnccl-profiler-collscope.so (a fresh ring), plays what NCCL
does for ring all-reduces, point-to-point ops, a stalled peer, PXN and finalize (notes §3-§4),
and checks every counter and record the reader returns, exactly.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pydantic
import pytest

from collscope.nodeagent import ring
from collscope.nodeagent.bundle import models
from collscope.nodeagent.ring import eventlog, layout, records

Nccl = Any  # conftest.Nccl: conftest modules cannot be imported under --import-mode=importlib
Load = Callable[[int], Any]
ROOT = pathlib.Path(__file__).resolve().parents[3]
COMM = 0x5EED_0000_0001_CAFE
# conftest event types and states (same reason as Nccl above)
COLL, P2P, KERNEL_CH = 2, 4, 64
PROXY_OP_IN_PROGRESS, KERNEL_CH_STOP = 19, 22
SEND = [8, 20, 9]  # SendGPUWait, SendPeerWait, SendWait
RECV = [10, 11, 12]  # RecvWait, RecvFlushWait, RecvGPUWait
MASK = 2 | 4 | 8 | 16 | 64  # Coll, P2p, ProxyOp, ProxyStep, KernelCh: what the plugin asks for
RECORD: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(models.Record)


def plugin_version() -> str:
    text = (ROOT / "native" / "src" / "internal.h").read_text()
    match = re.search(r'#define COLLSCOPE_PLUGIN_VERSION "([^"]+)"', text)
    assert match
    return match.group(1)


def rings(trace_dir: pathlib.Path) -> list[pathlib.Path]:
    return sorted(trace_dir.glob("*.ring"))


def the_ring(trace_dir: pathlib.Path) -> ring.Ring:
    (path,) = rings(trace_dir)
    return ring.open(path)


class Op:
    """Handles of one operation and its children, and the times the test took around them."""

    def __init__(self, nccl: Nccl, ctx: int, kind: int, **fields: Any) -> None:
        self.nccl, self.ctx = nccl, ctx
        self.t_start = time.time_ns()
        self.handle, self.enqueued = nccl.enqueue(ctx, kind, **fields)
        self.t_started = time.time_ns()
        self.proxy: dict[tuple[int, bool], int | None] = {}
        self.kernel: dict[int, int | None] = {}

    def proxy_ops(self, channel: int, peers: dict[bool, int], nsteps: int) -> None:
        for send, peer in peers.items():
            h = self.nccl.proxy_op(self.ctx, self.handle, channel, peer, nsteps, send=send)
            self.nccl.record(h, PROXY_OP_IN_PROGRESS)
            self.proxy[(channel, send)] = h

    def steps(self, channel: int, send: bool, plan: list[tuple[list[int], bool]]) -> None:
        for step, (states, stop) in enumerate(plan):
            self.nccl.step(self.ctx, self.proxy[(channel, send)], step, states, stop)

    def kernel_start(self, channel: int) -> None:
        self.kernel[channel] = self.nccl.start(
            self.ctx, KERNEL_CH, self.handle, channelId=channel, pTimer=1_000 + channel
        )

    def kernel_stop(self, channel: int) -> None:
        h = self.kernel[channel]
        self.nccl.record(h, KERNEL_CH_STOP, 50_000 + 10 * channel)
        self.nccl.stop(h)


def full(nsteps: int, states: list[int]) -> list[tuple[list[int], bool]]:
    return [(states, True)] * nsteps


def allreduce(
    nccl: Nccl, ctx: int, *, seq: int, nch: int, nsteps: int, peers: tuple[int, int] = (2, 0)
) -> tuple[Op, int, int]:
    """A complete ring AllReduce of 1 Mi float32; ``peers``: the comm ranks it sends to and
    receives from (rank 1 of 4 by default). Returns the op and the times around the last
    child stop, the true completion."""
    op = Op(nccl, ctx, COLL, seqNumber=seq, func=b"AllReduce", count=1 << 20,
            datatype=b"ncclFloat32", nChannels=nch, algo=b"RING", proto=b"SIMPLE")  # fmt: skip
    op.enqueued()  # Coll stop: enqueued only, the GPU has not even started
    for ch in range(nch):
        op.proxy_ops(ch, {True: peers[0], False: peers[1]}, nsteps)
        op.kernel_start(ch)
    for ch in range(nch):
        op.steps(ch, True, full(nsteps, SEND))
        op.steps(ch, False, full(nsteps, RECV))
        for send in (True, False):
            nccl.stop(op.proxy[(ch, send)])
    for ch in range(nch - 1):
        op.kernel_stop(ch)
    before = time.time_ns()
    op.kernel_stop(nch - 1)
    return op, before, time.time_ns()


@pytest.mark.parametrize("api", [4, 5, 6])
def test_init_writes_identity_mask_and_comm(api: int, load: Load, trace_dir: pathlib.Path) -> None:
    nccl = load(api)
    t0 = time.time_ns()
    nccl.init(COMM, "dp0", 2, 4, 1)
    t1 = time.time_ns()
    assert nccl.mask.value == MASK
    (path,) = rings(trace_dir)
    assert path.name == f"collscope-{socket.gethostname()}-pid{os.getpid()}-0.ring"
    with ring.open(path) as r:
        i = r.identity
        assert (i.pid, i.rank, i.local_rank, i.world_size) == (os.getpid(), 5, 1, 8)
        assert (i.hostname, i.pod_name, i.pod_namespace, i.node_name) == (
            socket.gethostname()[:127],
            "llama-5",
            "train",
            "gpu-node-2",
        )
        assert (i.nccl_version, i.nccl_version_code) == ("", 0)  # no libnccl in this process
        assert (i.plugin_version, i.activation_mask) == (plugin_version(), MASK)
        assert t0 <= i.init_ns <= t1
        assert i.file_size == path.stat().st_size == 4 << 20  # COLLSCOPE_RING_BYTES default
        assert i.event_slots == (i.file_size - 4096 - 16 * 9728) // 64
        snap = r.snapshot()
        (c,) = snap.comms
        assert (c.slot, c.state, c.comm_hash, c.rank, c.nranks, c.nnodes, c.name) == (
            0,
            "active",
            COMM,
            1,
            4,
            2,
            "dp0",
        )
        assert (c.profiler_api, c.generation, c.ops, c.flows) == (api, 1, (), ())
        assert t0 <= c.init_ns <= t1 and c.finalize_ns is None
        st = snap.status
        assert (st.state, st.profiler_api, st.comms_open, st.comms_total) == ("active", api, 1, 1)
        events, cursor, missed = r.events_since(0)
        assert (cursor, missed) == (1, 0)
        assert events == [
            eventlog.CommEvent(
                index=0,
                kind="init",
                comm_hash=COMM,
                comm_slot=0,
                rank=1,
                nranks=4,
                nnodes=2,
                profiler_api=api,
                time_ns=c.init_ns,
                name="dp0",
            )
        ]


@pytest.mark.parametrize("api", [4, 5, 6])
def test_ring_allreduce_completes_at_its_last_child(
    api: int, load: Load, trace_dir: pathlib.Path
) -> None:
    nccl = load(api)
    ctx = nccl.init(COMM, "dp0", 2, 4, 1)
    with the_ring(trace_dir) as r:
        op, before, after = allreduce(nccl, ctx, seq=7, nch=4, nsteps=6)
        events, cursor, missed = r.events_since(1)
        assert (cursor, missed) == (2, 0)
        (e,) = events
        assert isinstance(e, eventlog.OpEvent)
        flags = layout.OPF_KERNEL | layout.OPF_PROXY | layout.OPF_GPU_TIMED
        assert e == eventlog.OpEvent(
            index=1,
            comm_hash=COMM,
            comm_slot=0,
            seq=7,
            op="AllReduce",
            bytes=4 << 20,
            dtype="float32",
            algo="Ring",
            proto="Simple",
            nchannels=4,
            flags=flags,
            start_ns=e.start_ns,
            end_ns=e.end_ns,
            peer=None,
            gpu_ns=50_030 - 1_000,  # max KernelCh stop pTimer - min start pTimer
        )
        assert op.t_start <= e.start_ns <= op.t_started
        assert before <= e.end_ns <= after  # the last KernelCh stop, not the Coll stop

        snap = r.snapshot()
        (c,) = snap.comms
        assert (c.ops_started, c.ops_completed, c.last_completion_ns) == (1, 1, e.end_ns)
        assert (c.enqueued[1], c.completed[1], sum(c.enqueued), sum(c.completed)) == (8, 8, 8, 8)
        (o,) = c.ops
        assert (o.state, o.serial, o.seq, o.end_ns, o.flags) == ("done", 0, 7, e.end_ns, flags)
        assert (o.kch_started, o.kch_done, o.proxy_ops_started, o.proxy_ops_done) == (4, 4, 8, 8)
        assert c.in_flight() is None
        assert sorted((f.channel, f.dir, f.peer) for f in c.flows) == [
            (ch, d, 2 if d == "send" else 0) for ch in range(4) for d in ("recv", "send")
        ]
        for f in c.flows:
            counters = (f.total, f.started, f.ready_posted, f.sent_done, f.done_consumed)
            assert (f.state, f.serial, counters) == ("done", 0, (6, 6, 6, 6, 6))
            assert f.gpu_ready == (6 if f.dir == "recv" else 0)
        st = snap.status
        assert (st.events_written, st.events_overwritten, st.events_dropped) == (2, 0, 0)
        assert (st.handles_exhausted, st.flow_slots_exhausted, st.op_slots_busy) == (0, 0, 0)
        assert (st.pxn_foreign_events, st.stale_flow_events, st.comm_slots_exhausted) == (0, 0, 0)
        assert records.state_records(5, snap, {}) == []


def test_stalled_peer_shows_in_the_live_state(load: Load, trace_dir: pathlib.Path) -> None:
    nccl = load(5)
    ctx = nccl.init(COMM, "dp0", 2, 4, 1)
    op = Op(nccl, ctx, COLL, seqNumber=7, func=b"AllReduce", count=1 << 20,
            datatype=b"ncclBfloat16", nChannels=2, algo=b"RING", proto=b"LL128")  # fmt: skip
    op.enqueued()
    for ch in range(2):
        op.proxy_ops(ch, {True: 2, False: 0}, 8)
        op.kernel_start(ch)
    # channel 1 finishes; on channel 0 the receiver (comm rank 2) stops posting buffers
    op.steps(1, True, full(8, SEND))
    op.steps(1, False, full(8, RECV))
    nccl.stop(op.proxy[(1, True)])
    nccl.stop(op.proxy[(1, False)])
    op.kernel_stop(1)
    op.steps(0, True, [
        *full(5, SEND),
        (SEND, False),  # step 5 on the network, no completion
        ([8, 20, 20, 20], False),  # step 6 ready; SendPeerWait again on every isend retry
        ([8], False),  # step 7: buffer offered to the GPU
    ])  # fmt: skip
    op.steps(0, False, [
        *full(4, RECV),
        (RECV, False),  # step 4 handed to the GPU, not consumed
        ([10, 11], False),  # step 5 arrived
        ([10], False),  # step 6 posted
    ])  # fmt: skip
    behind = Op(nccl, ctx, COLL, seqNumber=8, func=b"AllReduce", count=16,
                datatype=b"ncclBfloat16", nChannels=2, algo=b"RING", proto=b"LL")  # fmt: skip
    behind.enqueued()

    with the_ring(trace_dir) as r:
        snap = r.snapshot()
    (c,) = snap.comms
    assert [(o.serial, o.seq, o.state) for o in c.ops] == [(0, 7, "active"), (1, 8, "active")]
    inflight = c.in_flight()
    assert inflight is not None
    assert (inflight.seq, inflight.bytes, inflight.dtype, inflight.proto) == (
        7,
        2 << 20,
        "bfloat16",
        "LL128",
    )
    assert (inflight.kch_started, inflight.kch_done) == (2, 1)
    assert (inflight.proxy_ops_started, inflight.proxy_ops_done) == (4, 2)
    flows = {(f.channel, f.dir): f for f in c.flows_of(inflight)}
    assert {k: (f.state, f.started, f.gpu_ready) for k, f in flows.items()} == {
        (0, "send"): ("running", 8, 0),
        (0, "recv"): ("running", 7, 5),
        (1, "send"): ("done", 8, 0),
        (1, "recv"): ("done", 8, 8),
    }
    peers = records.peer_ranks(5, snap)
    assert peers == {(COMM, 1): 5}
    assert records.untranslated(snap, [], peers) == {(COMM, 0), (COMM, 2)}
    (state,) = records.state_records(5, snap, {(COMM, 0): 4, (COMM, 2): 6})
    got = state.model_dump(exclude_none=True)
    idle = {(f["channel"], f["dir"]): f.pop("idle_ns") for f in got["flows"]}
    for key, value in idle.items():
        assert value == snap.taken_ns - flows[key].last_progress_ns
        assert 0 <= value < 10**10
    RECORD.validate_python(state.model_dump())
    assert got == {
        "type": "state",
        "rank": 5,
        "ts": snap.taken_ns,
        "comm": records.comm_hex(COMM),
        "seq": 7,
        "op": "AllReduce",
        "bytes": 2 << 20,
        "start": inflight.start_ns,
        "flows": [
            {"channel": 0, "peer": 6, "dir": "send", "total": 8, "ready": 7, "sent": 6, "done": 5},
            {
                "channel": 0,
                "peer": 4,
                "dir": "recv",
                "total": 8,
                "posted": 7,
                "done": 6,
                "consumed": 4,
            },
            {"channel": 1, "peer": 6, "dir": "send", "total": 8, "ready": 8, "sent": 8, "done": 8},
            {
                "channel": 1,
                "peer": 4,
                "dir": "recv",
                "total": 8,
                "posted": 8,
                "done": 8,
                "consumed": 8,
            },
        ],
        "kernel": {"channels": 2, "done": 1},
    }


def test_point_to_point_records_their_peer_and_own_count(
    load: Load, trace_dir: pathlib.Path
) -> None:
    nccl = load(5)
    ctx = nccl.init(COMM, "", 2, 4, 1)
    for func, send in ((b"Send", True), (b"Recv", False), (b"Send", True)):
        op = Op(nccl, ctx, P2P, func=func, count=1024, datatype=b"ncclInt8", peer=3,
                nChannels=1)  # fmt: skip
        op.enqueued()
        op.proxy_ops(0, {send: 3}, 2)
        op.kernel_start(0)
        op.steps(0, send, full(2, SEND if send else RECV))
        nccl.stop(op.proxy[(0, send)])
        op.kernel_stop(0)
    with the_ring(trace_dir) as r:
        events, _, _ = r.events_since(1)
        snap = r.snapshot()
    flags = layout.OPF_P2P | layout.OPF_KERNEL | layout.OPF_PROXY | layout.OPF_GPU_TIMED
    assert all(isinstance(e, eventlog.OpEvent) for e in events)
    ops = [e for e in events if isinstance(e, eventlog.OpEvent)]
    assert [(e.op, e.seq, e.peer, e.bytes, e.algo, e.proto, e.flags) for e in ops] == [
        ("Send", 0, 3, 1024, "", "", flags),
        ("Recv", 0, 3, 1024, "", "", flags),
        ("Send", 1, 3, 1024, "", "", flags),
    ]
    translated = records.op_records(5, "ring", events, {(COMM, 3): 7})
    assert [r.peer for r in translated] == [7, 7, 7]
    (c,) = snap.comms
    assert (c.enqueued[6], c.enqueued[7], c.completed[6], c.completed[7]) == (2, 1, 2, 1)
    assert records.comm_records(5, snap, events)[0].name == ""


def test_op_without_children_ends_at_enqueue(load: Load, trace_dir: pathlib.Path) -> None:
    nccl = load(4)
    ctx = nccl.init(COMM, "dp0", 1, 2, 1)
    op = Op(nccl, ctx, COLL, seqNumber=0, func=b"Broadcast", count=8, datatype=b"ncclInt8",
            nChannels=0, algo=b"RING", proto=b"SIMPLE")  # fmt: skip
    before = time.time_ns()
    op.enqueued()
    after = time.time_ns()
    with the_ring(trace_dir) as r:
        (e,) = r.events_since(1)[0]
    assert isinstance(e, eventlog.OpEvent)
    assert (e.op, e.flags, e.nchannels, e.gpu_ns) == ("Broadcast", layout.OPF_NO_CHILDREN, 0, 0)
    assert before <= e.end_ns <= after


def test_pxn_events_from_another_process_are_ignored(load: Load, trace_dir: pathlib.Path) -> None:
    nccl = load(6)
    ctx = nccl.init(COMM, "dp0", 2, 4, 1)
    op = Op(nccl, ctx, COLL, seqNumber=3, func=b"AllGather", count=4096, datatype=b"ncclInt8",
            nChannels=1, algo=b"RING", proto=b"SIMPLE")  # fmt: skip
    op.enqueued()
    # another local rank's proxy progresses this op (PXN): its pid, its pointers
    foreign = nccl.proxy_op(0xDEAD, 0xBEEF, 0, 2, 4, send=True, pid=os.getpid() + 1)
    assert foreign is None
    op.kernel_start(0)
    op.kernel_stop(0)
    with the_ring(trace_dir) as r:
        snap = r.snapshot()
        (e,) = r.events_since(1)[0]
    assert snap.status.pxn_foreign_events == 1
    assert snap.comms[0].flows == ()
    assert isinstance(e, eventlog.OpEvent)
    assert (e.op, e.flags) == ("AllGather", layout.OPF_KERNEL | layout.OPF_GPU_TIMED)


def test_concurrent_proxy_threads(load: Load, trace_dir: pathlib.Path) -> None:
    # ctypes releases the GIL around each call: 8 threads really call the plugin at once.
    nccl = load(5)
    ctx = nccl.init(COMM, "dp0", 2, 4, 1)
    nch, nsteps = 8, 32
    op = Op(nccl, ctx, COLL, seqNumber=1, func=b"ReduceScatter", count=1 << 16,
            datatype=b"ncclFloat16", nChannels=nch, algo=b"RING", proto=b"SIMPLE")  # fmt: skip
    for ch in range(nch):
        op.proxy_ops(ch, {True: 2, False: 0}, nsteps)
        op.kernel_start(ch)
    barrier = threading.Barrier(nch)

    def channel(ch: int) -> None:
        barrier.wait(timeout=30)
        op.steps(ch, True, full(nsteps, SEND))
        op.steps(ch, False, full(nsteps, RECV))
        nccl.stop(op.proxy[(ch, True)])
        nccl.stop(op.proxy[(ch, False)])
        op.kernel_stop(ch)

    threads = [threading.Thread(target=channel, args=(ch,)) for ch in range(nch)]
    for t in threads:
        t.start()
    op.enqueued()  # the user thread's Coll stop races with the proxy threads
    for t in threads:
        t.join(timeout=60)
    with the_ring(trace_dir) as r:
        snap = r.snapshot()
        events, _, _ = r.events_since(1)
    assert [(e.op, e.seq) for e in events if isinstance(e, eventlog.OpEvent)] == [
        ("ReduceScatter", 1)
    ]
    (c,) = snap.comms
    (o,) = c.ops
    assert (o.state, o.kch_done, o.proxy_ops_done) == ("done", nch, 2 * nch)
    assert len(c.flows) == 2 * nch
    assert {(f.started, f.ready_posted, f.sent_done, f.done_consumed) for f in c.flows} == {
        (nsteps,) * 4
    }


def test_full_event_ring_overwrites_the_oldest(
    load: Load, trace_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLLSCOPE_RING_BYTES", "256k")  # the minimum: 1600 records
    nccl = load(4)
    ctx = nccl.init(COMM, "dp0", 1, 2, 1)
    for seq in range(1650):  # no children: each completes at its Coll stop
        nccl.stop(nccl.start(ctx, COLL, None, seqNumber=seq, func=b"AllReduce", count=1,
                             datatype=b"ncclInt8", nChannels=0))  # fmt: skip
    with the_ring(trace_dir) as r:
        assert r.identity.event_slots == 1600
        assert r.status().events_overwritten == 1651 - 1600
        assert r.first_cursor() == 51
        events, cursor, missed = r.events_since(0)
    assert (len(events), cursor, missed) == (1600, 1651, 51)
    assert [e.index for e in events] == list(range(51, 1651))
    assert [e.seq for e in events if isinstance(e, eventlog.OpEvent)] == list(range(50, 1650))


def test_finalize_leaves_a_readable_ring(load: Load, trace_dir: pathlib.Path) -> None:
    nccl = load(5)
    ctx = nccl.init(COMM, "dp0", 2, 4, 1)
    allreduce(nccl, ctx, seq=0, nch=1, nsteps=1)
    t0 = time.time_ns()
    nccl.finalize(ctx)
    with the_ring(trace_dir) as r:
        snap = r.snapshot()
        events, cursor, _ = r.events_since(0)
    (c,) = snap.comms
    assert c.state == "finalized" and c.finalize_ns is not None and c.finalize_ns >= t0
    assert (snap.status.state, snap.status.comms_open, snap.status.comms_total) == ("idle", 0, 1)
    assert [(type(e).__name__, getattr(e, "kind", None)) for e in events] == [
        ("CommEvent", "init"),
        ("OpEvent", None),
        ("CommEvent", "finalize"),
    ]
    assert cursor == 3


def dump(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collscope.operator.cli", "ring", "dump", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_ring_dump_translates_peers_across_rings(
    load: Load, trace_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two processes (global ranks 5 and 9) of one 2-rank communicator, both mid-AllReduce.
    for rank, me in ((5, 0), (9, 1)):
        monkeypatch.setenv("RANK", str(rank))
        nccl = load(5)
        ctx = nccl.init(COMM, "pp", 1, 2, me)
        allreduce(nccl, ctx, seq=0, nch=1, nsteps=2, peers=(1 - me, 1 - me))
        op = Op(nccl, ctx, COLL, seqNumber=1, func=b"AllReduce", count=256,
                datatype=b"ncclFloat32", nChannels=1, algo=b"RING", proto=b"LL")  # fmt: skip
        op.enqueued()
        op.proxy_ops(0, {True: 1 - me, False: 1 - me}, 4)
        op.steps(0, True, [*full(2, SEND), (SEND, False)])
    a, b = rings(trace_dir)
    res = dump(str(a), str(b))
    assert res.returncode == 0, res.stderr
    records = [RECORD.validate_json(line) for line in res.stdout.splitlines()]
    assert [(r.type, r.rank) for r in records] == [
        ("comm", 5),
        ("op", 5),
        ("state", 5),
        ("comm", 9),
        ("op", 9),
        ("state", 9),
    ]
    states = [r for r in records if isinstance(r, models.StateRecord)]
    assert [[(f.dir, f.peer) for f in s.flows] for s in states] == [
        [("send", 9), ("recv", 9)],
        [("send", 5), ("recv", 5)],
    ]
    first = states[0].flows[0]
    assert isinstance(first, models.SendFlow)
    assert (first.ready, first.sent, first.done) == (3, 3, 2)
    summaries = [line for line in res.stderr.splitlines() if not line.startswith(" ")]
    assert summaries[0].startswith(f"{a}: pid {os.getpid()}, rank 5 (local 1, world 8)")
    assert summaries[1].startswith(f"{b}: pid {os.getpid()}, rank 9")
    assert "communicator ranks" not in res.stderr
    assert "snapshot consistent" in res.stderr

    alone = dump(str(a))
    assert alone.returncode == 0
    assert "1 peer(s) left as communicator ranks" in alone.stderr
    assert json.loads(alone.stdout.splitlines()[-1])["flows"][0]["peer"] == 1


def test_ring_dump_needs_a_rank(
    load: Load, trace_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RANK")
    load(5).init(COMM, "dp0", 1, 2, 1)
    (path,) = rings(trace_dir)
    res = dump(str(path))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"collscope ring: error: {path}: RANK was not set in the writing process; pass --rank"
    ]
    res = dump(str(path), "--rank", "3")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[0])["rank"] == 3


def test_ring_dump_of_a_corrupt_ring_is_one_line(load: Load, trace_dir: pathlib.Path) -> None:
    load(5).init(COMM, "dp0", 1, 2, 1)
    (path,) = rings(trace_dir)
    data = bytearray(path.read_bytes())
    data[12] = 0xFF  # header_size
    bad = trace_dir / "bad.bin"
    bad.write_bytes(bytes(data))
    res = dump(str(bad))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        f"collscope ring: error: {bad}: header @0xc field 'header_size': expected 4096, got 4351"
    ]
