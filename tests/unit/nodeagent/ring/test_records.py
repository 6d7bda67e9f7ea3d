"""records: ring contents as bundle-v1 comm, op and state records, peers as global ranks."""

from __future__ import annotations

import pathlib
from typing import Any

import pydantic
import pytest

from collscope.nodeagent import errors, ring
from collscope.nodeagent.bundle import models
from collscope.nodeagent.ring import layout, records

T0 = 1_732_001_234_000_000_000  # the conftest epoch
COMM = 0x1F3A_0000_BEEF  # the conftest communicator
HEX = "0x1f3a0000beef"
NOW = T0 + 3_000_000_000
Builder = Any  # conftest.RingBuilder: conftest modules cannot be imported under importlib mode
# comm ranks 0..3 of the conftest communicator are global ranks 10..13 (this ring: rank 1 -> 3
# in the header, but the map below is what the other rings would say)
PEERS = {(COMM, r): 10 + r for r in range(4)}
RECORD: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(models.Record)


def read(b: Builder, tmp_path: pathlib.Path) -> tuple[Any, list[Any]]:
    with ring.open(b.write(tmp_path / "r.ring"), clock=lambda: NOW) as r:
        return r.snapshot(), r.events_since(0)[0]


def dumped(records: list[Any]) -> list[dict[str, Any]]:
    out = [r.model_dump(exclude_none=True) for r in records]
    for rec in out:  # what a bundle reader accepts
        RECORD.validate_python(rec)
    return out


def test_state_record_of_the_op_in_flight(scenario: Builder, tmp_path: pathlib.Path) -> None:
    snap, _ = read(scenario, tmp_path)
    assert dumped(records.state_records(3, snap, PEERS)) == [
        {
            "type": "state",
            "rank": 3,
            "ts": NOW,
            "comm": HEX,
            "seq": 17,
            "op": "AllReduce",
            "bytes": 4 << 20,
            "start": T0 + 1_000_000,
            "flows": [
                {
                    "channel": 0,
                    "peer": 12,
                    "dir": "send",
                    "total": 8,
                    "ready": 5,
                    "sent": 4,
                    "done": 3,
                    "idle_ns": NOW - (T0 + 2_000_000),
                },
                {
                    "channel": 0,
                    "peer": 10,
                    "dir": "recv",
                    "total": 8,
                    "posted": 8,
                    "done": 4,
                    "consumed": 4,
                    "idle_ns": NOW - (T0 + 2_000_000),
                },
                {
                    "channel": 1,
                    "peer": 12,
                    "dir": "send",
                    "total": 8,
                    "ready": 8,
                    "sent": 8,
                    "done": 8,
                    "idle_ns": NOW - (T0 + 2_000_000),
                },
                {
                    "channel": 1,
                    "peer": 10,
                    "dir": "recv",
                    "total": 8,
                    "posted": 8,
                    "done": 8,
                    "consumed": 8,
                    "idle_ns": NOW - (T0 + 1_500_000),
                },
            ],
            "kernel": {"channels": 2, "done": 1},
        }
    ]


def test_no_state_without_an_op_in_flight(scenario: Builder, tmp_path: pathlib.Path) -> None:
    for slot in (1, 2):
        scenario.comms[0]["ops"][slot]["state"] = layout.OP_DONE
    snap, _ = read(scenario, tmp_path)
    assert records.state_records(3, snap, PEERS) == []


def test_flow_details(builder: Builder, tmp_path: pathlib.Path) -> None:
    builder.comm()
    builder.op(serial=4)
    builder.flow(slot=0, serial=4, last_progress_ns=NOW + 5)  # coarse clock ahead: idle 0
    builder.flow(slot=1, serial=4, channel=1, state=layout.FLOW_FREE)  # not yet taken
    builder.flow(slot=2, serial=3, channel=2)  # an older op's counters
    snap, _ = read(builder, tmp_path)
    (state,) = records.state_records(3, snap, {})
    assert [(f.channel, f.peer, f.idle_ns) for f in state.flows] == [(0, 2, 0)]
    assert state.kernel is None  # no KernelCh seen for the op


def test_untranslated_peers_keep_their_comm_rank(scenario: Builder, tmp_path: pathlib.Path) -> None:
    scenario.event(3, func=6, flags=layout.OPF_P2P, peer=3)
    snap, events = read(scenario, tmp_path)
    peers = {(COMM, 0): 10}
    assert records.untranslated(snap, events, peers) == {(COMM, 2), (COMM, 3)}
    (state,) = records.state_records(3, snap, peers)
    assert [f.peer for f in state.flows] == [2, 10, 2, 10]
    assert records.untranslated(snap, events, PEERS) == set()


def test_op_records(scenario: Builder, tmp_path: pathlib.Path) -> None:
    scenario.event(3, func=7, flags=layout.OPF_P2P, peer=2, seq=0, algo=0, proto=0)
    scenario.event(4, start_ns=T0 + 10, end_ns=T0 + 5)  # clock stepped back by NTP
    _, events = read(scenario, tmp_path)
    assert dumped(records.op_records(3, "r.ring", events, PEERS)) == [
        {
            "type": "op",
            "rank": 3,
            "ts": T0 + 1_500_000,
            "comm": HEX,
            "seq": 15,
            "op": "AllReduce",
            "bytes": 4 << 20,
            "dtype": "float32",
            "algo": "Ring",
            "proto": "Simple",
            "channels": 2,
            "start": T0 + 1_000_000,
            "end": T0 + 1_500_000,
        },
        {
            "type": "op",
            "rank": 3,
            "ts": T0 + 2_500_000,
            "comm": HEX,
            "seq": 16,
            "op": "AllReduce",
            "bytes": 4 << 20,
            "dtype": "float32",
            "algo": "Ring",
            "proto": "Simple",
            "channels": 2,
            "start": T0 + 2_000_000,
            "end": T0 + 2_500_000,
        },
        {
            "type": "op",
            "rank": 3,
            "ts": T0 + 3_500_000,
            "comm": HEX,
            "seq": 0,
            "op": "Recv",
            "bytes": 4 << 20,
            "dtype": "float32",
            "algo": "",
            "proto": "",
            "channels": 2,
            "start": T0 + 3_000_000,
            "end": T0 + 3_500_000,
            "peer": 12,
        },
        {
            "type": "op",
            "rank": 3,
            "ts": T0 + 10,
            "comm": HEX,
            "seq": 4,
            "op": "AllReduce",
            "bytes": 4 << 20,
            "dtype": "float32",
            "algo": "Ring",
            "proto": "Simple",
            "channels": 2,
            "start": T0 + 10,
            "end": T0 + 10,
        },
    ]


def test_comm_records_from_slots_and_from_init_events(
    scenario: Builder, tmp_path: pathlib.Path
) -> None:
    # A communicator whose slot was reused is known only from its init record (name cut).
    scenario.event(3, "init", comm_hash=0xAB, rank=0, nranks=2, nnodes=1, time_ns=T0 - 5)
    scenario.event(4, "finalize", comm_hash=0xAB, rank=0, nranks=2, nnodes=1)
    scenario.comm(name=b"a-long-communicator-name")
    snap, events = read(scenario, tmp_path)
    assert dumped(records.comm_records(3, snap, events)) == [
        {
            "type": "comm",
            "rank": 3,
            "ts": T0 - 5,
            "comm": "0xab",
            "comm_rank": 0,
            "nranks": 2,
            "nnodes": 1,
            "name": "dp0",
        },
        {
            "type": "comm",
            "rank": 3,
            "ts": T0,
            "comm": HEX,
            "comm_rank": 1,
            "nranks": 4,
            "nnodes": 2,
            "name": "a-long-communicator-name",
        },
    ]
    assert records.peer_ranks(3, snap, events) == {(COMM, 1): 3, (0xAB, 0): 3}


def test_counters_out_of_order_are_corrupt(scenario: Builder, tmp_path: pathlib.Path) -> None:
    scenario.comms[0]["flows"][0]["c_sent_done"] = 6  # sent 6 > ready 5
    snap, _ = read(scenario, tmp_path)
    with pytest.raises(errors.RingCorrupt) as info:
        records.state_records(3, snap, PEERS)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'r.ring'}: comm slot 0 op 2 field 'flows.0.send': ")
    assert "ready >= sent >= done" in message


def test_torn_flow_out_of_order_is_left_out(scenario: Builder, tmp_path: pathlib.Path) -> None:
    flow = scenario.comms[0]["flows"][0]
    flow["c_sent_done"] = 6
    flow["seqlock"] = 1  # frozen mid-write
    with ring.open(scenario.write(tmp_path / "r.ring"), clock=lambda: NOW) as r:
        snap = r.snapshot(retries=2)
    (state,) = records.state_records(3, snap, PEERS)
    assert [(f.channel, f.dir) for f in state.flows] == [(0, "recv"), (1, "send"), (1, "recv")]


def test_kernel_done_past_channels_is_corrupt(scenario: Builder, tmp_path: pathlib.Path) -> None:
    scenario.comms[0]["ops"][2]["kch_done"] = 3
    snap, _ = read(scenario, tmp_path)
    with pytest.raises(errors.RingCorrupt, match=r"field 'kernel': .*done 3 > channels 2"):
        records.state_records(3, snap, PEERS)
