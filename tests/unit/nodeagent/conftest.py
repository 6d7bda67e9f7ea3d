"""A ring file built in Python, field by field, as the plugin would leave it.

The builder writes through ``layout``'s dtypes: a layout error there is caught by
``test_ringlayout.py`` (compiled against the C header) and by the plugin tests in
``tests/unit/native``, not here. These fixtures let the reader's logic be tested exactly, with
no compiler, including states the plugin reaches only by racing or dying.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

from collscope.nodeagent.ring import layout
from collscope.operator.onebox import nccl as abi

# Any fixed epoch time works; a realistic one keeps 19-digit timestamps.
T0 = 1_732_001_234_000_000_000
COMM = 0x1F3A_0000_BEEF
# 64 event slots: enough for every scenario, small enough to wrap in a few records.
EVENT_SLOTS = 64


class RingBuilder:
    """The three regions as numpy arrays; tests set fields, then ``write`` the file."""

    def __init__(self, event_slots: int = EVENT_SLOTS) -> None:
        self.header = np.zeros(1, layout.HEADER)
        self.comms = np.zeros(layout.COMM_SLOTS, layout.COMM_SLOT)
        self.events = np.zeros(event_slots, layout.EVENT)
        comm_offset = layout.HEADER_BYTES
        event_offset = comm_offset + self.comms.nbytes
        h = self.header[0]
        for name, value in {
            "magic": layout.MAGIC,
            "version": layout.VERSION,
            "header_size": layout.HEADER_BYTES,
            "file_size": event_offset + self.events.nbytes,
            "state": layout.RING_STATE_ACTIVE,
            "profiler_api": 5,
            "comm_region_offset": comm_offset,
            "comm_region_size": self.comms.nbytes,
            "comm_slot_count": layout.COMM_SLOTS,
            "comm_slot_size": layout.COMM_SLOT.itemsize,
            "op_slots_per_comm": layout.OPS_PER_COMM,
            "flow_slots_per_comm": layout.FLOWS_PER_COMM,
            "event_region_offset": event_offset,
            "event_region_size": self.events.nbytes,
            "event_slot_count": event_slots,
            "event_record_size": layout.EVENT_BYTES,
            "op_slot_size": layout.OP_SLOT.itemsize,
            "flow_slot_size": layout.FLOW_SLOT.itemsize,
            "pid": 4242,
            "rank": 3,
            "local_rank": 3,
            "world_size": 8,
            "nccl_version_code": 22703,
            "activation_mask": 94,
            "init_realtime_ns": T0,
            "coarse_res_ns": 4_000_000,
            "hostname": b"node7",
            "pod_name": b"llama-3",
            "pod_namespace": b"train",
            "node_name": b"gpu-node-7",
            "nccl_version": b"2.27.3",
            "plugin_version": b"0.1.0",
            "heartbeat_ns": T0 + 900_000_000,
            "heartbeat_count": 9,
            "comms_open": 1,
            "comms_total": 1,
        }.items():
            h[name] = value

    def comm(self, slot: int = 0, **fields: Any) -> Any:
        """An active communicator: rank 1 of 4 on 2 nodes, named "dp0", unless ``fields``."""
        c = self.comms[slot]
        values = {
            "state": layout.COMM_ACTIVE,
            "comm_hash": COMM,
            "rank": 1,
            "nranks": 4,
            "nnodes": 2,
            "profiler_api": 5,
            "init_ns": T0,
            "generation": 1,
            "name": b"dp0",
            "last_progress_ns": T0,
        }
        for name, value in (values | fields).items():
            c[name] = value
        return c

    def op(self, comm: int = 0, slot: int = 0, **fields: Any) -> Any:
        """An AllReduce in flight (serial 0, seq 17, 4 MiB of float32, Ring/Simple, 2 ch)."""
        o = self.comms[comm]["ops"][slot]
        values = {
            "state": layout.OP_ACTIVE,
            "serial": 0,
            "seq": 17,
            "bytes": 4 << 20,
            "start_ns": T0 + 1_000_000,
            "func": 1,
            "algo": 2,
            "proto": 3,
            "nchannels": 2,
            "dtype": 8,
            "peer": -1,
            "last_progress_ns": T0 + 1_000_000,
        }
        for name, value in (values | fields).items():
            o[name] = value
        return o

    def flow(self, comm: int = 0, slot: int = 0, **fields: Any) -> Any:
        """A running send flow on channel 0 to comm rank 2 of op serial 0, 8 chunks."""
        f = self.comms[comm]["flows"][slot]
        values = {
            "dir": layout.DIR_SEND,
            "channel": 0,
            "state": layout.FLOW_RUNNING,
            "peer": 2,
            "key": 1,
            "serial": 0,
            "total": 8,
            "started": 6,
            "c_ready_posted": 5,
            "c_sent_done": 4,
            "c_done_consumed": 3,
            "last_progress_ns": T0 + 2_000_000,
        }
        for name, value in (values | fields).items():
            f[name] = value
        return f

    def event(self, index: int, kind: str = "op", **fields: Any) -> Any:
        """Record number ``index`` (committed) in its slot; advances ``events_written``."""
        dtype = layout.OP_RECORD if kind == "op" else layout.COMM_RECORD
        r = np.zeros(1, dtype)[0]
        if kind == "op":
            values: dict[str, Any] = {
                "type": layout.EV_OP,
                "func": 1,
                "algo": 2,
                "proto": 3,
                "nchannels": 2,
                "dtype": 8,
                "flags": layout.OPF_KERNEL | layout.OPF_PROXY,
                "comm_slot": 0,
                "comm_hash": COMM,
                "seq": index,
                "bytes": 4 << 20,
                "start_ns": T0 + index * 1_000_000,
                "end_ns": T0 + index * 1_000_000 + 500_000,
                "peer": -1,
            }
        else:
            values = {
                "type": layout.EV_COMM_INIT if kind == "init" else layout.EV_COMM_FINALIZE,
                "profiler_api": 5,
                "comm_slot": 0,
                "comm_hash": COMM,
                "rank": 1,
                "nranks": 4,
                "nnodes": 2,
                "time_ns": T0,
                "name": b"dp0",
            }
        for name, value in (values | fields | {"idx": index}).items():
            r[name] = value
        slot = index % len(self.events)
        self.events[slot]["raw"] = np.frombuffer(r.tobytes(), np.uint8)
        h = self.header[0]
        h["events_written"] = max(int(h["events_written"]), index + 1)
        return r

    def tobytes(self) -> bytes:
        return self.header.tobytes() + self.comms.tobytes() + self.events.tobytes()

    def write(self, path: pathlib.Path) -> pathlib.Path:
        path.write_bytes(self.tobytes())
        return path


@pytest.fixture
def builder() -> RingBuilder:
    return RingBuilder()


@pytest.fixture
def scenario() -> RingBuilder:
    """A ring as a rank leaves it mid-AllReduce: one communicator, op serial 1 (seq 17) in
    flight with a send and a receive flow on each of 2 channels, serial 2 (seq 18) queued
    behind it, serial 0 (seq 16) done; the event ring holds the comm init and seqs 15, 16."""
    b = RingBuilder()
    b.comm(ops_started=3, ops_completed=2)
    b.op(slot=0, serial=0, seq=16, state=layout.OP_DONE, end_ns=T0 + 900_000)
    b.op(slot=1, serial=2, seq=18, start_ns=T0 + 3_000_000)
    b.op(slot=2, serial=1, seq=17, kch_started=2, kch_done=1)
    b.flow(slot=0, serial=1, channel=0, peer=2)
    b.flow(
        slot=1,
        serial=1,
        channel=0,
        peer=0,
        dir=layout.DIR_RECV,
        c_ready_posted=8,
        c_sent_done=4,
        c_done_consumed=4,
        c_gpu_ready=4,
    )
    b.flow(slot=2, serial=1, channel=1, peer=2, c_ready_posted=8, c_sent_done=8, c_done_consumed=8)
    b.flow(
        slot=3,
        serial=1,
        channel=1,
        peer=0,
        dir=layout.DIR_RECV,
        state=layout.FLOW_DONE,
        c_ready_posted=8,
        c_sent_done=8,
        c_done_consumed=8,
        last_progress_ns=T0 + 1_500_000,
    )
    b.flow(slot=4, serial=0, channel=2, peer=2, state=layout.FLOW_DONE)  # serial 0 only
    b.event(0, "init")
    b.event(1, seq=15)
    b.event(2, seq=16)
    return b


# -- the real plugin, for the agent's tests (issue 4) ----------------------------------------
# tests/unit/native/conftest.py builds the plugin (its session fixture); conftest modules cannot
# be imported by name under --import-mode=importlib, so it is loaded by path. NCCL's side of the
# ABI is ``collscope.operator.onebox.nccl``.


def _native_conftest() -> Any:
    import importlib.util

    path = pathlib.Path(__file__).resolve().parents[1] / "native" / "conftest.py"
    spec = importlib.util.spec_from_file_location("collscope_native_conftest", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


native = _native_conftest()
plugin_build = native.plugin_build  # the session fixture: `make -C native` once


class PluginOp:
    """One AllReduce driven through the plugin: proxy ops and kernel channels started."""

    def __init__(self, rank: PluginRank, seq: int, nch: int, nsteps: int) -> None:
        n = rank.nccl
        self.rank, self.nch, self.nsteps = rank, nch, nsteps
        self.handle, enqueued = n.enqueue(
            rank.ctx, abi.COLL, seqNumber=seq, func=b"AllReduce", count=1 << 20,
            datatype=b"ncclFloat32", nChannels=nch, algo=b"RING", proto=b"SIMPLE",
        )  # fmt: skip
        enqueued()
        self.proxy: dict[tuple[int, bool], Any] = {}
        self.kernel: dict[int, Any] = {}
        self.done_steps = 0
        for ch in range(nch):
            for send, peer in ((True, (rank.comm_rank + 1) % rank.nranks),
                               (False, (rank.comm_rank - 1) % rank.nranks)):  # fmt: skip
                h = n.proxy_op(rank.ctx, self.handle, ch, peer, nsteps, send=send)
                n.record(h, abi.PROXY_OP_IN_PROGRESS)
                self.proxy[(ch, send)] = h
            self.kernel[ch] = n.start(rank.ctx, abi.KERNEL_CH, self.handle, channelId=ch)

    def advance(self, steps: int = 1) -> None:
        """``steps`` more chunks sent and received on every channel."""
        n = self.rank.nccl
        for step in range(self.done_steps, min(self.nsteps, self.done_steps + steps)):
            for (_, send), h in self.proxy.items():
                states = abi.SEND_STATES if send else abi.RECV_STATES
                n.step(self.rank.ctx, h, step, states, True)
        self.done_steps = min(self.nsteps, self.done_steps + steps)

    def finish(self) -> None:
        n = self.rank.nccl
        self.advance(self.nsteps)
        for h in self.proxy.values():
            n.stop(h)
        for ch, h in self.kernel.items():
            n.record(h, abi.KERNEL_CH_STOP, 50_000 + ch)
            n.stop(h)


class PluginRank:
    """One training process: its own copy of the plugin, one communicator, one ring file."""

    def __init__(self, nccl: Any, ctx: int, ring_path: pathlib.Path, comm_rank: int, nranks: int):
        self.nccl, self.ctx, self.ring_path = nccl, ctx, ring_path
        self.comm_rank, self.nranks = comm_rank, nranks
        self.seq = 0

    def allreduce(self, nch: int = 2, nsteps: int = 4) -> PluginOp:
        """Start the next AllReduce (left in flight: ``advance``/``finish`` it)."""
        self.seq += 1
        return PluginOp(self, self.seq, nch, nsteps)

    def complete(self, count: int = 1) -> None:
        for _ in range(count):
            self.allreduce().finish()


@pytest.fixture
def plugin_rank(
    plugin_build: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """``plugin_rank(trace_dir, rank, world=4)``: a fresh plugin copy whose ring (256 KiB)
    appears in ``trace_dir``, as rank ``rank`` (global = comm rank) of a job of ``world``."""
    import shutil

    made: list[Any] = []

    def make(
        trace_dir: pathlib.Path, rank: int, *, world: int = 4, api: int = 5, pod: str = ""
    ) -> PluginRank:
        trace_dir.mkdir(parents=True, exist_ok=True)
        env = {
            "COLLSCOPE_TRACE_DIR": str(trace_dir),
            "COLLSCOPE_RING_BYTES": "256k",  # the minimum: tests never need more
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "POD_NAME": pod or f"train-{rank}",
            "POD_NAMESPACE": "ml",
            "NODE_NAME": "gpu-node-1",
        }
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        lib = tmp_path / f"plugin-copy{len(made)}" / abi.LIB_NAME
        lib.parent.mkdir()
        shutil.copy(plugin_build, lib)
        nccl = abi.Nccl(lib, api)
        before = set(trace_dir.glob("*.ring"))
        ctx = nccl.init(COMM, "dp0", 1, world, rank)  # the ring is created at the first init
        (path,) = set(trace_dir.glob("*.ring")) - before
        made.append(nccl)
        return PluginRank(nccl, ctx, path, rank, world)

    yield make
    for nccl in made:
        for ctx in list(nccl.contexts):
            nccl.finalize(ctx)
