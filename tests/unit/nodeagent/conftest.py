"""A ring file built in Python, field by field, as the plugin would leave it.

The builder writes through ``ringlayout``'s dtypes: a layout error there is caught by
``test_ringlayout.py`` (compiled against the C header) and by the plugin tests in
``tests/unit/native``, not here. These fixtures let the reader's logic be tested exactly, with
no compiler, including states the plugin reaches only by racing or dying.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

from collscope.nodeagent import ringlayout

# Any fixed epoch time works; a realistic one keeps 19-digit timestamps.
T0 = 1_732_001_234_000_000_000
COMM = 0x1F3A_0000_BEEF
# 64 event slots: enough for every scenario, small enough to wrap in a few records.
EVENT_SLOTS = 64


class RingBuilder:
    """The three regions as numpy arrays; tests set fields, then ``write`` the file."""

    def __init__(self, event_slots: int = EVENT_SLOTS) -> None:
        self.header = np.zeros(1, ringlayout.HEADER)
        self.comms = np.zeros(ringlayout.COMM_SLOTS, ringlayout.COMM_SLOT)
        self.events = np.zeros(event_slots, ringlayout.EVENT)
        comm_offset = ringlayout.HEADER_BYTES
        event_offset = comm_offset + self.comms.nbytes
        h = self.header[0]
        for name, value in {
            "magic": ringlayout.MAGIC,
            "version": ringlayout.VERSION,
            "header_size": ringlayout.HEADER_BYTES,
            "file_size": event_offset + self.events.nbytes,
            "state": ringlayout.RING_STATE_ACTIVE,
            "profiler_api": 5,
            "comm_region_offset": comm_offset,
            "comm_region_size": self.comms.nbytes,
            "comm_slot_count": ringlayout.COMM_SLOTS,
            "comm_slot_size": ringlayout.COMM_SLOT.itemsize,
            "op_slots_per_comm": ringlayout.OPS_PER_COMM,
            "flow_slots_per_comm": ringlayout.FLOWS_PER_COMM,
            "event_region_offset": event_offset,
            "event_region_size": self.events.nbytes,
            "event_slot_count": event_slots,
            "event_record_size": ringlayout.EVENT_BYTES,
            "op_slot_size": ringlayout.OP_SLOT.itemsize,
            "flow_slot_size": ringlayout.FLOW_SLOT.itemsize,
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
            "state": ringlayout.COMM_ACTIVE,
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
            "state": ringlayout.OP_ACTIVE,
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
            "dir": ringlayout.DIR_SEND,
            "channel": 0,
            "state": ringlayout.FLOW_RUNNING,
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
        dtype = ringlayout.OP_RECORD if kind == "op" else ringlayout.COMM_RECORD
        r = np.zeros(1, dtype)[0]
        if kind == "op":
            values: dict[str, Any] = {
                "type": ringlayout.EV_OP,
                "func": 1,
                "algo": 2,
                "proto": 3,
                "nchannels": 2,
                "dtype": 8,
                "flags": ringlayout.OPF_KERNEL | ringlayout.OPF_PROXY,
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
                "type": ringlayout.EV_COMM_INIT if kind == "init" else ringlayout.EV_COMM_FINALIZE,
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
    b.op(slot=0, serial=0, seq=16, state=ringlayout.OP_DONE, end_ns=T0 + 900_000)
    b.op(slot=1, serial=2, seq=18, start_ns=T0 + 3_000_000)
    b.op(slot=2, serial=1, seq=17, kch_started=2, kch_done=1)
    b.flow(slot=0, serial=1, channel=0, peer=2)
    b.flow(
        slot=1,
        serial=1,
        channel=0,
        peer=0,
        dir=ringlayout.DIR_RECV,
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
        dir=ringlayout.DIR_RECV,
        state=ringlayout.FLOW_DONE,
        c_ready_posted=8,
        c_sent_done=8,
        c_done_consumed=8,
        last_progress_ns=T0 + 1_500_000,
    )
    b.flow(slot=4, serial=0, channel=2, peer=2, state=ringlayout.FLOW_DONE)  # serial 0 only
    b.event(0, "init")
    b.event(1, seq=15)
    b.event(2, seq=16)
    return b
