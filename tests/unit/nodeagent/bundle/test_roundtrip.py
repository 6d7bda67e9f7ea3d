"""Property: any valid records -> BundleBuilder -> writer.write -> reader.load gives them back.

Tables are re-sorted on build, so records are compared as multisets of their JSON dumps (which
also makes NaN compare equal to itself).
"""

from __future__ import annotations

import collections
import pathlib
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collscope.nodeagent.bundle import models, reader, tables, writer

I64 = 2**63 - 1
I32 = 2**31 - 1
# Small values most of the time (shared ranks and comms make the tables interesting), the
# extremes of each column sometimes.
i64 = st.one_of(st.integers(0, 1000), st.integers(0, I64))
i32 = st.one_of(st.integers(0, 64), st.integers(0, I32))
# Record times: any, as long as the records fit in a job's plausible span (a bundle with one
# record years away from the others is refused: tables.MAX_SPAN_NS).
times = st.one_of(st.integers(0, 1000), st.integers(0, tables.MAX_SPAN_NS))
comm_ids = st.one_of(
    st.sampled_from(["0x1", "0xabc"]), st.from_regex(r"0x[0-9a-f]{1,32}", fullmatch=True)
)
texts = st.text(max_size=12)
op_names = st.one_of(
    st.sampled_from(["AllReduce", "Send", "Recv"]), st.text(min_size=1, max_size=64)
)


@st.composite
def counts(draw: st.DrawFn) -> tuple[int, int, int]:
    """(hi, mid, lo) with hi >= mid >= lo >= 0, all within int64."""
    lo = draw(st.integers(0, I64 // 3))
    mid = lo + draw(st.integers(0, I64 // 3))
    return mid + draw(st.integers(0, I64 // 3)), mid, lo


@st.composite
def flows(draw: st.DrawFn) -> models.SendFlow | models.RecvFlow:
    hi, mid, lo = draw(counts())
    common = {"channel": draw(i32), "peer": draw(i32), "total": draw(i64), "idle_ns": draw(i64)}
    if draw(st.booleans()):
        return models.SendFlow(dir="send", ready=hi, sent=mid, done=lo, **common)
    return models.RecvFlow(dir="recv", posted=hi, done=mid, consumed=lo, **common)


@st.composite
def kernels(draw: st.DrawFn) -> models.KernelProgress:
    channels = draw(i32)
    return models.KernelProgress(channels=channels, done=draw(st.integers(0, channels)))


@st.composite
def comm_records(draw: st.DrawFn) -> models.CommRecord:
    nranks = draw(st.integers(1, I32))
    return models.CommRecord(
        rank=draw(i32),
        ts=draw(times),
        comm=draw(comm_ids),
        comm_rank=draw(st.integers(0, nranks - 1)),
        nranks=nranks,
        nnodes=draw(st.integers(1, I32)),
        name=draw(texts),
    )


@st.composite
def op_records(draw: st.DrawFn) -> models.OpRecord:
    start = draw(i64)
    return models.OpRecord(
        rank=draw(i32),
        ts=draw(times),
        comm=draw(comm_ids),
        seq=draw(i64),
        op=draw(op_names),
        bytes=draw(i64),
        dtype=draw(texts),
        algo=draw(texts),
        proto=draw(texts),
        channels=draw(i32),
        start=start,
        end=draw(st.integers(start, I64)),
        peer=draw(st.none() | i32),
    )


@st.composite
def state_records(draw: st.DrawFn) -> models.StateRecord:
    return models.StateRecord(
        rank=draw(i32),
        ts=draw(times),
        comm=draw(comm_ids),
        seq=draw(i64),
        op=draw(op_names),
        bytes=draw(i64),
        start=draw(i64),
        flows=draw(st.lists(flows(), max_size=6)),
        kernel=draw(st.none() | kernels()),
    )


hw_records = st.builds(
    models.HwRecord, rank=i32, ts=times, node=texts, device=texts, metric=texts, value=st.floats()
)
any_records = st.lists(
    st.one_of(comm_records(), op_records(), state_records(), hw_records), max_size=25
)


@st.composite
def jobs(draw: st.DrawFn) -> models.Job:
    world = draw(st.integers(1, 16))
    ranks = draw(st.lists(st.integers(0, world - 1), unique=True, max_size=world))
    infos = [
        models.RankInfo(
            rank=r,
            node=draw(st.none() | texts),
            pod=draw(st.none() | texts),
            gpu=draw(st.none() | i32),
            nic=draw(st.none() | texts),
        )
        for r in ranks
    ]
    parallelism = models.Parallelism(dp=world) if draw(st.booleans()) else None
    return models.Job(job=draw(texts), world_size=world, parallelism=parallelism, ranks=infos)


def dumps(bundle: tables.Bundle) -> collections.Counter[str]:
    return collections.Counter(r.model_dump_json() for r in bundle.iter_records())


@pytest.mark.parametrize("name", ["bundle", "bundle.tar.gz"])
@pytest.mark.parametrize("compress", [True, False])
@settings(max_examples=40, deadline=None)
@given(job=jobs(), records=any_records)
def test_write_then_load_gives_the_records_back(
    name: str,
    compress: bool,
    job: models.Job,
    records: list[models.CommRecord | models.OpRecord | models.StateRecord | models.HwRecord],
) -> None:
    builder = tables.BundleBuilder(job)
    for rec in records:
        builder.add_record(rec)
    bundle = builder.build()
    with tempfile.TemporaryDirectory() as tmp:
        out = writer.write(bundle, pathlib.Path(tmp) / name, compress=compress)
        back = reader.load(out)
    assert back.job == job
    assert dumps(back) == dumps(bundle) == collections.Counter(r.model_dump_json() for r in records)
    assert back.source == str(out)


@settings(max_examples=40, deadline=None)
@given(
    records=any_records,
    since=st.none() | i64,
    until=st.none() | i64,
    ranks=st.none() | st.sets(i32, max_size=4),
)
def test_load_window_is_a_filter_of_the_records(
    records: list[models.CommRecord | models.OpRecord | models.StateRecord | models.HwRecord],
    since: int | None,
    until: int | None,
    ranks: set[int] | None,
) -> None:
    builder = tables.BundleBuilder(models.Job(world_size=1))
    for rec in records:
        builder.add_record(rec)
    with tempfile.TemporaryDirectory() as tmp:
        out = writer.write(builder.build(), pathlib.Path(tmp) / "b")
        back = reader.load(out, since_ns=since, until_ns=until, ranks=ranks)

    def kept(
        rec: models.CommRecord | models.OpRecord | models.StateRecord | models.HwRecord,
    ) -> bool:
        if ranks is not None and rec.rank not in ranks:
            return False
        in_time = (since is None or rec.ts >= since) and (until is None or rec.ts <= until)
        return in_time or isinstance(rec, models.CommRecord)

    assert dumps(back) == collections.Counter(r.model_dump_json() for r in records if kept(r))
