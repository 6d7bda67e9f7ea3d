"""The HTTP API over a real socket on 127.0.0.1 (port 0), rings from the real plugin."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import tarfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import numpy as np
import pydantic
import pytest

from collscope.nodeagent import __main__ as cli
from collscope.nodeagent import (
    agent,
    api,
    flightrecorder,
    frdump,
    hardware,
    server,
    settings,
    stacks,
)
from collscope.nodeagent.bundle import columnar, models, reader, tables

RECORD: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(models.Record)


class FakeGpu(hardware.Source):
    """A GPU source with the real Source interface: one device, two counters."""

    name = "fake-gpu"

    def sample(self, now_ns: int) -> list[hardware.Reading]:
        return [
            hardware.Reading("gpu0", "gpu_sm_clock_mhz", 1410.0),
            hardware.Reading("gpu0", "gpu_power_watts", 312.5),
        ]

    def gpu_processes(self) -> dict[int, int]:
        return {os.getpid(): 0}


class Calls:
    def __init__(self) -> None:
        self.stacks: list[tuple[list[int], float]] = []
        self.fr: list[tuple[list[tuple[int, int]], float]] = []

    def dump_stacks(self, pids: Sequence[int], timeout_s: float) -> pydantic.BaseModel:
        self.stacks.append((list(pids), timeout_s))
        group = stacks.StackGroup(frames=["main (train.py:3)"], pids=list(pids))
        return stacks.StacksReport(groups=[group])

    def dump_fr(
        self, targets: Sequence[tuple[int, int]], timeout_s: float
    ) -> flightrecorder.FlightRecorderReport:
        """One dump per rank: three entries on process group 0, then one on group 1."""
        self.fr.append((list(targets), timeout_s))
        entries = [frdump.Entry(pg_id=pg, collective_seq_id=s) for pg, s in FR_ENTRIES]
        dumps = [
            frdump.RankDump(rank=r, file=f"f{r}", entries=entries, raw=b"dump %d" % r)
            for r, _ in targets
        ]
        return flightrecorder.FlightRecorderReport(dumps=dumps)


FR_ENTRIES = [(0, 1), (0, 2), (0, 3), (1, 1)]


class Running:
    def __init__(self, a: agent.Agent, calls: Calls, clock_offset: list[int]) -> None:
        self.agent, self.calls, self.offset = a, calls, clock_offset
        host, port = a.server.address
        self.url = f"http://{host}:{port}"
        self.http = httpx.Client(base_url=self.url, timeout=10.0)


def config(trace: pathlib.Path) -> settings.Settings:
    return settings.Settings(
        node_name="gpu-node-1",
        discovery=settings.DiscoverySettings(
            mode="directory", trace_root=str(trace), rescan_interval_s=0.1
        ),
        sampling=settings.SamplingSettings(sample_interval_s=0.02),
        window=settings.WindowSettings(window_s=30, memory_cap_bytes=32 << 20),
        server=settings.ServerSettings(listen_host="127.0.0.1", listen_port=0),
        auth=settings.AuthSettings(mode="none"),  # test_auth.py and tests/hostile check it
    )


@pytest.fixture
def running(tmp_path: pathlib.Path, plugin_rank: Any) -> Iterator[Running]:
    trace = tmp_path / "trace"
    r0 = plugin_rank(trace, 0)
    r1 = plugin_rank(trace, 1)
    r0.complete(3)
    stuck = r1.allreduce(nch=2, nsteps=8)
    stuck.advance(1)
    calls, offset = Calls(), [0]
    hw = hardware.Sampler([FakeGpu()], node="gpu-node-1", interval_s=0.05, history_s=30)
    a = agent.Agent(
        config(trace),
        hardware_sampler=hw,
        stacks_dumper=calls.dump_stacks,
        fr_dumper=calls.dump_fr,
        clock_ns=lambda: time.time_ns() + offset[0],
    )
    a.start()
    run = Running(a, calls, offset)
    deadline = time.monotonic() + 5
    while a.sampler.stats.ticks < 3 or not hw.latest():
        assert time.monotonic() < deadline, "the agent never ticked"
        time.sleep(0.02)
    yield run
    run.http.close()
    a.stop()


def test_ranks_lists_identity_and_health(running: Running) -> None:
    r = running.http.get("/v1/ranks")
    assert r.status_code == 200
    body = api.RanksResponse.model_validate_json(r.content)
    assert [x.rank for x in body.ranks] == [0, 1]
    assert {x.health for x in body.ranks} == {"live"}
    assert body.ranks[1].pod_name == "train-1" and body.ranks[1].pid == os.getpid()
    assert body.ranks[1].host_pid == os.getpid()  # from the real /proc: same namespace
    assert body.ranks[0].ring_path.endswith(".ring") and body.ranks[0].world_size == 4


def test_summaries_feed_the_trigger(running: Running) -> None:
    # The fixture waits for three sampler ticks, not for a tick that has seen rank 1's ring
    # (discovery rescans every 0.1 s): on a loaded machine rank 1's stuck operation can show
    # up a tick later (once in a CI run), so ask until it does, within 5 s.
    deadline = time.monotonic() + 5.0
    while True:
        r = running.http.get("/v1/summaries", params={"ranks": "0,1", "window_s": "20"})
        assert r.status_code == 200, r.text
        s0, s1 = api.SummariesResponse.model_validate_json(r.content).summaries
        if s1.in_flight or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert s0.completed_ops == 3 and s0.in_flight == [] and s0.completed_bytes == 3 << 22
    assert s1.completed_ops == 0
    (op,) = s1.in_flight
    assert (op.seq, op.op, op.flows) == (1, "AllReduce", 4) and op.stalled_ns >= op.idle_ns


def test_window_streams_bundle_records(running: Running) -> None:
    with running.http.stream("GET", "/v1/window", params={"ranks": "1"}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/x-ndjson"
        recs = [RECORD.validate_json(line) for line in r.iter_lines() if line]
    kinds = {x.type for x in recs}
    # hw: the fake GPU's samples (the window carries its ranks' devices, since d2ae2ae)
    assert kinds - {"hw"} == {"comm", "state"}
    assert {x.rank for x in recs if x.type != "hw"} == {1}
    t = max(x.ts for x in recs if x.type == "state")
    # The loop keeps sampling: a range closed on both ends is what stays the same.
    r = running.http.get("/v1/window", params={"ranks": "1", "since": str(t), "until": str(t)})
    got = [json.loads(x) for x in r.text.splitlines()]
    assert [x["type"] for x in got] == ["comm", "state"] and got[1]["ts"] == t


def test_window_in_columns_when_asked_holds_the_same_records(running: Running) -> None:
    params = {"ranks": "0,1", "since": "0", "until": str(time.time_ns())}
    r = running.http.get("/v1/window", params=params, headers={"Accept": COLUMNS_FIRST})
    assert r.status_code == 200 and r.headers["content-type"] == columnar.MEDIA_TYPE
    assert int(r.headers["content-length"]) == len(r.content)
    part = columnar.decode(r.content, where="test")
    lines = running.http.get("/v1/window", params=params).content.splitlines()
    job = models.Job(world_size=4)
    builder = tables.BundleBuilder(job)
    builder.add_tables(part)
    got, want = builder.build(), reader.load_lines(job, [("test", lines)])
    assert len(want.states) > 0 and len(want.ops) > 0
    for name in ("comms", "ops", "states", "flows"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert got.comm_ids == want.comm_ids and got.strings == want.strings
    # ... plus each rank's writer as seen now: this process, beating (the plugin's thread)
    live = got.liveness
    assert live["rank"].tolist() == [0, 1]
    assert [tables.LIVENESS_STATES[s] for s in live["state"]] == ["running", "running"]
    assert ((live["ts"] - live["heartbeat"]) < 2_000_000_000).all()


COLUMNS_FIRST = f"{columnar.MEDIA_TYPE}, application/x-ndjson;q=0.5"


@pytest.mark.parametrize(
    "accept", [None, "*/*", "application/*", f"{columnar.MEDIA_TYPE};q=0", "text/plain"]
)
def test_window_stays_json_lines_unless_columns_are_named(
    running: Running, accept: str | None
) -> None:
    headers = {} if accept is None else {"Accept": accept}
    r = running.http.get("/v1/window", params={"ranks": "1"}, headers=headers)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    assert RECORD.validate_json(r.content.splitlines()[0]).rank == 1


def test_window_in_columns_checks_its_query_like_json_lines(running: Running) -> None:
    r = running.http.get(
        "/v1/window", params={"since": "5", "until": "1"}, headers={"Accept": COLUMNS_FIRST}
    )
    assert r.status_code == 400 and r.json()["parameter"] == "until"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([COLUMNS_FIRST], True),
        (["text/html", "APPLICATION/VND.COLLSCOPE.COLUMNS.V1 ; q=0.2"], True),
        ([f"{columnar.MEDIA_TYPE};q=0.0"], False),
        ([f"{columnar.MEDIA_TYPE};q=x"], False),
        ([f"{columnar.MEDIA_TYPE}x"], False),
        ([], False),
    ],
)
def testaccepts(values: list[str], expected: bool) -> None:
    assert server.accepts(values, columnar.MEDIA_TYPE) is expected


def test_export_reads_back_with_the_bundle_reader(running: Running, tmp_path: pathlib.Path) -> None:
    r = running.http.get("/v1/export")
    assert r.status_code == 200 and r.headers["content-type"] == "application/gzip"
    out = tmp_path / "node.tar.gz"
    out.write_bytes(r.content)
    b = reader.load(out)
    assert b.job.world_size == 4
    assert [(i.rank, i.pod, i.gpu) for i in b.job.ranks] == [
        (0, "ml/train-0", 0),
        (1, "ml/train-1", 0),
    ]
    assert len(b.ops) == 3 and len(b.states) >= 3 and len(b.hw) >= 2
    assert [(x.rank, x.state) for x in b.iter_liveness()] == [(0, "running"), (1, "running")]
    # The CLI does the same against the running agent.
    cli_out = tmp_path / "cli.tar.gz"
    assert cli.main(["export", "--agent", running.url, "--since=-60s", str(cli_out)]) == 0
    with tarfile.open(cli_out) as tar:
        assert any(n.endswith("job.json") for n in tar.getnames())
    assert len(reader.load(cli_out).ops) == 3


@pytest.mark.parametrize(
    ("path", "params", "parameter"),
    [
        ("/v1/summaries", {"ranks": "one"}, "ranks"),
        ("/v1/summaries", {"ranks": "7"}, "ranks"),
        ("/v1/summaries", {"window_s": "-1"}, "window_s"),
        ("/v1/summaries", {"window_s": "600"}, "window_s"),
        ("/v1/window", {"since": "5", "until": "1"}, "until"),
        ("/v1/window", {"since": "yesterday"}, "since"),
        ("/v1/export", {"colour": "red"}, "colour"),
    ],
)
def test_bad_parameters_are_400_naming_them(
    running: Running, path: str, params: dict[str, str], parameter: str
) -> None:
    r = running.http.get(path, params=params)
    assert r.status_code == 400
    assert api.ErrorResponse.model_validate_json(r.content).parameter == parameter


def test_unknown_paths_and_methods(running: Running) -> None:
    assert running.http.get("/v2/ranks").status_code == 404
    assert running.http.post("/v1/ranks").status_code == 405


def test_hardware_from_the_hardware_sampler(running: Running) -> None:
    r = running.http.get("/v1/hardware", params={"since": "0"})
    body = api.HardwareResponse.model_validate_json(r.content)
    assert body.sources == [api.SourceInfo(name="fake-gpu", available=True)]
    assert {x.metric for x in body.records} == {"gpu_sm_clock_mhz", "gpu_power_watts"}
    assert body.gpu_processes == {os.getpid(): 0}


def test_stacks_and_flight_recorder_resolve_ranks_to_pids(running: Running) -> None:
    r = running.http.post("/v1/stacks", json={"ranks": [1], "timeout_s": 2})
    assert r.status_code == 200
    assert r.json()["groups"][0]["pids"] == [os.getpid()]
    assert running.calls.stacks == [([os.getpid()], 2.0)]
    r = running.http.post("/v1/stacks", json={"ranks": [1], "timeout_s": 0})
    assert r.status_code == 400 and r.json()["parameter"] == "timeout_s"
    r = running.http.post("/v1/flightrecorder", json={})
    assert r.status_code == 200 and r.json()["errors"] == []
    assert [len(d["entries"]) for d in r.json()["dumps"]] == [4, 4]
    assert running.calls.fr == [([(0, os.getpid()), (1, os.getpid())], 10.0)]


def test_flight_recorder_keeps_the_newest_entries_per_group_when_asked(running: Running) -> None:
    r = running.http.post("/v1/flightrecorder", json={"ranks": [1], "max_entries": 2})
    assert r.status_code == 200
    (dump,) = r.json()["dumps"]
    assert [(e["pg_id"], e["collective_seq_id"]) for e in dump["entries"]] == [
        (0, 2), (0, 3), (1, 1)
    ]  # fmt: skip
    r = running.http.post("/v1/flightrecorder", json={"ranks": [1], "max_entries": -1})
    assert r.status_code == 400 and r.json()["parameter"] == "max_entries"


def test_flight_recorder_raw_files_only_when_asked(running: Running) -> None:
    r = running.http.post("/v1/flightrecorder", json={"ranks": [0, 1], "max_entries": 1})
    assert [d["raw_b64"] for d in r.json()["dumps"]] == [None, None]
    assert b"dump 0" not in r.content
    r = running.http.post("/v1/flightrecorder", json={"ranks": [1], "max_entries": 1, "raw": True})
    assert r.status_code == 200
    (dump,) = r.json()["dumps"]
    assert base64.b64decode(dump["raw_b64"]) == b"dump 1"  # the file, untouched by max_entries
    assert len(dump["entries"]) == 2 and dump["raw_omitted"] == ""


def test_metrics(running: Running) -> None:
    text = running.http.get("/metrics").text
    (idle,) = [x for x in text.splitlines() if x.startswith("collscope_rank_inflight_idle_")]
    for label in ('comm="0x1f3a0000beef"', 'op="AllReduce"', 'rank="1"', "namespace=", "pod="):
        assert label in idle
    assert 'collscope_rank_completed_ops_total{namespace="' in text  # test_metrics.py: the rest
    assert 'collscope_agent_rings{health="live"} 2.0' in text
    assert 'collscope_agent_records_ingested_total{kind="op"} 3.0' in text
    assert "collscope_agent_ring_errors_total 0.0" in text
    assert "collscope_agent_sample_duration_seconds" in text


def test_livez_follows_the_sampling_loop(running: Running) -> None:
    assert running.http.get("/livez").status_code == 200
    assert running.http.get("/readyz").status_code == 200
    running.agent.sampler.stop()
    running.offset[0] = 60 * 10**9  # a minute without a tick
    r = running.http.get("/livez")
    assert r.status_code == 503 and "last sampling tick" in r.json()["reason"]


def test_missing_capabilities_are_503(tmp_path: pathlib.Path) -> None:
    a = agent.Agent(config(tmp_path))
    a.start()
    host, port = a.server.address
    try:
        with httpx.Client(base_url=f"http://{host}:{port}") as c:
            assert c.get("/v1/hardware").status_code == 503
            assert c.post("/v1/stacks", json={"pids": [1]}).status_code == 503
            assert c.get("/v1/ranks").json()["ranks"] == []
    finally:
        a.stop()


def test_flight_recorder_adapter_reads_the_environment(tmp_path: pathlib.Path) -> None:
    proc = tmp_path / "proc"
    (proc / "10").mkdir(parents=True)
    (proc / "10" / "environ").write_bytes(b"PATH=/bin\0RANK=0\0")
    (proc / "11" / "root" / "tmp").mkdir(parents=True)
    (proc / "11" / "environ").write_bytes(b"TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/fr_\0")
    report = agent.fr_dumper(proc)([(0, 10), (1, 11), (2, 12)], 0.2)
    assert isinstance(report, flightrecorder.FlightRecorderReport)
    reasons = {e.rank: e.reason for e in report.errors}
    assert "is not set" in reasons[0] and "no debug pipe" in reasons[1] and "pid 12" in reasons[2]
