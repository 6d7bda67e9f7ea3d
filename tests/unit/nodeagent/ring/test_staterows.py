"""staterows's numpy path gives exactly the records of the reference (records) path."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from collscope.nodeagent import errors, ring, window
from collscope.nodeagent.bundle import models, tables
from collscope.nodeagent.ring import layout, records, staterows


def fast(path: pathlib.Path, rank: int, peers: records.PeerMap) -> list[models.StateRecord]:
    """staterows rows turned back into models through a Bundle (the writer's view)."""
    w = window.Window(window_s=60, memory_cap_bytes=1 << 30)
    with ring.open(path) as r:
        _, copies, taken = r.live_copies()
        names = staterows.Names(w.comm_ids, w.strings)
        for (h, comm_rank), g in peers.items():
            names.learn_peer(h, comm_rank, g)
        rows = staterows.state_rows(str(path), rank, copies, taken, names)
    w.add(rank, states=rows.states, flows=rows.flows)
    b = w.bundle(models.Job(world_size=rank + 1))
    return [rec for rec in b.iter_records() if isinstance(rec, models.StateRecord)]


def reference(path: pathlib.Path, rank: int, peers: records.PeerMap, taken_ns: int) -> Any:
    with ring.open(path, clock=lambda: taken_ns) as r:
        return records.state_records(rank, r.snapshot(), peers)


def test_equals_reference_on_a_synthetic_ring(tmp_path: pathlib.Path, scenario: Any) -> None:
    path = scenario.write(tmp_path / "r.ring")
    peers = {(0x1F3A_0000_BEEF, 2): 7}
    got = fast(path, 3, peers)
    want = reference(path, 3, peers, got[0].ts)
    assert got == want
    assert [f.peer for f in got[0].flows] == [7, 0, 7, 0]  # comm rank 2 -> global 7


def test_equals_reference_on_a_live_plugin_ring(tmp_path: pathlib.Path, plugin_rank: Any) -> None:
    rk = plugin_rank(tmp_path / "trace", 1)
    rk.complete(2)
    op = rk.allreduce(nch=3, nsteps=8)
    op.advance(3)
    got = fast(rk.ring_path, 1, {})
    (want,) = reference(rk.ring_path, 1, {}, got[0].ts)
    assert got == [want]
    assert want.seq == 3 and len(want.flows) == 6
    assert want.kernel == models.KernelProgress(channels=3, done=0)


def test_nothing_in_flight_gives_no_rows(tmp_path: pathlib.Path, plugin_rank: Any) -> None:
    rk = plugin_rank(tmp_path / "trace", 0)
    rk.complete(1)
    assert fast(rk.ring_path, 0, {}) == []


def test_op_before_its_kernel_starts_has_no_kernel(tmp_path: pathlib.Path, scenario: Any) -> None:
    # The u1 channel count must not turn the "no kernel" -1 into 255 (a bug seen live).
    scenario.op(slot=2, serial=1, seq=17, kch_started=0, kch_done=0)
    path = scenario.write(tmp_path / "r.ring")
    got = fast(path, 3, {})
    assert got == reference(path, 3, {}, got[0].ts)
    assert got[0].kernel is None


def test_untorn_disordered_counters_are_corrupt(tmp_path: pathlib.Path, scenario: Any) -> None:
    scenario.flow(slot=0, serial=1, c_ready_posted=1, c_sent_done=5)  # sent > ready
    path = scenario.write(tmp_path / "r.ring")
    with pytest.raises(errors.RingCorrupt, match="flow 0"):
        fast(path, 3, {})


def test_comm_records_name_the_live_slots(tmp_path: pathlib.Path, scenario: Any) -> None:
    path = scenario.write(tmp_path / "r.ring")
    with ring.open(path) as r:
        _, copies, _ = r.live_copies()
        got = staterows.comm_records(str(path), 3, copies)
        want = records.comm_records(3, r.snapshot())
    assert got == want
    assert tables.SEND == 0 and layout.COMM_SLOTS == 16


def _ring(new: Any, path: pathlib.Path, slots: dict[int, list[int]]) -> pathlib.Path:
    """A ring (``new()``: an empty conftest builder) with an AllReduce in flight on each comm
    slot of ``slots`` and a flow at each listed flow slot (channels above 127 among them: u1
    values must not wrap)."""
    b = new()
    for slot, flows in slots.items():
        b.comm(slot=slot, comm_hash=0xC000 + slot, rank=1, nranks=300)
        b.op(comm=slot, slot=slot % 8, serial=3, seq=50 + slot)
        for n, k in enumerate(flows):
            recv = n % 2 == 1
            b.flow(
                comm=slot,
                slot=k,
                serial=3,
                channel=(37 * k) % 256,
                peer=(11 * k + slot) % 300,
                dir=layout.DIR_RECV if recv else layout.DIR_SEND,
            )
    written: pathlib.Path = b.write(path)
    return written


def test_a_batch_of_rings_with_different_live_slots(tmp_path: pathlib.Path, builder: Any) -> None:
    # Only live slots are copied, so the rings of a batch contribute different numbers of
    # communicators and flows: each ring's rows must be those it gives alone and those of the
    # reference decoder, with global peers of its own communicators.
    layouts = [
        {0: [0, 1, 127], 5: [64, 3]},
        {},
        {15: [126, 127, 0, 1, 2], 2: []},
        {9: [10]},
    ]
    paths = [_ring(type(builder), tmp_path / f"r{n}.ring", s) for n, s in enumerate(layouts)]
    peers = {(0xC000 + 5, 3): 42, (0xC000 + 15, 1): 7}
    w = window.Window(window_s=60, memory_cap_bytes=1 << 30)
    names = staterows.Names(w.comm_ids, w.strings)
    for (h, comm_rank), g in peers.items():
        names.learn_peer(h, comm_rank, g)
    rings = [ring.open(p) for p in paths]
    try:
        parts = []
        for rank, r in enumerate(rings):
            _, copies, taken = r.live_copies()
            parts.append(staterows.Part(r.path, 10 + rank, copies, taken))
        batch = staterows.state_rows_batch(parts, names)
        alone = [staterows.state_rows_batch([p], names)[0] for p in parts]
    finally:
        for r in rings:
            r.close()
    assert [len(b.states) for b in batch] == [2, 0, 2, 1]  # slot 2 of ring 2: no flow yet
    for b, a in zip(batch, alone, strict=True):
        assert b.states.tobytes() == a.states.tobytes()
        assert b.flows.tobytes() == a.flows.tobytes()
    for rank, (path, b) in enumerate(zip(paths, batch, strict=True)):
        w = window.Window(window_s=60, memory_cap_bytes=1 << 30)
        names = staterows.Names(w.comm_ids, w.strings)
        for (h, comm_rank), g in peers.items():
            names.learn_peer(h, comm_rank, g)
        p = parts[rank]
        rows = staterows.state_rows(str(path), p.rank, p.copies, p.taken_ns, names)
        w.add(10 + rank, states=rows.states, flows=rows.flows)
        got = [
            rec
            for rec in w.bundle(models.Job(world_size=11 + rank)).iter_records()
            if isinstance(rec, models.StateRecord)
        ]
        assert got == reference(path, 10 + rank, peers, parts[rank].taken_ns)
        assert len(b.flows) == sum(len(f) for f in layouts[rank].values())


def test_peers_learnt_later_are_used(tmp_path: pathlib.Path, builder: Any) -> None:
    path = _ring(type(builder), tmp_path / "r.ring", {4: [0, 1]})
    w = window.Window(window_s=60, memory_cap_bytes=1 << 30)
    names = staterows.Names(w.comm_ids, w.strings)
    names.learn_peer(0xC000 + 4, 99, 1)  # some other peer: the tables are built
    with ring.open(path) as r:
        _, copies, taken = r.live_copies()
        first = staterows.state_rows(str(path), 0, copies, taken, names)
        names.learn_peer(0xC000 + 4, int(first.flows["peer"][0]), 123)
        second = staterows.state_rows(str(path), 0, copies, taken, names)
    assert int(second.flows["peer"][0]) == 123
    assert second.flows["peer"][1:].tolist() == first.flows["peer"][1:].tolist()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("func", 13),
        ("func", 200),
        ("bytes", 2**63),
        ("seq", 2**64 - 1),
        ("start_ns", 1),  # before the plugin's init: outside the ring's plausible span
        ("start_ns", 2**62),  # far past the reader's clock
    ],
)
def test_untorn_op_out_of_domain_is_corrupt(
    tmp_path: pathlib.Path, scenario: Any, field: str, value: int
) -> None:
    scenario.op(**({"slot": 2, "serial": 1, "seq": 17} | {field: value}))
    path = scenario.write(tmp_path / "r.ring")
    with pytest.raises(errors.RingCorrupt, match="comm slot 0 op 2"):
        fast(path, 3, {})


def test_untorn_flow_progress_out_of_the_span_is_corrupt(
    tmp_path: pathlib.Path, scenario: Any
) -> None:
    scenario.flow(slot=0, serial=1, last_progress_ns=1)
    path = scenario.write(tmp_path / "r.ring")
    with pytest.raises(errors.RingCorrupt, match="flow 0"):
        fast(path, 3, {})


def test_comm_records_refuse_an_init_time_out_of_the_span(
    tmp_path: pathlib.Path, scenario: Any
) -> None:
    scenario.comm(slot=0, init_ns=1)
    path = scenario.write(tmp_path / "r.ring")
    with ring.open(path) as r, pytest.raises(errors.RingCorrupt, match="init_ns"):
        _, copies, _ = r.live_copies()
        staterows.comm_records(str(path), 3, copies)
