"""Hostile tenants against the readers of rings and bundles (issue 15 item 3, and the FIFO part
of "Multi-tenancy"): each attack fails for the attacker's own file only, quickly, with an error
naming it, while the reader keeps serving the other tenants' rings.

The rings are written here in the plugin's layout (``layout`` dtypes, the same the reader
is checked against in tests/unit/native), with times near the real clock: the reader's default
clock bounds the times a ring may hold.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pytest

from collscope.nodeagent import errors, ring
from collscope.nodeagent.bundle import reader, writer
from collscope.nodeagent.ring import layout, staterows
from collscope.operator.simulator import config, engine

REPO = pathlib.Path(__file__).resolve().parents[2]
EVENT_SLOTS = 64


def write_ring(path: pathlib.Path, *, init_ns: int | None = None) -> np.ndarray[Any, Any]:
    """A valid ring with one active communicator and one op in flight; returns its comm slots
    (modify them and call ``write_ring`` again to rewrite)."""
    t0 = time.time_ns() - 10 * 10**9 if init_ns is None else init_ns
    header = np.zeros(1, layout.HEADER)
    comms = np.zeros(layout.COMM_SLOTS, layout.COMM_SLOT)
    events = np.zeros(EVENT_SLOTS, layout.EVENT)
    comm_off = layout.HEADER_BYTES
    ev_off = comm_off + comms.nbytes
    h = header[0]
    for name, value in {
        "magic": layout.MAGIC, "version": layout.VERSION,
        "header_size": layout.HEADER_BYTES, "file_size": ev_off + events.nbytes,
        "state": layout.RING_STATE_ACTIVE, "profiler_api": 5,
        "comm_region_offset": comm_off, "comm_region_size": comms.nbytes,
        "comm_slot_count": layout.COMM_SLOTS, "comm_slot_size": layout.COMM_SLOT.itemsize,
        "op_slots_per_comm": layout.OPS_PER_COMM,
        "flow_slots_per_comm": layout.FLOWS_PER_COMM,
        "event_region_offset": ev_off, "event_region_size": events.nbytes,
        "event_slot_count": EVENT_SLOTS, "event_record_size": layout.EVENT_BYTES,
        "op_slot_size": layout.OP_SLOT.itemsize,
        "flow_slot_size": layout.FLOW_SLOT.itemsize,
        "pid": 4242, "rank": 3, "local_rank": 3, "world_size": 8, "init_realtime_ns": t0,
    }.items():  # fmt: skip
        h[name] = value
    c = comms[0]
    for name, value in {
        "state": layout.COMM_ACTIVE, "comm_hash": 0x1F3A, "rank": 1, "nranks": 4,
        "nnodes": 2, "profiler_api": 5, "init_ns": t0, "generation": 1,
        "last_progress_ns": t0,
    }.items():  # fmt: skip
        c[name] = value
    o = c["ops"][0]
    for name, value in {
        "state": layout.OP_ACTIVE, "seq": 17, "bytes": 4 << 20, "start_ns": t0 + 10**6,
        "func": 1, "algo": 2, "proto": 3, "nchannels": 2, "dtype": 8, "peer": -1,
    }.items():  # fmt: skip
        o[name] = value
    path.write_bytes(header.tobytes() + comms.tobytes() + events.tobytes())
    return comms


# Runs in a subprocess: were the reader to map the file again, a read past its new end would
# be SIGBUS, which would kill the test runner instead of failing the test.
TRUNCATE = textwrap.dedent(
    """
    import os, sys, threading, time
    from collscope.nodeagent import errors, ring
    victim, other = sys.argv[1], sys.argv[2]
    whole = open(victim, "rb").read()
    stop = threading.Event()

    def tenant():  # truncates and restores its own ring as fast as it can
        while not stop.is_set():
            os.truncate(victim, 4096)
            with open(victim, "r+b") as f:
                f.write(whole)

    threading.Thread(target=tenant, daemon=True).start()
    bad = ok = 0
    reasons = set()
    with ring.open(other) as good:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                with ring.open(victim) as r:
                    for _ in range(20):
                        r.live_copies()
                        r.events_since(0)
                        r.snapshot()
            except errors.RingCorrupt as e:
                bad += 1
                assert e.file == victim, e
                reasons.add(e.region)
            good.snapshot()
            ok += 1
    stop.set()
    print(bad, ok, sorted(reasons))
    """
)


def test_a_ring_truncated_while_read_is_an_error_for_that_ring_only(
    tmp_path: pathlib.Path,
) -> None:
    victim, other = tmp_path / "victim.ring", tmp_path / "other.ring"
    write_ring(victim)
    write_ring(other)
    env = {**os.environ, "PYTHONPATH": str(REPO / "nodeagent")}
    res = subprocess.run(
        [sys.executable, "-c", TRUNCATE, str(victim), str(other)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr  # -7 would be SIGBUS
    bad, ok, _ = res.stdout.split(" ", 2)
    assert int(bad) > 0 and int(ok) > 0, res.stdout


def test_a_ring_truncated_between_the_header_check_and_the_copy(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "r.ring"
    write_ring(path)
    with ring.open(path) as r:
        os.truncate(path, layout.HEADER_BYTES + 100)  # inside the first comm slot
        with pytest.raises(errors.RingCorrupt, match=r"truncated while open|shrank") as info:
            r._comm_slots(0, layout.COMM_SLOTS)  # what a copy reads after the header
        assert info.value.file == str(path)
        with pytest.raises(errors.RingCorrupt):
            r.live_copies()


def test_a_fifo_as_a_ring_is_refused_without_blocking(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "r.ring"
    os.mkfifo(path)
    started = time.monotonic()
    with pytest.raises(errors.RingCorrupt, match="is not a regular file") as info:
        ring.open(path)
    assert info.value.file == str(path) and time.monotonic() - started < 5


def test_a_symlink_as_a_ring_is_not_followed(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "elsewhere.ring"
    write_ring(target)
    link = tmp_path / "r.ring"
    link.symlink_to(target)
    with pytest.raises(errors.RingCorrupt, match="symbolic link") as info:
        ring.open(link)
    assert info.value.file == str(link)


def test_a_comm_initialised_at_1_ns_is_refused_at_ingest(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "r.ring"
    comms = write_ring(path)
    header = path.read_bytes()[: layout.HEADER_BYTES]
    comms[0]["init_ns"] = 1
    with path.open("r+b") as f:
        f.write(header + comms.tobytes())
    with ring.open(path) as r:
        with pytest.raises(errors.RingCorrupt, match=r"init_ns.*outside the ring's plausible"):
            r.snapshot()
        _, copies, _ = r.live_copies()
        with pytest.raises(errors.RingCorrupt, match="init_ns"):
            staterows.comm_records(str(path), 3, copies)


def test_a_ring_whose_plugin_started_in_1970_is_refused(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "r.ring"
    write_ring(path, init_ns=1)
    with pytest.raises(errors.RingCorrupt, match="init_realtime_ns"):
        ring.open(path)


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # 8 ranks, 2 s: the smallest simulated bundle with every record type, in a second.
    cfg = config.SimConfig(ranks=8, tp=4, pp=1, dp=2, duration_s=2.0, onset_s=1.0, seed=1)
    sim = engine.simulate(cfg)
    out = tmp_path_factory.mktemp("b") / "bundle"
    writer.write(sim.bundle, out, compress=False)
    return out


@pytest.mark.parametrize("name", ["job.json", "records.jsonl"])
def test_a_fifo_as_a_bundle_file_is_refused_without_blocking(
    bundle_dir: pathlib.Path, tmp_path: pathlib.Path, name: str
) -> None:
    copy = tmp_path / "bundle"
    copy.mkdir()
    for f in bundle_dir.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    (copy / name).unlink()
    os.mkfifo(copy / name)
    started = time.monotonic()
    with pytest.raises(errors.BundleFormatError, match="is not a regular file") as info:
        reader.load(copy)
    assert info.value.file == str(copy / name) and time.monotonic() - started < 5


def test_a_bundle_with_a_comm_at_1_ns_is_one_line_from_the_cli(
    bundle_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    copy = tmp_path / "bundle"
    copy.mkdir()
    for f in bundle_dir.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    lines = (copy / "records.jsonl").read_text().splitlines()
    i = next(k for k, line in enumerate(lines) if '"type":"comm"' in line.replace(" ", ""))
    head, _, tail = lines[i].partition('"ts":')
    lines[i] = head + '"ts":1' + tail[tail.index(",") :]
    (copy / "records.jsonl").write_text("\n".join(lines) + "\n")
    res = subprocess.run(
        [sys.executable, "-m", "collscope.operator.cli", "analyze", str(copy)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "at 1 ns" in line and "outside the job's plausible span" in line
