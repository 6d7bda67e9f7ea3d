"""ring: header validation, seqlock snapshots, events since a cursor, precise corruption errors."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from collscope.nodeagent import errors, ring
from collscope.nodeagent.ring import eventlog, layout, reader

T0 = 1_732_001_234_000_000_000  # the conftest epoch
COMM = 0x1F3A_0000_BEEF  # the conftest communicator
NOW = T0 + 3_000_000_000  # the injected clock: 3 s after T0
Builder = Any  # conftest.RingBuilder: conftest modules cannot be imported under importlib mode
COMM_BASE = layout.HEADER_BYTES  # where the builder puts the live region
EVENT_BASE = COMM_BASE + layout.COMM_SLOTS * layout.COMM_SLOT.itemsize


def open_ring(b: Builder, tmp_path: pathlib.Path) -> ring.Ring:
    return ring.open(b.write(tmp_path / "r.ring"), clock=lambda: NOW)


def test_identity_is_the_header(scenario: Builder, tmp_path: pathlib.Path) -> None:
    with open_ring(scenario, tmp_path) as r:
        assert r.identity == ring.Identity(
            path=str(tmp_path / "r.ring"),
            pid=4242,
            rank=3,
            local_rank=3,
            world_size=8,
            hostname="node7",
            pod_name="llama-3",
            pod_namespace="train",
            node_name="gpu-node-7",
            nccl_version="2.27.3",
            nccl_version_code=22703,
            plugin_version="0.1.0",
            activation_mask=94,
            init_ns=T0,
            coarse_res_ns=4_000_000,
            file_size=EVENT_BASE + 64 * 64,
            event_slots=64,
        )


def test_unset_environment_reads_as_none_and_empty(
    builder: Builder, tmp_path: pathlib.Path
) -> None:
    h = builder.header[0]
    h["rank"] = h["local_rank"] = h["world_size"] = -1
    h["pod_name"] = h["node_name"] = b""
    with open_ring(builder, tmp_path) as r:
        i = r.identity
        assert (i.rank, i.local_rank, i.world_size, i.pod_name, i.node_name) == (
            None,
            None,
            None,
            "",
            "",
        )


def test_status_reads_live_counters(scenario: Builder, tmp_path: pathlib.Path) -> None:
    scenario.header[0]["events_dropped"] = 7
    scenario.header[0]["pxn_foreign_events"] = 2
    with open_ring(scenario, tmp_path) as r:
        st = r.status()
    assert (st.state, st.profiler_api, st.events_written, st.events_dropped) == ("active", 5, 3, 7)
    assert (st.pxn_foreign_events, st.heartbeat_ns, st.comms_open) == (2, T0 + 900_000_000, 1)


def test_snapshot_decodes_the_live_state(scenario: Builder, tmp_path: pathlib.Path) -> None:
    with open_ring(scenario, tmp_path) as r:
        snap = r.snapshot()
    assert (snap.consistent, snap.torn, snap.attempts, snap.taken_ns) == (True, 0, 1, NOW)
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
    assert (c.ops_started, c.ops_completed, c.finalize_ns, c.torn) == (3, 2, None, False)
    assert [(o.serial, o.seq, o.state) for o in c.ops] == [
        (0, 16, "done"),
        (2, 18, "active"),
        (1, 17, "active"),
    ]
    op = c.in_flight()
    assert op is not None
    assert (op.serial, op.seq, op.op, op.bytes, op.dtype, op.algo, op.proto) == (
        1,
        17,
        "AllReduce",
        4 << 20,
        "float32",
        "Ring",
        "Simple",
    )
    assert (op.nchannels, op.peer, op.end_ns, op.kch_started, op.kch_done) == (2, None, None, 2, 1)
    assert c.ops[0].end_ns == T0 + 900_000
    flows = c.flows_of(op)
    assert [(f.slot, f.dir, f.channel, f.peer, f.state) for f in flows] == [
        (0, "send", 0, 2, "running"),
        (1, "recv", 0, 0, "running"),
        (2, "send", 1, 2, "running"),
        (3, "recv", 1, 0, "done"),
    ]
    f = flows[1]
    assert (f.total, f.started, f.ready_posted, f.sent_done, f.done_consumed, f.gpu_ready) == (
        8,
        6,
        8,
        4,
        4,
        4,
    )
    assert len(c.flows) == 5  # the flow of serial 0 is there, just not the in-flight op's


def test_free_comm_slots_and_empty_ops_are_left_out(
    builder: Builder, tmp_path: pathlib.Path
) -> None:
    builder.comm(slot=3)
    builder.op(comm=3, slot=0, state=layout.OP_CLAIMING, func=200)  # being filled: ignored
    builder.comm(slot=5, state=layout.COMM_FINALIZED, finalize_ns=T0 + 5)
    with open_ring(builder, tmp_path) as r:
        snap = r.snapshot()
    assert [(c.slot, c.state, c.ops, c.finalize_ns) for c in snap.comms] == [
        (3, "active", (), None),
        (5, "finalized", (), T0 + 5),
    ]
    assert snap.comms[0].in_flight() is None


def test_frozen_writer_gives_a_torn_snapshot_without_waiting(
    scenario: Builder, tmp_path: pathlib.Path
) -> None:
    # A writer frozen between its two seqlock increments leaves the counter odd forever.
    scenario.comms[0]["flows"][2]["seqlock"] = 7
    with open_ring(scenario, tmp_path) as r:
        snap = r.snapshot(retries=5)
    assert (snap.consistent, snap.torn, snap.attempts) == (False, 1, 5)
    torn = [f.slot for f in snap.comms[0].flows if f.torn]
    assert torn == [2]


def test_torn_slot_with_impossible_values_is_dropped_not_raised(
    scenario: Builder, tmp_path: pathlib.Path
) -> None:
    scenario.comms[0]["flows"][2]["seqlock"] = 7
    scenario.comms[0]["flows"][2]["dir"] = 9
    with open_ring(scenario, tmp_path) as r:
        snap = r.snapshot(retries=2)
    assert snap.torn == 1
    assert [f.slot for f in snap.comms[0].flows] == [0, 1, 3, 4]


WRITER = textwrap.dedent(
    """
    import mmap, sys, time
    import numpy as np
    sys.path[:0] = ["nodeagent"]
    from collscope.nodeagent.ring import layout
    f = open(sys.argv[1], "r+b")
    mm = mmap.mmap(f.fileno(), 0)
    comms = np.frombuffer(mm, layout.COMM_SLOT, count=16, offset=layout.HEADER_BYTES)
    flow = comms[0:1]["flows"][0, 0:1]
    print("ready", flush=True)
    k = 0
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        k += 1
        flow["seqlock"] += 1          # odd: writing
        flow["c_ready_posted"] = k    # three stores, each visible on its own
        flow["c_sent_done"] = k
        flow["c_done_consumed"] = k
        flow["seqlock"] += 1          # even: published
        time.sleep(20e-6)             # the plugin updates a flow once per step state, not
                                      # back to back: a reader gets its window
    print(k)
    """
)


def test_snapshots_under_a_live_writer_are_consistent(
    scenario: Builder, tmp_path: pathlib.Path
) -> None:
    # A real second process rewrites one flow under its seqlock as fast as it can; a snapshot
    # must see the three counters equal (a torn copy would see them differ) unless it says
    # that slot is torn, which happens only when the writer is descheduled mid-write for
    # longer than the reader's retries last.
    flow = scenario.comms[0]["flows"][0]
    flow["c_ready_posted"] = flow["c_sent_done"] = flow["c_done_consumed"] = 0
    path = scenario.write(tmp_path / "r.ring")
    root = pathlib.Path(__file__).resolve().parents[4]
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), "1.0"],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    ) as writer:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        seen, torn = set(), 0
        with ring.open(path) as r:
            for _ in range(300):
                snap = r.snapshot()
                (f,) = [f for f in snap.comms[0].flows if f.slot == 0]
                if f.torn:
                    torn += 1
                    assert not snap.consistent
                    continue
                assert f.ready_posted == f.sent_done == f.done_consumed, f
                seen.add(f.ready_posted)
        writer.wait(timeout=30)
    assert len(seen) > 10, "the writer did not run concurrently with the reader"
    assert torn < 30, f"{torn} of 300 snapshots torn"


def test_events_since_delivers_in_write_order(scenario: Builder, tmp_path: pathlib.Path) -> None:
    with open_ring(scenario, tmp_path) as r:
        events, cursor, missed = r.events_since(0)
        assert (cursor, missed) == (3, 0)
        init, a, b = events
        assert init == eventlog.CommEvent(
            index=0,
            kind="init",
            comm_hash=COMM,
            comm_slot=0,
            rank=1,
            nranks=4,
            nnodes=2,
            profiler_api=5,
            time_ns=T0,
            name="dp0",
        )
        assert a == eventlog.OpEvent(
            index=1,
            comm_hash=COMM,
            comm_slot=0,
            seq=15,
            op="AllReduce",
            bytes=4 << 20,
            dtype="float32",
            algo="Ring",
            proto="Simple",
            nchannels=2,
            flags=layout.OPF_KERNEL | layout.OPF_PROXY,
            start_ns=T0 + 1_000_000,
            end_ns=T0 + 1_500_000,
            peer=None,
            gpu_ns=0,
        )
        assert isinstance(b, eventlog.OpEvent) and b.seq == 16
        assert r.events_since(cursor) == ([], 3, 0)
        assert r.events_since(2)[0] == [b]


def test_records_read_in_chunks_are_the_same(
    scenario: Builder, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records are copied ``eventlog.CHUNK`` at a time (bounded copies of a 256 MiB ring)."""
    with open_ring(scenario, tmp_path) as r:
        whole = r.events_since(0)
    monkeypatch.setattr(eventlog, "CHUNK", 1)
    with open_ring(scenario, tmp_path) as r:
        assert r.events_since(0) == whole


def test_point_to_point_record_carries_its_peer(builder: Builder, tmp_path: pathlib.Path) -> None:
    builder.event(0, func=6, flags=layout.OPF_P2P, peer=3, comm_slot=layout.NO_SLOT)
    builder.event(1, func=1, peer=3)  # a collective's peer field is not a peer
    with open_ring(builder, tmp_path) as r:
        (send, coll), _, _ = r.events_since(0)
    assert isinstance(send, eventlog.OpEvent) and isinstance(coll, eventlog.OpEvent)
    assert (send.op, send.peer, send.comm_slot) == ("Send", 3, None)
    assert coll.peer is None


def test_a_full_ring_reports_what_was_overwritten(builder: Builder, tmp_path: pathlib.Path) -> None:
    for i in range(100):  # 64 slots: records 0..35 were overwritten by 64..99
        builder.event(i)
    with open_ring(builder, tmp_path) as r:
        assert r.first_cursor() == 36
        events, cursor, missed = r.events_since(0)
        assert (len(events), cursor, missed) == (64, 100, 36)
        assert [e.index for e in events] == list(range(36, 100))
        events, cursor, missed = r.events_since(90)
        assert ([e.index for e in events], cursor, missed) == (list(range(90, 100)), 100, 0)


def test_a_record_not_yet_committed_ends_the_read(builder: Builder, tmp_path: pathlib.Path) -> None:
    for i in range(8):
        builder.event(i)
    builder.events[5]["raw"][:8] = np.frombuffer(
        np.uint64(layout.EVENT_IDX_BUSY).tobytes(), np.uint8
    )
    path = builder.write(tmp_path / "r.ring")
    with ring.open(path) as r:
        events, cursor, missed = r.events_since(0)
        assert ([e.index for e in events], cursor, missed) == ([0, 1, 2, 3, 4], 5, 0)
    with ring.open(path) as r:  # a post-mortem reader does not wait for a dead writer
        events, cursor, missed = r.events_since(0, skip_pending=True)
        assert ([e.index for e in events], cursor, missed) == ([0, 1, 2, 3, 4, 6, 7], 8, 1)
    builder.event(5)  # the writer commits it
    with ring.open(builder.write(path)) as r:
        events, cursor, missed = r.events_since(5)
        assert ([e.index for e in events], cursor, missed) == ([5, 6, 7], 8, 0)


def test_reserved_slot_still_holding_the_last_lap_is_pending(
    builder: Builder, tmp_path: pathlib.Path
) -> None:
    for i in range(64):
        builder.event(i)
    builder.header[0]["events_written"] = 66  # 64 and 65 reserved, their slots not yet rewritten
    builder.event(65)
    with open_ring(builder, tmp_path) as r:
        events, cursor, missed = r.events_since(60)
        assert ([e.index for e in events], cursor, missed) == ([60, 61, 62, 63], 64, 0)


def test_slot_overwritten_by_a_later_lap_is_missed(
    builder: Builder, tmp_path: pathlib.Path
) -> None:
    for i in range(10):
        builder.event(i)
    builder.event(3 + 64)  # slot 3 already holds record 67
    builder.header[0]["events_written"] = 10  # as read before the writer's counter moved on
    with open_ring(builder, tmp_path) as r:
        events, cursor, missed = r.events_since(0)
    assert ([e.index for e in events], cursor, missed) == ([0, 1, 2, 4, 5, 6, 7, 8, 9], 10, 1)


def test_cursor_rules(scenario: Builder, tmp_path: pathlib.Path) -> None:
    with open_ring(scenario, tmp_path) as r:
        with pytest.raises(ValueError, match="cursor"):
            r.events_since(-1)
        with pytest.raises(errors.RingCorrupt, match="went backwards"):
            r.events_since(4)


def test_closed_ring_refuses_reads_and_close_is_idempotent(
    scenario: Builder, tmp_path: pathlib.Path
) -> None:
    r = open_ring(scenario, tmp_path)
    snap = r.snapshot()
    r.close()
    r.close()
    assert snap.comms[0].comm_hash == COMM  # copies outlive the mapping
    with pytest.raises(ValueError, match="closed"):
        r.snapshot()


def test_missing_file_is_oserror(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError):
        ring.open(tmp_path / "nope.ring")


def test_only_a_regular_file_is_opened(scenario: Builder, tmp_path: pathlib.Path) -> None:
    """The file is the tenant's: no symlink followed, a FIFO refused without blocking, a
    file larger than the plugin ever writes refused (issue 15 item 2)."""
    target = scenario.write(tmp_path / "target.ring")
    (tmp_path / "link.ring").symlink_to(target)
    with pytest.raises(errors.RingCorrupt, match="is a symbolic link"):
        ring.open(tmp_path / "link.ring")
    os.mkfifo(tmp_path / "fifo.ring")
    with pytest.raises(errors.RingCorrupt, match=r"is not a regular file \(mode p"):
        ring.open(tmp_path / "fifo.ring")
    (tmp_path / "dir.ring").mkdir()
    with pytest.raises(errors.RingCorrupt, match="is not a regular file"):
        ring.open(tmp_path / "dir.ring")
    os.truncate(target, reader.MAX_FILE_BYTES + 1)  # sparse
    with pytest.raises(errors.RingCorrupt, match="larger than a plugin writes"):
        ring.open(target)


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        ("op", "start_ns", 1),
        ("op", "end_ns", NOW + 3_600_000_000_000),
        ("comm_init", "time_ns", T0 - 61_000_000_000),
    ],
)
def test_a_record_time_outside_the_rings_span_is_corrupt(
    scenario: Builder, tmp_path: pathlib.Path, kind: str, field: str, value: int
) -> None:
    """Times lie between the plugin's init and the reader's clock, 60 s slack either side
    (issue 15 item 3: one comm at ``init_ns = 1`` exhausted analysis memory)."""
    scenario.event(3, kind, **{field: value})
    with open_ring(scenario, tmp_path) as r:
        with pytest.raises(errors.RingCorrupt, match="outside the ring's plausible span") as e:
            r.events_since(0)
        assert (e.value.region, e.value.field) == ("events", field)


def test_live_times_outside_the_rings_span_are_corrupt(
    scenario: Builder, tmp_path: pathlib.Path
) -> None:
    scenario.comm(slot=0, init_ns=1)
    with open_ring(scenario, tmp_path) as r, pytest.raises(errors.RingCorrupt) as e:
        r.snapshot()
    assert (e.value.region, e.value.field) == ("comm slot 0", "init_ns")


def test_a_plugin_init_time_before_2020_or_in_the_future_is_corrupt(
    scenario: Builder, tmp_path: pathlib.Path
) -> None:
    for init in (1, NOW + 61_000_000_000):
        scenario.header[0]["init_realtime_ns"] = init
        with pytest.raises(errors.RingCorrupt, match="plugin init time") as e:
            open_ring(scenario, tmp_path)
        assert e.value.field == "init_realtime_ns"


# --- corruption: each check names file, region, offset and field --------------------------

Mutate = Callable[[Builder], None]


def _set(region: str, field: str, value: Any, index: tuple[int, ...] = ()) -> Mutate:
    def mutate(b: Builder) -> None:
        if region == "header":
            b.header[0][field] = value
        elif region == "comm":
            b.comms[index[0]][field] = value
        elif region == "op":
            b.comms[index[0]]["ops"][index[1]][field] = value
        else:
            b.comms[index[0]]["flows"][index[1]][field] = value

    return mutate


def _event(index: int, kind: str = "op", **fields: Any) -> Mutate:
    return lambda b: b.event(index, kind, **fields)


def _hoff(field: str) -> str:
    return f"header @{layout.field_offset(layout.HEADER, field):#x} field '{field}'"


CORRUPT = {
    "foreign magic": (_set("header", "magic", 0x1234), _hoff("magic") + ": expected"),
    "magic not yet written": (_set("header", "magic", 0), "retry later"),
    "header size": (_set("header", "header_size", 4095), _hoff("header_size")),
    "file size past the end": (_set("header", "file_size", 10**9), _hoff("file_size")),
    "file size under header": (_set("header", "file_size", 100), _hoff("file_size")),
    "comm slot count": (_set("header", "comm_slot_count", 15), _hoff("comm_slot_count")),
    "op slot size": (_set("header", "op_slot_size", 64), _hoff("op_slot_size")),
    "flows per comm": (_set("header", "flow_slots_per_comm", 7), _hoff("flow_slots_per_comm")),
    "event record size": (_set("header", "event_record_size", 32), _hoff("event_record_size")),
    "no event slots": (_set("header", "event_slot_count", 0), _hoff("event_slot_count")),
    "event count vs size": (_set("header", "event_slot_count", 65), _hoff("event_region_size")),
    "comm region misaligned": (
        _set("header", "comm_region_offset", 4100),
        _hoff("comm_region_offset"),
    ),
    "comm region inside header": (
        _set("header", "comm_region_offset", 0),
        _hoff("comm_region_offset"),
    ),
    "event region past end": (
        _set("header", "event_region_offset", 2**62),
        _hoff("event_region_offset"),
    ),
    "regions overlap": (
        _set("header", "event_region_offset", 4096 + 64),
        _hoff("event_region_offset") + ": events",
    ),
    "hostname unterminated": (_set("header", "hostname", b"h" * 128), _hoff("hostname")),
    "ring state": (_set("header", "state", 9), _hoff("state")),
    "comm state": (_set("comm", "state", 7, (0,)), "comm slot 0 @0x1000 field 'state'"),
    "comm rank": (_set("comm", "rank", 4, (0,)), "comm slot 0 @0x1000 field 'rank'"),
    "comm name": (_set("comm", "name", b"n" * 64, (0,)), "field 'name': string of 64 bytes"),
    "op algo": (
        _set("op", "algo", 8, (0, 2)),
        f"comm slot 0 op 2 @{COMM_BASE + 512 + 2 * 128:#x} field 'algo': code 8",
    ),
    "op func unassigned": (_set("op", "func", 13, (0, 2)), "comm slot 0 op 2"),
    "op bytes": (_set("op", "bytes", 2**63, (0, 2)), "field 'bytes'"),
    "op start time": (_set("op", "start_ns", -5, (0, 2)), "field 'start_ns'"),
    "p2p op peer": (
        lambda b: b.op(slot=2, flags=layout.OPF_P2P, peer=4),
        "field 'peer': peer rank 4 is outside [0, 3]",
    ),
    "flow dir": (
        _set("flow", "dir", 3, (0, 2)),
        f"comm slot 0 flow 2 @{COMM_BASE + 1536 + 2 * 64:#x} field 'dir'",
    ),
    "flow peer": (_set("flow", "peer", -1, (0, 1)), "comm slot 0 flow 1"),
    "flow state": (_set("flow", "state", 4, (0, 1)), "field 'state'"),
    "event type": (
        _event(1, type=9),
        f"events @{EVENT_BASE + 64:#x} field 'type': record type 9",
    ),
    "event func": (_event(2, func=14), f"events @{EVENT_BASE + 128:#x} field 'func'"),
    "event comm slot": (_event(2, comm_slot=16), "field 'comm_slot'"),
    "event seq": (_event(2, seq=2**64 - 1), "field 'seq'"),
    "event end time": (_event(2, end_ns=-1), "field 'end_ns'"),
    "p2p event peer": (_event(2, flags=layout.OPF_P2P, peer=-1), "field 'peer'"),
    "comm event ranks": (_event(0, "init", nranks=0), "field 'nranks'"),
    "comm event nodes": (_event(0, "init", nnodes=0), "field 'nnodes'"),
    "comm event name": (
        _event(0, "init", name=b"x" * layout.COMM_RECORD_NAME_LEN),
        "field 'name'",
    ),
}


@pytest.mark.parametrize("case", CORRUPT, ids=list(CORRUPT))
def test_corruption_is_reported_precisely(
    case: str, scenario: Builder, tmp_path: pathlib.Path
) -> None:
    mutate, message = CORRUPT[case]
    mutate(scenario)
    path = tmp_path / "r.ring"
    with pytest.raises(errors.RingCorrupt) as info, ring.open(scenario.write(path)) as r:
        r.snapshot()
        r.events_since(0)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("version", [1, layout.VERSION + 1])
def test_unknown_version_is_a_version_mismatch(
    version: int, scenario: Builder, tmp_path: pathlib.Path
) -> None:
    """A newer layout and the older version 1 (different op slot and comm record) alike."""
    scenario.header[0]["version"] = version
    want = f"version {version}, this reader reads version {layout.VERSION}"
    with pytest.raises(errors.RingVersionMismatch, match=want):
        open_ring(scenario, tmp_path)


@pytest.mark.parametrize("size", [0, 1, 4095])
def test_file_shorter_than_a_header(size: int, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "r.ring"
    path.write_bytes(b"CSCPRING"[:size].ljust(size, b"\0"))
    with pytest.raises(errors.RingCorrupt, match=f"file: file is {size} bytes, shorter"):
        ring.open(path)


def test_truncated_file_is_corrupt_at_open(scenario: Builder, tmp_path: pathlib.Path) -> None:
    path = scenario.write(tmp_path / "r.ring")
    path.write_bytes(path.read_bytes()[:100_000])
    with pytest.raises(errors.RingCorrupt, match="file_size"):
        ring.open(path)


SHRINK = textwrap.dedent(
    """
    import os, sys
    sys.path[:0] = ["nodeagent"]
    from collscope.nodeagent import errors, ring
    r = ring.open(sys.argv[1])
    os.truncate(sys.argv[1], 8192)   # the live region is now past the end of the file
    for read in (r.snapshot, lambda: r.events_since(0), r.status, r.first_cursor):
        try:
            read()
        except errors.RingCorrupt as e:
            print("corrupt:", e)
    """
)


def test_file_shrunk_while_open_is_corrupt_not_sigbus(
    scenario: Builder, tmp_path: pathlib.Path
) -> None:
    # In a subprocess: reading a mapping past the end of its file is SIGBUS, which would kill
    # the test runner instead of failing this test.
    path = scenario.write(tmp_path / "r.ring")
    root = pathlib.Path(__file__).resolve().parents[4]
    res = subprocess.run(
        [sys.executable, "-c", SHRINK, str(path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 4
    assert all("file: file shrank to 8192 bytes while open" in line for line in lines)


def test_child_counts_add_the_other_threads_counts(
    scenario: Builder, tmp_path: pathlib.Path
) -> None:
    """Version 2: each op slot child count is its proxy-thread field plus its `_other` twin."""
    scenario.op(
        slot=2,
        serial=1,
        seq=17,
        kch_started=2,
        kch_done=1,
        kch_started_other=1,
        kch_done_other=1,
        proxy_ops_started=3,
        proxy_ops_started_other=2,
        proxy_ops_done=1,
        proxy_ops_done_other=1,
    )
    scenario.header[0]["kernel_foreign_events"] = 1
    with open_ring(scenario, tmp_path) as r:
        snap = r.snapshot()
    op = snap.comms[0].in_flight()
    assert op is not None
    assert (op.kch_started, op.kch_done, op.proxy_ops_started, op.proxy_ops_done) == (3, 2, 5, 2)
    assert snap.status.kernel_foreign_events == 1


def test_comm_record_name_holds_23_bytes(scenario: Builder, tmp_path: pathlib.Path) -> None:
    """Version 2 comm records keep 23 bytes of the communicator name (15 in version 1)."""
    scenario.event(0, "init", name=b"tensor-parallel-group-0")
    with open_ring(scenario, tmp_path) as r:
        events, _, _ = r.events_since(0)
    init = events[0]
    assert isinstance(init, eventlog.CommEvent)
    assert (init.name, init.rank, init.nranks, init.nnodes) == ("tensor-parallel-group-0", 1, 4, 2)


def test_queued_flow_counters_read_as_zero(scenario: Builder, tmp_path: pathlib.Path) -> None:
    """Version 2: a QUEUED flow may still hold its previous op's step counters; every reader
    view (snapshot and the raw copies) shows them as 0."""
    scenario.flow(
        slot=9,
        channel=3,
        serial=2,
        state=layout.FLOW_QUEUED,
        total=4,
        started=8,
        c_ready_posted=8,
        c_sent_done=7,
        c_done_consumed=6,
        c_gpu_ready=5,
    )
    with open_ring(scenario, tmp_path) as r:
        flow = next(f for f in r.snapshot().comms[0].flows if f.slot == 9)
        _, copies, _ = r.live_copies()
    assert (flow.state, flow.serial, flow.total) == ("queued", 2, 4)
    counts = (flow.started, flow.ready_posted, flow.sent_done, flow.done_consumed)
    assert (*counts, flow.gpu_ready) == (0, 0, 0, 0, 0)
    raw = copies.flow(0, 9)
    assert raw is not None
    assert [int(raw[n]) for n in ("started", "c_ready_posted", "c_done_consumed")] == [0, 0, 0]
