"""``liveness.jsonl``: written, read, filtered and sent in columns; old bundles and old readers
are unaffected (the file is optional and ``records.jsonl`` never holds it)."""

from __future__ import annotations

import gzip
import json
import pathlib
import struct
from typing import Any

import numpy as np
import pydantic
import pytest

from collscope.nodeagent import errors
from collscope.nodeagent.bundle import columnar, models, reader, tables, writer

from .conftest import T0, MakeBundle, Record

RECORD: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(models.Record)
ROWS: list[tuple[int, int, models.LivenessState, int | None]] = [
    (0, T0 + 50, "running", T0 + 45),
    (1, T0 + 50, "dead", T0 + 12),
    (1, T0 + 20, "running", T0 + 12),  # an earlier look at rank 1: sorted before the other
    (2, T0 + 50, "unreachable", None),
    (3, T0 + 50, "stopped", T0 + 30),
]


def bundle_with_liveness(records: list[Record]) -> tables.Bundle:
    b = tables.BundleBuilder(models.Job(world_size=4))
    for line in records:
        b.add_record(RECORD.validate_python(line))
    for rank, ts, state, beat in ROWS:
        b.add_liveness(rank=rank, ts=ts, state=state, heartbeat=beat)
    return b.build()


def rows(t: tables.Table) -> list[tuple[int, int, str, int]]:
    return [
        (int(r["rank"]), int(r["ts"]), tables.LIVENESS_STATES[int(r["state"])], int(r["heartbeat"]))
        for r in t
    ]


EXPECTED = [
    (0, T0 + 50, "running", T0 + 45),
    (1, T0 + 20, "running", T0 + 12),
    (1, T0 + 50, "dead", T0 + 12),
    (2, T0 + 50, "unreachable", -1),
    (3, T0 + 50, "stopped", T0 + 30),
]


@pytest.mark.parametrize("name", ["b", "b.tar.gz"])
def test_written_and_read_back(records: list[Record], tmp_path: pathlib.Path, name: str) -> None:
    b = bundle_with_liveness(records)
    assert rows(b.liveness) == EXPECTED
    out = writer.write(b, tmp_path / name)
    back = reader.load(out)
    assert rows(back.liveness) == EXPECTED
    assert len(back.ops) == len(b.ops) and len(back.states) == len(b.states)


def test_file_layout_and_records_untouched(records: list[Record], tmp_path: pathlib.Path) -> None:
    out = writer.write(bundle_with_liveness(records), tmp_path / "b", compress=False)
    lines = [json.loads(x) for x in (out / "liveness.jsonl").read_text().splitlines()]
    assert lines[3] == {"rank": 2, "ts": T0 + 50, "state": "unreachable"}  # no heartbeat key
    assert lines[2] == {"rank": 1, "ts": T0 + 50, "state": "dead", "heartbeat": T0 + 12}
    # A reader from before liveness.jsonl reads records.jsonl only: nothing new is in it.
    types = {json.loads(x)["type"] for x in (out / "records.jsonl").read_text().splitlines()}
    assert types <= {"comm", "op", "state", "hw"}


def test_no_liveness_no_file(records: list[Record], tmp_path: pathlib.Path) -> None:
    b = reader.load_lines(
        models.Job(world_size=4), [("x", [json.dumps(r).encode() for r in records])]
    )
    assert b.liveness.dtype == tables.LIVENESS_DTYPE and len(b.liveness) == 0
    out = writer.write(b, tmp_path / "b")
    assert sorted(p.name for p in out.iterdir()) == ["job.json", "records.jsonl.gz"]
    assert len(reader.load(out).liveness) == 0
    # ... and an extra file may then take the name, as flows.jsonl may without net_flows
    writer.write(b, tmp_path / "c", extra_files={"liveness.jsonl": ""})
    with pytest.raises(ValueError, match="would replace a file the writer makes"):
        writer.write(
            bundle_with_liveness(records), tmp_path / "d", extra_files={"liveness.jsonl": ""}
        )


def test_load_filters_by_rank_and_time(make_bundle: MakeBundle, records: list[Record]) -> None:
    lines = [json.dumps({"rank": r, "ts": ts, "state": s} | ({} if h is None else {"heartbeat": h}))
             for r, ts, s, h in ROWS]  # fmt: skip
    root = make_bundle(
        records, extra={"liveness.jsonl.gz": gzip.compress("\n".join(lines).encode())}
    )
    assert rows(reader.load(root).liveness) == EXPECTED
    assert [r[0] for r in rows(reader.load(root, ranks=[1, 3]).liveness)] == [1, 1, 3]
    assert rows(reader.load(root, until_ns=T0 + 20).liveness) == [EXPECTED[1]]


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        ('{"rank": 1, "ts": 5, "state": "zombie"}', "state", "Input should be 'running'"),
        ('{"rank": 1, "ts": 5}', "state", "Field required"),
        ('{"rank": -1, "ts": 5, "state": "dead"}', "rank", "greater than or equal to 0"),
        ('{"rank": 1, "ts": 5, "state": "dead", "heartbeat": -3}', "heartbeat", ">= 0"),
    ],
)
def test_bad_lines_are_refused_naming_file_line_and_field(
    make_bundle: MakeBundle, records: list[Record], line: str, field: str, reason: str
) -> None:
    ok = '{"rank": 0, "ts": 5, "state": "running", "heartbeat": 4, "newer_field": 1}'
    root = make_bundle(records, extra={"liveness.jsonl": f"{ok}\n{line}\n".encode()})
    with pytest.raises(errors.BundleFormatError) as e:
        reader.load(root)
    assert e.value.line == 2 and e.value.field == field
    assert e.value.file.endswith("liveness.jsonl")
    assert reason.replace(">= 0", "greater than or equal to 0") in str(e.value)


def test_columns_carry_liveness(records: list[Record]) -> None:
    b = bundle_with_liveness(records)
    got = columnar.decode(columnar.encode(b), where="w")
    assert rows(got.liveness) == EXPECTED
    builder = tables.BundleBuilder(b.job)
    builder.add_tables(got)
    assert np.array_equal(builder.build().liveness, b.liveness)


def test_an_agent_from_before_liveness_sends_no_table(records: list[Record]) -> None:
    body = _repack(
        columnar.encode(bundle_with_liveness(records)), lambda h: h["tables"].pop("liveness")
    )
    got = columnar.decode(body, where="w")
    assert len(got.liveness) == 0 and got.liveness.dtype == tables.LIVENESS_DTYPE


@pytest.mark.parametrize(
    ("col", "value", "reason"),
    [
        ("state", 6, "state code 6 outside 0..5"),
        ("state", -1, "must be >= 0 (got -1)"),
        ("heartbeat", -2, "must be >= -1 (got -2)"),
        ("rank", -4, "must be >= 0 (got -4)"),
    ],
)
def test_bad_columns_are_refused_naming_row(
    records: list[Record], col: str, value: int, reason: str
) -> None:
    body = columnar.encode(bundle_with_liveness(records))

    def poke(h: dict[str, Any], data: bytearray) -> None:
        c = h["tables"]["liveness"]["columns"][col]
        dtype = np.dtype(c["dtype"])
        at = c["offset"] + 2 * dtype.itemsize
        data[at : at + dtype.itemsize] = np.array([value], dtype).tobytes()

    with pytest.raises(errors.BundleFormatError) as e:
        columnar.decode(_repack(body, data_edit=poke), where="w")
    assert e.value.field == f"liveness[2].{col}" and reason in str(e.value)


def _repack(
    body: bytes, header_edit: Any = lambda h: None, data_edit: Any = lambda h, d: None
) -> bytes:
    _, hlen = struct.unpack_from("<8sI", body)
    header = json.loads(body[12 : 12 + hlen])
    lead = 12 + hlen
    data = bytearray(body[lead + (-lead % 8) :])
    header_edit(header)
    data_edit(header, data)
    raw = json.dumps(header).encode()
    lead = 12 + len(raw)
    return struct.pack("<8sI", columnar.MAGIC, len(raw)) + raw + bytes(-lead % 8) + bytes(data)
