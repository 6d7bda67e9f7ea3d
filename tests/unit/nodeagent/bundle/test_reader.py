"""reader.load and friends: layouts, filters, and one precise error for every defect."""

from __future__ import annotations

import gzip
import io
import json
import pathlib
import tarfile
import tokenize
from collections.abc import Callable
from typing import Any

import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collscope.nodeagent import errors
from collscope.nodeagent.bundle import models, reader

Record = dict[str, Any]
MakeBundle = Callable[..., pathlib.Path]
T0 = 1_732_001_234_000_000_000  # the conftest records' epoch
ORACLE: pydantic.TypeAdapter[reader.AnyRecord] = pydantic.TypeAdapter(models.Record)


def dump(record: Record) -> str:
    return json.dumps(record, separators=(",", ":"))


def tar_of(root: pathlib.Path, dest: pathlib.Path, *, prefix: str | None) -> pathlib.Path:
    """Pack the files of ``root`` into ``dest``, under ``prefix/`` or at the top level."""
    with tarfile.open(dest, "w:gz") as tar:
        for f in sorted(root.iterdir()):
            tar.add(f, arcname=f.name if prefix is None else f"{prefix}/{f.name}")
    return dest


def format_error(call: Callable[[], object]) -> errors.BundleFormatError:
    with pytest.raises(errors.BundleFormatError) as info:
        call()
    err = info.value
    assert "\n" not in str(err) and "\r" not in str(err)
    return err


# --- layouts -------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_load_reads_every_record_type(
    make_bundle: MakeBundle, records: list[Record], gz: bool
) -> None:
    path = make_bundle(records, gz=gz)
    bundle = reader.load(path)
    assert bundle.source == str(path)
    assert bundle.job.world_size == 4 and bundle.job.parallelism is not None
    assert (len(bundle.comms), len(bundle.ops), len(bundle.states), len(bundle.hw)) == (2, 2, 1, 1)
    assert len(bundle.flows) == 2
    got = sorted(r.model_dump_json() for r in bundle.iter_records())
    want = sorted(ORACLE.validate_python(r).model_dump_json() for r in records)
    assert got == want


@pytest.mark.parametrize("prefix", [None, "bundle-7", "./bundle-7", "."])
@pytest.mark.parametrize("suffix", [".tar.gz", ".tgz"])
def test_load_reads_tar_archives(
    make_bundle: MakeBundle,
    records: list[Record],
    tmp_path: pathlib.Path,
    prefix: str | None,
    suffix: str,
) -> None:
    root = make_bundle(records, gz=True)
    archive = tar_of(root, tmp_path / f"x{suffix}", prefix=prefix)
    bundle = reader.load(archive)
    assert bundle.source == str(archive)
    assert len(bundle.states) == 1 and len(bundle.comms) == 2


def test_load_accepts_pathlike_and_str(make_bundle: MakeBundle, records: list[Record]) -> None:
    path = make_bundle(records)
    assert len(reader.load(str(path)).ops) == len(reader.load(path).ops) == 2


def test_unknown_fields_are_ignored(
    make_bundle: MakeBundle, records: list[Record], job: Record
) -> None:
    for rec in records:
        rec["future_field"] = {"nested": [1, "x"]}
    records[4]["flows"][0]["rdma_qp"] = 17
    records[4]["kernel"]["smid"] = 3
    job["cluster"] = "eu-1"
    job["ranks"][0]["rack"] = "r7"
    bundle = reader.load(make_bundle(records, job_text=json.dumps(job)))
    assert len(bundle.states) == 1 and int(bundle.states[0]["kernel_done"]) == 5


def test_blank_lines_are_skipped_and_counted(
    make_bundle: MakeBundle, records: list[Record]
) -> None:
    lines: list[Record | str] = ["", records[0], "   \t", records[1] | {"x": 1}, "\r"]
    path = make_bundle([*lines, "{"])
    err = format_error(lambda: reader.load(path))
    assert err.line == 6  # blank lines still count: the line number is the file's
    ok = make_bundle([*lines[:-1], dump(records[2]) + "\r"], name="ok")
    assert len(reader.load(ok).comms) == 2


def test_ground_truth_is_never_read(make_bundle: MakeBundle, records: list[Record]) -> None:
    path = make_bundle(records, extra={"truth.json": b"\xff not json at all"})
    assert len(reader.load(path).states) == 1
    # No code path may name the file: "truth" appears only in comments and the docstring.
    source = pathlib.Path(reader.__file__).read_bytes()
    tokens = list(tokenize.tokenize(io.BytesIO(source).readline))
    docstring = next(t for t in tokens if t.type == tokenize.STRING)
    for tok in tokens:
        if "truth" in tok.string.lower() and tok is not docstring:
            assert tok.type == tokenize.COMMENT, f"line {tok.start[0]}: {tok.string!r}"


# --- filters -------------------------------------------------------------------------------


def test_time_window_keeps_comms_of_any_time(
    make_bundle: MakeBundle, records: list[Record]
) -> None:
    path = make_bundle(records)
    bundle = reader.load(path, since_ns=T0 + 20, until_ns=T0 + 30)
    assert len(bundle.comms) == 2  # written at T0, before the window
    assert [int(t) for t in bundle.ops["ts"]] == [T0 + 20]  # bounds are inclusive
    assert [int(t) for t in bundle.states["ts"]] == [T0 + 30]
    assert len(bundle.hw) == 0 and len(bundle.flows) == 2
    assert len(reader.load(path, since_ns=T0 + 41).comms) == 2
    assert len(reader.load(path, until_ns=T0 - 1).ops) == 0


def test_rank_filter_applies_to_every_type(make_bundle: MakeBundle, records: list[Record]) -> None:
    path = make_bundle(records)
    only1 = reader.load(path, ranks=[1])
    assert [int(r) for r in only1.comms["rank"]] == [1]
    assert [int(r) for r in only1.ops["rank"]] == [1]
    assert len(only1.states) == 0 and len(only1.flows) == 0 and len(only1.hw) == 1
    assert list(reader.load(path, ranks=set()).ranks) == []
    both = reader.load(path, ranks=(0, 1), since_ns=T0 + 15)
    assert len(both.comms) == 2 and len(both.ops) == 1


def test_records_outside_the_window_are_still_validated(
    make_bundle: MakeBundle, records: list[Record]
) -> None:
    bad = records[2] | {"ts": T0 - 5, "end": 0}
    err = format_error(lambda: reader.load(make_bundle([bad]), since_ns=T0, ranks=[3]))
    assert err.line == 1


# --- errors in records.jsonl ---------------------------------------------------------------


def _state(records: list[Record], **flow0: object) -> Record:
    state = json.loads(json.dumps(records[4]))
    state["flows"][0].update(flow0)
    return dict(state)


CASES: list[tuple[str, Callable[[list[Record]], str], str | None, str]] = [
    ("bad json", lambda r: dump(r[2])[:-5], None, "bad JSON"),
    ("not an object", lambda r: "[1, 2]", None, "not a JSON object (got an array)"),
    ("a number", lambda r: "17", None, "not a JSON object (got a number)"),
    ("unknown type", lambda r: dump(r[2] | {"type": "gossip"}), "type", "unknown type 'gossip'"),
    ("no type", lambda r: dump({k: v for k, v in r[2].items() if k != "type"}), "type", "required"),
    (
        "missing field",
        lambda r: dump({k: v for k, v in r[2].items() if k != "end"}),
        "end",
        "Field required",
    ),
    ("wrong type", lambda r: dump(r[2] | {"seq": "seventeen"}), "seq", "valid integer"),
    ("wrong type nested", lambda r: dump(r[4] | {"flows": {"a": 1}}), "flows", "valid array"),
    ("negative rank", lambda r: dump(r[2] | {"rank": -1}), "rank", "greater than or equal"),
    ("rank beyond int32", lambda r: dump(r[2] | {"rank": 2**31}), "rank", "less than"),
    ("ts beyond int64", lambda r: dump(r[2] | {"ts": 2**63}), "ts", "less than"),
    ("negative count", lambda r: dump(_state(r, done=-3)), "flows[0].done", "(got -3)"),
    ("send invariant", lambda r: dump(_state(r, sent=50)), "flows[0]", "ready >= sent >= done"),
    (
        "recv invariant",
        lambda r: dump(r[4] | {"flows": [r[4]["flows"][1] | {"consumed": 31}]}),
        "flows[0]",
        "posted >= done >= consumed",
    ),
    (
        "flow dir",
        lambda r: dump(_state(r, dir="sideways")),
        "flows[0].dir",
        "unknown dir 'sideways'",
    ),
    (
        "flow not object",
        lambda r: dump(r[4] | {"flows": [r[4]["flows"][0], 5]}),
        "flows[1]",
        "object",
    ),
    (
        "flow missing",
        lambda r: dump(
            r[4]
            | {
                "flows": [
                    {
                        "dir": "recv",
                        "channel": 0,
                        "peer": 1,
                        "total": 1,
                        "posted": 1,
                        "done": 1,
                        "idle_ns": 0,
                    }
                ]
            }
        ),
        "flows[0].consumed",
        "Field required",
    ),
    (
        "kernel",
        lambda r: dump(r[4] | {"kernel": {"channels": 2, "done": 3}}),
        "kernel",
        "done 3 > channels 2",
    ),
    ("op end before start", lambda r: dump(r[2] | {"end": T0}), None, "end"),
    ("comm rank", lambda r: dump(r[0] | {"comm_rank": 2}), None, "comm_rank 2 >= nranks 2"),
    ("comm hex", lambda r: dump(r[0] | {"comm": "0xZZ"}), "comm", "pattern"),
    ("empty op", lambda r: dump(r[2] | {"op": ""}), "op", "at least 1"),
    ("hw value", lambda r: dump(r[5] | {"value": "hot"}), "value", "valid number"),
]


@pytest.mark.parametrize(("case", "make_line", "field", "reason"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("gz", [False, True])
def test_each_defect_names_file_line_and_field(
    *,
    make_bundle: MakeBundle,
    records: list[Record],
    case: str,
    make_line: Callable[[list[Record]], str],
    field: str | None,
    reason: str,
    gz: bool,
) -> None:
    path = make_bundle([records[0], "", records[1], make_line(records), records[2]], gz=gz)
    err = format_error(lambda: reader.load(path))
    name = "records.jsonl.gz" if gz else "records.jsonl"
    assert err.file == str(path / name)
    assert err.line == 4
    assert err.field == field
    assert reason in err.reason
    assert str(err).startswith(f"{path / name}:4: ")
    assert isinstance(err.__cause__, pydantic.ValidationError)


def test_non_utf8_byte(make_bundle: MakeBundle, records: list[Record]) -> None:
    line = dump(records[0]).replace('"tp"', '"t\\u00e9p"').encode().replace(b"\\u00e9", b"\xe9")
    err = format_error(lambda: reader.load(make_bundle([records[1], line])))
    assert err.line == 2 and "not valid UTF-8: byte 0xe9" in err.reason
    assert isinstance(err.__cause__, UnicodeDecodeError)
    # Also in a field the reader ignores.
    other = dump(records[0] | {"note": "x"}).encode().replace(b'"x"', b'"\xff"')
    assert format_error(lambda: reader.load(make_bundle([other], name="c"))).line == 1


def test_too_long_line(
    make_bundle: MakeBundle, records: list[Record], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 64)
    err = format_error(lambda: reader.load(make_bundle([records[2]])))
    assert err.line == 1 and "longer than 64 bytes" in err.reason


def test_truncated_gzip_names_last_good_line(
    make_bundle: MakeBundle, records: list[Record]
) -> None:
    lines = [records[2] | {"seq": i} for i in range(5000)]
    path = make_bundle(lines, gz=True)
    packed = (path / "records.jsonl.gz").read_bytes()
    (path / "records.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    err = format_error(lambda: reader.load(path))
    assert err.file == str(path / "records.jsonl.gz")
    assert err.line is not None and 0 < err.line < 5000
    assert f"after line {err.line} (the last good line)" in err.reason
    assert isinstance(err.__cause__, EOFError)


def test_corrupt_gzip(make_bundle: MakeBundle, records: list[Record]) -> None:
    path = make_bundle([records[2] | {"seq": i} for i in range(2000)], gz=True)
    packed = bytearray((path / "records.jsonl.gz").read_bytes())
    for i in range(200, 260):
        packed[i] ^= 0x5A
    (path / "records.jsonl.gz").write_bytes(bytes(packed))
    err = format_error(lambda: reader.load(path))
    assert err.file == str(path / "records.jsonl.gz")


def test_gz_name_without_gzip_data(make_bundle: MakeBundle, records: list[Record]) -> None:
    path = make_bundle(records)
    (path / "records.jsonl").rename(path / "records.jsonl.gz")
    err = format_error(lambda: reader.load(path))
    assert err.line is None and "before the first line" in err.reason


# --- errors in the bundle as a whole -------------------------------------------------------


def test_path_that_does_not_exist(tmp_path: pathlib.Path) -> None:
    err = format_error(lambda: reader.load(tmp_path / "nope"))
    assert err.file == str(tmp_path / "nope") and "no such file" in err.reason


def test_file_that_is_not_an_archive(tmp_path: pathlib.Path) -> None:
    junk = tmp_path / "b.tar.gz"
    junk.write_bytes(b"hello, not a tarball\n")
    err = format_error(lambda: reader.load(junk))
    assert err.file == str(junk) and err.__cause__ is not None


def test_truncated_archive(
    make_bundle: MakeBundle, records: list[Record], tmp_path: pathlib.Path
) -> None:
    root = make_bundle([records[2] | {"seq": i} for i in range(3000)])
    archive = tar_of(root, tmp_path / "x.tar.gz", prefix="x")
    archive.write_bytes(archive.read_bytes()[:-200])
    err = format_error(lambda: reader.load(archive))
    assert err.file.startswith(str(archive))


def test_archive_without_job(
    make_bundle: MakeBundle, records: list[Record], tmp_path: pathlib.Path
) -> None:
    root = make_bundle(records)
    (root / "job.json").unlink()
    archive = tar_of(root, tmp_path / "x.tar.gz", prefix="x")
    err = format_error(lambda: reader.load(archive))
    assert err.file == str(archive) and "no job.json" in err.reason
    nested = make_bundle(records, name="deep")
    deep = tmp_path / "deep.tgz"
    with tarfile.open(deep, "w:gz") as tar:
        tar.add(nested / "job.json", arcname="a/b/job.json")
        tar.add(nested / "records.jsonl", arcname="a/b/records.jsonl")
    assert "no job.json" in format_error(lambda: reader.load(deep)).reason


def test_archive_with_two_bundles(
    make_bundle: MakeBundle, records: list[Record], tmp_path: pathlib.Path
) -> None:
    root = make_bundle(records)
    archive = tmp_path / "two.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for top in ("a", "b"):
            for f in root.iterdir():
                tar.add(f, arcname=f"{top}/{f.name}")
    assert (
        "several top-level directories: a, b" in format_error(lambda: reader.load(archive)).reason
    )


def test_archive_errors_name_the_member(
    make_bundle: MakeBundle, records: list[Record], tmp_path: pathlib.Path
) -> None:
    root = make_bundle([records[0], dump(records[2] | {"rank": -4})], gz=True)
    archive = tar_of(root, tmp_path / "x.tar.gz", prefix="x")
    err = format_error(lambda: reader.load(archive))
    assert (err.file, err.line, err.field) == (f"{archive}/x/records.jsonl.gz", 2, "rank")


def test_directory_without_job_or_records(make_bundle: MakeBundle, records: list[Record]) -> None:
    path = make_bundle(records)
    (path / "records.jsonl").unlink()
    err = format_error(lambda: reader.load(path))
    assert err.file == str(path / "records.jsonl") and "missing" in err.reason
    (path / "job.json").unlink()
    err = format_error(lambda: reader.load(path))
    assert err.file == str(path / "job.json") and "missing" in err.reason


def test_both_records_files_present(make_bundle: MakeBundle, records: list[Record]) -> None:
    path = make_bundle(records)
    (path / "records.jsonl.gz").write_bytes(gzip.compress(b""))
    assert (
        "both records.jsonl and records.jsonl.gz" in format_error(lambda: reader.load(path)).reason
    )


def test_records_file_that_is_a_directory(make_bundle: MakeBundle, records: list[Record]) -> None:
    path = make_bundle(records)
    (path / "records.jsonl").unlink()
    (path / "records.jsonl").mkdir()
    err = format_error(lambda: reader.load(path))
    assert err.reason == "is not a regular file (mode drwxr-xr-x)"
    assert err.file == str(path / "records.jsonl")


@pytest.mark.parametrize("name", ["job.json", "records.jsonl"])
def test_a_bundle_file_that_is_a_symlink_is_not_followed(
    make_bundle: MakeBundle, records: list[Record], tmp_path: pathlib.Path, name: str
) -> None:
    path = make_bundle(records)
    secret = tmp_path / "secret"
    (path / name).rename(secret)
    (path / name).symlink_to(secret)
    err = format_error(lambda: reader.load(path))
    assert err.file == str(path / name) and "symbolic link" in err.reason


def test_a_bundle_file_larger_than_the_cap_is_refused(
    make_bundle: MakeBundle, records: list[Record], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_bundle(records)
    monkeypatch.setattr(reader, "MAX_FILE_BYTES", 10)
    err = format_error(lambda: reader.load(path))
    assert err.reason.endswith("bytes, larger than 10") and err.file == str(path / "job.json")


def test_a_record_far_from_the_job_names_it(make_bundle: MakeBundle, records: list[Record]) -> None:
    """Issue 15 item 3: a communicator record at ``ts = 1`` is refused at ingest."""
    comm = next(r for r in records if r["type"] == "comm")
    comm["ts"] = 1
    err = format_error(lambda: reader.load(make_bundle(records)))
    assert err.field == "ts"
    assert err.reason.startswith(f"comm record of rank {comm['rank']} at 1 ns is ")
    assert "outside the job's plausible span" in err.reason


JOB_CASES: list[tuple[bytes, int | None, str | None, str]] = [
    (b"[1, 2]", None, None, "not a JSON object"),
    (b'{"schema": "collscope.bundle/v2", "world_size": 4}', None, "schema", "v1"),
    (b'{"world_size": 4, "ranks": [{"rank": 9}]}', None, None, "rank 9 >= world_size 4"),
    (
        b'{"world_size": 4, "ranks": [{"rank": 1}, {"rank": 2, "gpu": -1}]}',
        None,
        "ranks[1].gpu",
        "greater than or equal to 0",
    ),
    (b'{"world_size": 4, "parallelism": {"tp": 3}}', None, None, "product 3 != world_size 4"),
    (b'{"world_size": 4}', None, None, ""),  # valid: the control case
    (b'{\n  "world_size": 4,\n  "job": "x",\n}\n', 4, None, "bad JSON"),
    (b'{"job": "caf\xe9", "world_size": 4}', 1, None, "not valid UTF-8"),
    (b"", 1, None, "bad JSON"),
]


@pytest.mark.parametrize(("text", "line", "field", "reason"), JOB_CASES)
def test_job_json_defects(
    *,
    make_bundle: MakeBundle,
    records: list[Record],
    text: bytes,
    line: int | None,
    field: str | None,
    reason: str,
) -> None:
    path = make_bundle(records, job_text=text)
    if not reason:
        assert reader.load(path).job.world_size == 4
        return
    err = format_error(lambda: reader.load(path))
    assert (err.file, err.line, err.field) == (str(path / "job.json"), line, field)
    assert reason in err.reason


# --- flows.jsonl and functions.jsonl -------------------------------------------------------


def test_iter_net_flows_and_functions(
    make_bundle: MakeBundle, records: list[Record], tmp_path: pathlib.Path
) -> None:
    flows = b'{"ts": 1, "src": "mlx5_0", "dst": "10.0.0.2", "bytes": 9, "duration": 5}\n\n'
    fns = (
        b'{"rank": 2, "fn": "ncclKernel", "kind": "kernel", "beta": 0.5, "mu": 0.2, '
        b'"sigma": 0.1, "window_ns": 1000, "new": true}\n'
    )
    path = make_bundle(
        records, extra={"flows.jsonl.gz": gzip.compress(flows * 3), "functions.jsonl": fns}
    )
    got = list(reader.iter_net_flows(path))
    assert len(got) == 3 and got[0].src == "mlx5_0" and got[0].switches == []
    assert [f.rank for f in reader.iter_functions(path)] == [2]
    archive = tar_of(path, tmp_path / "x.tar.gz", prefix=None)
    assert len(list(reader.iter_net_flows(archive))) == 3
    assert list(reader.iter_functions(make_bundle(records, name="none"))) == []


def test_iter_functions_rejects_bad_lines(make_bundle: MakeBundle, records: list[Record]) -> None:
    fns = (
        b'{"rank": 2, "fn": "f", "kind": "python", "beta": 1.5, "mu": 0, "sigma": 0, '
        b'"window_ns": 1}\n'
    )
    path = make_bundle(records, extra={"functions.jsonl": b"\n" + fns})
    err = format_error(lambda: list(reader.iter_functions(path)))
    assert (err.file, err.line, err.field) == (str(path / "functions.jsonl"), 2, "beta")
    both = make_bundle(records, name="both", extra={"flows.jsonl": b"", "flows.jsonl.gz": b""})
    assert "both" in format_error(lambda: list(reader.iter_net_flows(both))).reason


# --- garbage -------------------------------------------------------------------------------


def _oracle_accepts(line: bytes) -> bool:
    """What models.py accepts, the reference the reader must match exactly."""
    if not line.strip():
        return True  # a blank line is skipped
    try:
        ORACLE.validate_json(line)
    except pydantic.ValidationError:
        return False
    return True


def _check_verdict(path: pathlib.Path, line: bytes) -> None:
    try:
        reader.load(path)
    except errors.BundleFormatError as err:
        assert not _oracle_accepts(line)
        assert err.file == str(path / "records.jsonl") and err.line == 2
        assert "\n" not in str(err) and str(err).startswith(f"{err.file}:2: ")
    else:
        assert _oracle_accepts(line)


GARBAGE = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


@GARBAGE
@given(junk=st.binary(min_size=1, max_size=200).filter(lambda b: b"\n" not in b))
def test_junk_lines_raise_format_errors(
    records: list[Record],
    junk: bytes,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("junk")
    (root / "job.json").write_text('{"world_size": 4}')
    (root / "records.jsonl").write_bytes(dump(records[0]).encode() + b"\n" + junk + b"\n")
    _check_verdict(root, junk)


@GARBAGE
@given(data=st.data())
def test_mutated_lines_raise_format_errors(
    records: list[Record], data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    rec = json.loads(json.dumps(data.draw(st.sampled_from(records))))
    how = data.draw(st.sampled_from(["bytes", "field", "drop", "flow"]))
    if how == "bytes":  # edit the text: delete, insert or replace a few bytes
        line = bytearray(dump(rec).encode())
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(0, len(line) - 1))
            byte = data.draw(st.integers(0, 255).filter(lambda b: b != 10))
            op = data.draw(st.sampled_from(["del", "ins", "set"]))
            if op == "del":
                del line[at]
            elif op == "ins":
                line.insert(at, byte)
            else:
                line[at] = byte
        raw = bytes(line)
    else:
        target = rec
        if how == "flow" and rec["type"] == "state":
            target = rec["flows"][data.draw(st.integers(0, len(rec["flows"]) - 1))]
        key = data.draw(st.sampled_from(sorted(target)))
        if how == "drop":
            del target[key]
        else:
            target[key] = data.draw(JSON_VALUES)
        raw = dump(rec).encode()
    root = tmp_path_factory.mktemp("mut")
    (root / "job.json").write_text('{"world_size": 4}')
    (root / "records.jsonl").write_bytes(dump(records[1]).encode() + b"\n" + raw + b"\n")
    _check_verdict(root, raw)


# --- memory --------------------------------------------------------------------------------


@pytest.mark.slow
def test_load_streams_instead_of_holding_the_file(tmp_path: pathlib.Path) -> None:
    """200,000 lines (~50 MB of JSON): the reader's peak stays far below the file's size and
    close to the size of the tables it returns (no whole file, no Python object per field)."""
    import tracemalloc

    root = tmp_path / "big"
    root.mkdir()
    (root / "job.json").write_text('{"world_size": 64}')
    comm = (
        '{"type":"comm","rank":%d,"ts":%d,"comm":"0xabcdef0123456789","comm_rank":%d,'
        '"nranks":64,"nnodes":8,"name":"dp"}\n'
    )
    op = (
        '{"type":"op","rank":%d,"ts":%d,"comm":"0xabcdef0123456789","seq":%d,'
        '"op":"AllReduce","bytes":4194304,"dtype":"bf16","algo":"Ring","proto":"Simple",'
        '"channels":4,"start":%d,"end":%d}\n'
    )
    send = (
        '{"channel":%d,"peer":%d,"dir":"send","total":64,"ready":40,"sent":40,"done":31,'
        '"idle_ns":%d}'
    )
    recv = (
        '{"channel":%d,"peer":%d,"dir":"recv","total":64,"posted":64,"done":30,'
        '"consumed":30,"idle_ns":%d}'
    )
    state = (
        '{"type":"state","rank":%d,"ts":%d,"comm":"0xabcdef0123456789","seq":%d,'
        '"op":"AllReduce","bytes":4194304,"start":%d,"flows":[%s]}\n'
    )
    hw = (
        '{"type":"hw","rank":%d,"ts":%d,"node":"gpu-node-%02d","device":"gpu%d",'
        '"metric":"power_watts","value":%d.5}\n'
    )
    per_rank, raw_size = 200_000 // 64, 0
    with gzip.open(root / "records.jsonl.gz", "wt", compresslevel=1) as f:
        # Sorted by rank then time, as the writer writes; one state record (2 flows), one op
        # and one hardware sample in turn.
        for rank in range(64):
            lines = [comm % (rank, T0, rank)]
            for i in range(per_rank - 1):
                ts = T0 + i * 100_000_000
                if i % 3 == 0:
                    flows = ",".join(
                        [
                            send % (0, (rank + 1) % 64, 2_000_000_000 + i),
                            recv % (0, (rank - 1) % 64, 1_000_000_000 + i),
                        ]
                    )
                    lines.append(state % (rank, ts, i, ts - 5_000, flows))
                elif i % 3 == 1:
                    lines.append(op % (rank, ts, i, ts - 5_000, ts))
                else:
                    lines.append(hw % (rank, ts, rank // 8, rank % 8, 300 + i % 400))
            text = "".join(lines)
            raw_size += len(text.encode())
            f.write(text)
    tracemalloc.start()
    try:
        bundle = reader.load(root)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tables_size = sum(
        t.nbytes for t in (bundle.comms, bundle.ops, bundle.states, bundle.flows, bundle.hw)
    )
    assert sum(map(len, (bundle.comms, bundle.ops, bundle.states, bundle.hw))) == 64 * per_rank
    assert peak < 0.6 * raw_size, f"peak {peak / 1e6:.1f} MB for {raw_size / 1e6:.1f} MB"
    assert peak < 1.4 * tables_size, f"peak {peak / 1e6:.1f} MB, tables {tables_size / 1e6:.1f}"


# --- lines held in memory (what the operator pulls from agents) ----------------------------


def test_load_lines_equals_load_of_the_same_records(
    make_bundle: MakeBundle, records: list[Record], job: dict[str, Any]
) -> None:
    from_file = reader.load(make_bundle(records))
    lines = [dump(r).encode() for r in records]
    half = len(lines) // 2
    from_lines = reader.load_lines(
        models.Job.model_validate(job),
        [
            ("http://node-0/v1/window", lines[:half]),
            ("http://node-1/v1/window", [b"", *lines[half:]]),
        ],
    )
    assert from_lines.job == from_file.job
    for name in ("comms", "ops", "states", "flows", "hw"):
        assert (getattr(from_lines, name) == getattr(from_file, name)).all(), name


def test_load_lines_names_the_source_and_line_of_a_bad_record(
    records: list[Record], job: dict[str, Any]
) -> None:
    bad = dict(records[0], rank="three")
    lines = [dump(records[1]).encode(), b"", dump(bad).encode()]
    err = format_error(
        lambda: reader.load_lines(
            models.Job.model_validate(job), [("http://node-7:9464/v1/window", lines)]
        )
    )
    assert "http://node-7:9464/v1/window:3" in str(err) and "rank" in str(err)
