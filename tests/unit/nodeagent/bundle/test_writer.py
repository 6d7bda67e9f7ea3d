"""writer.write: layout, the exact JSON of each record, archives, extra files, crash safety."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import pathlib
import tarfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pydantic
import pytest

from collscope.nodeagent import errors
from collscope.nodeagent.bundle import models, reader, tables, writer

Record = dict[str, Any]
ORACLE: pydantic.TypeAdapter[reader.AnyRecord] = pydantic.TypeAdapter(models.Record)


@pytest.fixture
def bundle(job: Record, records: list[Record]) -> tables.Bundle:
    builder = tables.BundleBuilder(models.Job.model_validate(job))
    for rec in records:
        builder.add_record(ORACLE.validate_python(rec))
    return builder.build()


def record_lines(path: pathlib.Path) -> list[str]:
    plain = path / "records.jsonl"
    if plain.exists():
        return plain.read_text().splitlines()
    return gzip.decompress((path / "records.jsonl.gz").read_bytes()).decode().splitlines()


def leftovers(parent: pathlib.Path) -> list[str]:
    return sorted(
        p.name for p in parent.iterdir() if p.name.endswith(".partial") or ".partial." in p.name
    )


@pytest.mark.parametrize("compress", [True, False])
def test_directory_layout(bundle: tables.Bundle, tmp_path: pathlib.Path, compress: bool) -> None:
    out = writer.write(bundle, tmp_path / "b", compress=compress)
    assert out == tmp_path / "b"
    records = "records.jsonl.gz" if compress else "records.jsonl"
    assert sorted(p.name for p in out.iterdir()) == ["job.json", records]
    if compress:
        assert (out / records).read_bytes()[:2] == b"\x1f\x8b"
    job_text = (out / "job.json").read_text()
    assert models.Job.model_validate_json(job_text) == bundle.job
    assert '"schema":"collscope.bundle/v1"' in job_text and "null" not in job_text
    assert leftovers(tmp_path) == []


def test_lines_are_the_records_of_iter_records(
    bundle: tables.Bundle, tmp_path: pathlib.Path
) -> None:
    lines = record_lines(writer.write(bundle, tmp_path / "b", compress=False))
    models_ = list(bundle.iter_records())
    assert [ORACLE.validate_json(line) for line in lines] == models_
    for line, model in zip(lines, models_, strict=True):
        assert json.loads(line) == model.model_dump(mode="json", by_alias=True, exclude_none=True)
        assert ", " not in line and '": ' not in line  # compact separators


def test_optional_members_are_absent_not_null(
    bundle: tables.Bundle, tmp_path: pathlib.Path
) -> None:
    lines = [json.loads(x) for x in record_lines(writer.write(bundle, tmp_path / "b"))]
    ops = {o["op"]: o for o in lines if o["type"] == "op"}
    assert "peer" not in ops["AllReduce"] and ops["Send"]["peer"] == 0
    (state,) = [s for s in lines if s["type"] == "state"]
    assert state["kernel"] == {"channels": 8, "done": 5}
    assert [f["dir"] for f in state["flows"]] == ["send", "recv"]
    assert "posted" not in state["flows"][0] and "ready" not in state["flows"][1]
    assert all(isinstance(v, int) for v in state.values() if not isinstance(v, str | list | dict))
    bare = tables.BundleBuilder(bundle.job)
    bare.add_state(rank=0, ts=5, comm="0x1", seq=0, op="Recv", nbytes=0, start=1)
    (line,) = record_lines(writer.write(bare.build(), tmp_path / "bare"))
    assert json.loads(line) == {
        "type": "state",
        "rank": 0,
        "ts": 5,
        "comm": "0x1",
        "seq": 0,
        "op": "Recv",
        "bytes": 0,
        "start": 1,
        "flows": [],
    }


@pytest.mark.parametrize(("name", "stem"), [("run-7.tar.gz", "run-7"), ("run-7.tgz", "run-7")])
@pytest.mark.parametrize("compress", [True, False])
def test_archive_holds_one_directory_named_after_it(
    bundle: tables.Bundle, tmp_path: pathlib.Path, name: str, stem: str, compress: bool
) -> None:
    out = writer.write(bundle, tmp_path / name, compress=compress, extra_files={"truth.json": "{}"})
    assert out == tmp_path / name and out.is_file()
    records = "records.jsonl.gz" if compress else "records.jsonl"
    with tarfile.open(out, "r:gz") as tar:
        names = tar.getnames()
        assert names == [stem, f"{stem}/job.json", f"{stem}/{records}", f"{stem}/truth.json"]
        assert all(m.isfile() for m in tar.getmembers()[1:])
    assert leftovers(tmp_path) == []
    again = reader.load(out)
    assert sorted(r.model_dump_json() for r in again.iter_records()) == sorted(
        r.model_dump_json() for r in bundle.iter_records()
    )


def test_extra_files_are_written_verbatim(bundle: tables.Bundle, tmp_path: pathlib.Path) -> None:
    text = '{"fault": "nic_down",\n  "rank": 3, "note": "caf\u00e9 \u2713"}\n'
    out = writer.write(bundle, tmp_path / "b", extra_files={"truth.json": text, "flows.jsonl": ""})
    assert (out / "truth.json").read_bytes() == text.encode("utf-8")
    assert (out / "flows.jsonl").read_bytes() == b""
    assert list(reader.iter_net_flows(out)) == []


@pytest.mark.parametrize(
    "name", ["", ".", "..", "../x", "a/b", "job.json", "records.jsonl", "records.jsonl.gz", "x\0y"]
)
def test_bad_extra_file_names(bundle: tables.Bundle, tmp_path: pathlib.Path, name: str) -> None:
    with pytest.raises(ValueError, match="extra file"):
        writer.write(bundle, tmp_path / "b", extra_files={name: "x"})
    assert list(tmp_path.iterdir()) == []


def test_existing_outputs(bundle: tables.Bundle, tmp_path: pathlib.Path) -> None:
    (tmp_path / "empty").mkdir()
    assert (writer.write(bundle, tmp_path / "empty") / "job.json").exists()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        writer.write(bundle, full)
    with pytest.raises(FileExistsError, match="neither empty nor a bundle"):
        writer.check_target(full)  # what a command asks before it makes the bundle
    writer.check_target(tmp_path / "new")
    (full / "job.json").write_text("{}")
    (full / "sub").mkdir()
    with pytest.raises(FileExistsError):
        writer.write(bundle, full)  # a subdirectory: not a bundle the writer made
    assert sorted(p.name for p in full.iterdir()) == ["job.json", "keep.txt", "sub"]
    with pytest.raises(FileExistsError):
        writer.write(bundle, tmp_path / "full" / "keep.txt")
    archive = tmp_path / "b.tar.gz"
    archive.write_bytes(b"old")
    writer.write(bundle, archive)
    assert len(reader.load(archive).states) == 1  # a file of the archive's name is replaced
    assert leftovers(tmp_path) == []


def test_a_previous_bundle_is_replaced(bundle: tables.Bundle, tmp_path: pathlib.Path) -> None:
    out = writer.write(bundle, tmp_path / "b", compress=False, extra_files={"truth.json": "{}"})
    writer.write(bundle, out)
    assert sorted(p.name for p in out.iterdir()) == ["job.json", "records.jsonl.gz"]
    assert len(reader.load(out).ops) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


@pytest.mark.parametrize("name", ["b", "b.tar.gz"])
def test_a_crash_leaves_no_partial_bundle(
    bundle: tables.Bundle, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    def failing(b: tables.Bundle) -> Iterator[str]:
        yield '{"half": '
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "record_blocks", failing)
    with pytest.raises(OSError, match="No space"):
        writer.write(bundle, tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def test_job_that_would_not_read_back(bundle: tables.Bundle, tmp_path: pathlib.Path) -> None:
    broken = models.Job.model_construct(world_size=0, job="x", ranks=[], parallelism=None)
    with pytest.raises(errors.BundleError, match="world_size"):
        writer.write(dataclasses.replace(bundle, job=broken), tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


def test_non_finite_hw_values_read_back(bundle: tables.Bundle, tmp_path: pathlib.Path) -> None:
    builder = tables.BundleBuilder(bundle.job)
    for i, value in enumerate([math.nan, math.inf, -math.inf, -0.0, 1e300, 5e-324]):
        builder.add_hw(rank=0, ts=i, node="n", device="gpu0", metric="m", value=value)
    back = reader.load(writer.write(builder.build(), tmp_path / "b"))
    values = back.hw["value"]
    assert math.isnan(values[0]) and list(values[1:3]) == [math.inf, -math.inf]
    assert math.copysign(1.0, values[3]) == -1.0 and list(values[4:]) == [1e300, 5e-324]


def test_flows_laid_out_in_any_order(bundle: tables.Bundle, tmp_path: pathlib.Path) -> None:
    """States whose flow ranges are not one contiguous run (a Bundle built by other means)."""
    builder = tables.BundleBuilder(bundle.job)
    for seq in range(3):
        rows = [(c, seq, tables.SEND, 9, 3, 2, -1, 1, -1, seq * 10 + c) for c in range(seq + 1)]
        builder.add_state(
            rank=0, ts=seq, comm="0x1", seq=seq, op="A", nbytes=1, start=0, flows=rows
        )
    b = builder.build()
    states = b.states.copy()
    flows = b.flows[::-1].copy()
    n = len(flows)
    states["flow_lo"], states["flow_hi"] = n - b.states["flow_hi"], n - b.states["flow_lo"]
    for i in range(len(states)):  # reversed rows: reverse each state's range back
        lo, hi = int(states["flow_lo"][i]), int(states["flow_hi"][i])
        flows[lo:hi] = flows[lo:hi][::-1].copy()
    assert not np.array_equal(states["flow_lo"][1:], states["flow_hi"][:-1])
    shuffled = dataclasses.replace(b, states=states, flows=flows)
    got = [ORACLE.validate_json(x) for x in record_lines(writer.write(shuffled, tmp_path / "b"))]
    assert got == list(shuffled.iter_records()) == list(b.iter_records())
    assert [len(s.flows) for s in got if isinstance(s, models.StateRecord)] == [1, 2, 3]


def test_same_bundle_same_bytes(bundle: tables.Bundle, tmp_path: pathlib.Path) -> None:
    a = writer.write(bundle, tmp_path / "a") / "records.jsonl.gz"
    b = writer.write(bundle, tmp_path / "b") / "records.jsonl.gz"
    assert a.read_bytes() == b.read_bytes()


def test_large_block_counts(
    bundle: tables.Bundle, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many blocks: every table crosses block boundaries and the flows stay with their state."""
    monkeypatch.setattr(writer, "_BLOCK_ROWS", 3)
    builder = tables.BundleBuilder(bundle.job)
    for i in range(20):
        builder.add_comm(rank=i % 4, ts=i, comm=f"0x{i:x}", comm_rank=0, nranks=1)
        builder.add_op(
            rank=i % 4,
            ts=i,
            comm="0xa",
            seq=i,
            op="Send",
            nbytes=i,
            start=i,
            end=i + 1,
            peer=(i + 1) % 4,
        )
        builder.add_state(
            rank=i % 4,
            ts=i,
            comm="0xa",
            seq=i,
            op="Send",
            nbytes=i,
            start=i,
            flows=[(0, 1, tables.RECV, i, -1, -1, i, i, i, i)] * (i % 3),
            kernel=(i, i // 2),
        )
        builder.add_hw(rank=i % 4, ts=i, node="n", device="d", metric="m", value=i / 3)
    b = builder.build()
    lines = record_lines(writer.write(b, tmp_path / "b"))
    assert [ORACLE.validate_json(x) for x in lines] == list(b.iter_records())
    assert np.array_equal(reader.load(tmp_path / "b").flows, b.flows)
