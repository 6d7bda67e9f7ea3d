"""The TCP fabric (``onebox.fabric``): real sockets on 127.0.0.1, no plugin, no processes.

The one-box run through it (rank processes, agents, the operator) is
``tests/e2e/test_onebox_fabric.py``.
"""

from __future__ import annotations

import pathlib
import socket
import struct
import time
from collections.abc import Callable, Iterator

import pytest

from collscope.operator import errors
from collscope.operator.onebox import fabric, faults, rank

WORLD, NCH = 3, 2
# How long a peer's write may take to show up here: one sync interval (5 ms) plus a round trip
# and thread scheduling on a busy 2-core CI machine; the checks poll, so this is only a bound.
SEEN_S = 5.0


def _until(cond: Callable[[], bool], timeout_s: float = SEEN_S) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "not seen in time"
        time.sleep(0.005)


@pytest.fixture
def server() -> Iterator[fabric.Server]:
    with fabric.Server(("127.0.0.1", 0), WORLD, NCH) as s:
        yield s


def _client(s: fabric.Server, me: int | None) -> fabric.Client:
    return fabric.Client(s.address, WORLD, NCH, me, connect_timeout_s=5.0)


def test_parse_address() -> None:
    assert fabric.parse_address("tcp://job-0.job:7071") == ("job-0.job", 7071)
    assert fabric.parse_address("10.0.0.3:9") == ("10.0.0.3", 9)
    assert fabric.parse_address("job-0.job") == ("job-0.job", fabric.PORT)
    for bad in ("", ":7070", "host:x", "host:0", "host:70000"):
        with pytest.raises(ValueError, match="want host:port"):
            fabric.parse_address(bad)


def test_layout_has_one_block_per_rank() -> None:
    lay = fabric.Layout(world=2, nchannels=2)
    assert lay.block == 2 + 2 * rank.COUNTERS
    assert lay.size == 2 + 2 * lay.block
    indices = [lay.op(r, w) for r in range(2) for w in (rank.CUR_SEQ, rank.CUR_SIG)]
    indices += [
        lay.counter(r, c, w) for r in range(2) for c in range(2) for w in range(rank.COUNTERS)
    ]
    assert sorted(indices) == list(range(2, lay.size))  # every slot once, after stop and onset


def test_a_write_reaches_the_peers(server: fabric.Server) -> None:
    a, b, ctl = _client(server, 0), _client(server, 1), _client(server, None)
    try:
        a.set_op(0, rank.CUR_SIG, 4096)
        a.set_op(0, rank.CUR_SEQ, 7)
        a.set_counter(0, 1, rank.DELIVERED, 12)
        _until(lambda: b.counter(0, 1, rank.DELIVERED) == 12)
        assert (b.op(0, rank.CUR_SEQ), b.op(0, rank.CUR_SIG)) == (7, 4096)
        assert ctl.counter(0, 1, rank.DELIVERED) == 12  # a controller pulls on every read
        # Our own slots are never overwritten by the server's older copy.
        b.set_counter(1, 0, rank.POSTED, 3)
        time.sleep(0.05)
        assert b.counter(1, 0, rank.POSTED) == 3
        _until(lambda: a.counter(1, 0, rank.POSTED) == 3)
        assert a.syncs > 1 and b.syncs > 1
    finally:
        for c in (a, b, ctl):
            c.close()


def test_one_writer_per_slot(server: fabric.Server) -> None:
    a = _client(server, 0)
    try:
        with pytest.raises(ValueError, match="rank 0 cannot write rank 1"):
            a.set_counter(1, 0, rank.POSTED, 1)
    finally:
        a.close()
    with pytest.raises(ValueError, match="outside a world of 3"):
        fabric.Client(server.address, WORLD, NCH, 3)


def test_arm_and_stop_reach_every_rank(server: fabric.Server) -> None:
    ranks = [_client(server, r) for r in range(WORLD)]
    ctl = _client(server, None)
    try:
        assert not any(c.stopped for c in ranks) and ranks[0].onset_ns == 0
        ctl.arm(123_456_789)
        _until(lambda: all(c.onset_ns == 123_456_789 for c in ranks))
        ctl.stop()
        _until(lambda: all(c.stopped for c in ranks))
        assert ctl.stopped and ctl.onset_ns == 123_456_789
    finally:
        for c in [*ranks, ctl]:
            c.close()


def test_server_arms_and_stops_once_every_rank_joined() -> None:
    """A workload on a cluster: nobody reaches into the pods, the coordinator drives the fault."""
    now = [1_000]
    s = fabric.Server(
        ("127.0.0.1", 0), 2, NCH, onset_after_s=20.0, duration_s=60.0, clock=lambda: now[0]
    )
    try:
        block = [0] * s.layout.block
        assert s.apply(fabric.SYNC, 0, block)[:2] == [0, 0]  # one rank of two: not armed
        now[0] = 5_000
        assert s.apply(fabric.SYNC, 1, block)[:2] == [0, 5_000 + 20 * 10**9]
        now[0] += 59 * 10**9
        assert s.apply(fabric.PULL, -1, [])[0] == 0
        now[0] += 10**9
        assert s.apply(fabric.PULL, -1, [])[0] == 1  # duration_s after the last join
    finally:
        s.close()


@pytest.mark.parametrize(
    ("kind", "r", "values", "match"),
    [
        (fabric.SYNC, 3, [0] * (2 + NCH * rank.COUNTERS), "SYNC of rank 3"),
        (fabric.SYNC, 0, [0], "SYNC of rank 0 with 1 values"),
        (fabric.ARM, -1, [], "ARM with 0 values"),
        (99, 0, [], "unknown request kind 99"),
    ],
)
def test_malformed_requests_are_refused(
    server: fabric.Server, kind: int, r: int, values: list[int], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        server.apply(kind, r, values)


def test_garbage_closes_that_connection_only(server: fabric.Server) -> None:
    good = _client(server, 0)
    try:
        with socket.create_connection(server.address, timeout=5) as raw:
            raw.sendall(struct.pack("<IHHiI", 0xDEADBEEF, 1, fabric.PULL, 0, 0))
            assert raw.recv(16) == b""  # closed without a reply
        with socket.create_connection(server.address, timeout=5) as raw:
            raw.sendall(fabric.HEADER.pack(fabric.MAGIC, fabric.VERSION, fabric.PULL, 0, 1 << 30))
            assert raw.recv(16) == b""  # a header asking for 8 GiB is garbage
        syncs = good.syncs
        _until(lambda: good.syncs > syncs + 2)  # the other connection goes on
    finally:
        good.close()


def test_a_client_of_another_world_is_told_so(server: fabric.Server) -> None:
    with pytest.raises(errors.FabricError, match=r"reply for a world of 3 .* world is 4"):
        fabric.Client(server.address, 4, NCH, 0)


def test_no_coordinator_after_the_connect_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        t0 = time.monotonic()
        with pytest.raises(errors.FabricError, match=f"127.0.0.1:{port}: cannot connect"):
            fabric.Client(("127.0.0.1", port), WORLD, NCH, 0, connect_timeout_s=0.5)
        assert time.monotonic() - t0 < 5


def test_a_lost_coordinator_stops_the_rank_and_fails_it() -> None:
    s = fabric.Server(("127.0.0.1", 0), WORLD, NCH).start()
    c = _client(s, 1)
    s.close()  # the coordinator's pod went away
    _until(lambda: c.stopped)  # the rank's loops return ...
    with pytest.raises(errors.FabricError, match=r"fabric 127\.0\.0\.1"):
        c.close()  # ... and its process exits non-zero


def test_a_coordinator_gone_after_stop_is_no_failure() -> None:
    s = fabric.Server(("127.0.0.1", 0), WORLD, NCH).start()
    c = _client(s, 1)
    ctl = _client(s, None)
    ctl.stop()
    ctl.close()
    _until(lambda: c.stopped)
    s.close()
    time.sleep(0.05)
    c.close()  # the job was over: no error


def _states(tmp_path: pathlib.Path) -> Iterator[tuple[str, rank.State, rank.State]]:
    spec = rank.RankSpec(
        rank=0, local_rank=0, world=WORLD, nnodes=1, node="n", pod="p", namespace="ns",
        trace_dir=str(tmp_path), plugin="x.so", timing=rank.Timing(nchannels=NCH),
        injection=faults.Injection("nic-down", (1,), 0.0, "n"), seed=0,
    )  # fmt: skip
    path = tmp_path / "shared.bin"
    yield "mmap", rank.open_state(str(path), spec), rank.Shared(path, WORLD, NCH)
    with fabric.Server(("127.0.0.1", 0), WORLD, NCH) as s:
        host, port = s.address
        mine = rank.open_state(f"tcp://{host}:{port}", spec)
        peer = fabric.Client(s.address, WORLD, NCH, None)
        yield "tcp", mine, peer
        mine.close()
        peer.close()


def test_both_states_behave_alike(tmp_path: pathlib.Path) -> None:
    """What ``Rank`` relies on, against ``Shared`` and against the fabric (``open_state``)."""
    kinds = []
    for kind, mine, peer in _states(tmp_path):
        kinds.append(kind)
        assert isinstance(mine, fabric.Client if kind == "tcp" else rank.Shared)
        mine.set_op(0, rank.CUR_SIG, 8)
        mine.set_op(0, rank.CUR_SEQ, 2)
        mine.set_counter(0, NCH - 1, rank.POSTED, 5)
        _until(lambda p=peer: p.counter(0, NCH - 1, rank.POSTED) == 5)  # type: ignore[misc]
        assert (peer.op(0, rank.CUR_SEQ), peer.op(0, rank.CUR_SIG)) == (2, 8)
        assert peer.counter(0, 0, rank.POSTED) == 0
        peer.arm(42)
        _until(lambda m=mine: m.onset_ns == 42)  # type: ignore[misc]
        peer.stop()
        _until(lambda m=mine: m.stopped)  # type: ignore[misc]
    assert kinds == ["mmap", "tcp"]
