"""Flight Recorder dumps through real FIFOs, with a fake trainer thread doing what PyTorch's
DumpPipe does: mkfifo ``<stem><rank>.pipe``, poll it non-blocking, and on any byte write a
pickled trace to ``<prefix><rank>`` in place (here in two writes, so a half-written file is
seen)."""

from __future__ import annotations

import base64
import copy
import io
import os
import pathlib
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from collscope.nodeagent import agent, errors, flightrecorder, frdump

T0 = 1_732_001_234_000_000_000


class IntList(list[int]):
    """Stands for torch's List[int], which its pickler writes as build_intlist(list)."""


class _TorchStylePickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is IntList:
            return (list, (list(obj),))
        return NotImplemented


def torch_style_pickle(obj: Any) -> bytes:
    """Protocol 2 with typed int lists as torch's jit pickler marks them (the GLOBAL opcode
    ``c<module>\\n<name>\\n`` is text, so the placeholder is swapped for torch's name)."""
    buf = io.BytesIO()
    _TorchStylePickler(buf, protocol=2, fix_imports=False).dump(obj)
    data = buf.getvalue()
    assert b"cbuiltins\nlist\n" in data
    return data.replace(b"cbuiltins\nlist\n", b"ctorch.jit._pickle\nbuild_intlist\n")


def trace(rank: int, *, version: str = "2.5") -> dict[str, Any]:
    def entry(seq: int, state: str) -> dict[str, Any]:
        return {
            "record_id": seq - 1,
            "pg_id": 0,
            "process_group": ("0", "default_pg"),
            "collective_seq_id": seq,
            "p2p_seq_id": 0,
            "op_id": seq,
            "profiling_name": "nccl:all_reduce",
            "time_created_ns": T0 + seq * 1000,
            "input_sizes": [IntList([1024, 8])],
            "input_dtypes": ["Float"],
            "output_sizes": [IntList([1024, 8])],
            "output_dtypes": ["Float"],
            "state": state,
            "time_discovered_started_ns": T0 + seq * 1000 + 10 if state != "scheduled" else None,
            "time_discovered_completed_ns": T0 + seq * 1000 + 90 if state == "completed" else None,
            "retired": state == "completed",
            "timeout_ms": 600000,
            "is_p2p": False,
            "duration": 0.08 if state == "completed" else None,
            "frames": [{"name": "all_reduce", "filename": "c10d.py", "line": 2500}],
        }

    return {
        "version": version,
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": 7,
                "last_started_collective": 7,
                "last_completed_collective": 6 + rank,
            }
        },
        "entries": [entry(6, "completed"), entry(7, "completed" if rank else "started")],
    }


class Trainer(threading.Thread):
    """One rank's DumpPipe and DebugInfoWriter."""

    def __init__(self, stem: str, prefix: str, rank: int, payload: bytes, *, dumps: bool = True):
        super().__init__(daemon=True)
        self.pipe = f"{stem}{rank}.pipe"
        self.dump = f"{prefix}{rank}"
        self.payload = payload
        self.dumps = dumps
        self.pokes = 0
        self.stop = threading.Event()
        if os.path.exists(self.pipe):
            os.unlink(self.pipe)
        os.mkfifo(self.pipe, 0o666)
        self.fd = os.open(self.pipe, os.O_RDONLY | os.O_NONBLOCK)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    data = os.read(self.fd, 64)
                except BlockingIOError:
                    data = b""
                if data:
                    self.pokes += 1
                    if self.dumps:
                        self.write()
                time.sleep(0.005)  # torch's monitor thread polls; so does this
        finally:
            os.close(self.fd)

    def write(self) -> None:
        half = len(self.payload) // 2
        with open(self.dump, "wb") as f:  # in place, like DebugInfoWriter
            f.write(self.payload[:half])
            f.flush()
            time.sleep(0.1)  # the agent sees a truncated pickle meanwhile
            f.write(self.payload[half:])


@pytest.fixture
def paths(tmp_path: pathlib.Path) -> tuple[str, str]:
    return str(tmp_path / "fr_pipe_"), str(tmp_path / "nccl_trace_rank_")


@pytest.fixture
def trainers(paths: tuple[str, str]) -> Iterator[list[Trainer]]:
    stem, prefix = paths
    ts = [Trainer(stem, prefix, r, torch_style_pickle(trace(r))) for r in range(2)]
    for t in ts:
        t.start()
    yield ts
    for t in ts:
        t.stop.set()
        t.join(timeout=5)


def targets(paths: tuple[str, str], ranks: range) -> list[flightrecorder.Target]:
    stem, prefix = paths
    env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix}
    out = [flightrecorder.target(r, env) for r in ranks]
    assert all(t is not None for t in out)
    return [t for t in out if t is not None]


def test_trigger_collects_and_converts_every_rank(
    trainers: list[Trainer], paths: tuple[str, str]
) -> None:
    report = flightrecorder.trigger(targets(paths, range(2)), timeout_s=5)
    assert report.errors == []
    assert [d.rank for d in report.dumps] == [0, 1]
    assert [t.pokes for t in trainers] == [1, 1]
    d0 = report.dumps[0]
    assert d0.version == "2.5"
    assert d0.file == f"{paths[1]}0"
    assert d0.pg_config == [frdump.PgInfo(id="0", name="0", desc="default_pg", ranks=[0, 1])]
    assert d0.pg_status[0].last_completed_collective == 6
    assert report.dumps[1].pg_status[0].last_completed_collective == 7
    done, stuck = d0.entries
    assert (stuck.collective_seq_id, stuck.state, stuck.profiling_name) == (
        7,
        "started",
        "nccl:all_reduce",
    )
    assert stuck.time_discovered_completed_ns is None
    assert stuck.time_discovered_started_ns == T0 + 7010
    assert stuck.input_sizes == [[1024, 8]]
    assert stuck.input_dtypes == ["Float"]
    assert (stuck.pg_name, stuck.pg_desc, stuck.timeout_ms) == ("0", "default_pg", 600000)
    assert done.duration_ms == pytest.approx(0.08)
    assert done.retired is True and done.is_p2p is False
    # JSON-ready: what the agent serves the operator.
    assert '"collective_seq_id":7' in report.model_dump_json()


def test_trigger_keeps_each_file_unchanged_for_export(
    trainers: list[Trainer], paths: tuple[str, str]
) -> None:
    report = flightrecorder.trigger(targets(paths, range(2)), timeout_s=5)
    assert [d.raw for d in report.dumps] == [t.payload for t in trainers]
    assert "raw" not in report.dumps[0].model_dump()  # never on the wire as bytes
    out = flightrecorder.exported(report)
    assert [base64.b64decode(d.raw_b64 or "") for d in out.dumps] == [t.payload for t in trainers]
    assert [d.raw for d in out.dumps] == [None, None] and out.dumps[0].raw_omitted == ""


def test_raw_dumps_past_the_cap_are_left_out_with_the_reason(
    trainers: list[Trainer], paths: tuple[str, str]
) -> None:
    sizes = [len(t.payload) for t in trainers]
    cap = max(sizes) + min(sizes) // 2  # exactly one fits, whichever comes first
    out = flightrecorder.exported(
        flightrecorder.trigger(targets(paths, range(2)), timeout_s=5, raw_max_bytes=cap)
    )
    assert [d.raw_b64 is not None for d in out.dumps].count(True) == 1
    (left_out,) = [d for d in out.dumps if d.raw_b64 is None]
    size = sizes[left_out.rank]
    assert f"{size} bytes, over what is left of the " in left_out.raw_omitted
    assert left_out.entries  # the parsed dump is still there
    unkept = flightrecorder.FlightRecorderReport(dumps=[frdump.RankDump(rank=0, file="f")])
    (d,) = flightrecorder.exported(unkept).dumps
    assert d.raw_b64 is None and d.raw_omitted == "the agent kept no copy of this dump"


def test_a_stale_dump_is_not_taken_for_the_new_one(paths: tuple[str, str]) -> None:
    stem, prefix = paths
    pathlib.Path(f"{prefix}0").write_bytes(torch_style_pickle(trace(0, version="old")))
    trainer = Trainer(stem, prefix, 0, torch_style_pickle(trace(0, version="new")))
    trainer.start()
    try:
        (dump,) = flightrecorder.trigger(targets(paths, range(1)), timeout_s=5).dumps
        assert dump.version == "new"
    finally:
        trainer.stop.set()
        trainer.join(timeout=5)


def test_rank_that_never_dumps_times_out_with_its_reason(paths: tuple[str, str]) -> None:
    stem, prefix = paths
    pathlib.Path(f"{prefix}0").write_bytes(torch_style_pickle(trace(0)))  # stale: must not count
    trainer = Trainer(stem, prefix, 0, b"", dumps=False)
    trainer.start()
    try:
        t0 = time.monotonic()
        report = flightrecorder.trigger(targets(paths, range(1)), timeout_s=0.3)
        assert time.monotonic() - t0 < 2
    finally:
        trainer.stop.set()
        trainer.join(timeout=5)
    assert report.dumps == []
    assert report.errors == [
        flightrecorder.RankFailure(rank=0, reason=f"{prefix}0: no dump within 0.3 s")
    ]


def test_pipe_problems_are_per_rank(paths: tuple[str, str], trainers: list[Trainer]) -> None:
    stem, _ = paths
    os.mkfifo(f"{stem}2.pipe")  # configured, but nobody reads it (the process exited)
    pathlib.Path(f"{stem}3.pipe").write_text("")  # not a FIFO: never write into it
    report = flightrecorder.trigger(targets(paths, range(5)), timeout_s=5)
    assert [d.rank for d in report.dumps] == [0, 1]
    reasons = {e.rank: e.reason for e in report.errors}
    assert reasons[2].endswith("no reader (Flight Recorder off in this process, or it exited)")
    assert reasons[3].endswith("not a FIFO (regular file)")
    assert reasons[4] == f"{stem}4.pipe: no debug pipe"


def test_target_from_environment() -> None:
    assert flightrecorder.target(3, {}) is None
    assert flightrecorder.target(3, {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": ""}) is None
    root = pathlib.Path("/proc/42/root")
    t = flightrecorder.target(3, {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/tmp/p_"}, root=root)
    # torch 2.13's default without HOME: /tmp/.cache/torch/comm_lib_trace_rank_<rank>
    assert t == flightrecorder.Target(
        rank=3, root=root, pipe="/tmp/p_3.pipe", dump="/tmp/.cache/torch/comm_lib_trace_rank_3"
    )
    assert t.shown(t.dump) == "/proc/42/root/tmp/.cache/torch/comm_lib_trace_rank_3"
    pipe = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/tmp/p_"}
    t = flightrecorder.target(1, {**pipe, "HOME": "/home/u"})
    assert t is not None and t.dump == "/home/u/.cache/torch/comm_lib_trace_rank_1"
    t = flightrecorder.target(1, {**pipe, "HOME": "/home/u", "XDG_CACHE_HOME": "/c/"})
    assert t is not None and t.dump == "/c/torch/comm_lib_trace_rank_1"
    env = {
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/x/p_",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/old_",
        "TORCH_FR_DUMP_TEMP_FILE": "/x/new_",
    }
    t = flightrecorder.target(0, env)
    assert t is not None and t.dump == "/x/new_0"


class _Evil:
    def __init__(self, canary: pathlib.Path) -> None:
        self.canary = canary

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.canary}",))


def test_unpickling_refuses_anything_but_plain_data(tmp_path: pathlib.Path) -> None:
    canary = tmp_path / "pwned"
    evil = pickle.dumps({"version": "2.5", "entries": [_Evil(canary)]})
    with pytest.raises(errors.FlightRecorderDumpInvalid, match="refused global"):
        frdump.loads(evil, file="dump0")
    assert not canary.exists()
    with pytest.raises(errors.FlightRecorderDumpInvalid, match="unexpected set"):
        frdump.loads(pickle.dumps({"entries": {1, 2}}, protocol=4))
    with pytest.raises(errors.FlightRecorderDumpInvalid, match="not a plain pickle"):
        frdump.loads(torch_style_pickle(trace(0))[:-30])
    with pytest.raises(errors.FlightRecorderDumpInvalid, match="not a plain pickle"):
        frdump.loads(b"\x80\x02P0\n.")  # persistent id (how torch pickles tensor storage)


def test_deeply_nested_pickle_does_not_recurse() -> None:
    depth = 200_000
    data = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."  # EMPTY_LIST..., APPEND...
    obj = frdump.loads(data)
    with pytest.raises(errors.FlightRecorderDumpInvalid, match="not dict"):
        frdump.convert(obj, rank=0, file="f")


def test_read_limits_and_shape(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "d"
    f.write_bytes(torch_style_pickle(trace(0)))
    with pytest.raises(errors.FlightRecorderDumpInvalid, match="larger than 100 bytes"):
        frdump.read(str(f), rank=0, max_bytes=100)
    f.write_bytes(pickle.dumps({"entries": "nope"}))
    with pytest.raises(errors.FlightRecorderDumpInvalid, match="'entries' is not a list"):
        frdump.read(str(f), rank=0)
    with pytest.raises(errors.FlightRecorderDumpInvalid, match="No such file"):
        frdump.read(str(tmp_path / "missing"), rank=0)


def test_missing_and_odd_fields_become_empty() -> None:
    t = trace(0)
    odd = copy.deepcopy(t)
    odd["pg_config"]["0"]["ranks"] = [0, "x", 1]
    odd["entries"][0] = {"state": "scheduled", "collective_seq_id": "9", "is_p2p": 1}
    odd["entries"].append("not a dict")
    d = frdump.convert(frdump.loads(torch_style_pickle(odd)), rank=0, file="f")
    assert d.pg_config[0].ranks == [0, 1]
    assert len(d.entries) == 2
    e = d.entries[0]
    assert (e.collective_seq_id, e.is_p2p, e.time_created_ns, e.input_sizes) == (9, None, None, [])


TRAINER_PROCESS = """
import os, pickle, time
stem = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"]
prefix = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
rank = os.environ["RANK"]
pipe = f"{stem}{rank}.pipe"
os.mkfifo(pipe, 0o666)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
print("ready", flush=True)
while True:
    try:
        data = os.read(fd, 64)
    except BlockingIOError:
        data = b""
    if data:
        trace = {"version": "2.5", "pg_config": {}, "pg_status": {},
                 "entries": [{"collective_seq_id": 41, "state": "scheduled"}]}
        with open(f"{prefix}{rank}", "wb") as f:
            pickle.dump(trace, f, protocol=2)
    time.sleep(0.005)
"""


def test_trigger_a_real_process_through_proc_root(paths: tuple[str, str]) -> None:
    """The agent's path (``agent.fr_dumper``): settings from /proc/<pid>/environ, files
    through /proc/<pid>/root."""
    stem, prefix = paths
    env = {
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
        "RANK": "3",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER_PROCESS], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        report = agent.fr_dumper()([(3, proc.pid)], 5.0)
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    assert report.errors == []
    (dump,) = report.dumps
    assert (dump.rank, dump.entries[0].collective_seq_id) == (3, 41)


# Small limits keep the tests fast: a normal test dump parses in ~50 ms.
FAST = frdump.ParseLimits(timeout_s=0.5)


def laughs(levels: int = 40, width: int = 10) -> list[Any]:
    """A "billion laughs": width**levels list items from ~1 KB of pickle (shared references)."""
    a: list[Any] = []
    for _ in range(levels):
        a = [a] * width
    return a


def cubic_bomb(n: int = 2000) -> bytes:
    """12 KB that converts in n**3 steps: n entries sharing one n x n size matrix."""
    matrix = [list(range(n))] * n
    return pickle.dumps({"entries": [{"input_sizes": matrix}] * n}, protocol=2)


def test_shared_references_cost_nothing_to_check() -> None:
    data = pickle.dumps({"version": "2.5", "entries": [{"frames": laughs(), "op_id": 3}]})
    start = time.monotonic()
    d = frdump.Parser(FAST).parse(data, rank=4, file="f")
    assert (d.rank, d.entries[0].op_id) == (4, 3)
    assert time.monotonic() - start < FAST.timeout_s


def test_a_pickle_bomb_ends_at_the_deadline() -> None:
    data = cubic_bomb()
    assert len(data) < 16 << 10
    start = time.monotonic()
    with pytest.raises(errors.FlightRecorderDumpInvalid, match=r"longer than 0.5 s \(killed\)"):
        frdump.Parser(FAST).parse(data, rank=0, file="bomb")
    assert time.monotonic() - start < 2


def test_a_memory_bomb_ends_at_the_memory_limit() -> None:
    row = list(range(4000))
    data = pickle.dumps({"entries": [{"input_sizes": [row] * 4000}]}, protocol=2)
    limits = frdump.ParseLimits(memory_bytes=64 << 20, timeout_s=10)
    with pytest.raises(errors.FlightRecorderDumpInvalid, match="memory limit"):
        frdump.Parser(limits).parse(data, rank=0, file="bomb")


def test_the_child_refuses_code_as_in_process(tmp_path: pathlib.Path) -> None:
    canary = tmp_path / "pwned"
    evil = pickle.dumps({"version": "2.5", "entries": [_Evil(canary)]})
    with pytest.raises(errors.FlightRecorderDumpInvalid, match=r"refused global posix\.system"):
        frdump.Parser(FAST).parse(evil, rank=0, file="dump0")
    assert not canary.exists()
    huge = {"pg_config": {"0": {"ranks": "9" * 5000}}, "entries": [{"op_id": 10**30}]}
    d = frdump.Parser(FAST).parse(pickle.dumps(huge), rank=0, file="f")
    assert d.pg_config[0].ranks == [] and d.entries[0].op_id is None  # dropped, not a 500


def test_the_parser_caps_children_at_once() -> None:
    parser = frdump.Parser(frdump.ParseLimits(timeout_s=0.3, parallel=1))
    assert parser._slots.acquire(timeout=1)  # another request's parse holds the only slot
    try:
        with pytest.raises(errors.FlightRecorderDumpInvalid, match="parser busy"):
            parser.parse(torch_style_pickle(trace(0)), rank=0, file="f")
    finally:
        parser._slots.release()


def test_one_bad_dump_among_good_ones_is_that_ranks_error(paths: tuple[str, str]) -> None:
    stem, prefix = paths
    payloads = [torch_style_pickle(trace(0)), cubic_bomb(), torch_style_pickle(trace(3))]
    ts = [Trainer(stem, prefix, r, p) for r, p in zip((0, 1, 3), payloads, strict=True)]
    for t in ts:
        t.start()
    try:
        report = flightrecorder.trigger(
            targets(paths, range(4)), timeout_s=1.5, parser=frdump.Parser(FAST)
        )
    finally:
        for t in ts:
            t.stop.set()
            t.join(timeout=5)
    assert [d.rank for d in report.dumps] == [0, 3]
    reasons = {e.rank: e.reason for e in report.errors}
    assert "longer than" in reasons[1] and "no debug pipe" in reasons[2]


def test_tenant_files_are_not_followed_nor_waited_for(tmp_path: pathlib.Path) -> None:
    """The dump path is a symlink to a host file, a FIFO, a directory, or too large: each an
    error for its rank, promptly, and never the linked file's content."""
    root = tmp_path / "root"
    (root / "tmp").mkdir(parents=True)
    (tmp_path / "secret").write_bytes(torch_style_pickle(trace(0)))  # a dump-shaped host file
    (root / "tmp" / "d0").symlink_to(tmp_path / "secret")
    os.mkfifo(root / "tmp" / "d1")
    (root / "tmp" / "d2").mkdir()
    (root / "tmp" / "d3").write_bytes(b"x" * 2000)
    reasons = {}
    start = time.monotonic()
    for rank in range(4):
        with pytest.raises(errors.FlightRecorderDumpInvalid) as e:
            frdump.read(f"/tmp/d{rank}", rank=rank, root=root, max_bytes=1000)
        reasons[rank] = str(e.value)
    assert time.monotonic() - start < 2
    assert "symbolic link" in reasons[0] and "FIFO" in reasons[1]
    assert "directory" in reasons[2] and "larger than 1000 bytes" in reasons[3]


def test_a_symlinked_pipe_is_never_written(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    (root / "tmp").mkdir(parents=True)
    host_fifo = tmp_path / "initctl"  # stands for a host daemon's control FIFO
    os.mkfifo(host_fifo)
    reader = os.open(host_fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        (root / "tmp" / "p_0.pipe").symlink_to(host_fifo)
        t = flightrecorder.Target(rank=0, root=root, pipe="/tmp/p_0.pipe", dump="/tmp/d0")
        report = flightrecorder.trigger([t], timeout_s=0.2)
        assert "symbolic link" in report.errors[0].reason
        assert os.read(reader, 1) == b""  # no byte ever written to the host's FIFO
    finally:
        os.close(reader)


def test_guarded_refuses_pids_outside_training_pods() -> None:
    seen: list[list[tuple[int, int]]] = []

    def inner(
        ts: Sequence[tuple[int, int]], timeout_s: float
    ) -> flightrecorder.FlightRecorderReport:
        seen.append(list(ts))
        dumps = [frdump.RankDump(rank=r, file="f") for r, _ in ts]
        return flightrecorder.FlightRecorderReport(dumps=dumps)

    def refusal(pid: int) -> str | None:
        return None if pid == 10 else "refused: not in a training pod"

    report = flightrecorder.guarded(inner, refusal)([(0, 10), (1, 4242)], 1.0)
    assert seen == [[(0, 10)]] and [d.rank for d in report.dumps] == [0]
    assert report.errors == [
        flightrecorder.RankFailure(rank=1, reason="pid 4242: refused: not in a training pod")
    ]
    report = flightrecorder.guarded(inner, refusal)([(1, 4242)], 1.0)
    assert seen == [[(0, 10)]] and report.dumps == []
