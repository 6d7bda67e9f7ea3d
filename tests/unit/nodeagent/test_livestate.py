"""livestate's numpy path gives exactly the records of the reference (ringrecords) path."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from collscope.nodeagent import errors, livestate, ring, ringlayout, ringrecords, window
from collscope.nodeagent.bundle import models, tables


def fast(path: pathlib.Path, rank: int, peers: ringrecords.PeerMap) -> list[models.StateRecord]:
    """livestate rows turned back into models through a Bundle (the writer's view)."""
    w = window.Window(window_s=60, memory_cap_bytes=1 << 30)
    with ring.open(path) as r:
        _, copies, taken = r.live_copies()
        names = livestate.Names(w.comm_ids, w.strings)
        for (h, comm_rank), g in peers.items():
            names.learn_peer(h, comm_rank, g)
        rows = livestate.state_rows(str(path), rank, copies, taken, names)
    w.add(rank, states=rows.states, flows=rows.flows)
    b = w.bundle(models.Job(world_size=rank + 1))
    return [rec for rec in b.iter_records() if isinstance(rec, models.StateRecord)]


def reference(path: pathlib.Path, rank: int, peers: ringrecords.PeerMap, taken_ns: int) -> Any:
    with ring.open(path, clock=lambda: taken_ns) as r:
        return ringrecords.state_records(rank, r.snapshot(), peers)


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
        got = livestate.comm_records(str(path), 3, copies)
        want = ringrecords.comm_records(3, r.snapshot())
    assert got == want
    assert tables.SEND == 0 and ringlayout.COMM_SLOTS == 16
