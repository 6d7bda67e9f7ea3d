"""columnar: the window's column-array wire form round-trips to exactly the tables the JSON-lines
path builds, and every malformed payload is refused naming where, field and row."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from collscope.nodeagent import errors
from collscope.nodeagent.bundle import columnar, models, reader, tables, writer

from .conftest import T0, Record

WHERE = "http://node-3:9464/v1/window"


def lines_of(records: list[Record]) -> list[bytes]:
    return [json.dumps(r).encode() for r in records]


def node_records(rng: random.Random, ranks: range) -> list[Record]:
    """Comms, collectives, point-to-point ops, states with both flow kinds (or none, or a
    kernel object) and hw samples of ``ranks``, in a scrambled order with equal timestamps."""
    out: list[Record] = []
    comms = ["0x1f3a", "0xab", "0x99"]
    for r in ranks:
        for i, c in enumerate(comms):
            out.append({"type": "comm", "rank": r, "ts": T0 + i, "comm": c,
                        "comm_rank": r % 4, "nranks": 4, "nnodes": 2, "name": f"g{i}"})  # fmt: skip
        for seq in range(6):
            c = rng.choice(comms)
            end = T0 + 100 + rng.randrange(5) * 10  # ties on (rank, end): comm decides
            op = rng.choice(["AllReduce", "Send", "Recv", "AllGather"])
            rec: Record = {"type": "op", "rank": r, "ts": end, "comm": c, "seq": seq, "op": op,
                           "bytes": 1 << seq, "start": end - 5, "end": end, "channels": 2,
                           "algo": rng.choice(["", "Ring", "Tree"]), "proto": "Simple",
                           "dtype": "bf16"}  # fmt: skip
            if op in ("Send", "Recv"):
                rec["peer"] = (r + 1) % 8
            out.append(rec)
        for k in range(5):
            flows = []
            for ch in range(rng.randrange(4)):
                if rng.random() < 0.5:
                    flows.append({"channel": ch, "peer": 1, "dir": "send", "total": 8, "ready": 6,
                                  "sent": 5, "done": 4, "idle_ns": k})  # fmt: skip
                else:
                    flows.append({"channel": ch, "peer": 2, "dir": "recv", "total": 8,
                                  "posted": 8, "done": 3, "consumed": 2, "idle_ns": k})  # fmt: skip
            st: Record = {"type": "state", "rank": r, "ts": T0 + 200 + (k // 2), "seq": 9,
                          "comm": rng.choice(comms), "op": "ReduceScatter", "bytes": 64,
                          "start": T0 + 150, "flows": flows}  # fmt: skip
            if rng.random() < 0.3:
                st["kernel"] = {"channels": 4, "done": rng.randrange(5)}
            out.append(st)
        out.append({"type": "hw", "rank": r, "ts": T0 + 5, "node": "n", "device": "gpu0",
                    "metric": "power_watts", "value": 300.25})  # fmt: skip
    rng.shuffle(out)
    return out


def same(a: tables.Tables, b: tables.Tables) -> None:
    assert a.comm_ids == b.comm_ids and a.strings == b.strings
    for name in ("comms", "ops", "states", "flows", "hw"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name


def via_columns(job: models.Job, windows: list[tables.Bundle]) -> tables.Bundle:
    builder = tables.BundleBuilder(job, source="agents")
    for i, w in enumerate(windows):
        builder.add_tables(columnar.decode(columnar.encode(w), where=f"node-{i}"))
    return builder.build()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_round_trip_equals_the_json_lines_path(seed: int) -> None:
    """What agents hold (their window, a sorted Bundle) sent both ways: identical tables,
    interned indices and row order included."""
    rng = random.Random(seed)
    job = models.Job(world_size=8)
    nodes = [lines_of(node_records(rng, range(4 * n, 4 * n + 4))) for n in range(2)]
    windows = [reader.load_lines(job, [(f"node-{n}", lines)]) for n, lines in enumerate(nodes)]
    as_json = reader.load_lines(
        job,
        [(f"node-{i}", "".join(writer.record_blocks(w)).encode().splitlines())
         for i, w in enumerate(windows)],
    )  # fmt: skip
    same(via_columns(job, windows), as_json)


def test_round_trip_of_the_fixture_records(records: list[Record]) -> None:
    job = models.Job(world_size=4)
    window = reader.load_lines(job, [("x", lines_of(records))])
    same(via_columns(job, [window]), window)


def test_states_whose_flows_do_not_start_at_row_0(records: list[Record]) -> None:
    """A cut of a window: the states index flows in the middle of the flow table."""
    job = models.Job(world_size=4)
    state = next(r for r in records if r["type"] == "state")
    later = {**state, "ts": state["ts"] + 1, "seq": 3}
    window = reader.load_lines(job, [("x", lines_of([state, later]))])
    cut = dataclasses.replace(window, states=window.states[1:])
    got = columnar.decode(columnar.encode(cut), where=WHERE)
    assert got.states["flow_lo"].tolist() == [0] and got.states["flow_hi"].tolist() == [2]
    assert np.array_equal(got.flows, window.flows[2:4])


def test_empty_window_and_absent_hw_table() -> None:
    empty = reader.load_lines(models.Job(world_size=1), [])
    body = repack(columnar.encode(empty), lambda h: h["tables"].pop("hw"))
    got = columnar.decode(body, where=WHERE)
    assert all(len(getattr(got, t)) == 0 for t in ("comms", "ops", "states", "flows", "hw"))


def test_unknown_tables_and_columns_are_ignored(records: list[Record]) -> None:
    window = reader.load_lines(models.Job(world_size=4), [("x", lines_of(records))])

    def newer(h: dict[str, Any]) -> None:
        h["tables"]["ops"]["columns"]["a_newer_column"] = {"dtype": "<f8", "offset": 0}
        h["tables"]["a_newer_table"] = {"rows": 0, "columns": {}}
        h["a_newer_key"] = 1

    got = columnar.decode(repack(columnar.encode(window), newer), where=WHERE)
    assert np.array_equal(got.ops, window.ops)


# -- malformed payloads -----------------------------------------------------------------------
def split(body: bytes) -> tuple[dict[str, Any], bytes]:
    _, hlen = struct.unpack_from("<8sI", body)
    lead = 12 + hlen
    return json.loads(body[12:lead]), body[lead + (-lead % 8) :]


def repack(
    body: bytes,
    header_edit: Callable[[dict[str, Any]], object] = lambda h: None,
    data_edit: Callable[[dict[str, Any], bytearray], object] = lambda h, d: None,
) -> bytes:
    header, data = split(body)
    header_edit(header)
    buf = bytearray(data)
    data_edit(header, buf)
    raw = json.dumps(header).encode()
    lead = 12 + len(raw)
    return struct.pack("<8sI", columnar.MAGIC, len(raw)) + raw + bytes(-lead % 8) + bytes(buf)


def poke(table: str, col: str, row: int, value: int) -> Callable[[dict[str, Any], bytearray], None]:
    """Overwrite one value of a column in the data section."""

    def edit(h: dict[str, Any], data: bytearray) -> None:
        spec = h["tables"][table]["columns"][col]
        dtype = np.dtype(spec["dtype"])
        at = spec["offset"] + row * dtype.itemsize
        data[at : at + dtype.itemsize] = np.array([value], dtype).tobytes()

    return edit


@pytest.fixture
def body(records: list[Record]) -> bytes:
    return columnar.encode(reader.load_lines(models.Job(world_size=4), [("x", lines_of(records))]))


def refused(payload: bytes) -> errors.BundleFormatError:
    with pytest.raises(errors.BundleFormatError) as info:
        columnar.decode(payload, where=WHERE)
    assert str(info.value).startswith(WHERE + ": ")
    return info.value


def test_layout_defects(body: bytes) -> None:
    assert "too short" in str(refused(b"CSCO"))
    assert "magic" in str(refused(b'{"type": "comm"}\n' * 3))
    assert "does not fit" in str(refused(body[:40]))
    hlen = struct.unpack_from("<I", body, 8)[0]
    bad_json = body[:12] + b"\xff" + body[13 : 12 + hlen] + body[12 + hlen :]
    assert refused(bad_json).field == "header"
    assert refused(body[: len(body) - 8]).field is not None  # the last column overruns


@pytest.mark.parametrize(
    ("edit", "field", "reason"),
    [
        (lambda h: h.update(schema="collscope.window/v9"), "schema", "expected"),
        (lambda h: h.update(strings="AllReduce"), "strings", "list of strings"),
        (lambda h: h["comm_ids"].__setitem__(0, "0X1F3A"), "comm_ids[0]", "hex id"),
        (lambda h: h.pop("tables"), "tables", "missing"),
        (lambda h: h["tables"].pop("states"), "tables.states", "rows"),
        (lambda h: h["tables"]["flows"]["columns"].pop("done"), "tables.flows.done", "missing"),
        (
            lambda h: h["tables"]["ops"]["columns"]["seq"].update(dtype="<i4"),
            "tables.ops.seq",
            "expected '<i8'",
        ),
        (
            lambda h: h["tables"]["ops"]["columns"]["seq"].update(dtype=">i8"),
            "tables.ops.seq",
            "expected '<i8'",
        ),
        (
            lambda h: h["tables"]["ops"]["columns"]["end"].update(offset=1 << 40),
            "tables.ops.end",
            "overrun",
        ),
        (
            lambda h: h["tables"]["ops"]["columns"]["end"].update(offset=-8),
            "tables.ops.end",
            "overrun",
        ),
        (lambda h: h["tables"]["ops"].update(rows=100), "tables.ops.ts", "overrun"),
        (lambda h: h["tables"]["ops"].update(rows=1 << 50), "tables.ops", "1125899906842624 rows"),
        (lambda h: h["tables"]["states"].update(rows=0), "states.nflows", "flows has 2 rows"),
    ],
)
def test_header_defects_name_the_field(
    body: bytes, edit: Callable[[dict[str, Any]], object], field: str, reason: str
) -> None:
    err = refused(repack(body, edit))
    assert err.field == field and reason in err.reason, str(err)


# Rows of the fixture: ops 0 AllReduce (rank 0), 1 Send (rank 1); state 0 with flows 0 send,
# 1 recv; comms 0, 1. Each edit breaks one rule that the JSON path enforces too.
VALUE_DEFECTS = [
    ("ops", "seq", 1, -1, "ops[1].seq", "must be >= 0"),
    ("ops", "rank", 0, -5, "ops[0].rank", "must be >= 0"),
    ("ops", "peer", 1, -2, "ops[1].peer", "must be >= -1"),
    ("ops", "end", 0, T0, "ops[0].end", "< start"),
    ("ops", "comm", 0, 7, "ops[0].comm", "outside comm_ids"),
    ("ops", "algo", 1, 999, "ops[1].algo", "outside strings"),
    ("ops", "op", 0, 0, "ops[0].op", "1 to 64 characters"),  # strings[0] is ""
    ("comms", "comm_rank", 1, 2, "comms[1].comm_rank", ">= nranks"),
    ("comms", "nranks", 0, 0, "comms[0].nranks", "must be >= 1"),
    ("states", "kernel_done", 0, 9, "states[0].kernel_done", "done <= channels"),
    ("states", "nflows", 0, 1, "states.nflows", "add up to 1"),
    ("states", "nflows", 0, 1 << 62, "states[0].nflows", "not in [0, 2]"),
    ("states", "nflows", 0, -1, "states[0].nflows", "not in [0, 2]"),
    ("flows", "dir", 0, 2, "flows[0].dir", "send"),
    ("flows", "sent", 0, 41, "flows[0].done", "ready >= sent >= done"),
    ("flows", "consumed", 1, 31, "flows[1].done", "posted >= done >= consumed"),
    ("flows", "consumed", 1, -1, "flows[1].done", "consumed >= 0"),
    ("flows", "idle_ns", 1, -1, "flows[1].idle_ns", "must be >= 0"),
    ("hw", "metric", 0, -1, "hw[0].metric", "outside strings"),
]


@pytest.mark.parametrize(
    ("table", "col", "row", "value", "field", "reason"),
    VALUE_DEFECTS,
    ids=[f"{d[0]}.{d[1]}={d[3]}" for d in VALUE_DEFECTS],
)
def test_value_defects_name_table_row_and_column(  # noqa: PLR0917 - one per parameter
    body: bytes, table: str, col: str, row: int, value: int, field: str, reason: str
) -> None:
    err = refused(repack(body, data_edit=poke(table, col, row, value)))
    assert err.field == field and reason in err.reason, str(err)


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: r[4]["flows"][0].update(sent=41),
        lambda r: r[3].update(peer=-2),
        lambda r: r[0].update(comm_rank=2),
        lambda r: r[4]["kernel"].update(done=9),
    ],
)
def test_the_json_path_refuses_the_same(
    records: list[Record], edit: Callable[[list[Record]], object]
) -> None:
    """The rules above are the models' rules: the same defect as a JSON line is refused too."""
    broken = copy.deepcopy(records)
    edit(broken)
    with pytest.raises(errors.BundleFormatError):
        reader.load_lines(models.Job(world_size=4), [("x", lines_of(broken))])


def test_unused_flow_counts_come_back_as_minus_one(body: bytes) -> None:
    """A producer's junk in the columns a flow kind does not use reads as the JSON path's -1."""
    junk = repack(body, data_edit=poke("flows", "posted", 0, 77))
    assert columnar.decode(junk, where=WHERE).flows["posted"].tolist() == [-1, 64]
