"""Fuzz: a damaged ring file reads fine or raises RingCorrupt/RingVersionMismatch, nothing else.

Damage is what a disk, a dying writer or a foreign file can do: random bytes anywhere, bogus
header fields (offsets, counts, sizes, the write index), bogus 8-byte words where seqlocks,
commit words and counters live, and truncation. Every read path runs on the result, down to
the bundle-v1 records, so a check missing anywhere shows up as another exception.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collscope.nodeagent import errors, ring
from collscope.nodeagent.ring import layout, records

NOW = 1_732_001_237_000_000_000  # 3 s after the conftest epoch
Builder = Any  # conftest.RingBuilder: conftest modules cannot be imported under importlib mode
COMM_BASE = layout.HEADER_BYTES
EVENT_BASE = COMM_BASE + layout.COMM_SLOTS * layout.COMM_SLOT.itemsize
# The header's integer fields, the ones a reader trusts to find everything else.
HEADER_INTS = [
    name
    for name in layout.HEADER.names or ()
    if layout.HEADER.fields is not None
    and layout.HEADER.fields[name][0].kind in "iu"
    and layout.HEADER.fields[name][0].shape == ()
]
# Where the scenario's live data and records are: the first comm slot and the first events.
HOT = [(0, 1024), (COMM_BASE, COMM_BASE + 1536 + 8 * 64), (EVENT_BASE, EVENT_BASE + 8 * 64)]


def _header_field() -> st.SearchStrategy[tuple[str, str, int]]:
    def value(name: str) -> st.SearchStrategy[tuple[str, str, int]]:
        size = layout.field_size(layout.HEADER, name)
        interesting = st.sampled_from([0, 1, 63, 64, 4096, 2**31, 2 ** (8 * size) - 1])
        anything = st.integers(0, 2 ** (8 * size) - 1)
        return st.tuples(st.just("field"), st.just(name), interesting | anything)

    return st.sampled_from(HEADER_INTS).flatmap(value)


def _offset() -> st.SearchStrategy[int]:
    return st.sampled_from(HOT).flatmap(lambda r: st.integers(r[0], r[1] - 1))


MUTATION = st.one_of(
    _header_field(),
    st.tuples(st.just("byte"), _offset(), st.integers(0, 255)),
    st.tuples(st.just("word"), _offset().map(lambda o: o & ~7), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("byte"), st.integers(0, EVENT_BASE + 64 * 64 - 1), st.integers(0, 255)),
    st.tuples(st.just("truncate"), st.integers(0, EVENT_BASE + 64 * 64), st.just(0)),
)


def damage(data: bytes, mutations: list[tuple[str, Any, int]]) -> bytes:
    buf = bytearray(data)
    for kind, where, value in mutations:
        if kind == "field":
            offset = layout.field_offset(layout.HEADER, where)
            size = layout.field_size(layout.HEADER, where)
            if offset + size <= len(buf):
                buf[offset : offset + size] = value.to_bytes(size, "little")
        elif kind == "byte" and where < len(buf):
            buf[where] = value
        elif kind == "word" and where + 8 <= len(buf):
            buf[where : where + 8] = value.to_bytes(8, "little")
        elif kind == "truncate":
            del buf[where:]
    return bytes(buf)


def read_everything(path: pathlib.Path) -> None:
    with ring.open(path, clock=lambda: NOW) as r:
        snap = r.snapshot(retries=2)  # a damaged seqlock is odd for ever: keep the test fast
        r.status()
        events, cursor, missed = r.events_since(0)
        assert 0 <= missed <= cursor and len(events) + missed <= cursor
        r.events_since(r.first_cursor())
        r.events_since(0, skip_pending=True)
        rank = r.identity.rank or 0
        peers = records.peer_ranks(rank, snap, events)
        records.comm_records(rank, snap, events)
        records.op_records(rank, str(path), events, peers)
        records.state_records(rank, snap, peers)
        records.untranslated(snap, events, peers)
        for c in snap.comms:
            op = c.in_flight()
            if op is not None:
                c.flows_of(op)


@pytest.fixture
def pristine(scenario: Builder) -> bytes:
    for i in range(3, 70):  # wrap the 64-slot event ring once
        scenario.event(i, seq=i)
    data: bytes = scenario.tobytes()
    return data


def test_the_pristine_scenario_reads(pristine: bytes, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "r.ring"
    path.write_bytes(pristine)
    read_everything(path)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mutations=st.lists(MUTATION, min_size=1, max_size=6))
def test_damage_reads_or_raises_ring_errors_only(
    mutations: list[tuple[str, Any, int]], pristine: bytes, tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "r.ring"
    path.write_bytes(damage(pristine, mutations))
    try:
        read_everything(path)
    except (errors.RingCorrupt, errors.RingVersionMismatch) as e:
        assert str(e).startswith(str(path)), e
        assert "\n" not in str(e)


def test_damage_helper_damages() -> None:
    data = bytes(np.arange(64, dtype=np.uint8))
    assert damage(data, [("byte", 3, 0)])[3] == 0
    assert damage(data, [("word", 8, 2**64 - 1)])[8:16] == b"\xff" * 8
    assert damage(data, [("truncate", 10, 0)]) == data[:10]
    assert damage(data, [("field", "version", 2)])[8:12] == b"\x02\0\0\0"
