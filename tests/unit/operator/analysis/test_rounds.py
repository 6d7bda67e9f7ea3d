"""Completed operations grouped into rounds (trace ids), with Tmax/Tmin and own compute time."""

from __future__ import annotations

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import rounds

MS = 1_000_000

# (rank, comm, seq, start ms, end ms)
OPS = [
    (0, "0xa", 0, 0, 10),
    (1, "0xa", 0, 4, 10),
    (0, "0xb", 0, 12, 22),  # rank 0 is busy in another communicator between the rounds
    (0, "0xa", 1, 30, 40),
    (1, "0xa", 1, 32, 40),
    (1, "0xa", 2, 50, 60),  # rank 0 has not finished seq 2
]


def _ops() -> tables.Table:
    b = tables.BundleBuilder(models.Job(world_size=2))
    for rank, comm, seq, start, end in OPS:
        b.add_op(
            rank=rank,
            ts=end * MS,
            comm=comm,
            seq=seq,
            op="AllReduce",
            nbytes=64,
            start=start * MS,
            end=end * MS,
        )
    return b.build().ops


def _round(r: rounds.Rounds, comm: int, seq: int) -> int:
    for i in range(len(r)):
        if r.r_comm[i] == comm and r.r_seq[i] == seq:
            return i
    raise AssertionError((comm, seq))


def test_rounds_by_trace_id() -> None:
    r = rounds.build(_ops())
    assert len(r) == 4  # (a, 0), (a, 1), (a, 2), (b, 0)
    a0 = _round(r, 0, 0)
    assert r.r_n[a0] == 2
    assert (r.r_tmax[a0], r.r_tmin[a0]) == (10 * MS, 6 * MS)
    assert (r.r_start_min[a0], r.r_start_max[a0], r.r_end_max[a0]) == (0, 4 * MS, 10 * MS)
    assert r.r_n[_round(r, 0, 2)] == 1
    assert r.r_bytes[a0] == 64
    # rows sorted by (comm, seq, rank) and mapped to their round
    lo = int(r.r_lo[a0])
    assert r.rank[lo : lo + 2].tolist() == [0, 1]
    assert (r.rid[lo : lo + 2] == a0).all()
    assert (r.duration == r.end - r.start).all()


def test_own_time_excludes_operations_in_between() -> None:
    r = rounds.build(_ops())
    own = {
        (int(k), int(c), int(s)): int(o)
        for k, c, s, o in zip(r.rank, r.comm, r.seq, r.own, strict=True)
    }
    assert own[(0, 0, 0)] == -1 and own[(1, 0, 0)] == -1  # no previous round: unknown
    assert own[(0, 0, 1)] == (30 - 10 - 10) * MS  # 20 ms gap, 10 of them inside comm b
    assert own[(1, 0, 1)] == (32 - 10) * MS
    assert own[(1, 0, 2)] == (50 - 40) * MS


def test_empty() -> None:
    r = rounds.build(_ops()[:0])
    assert len(r) == 0 and len(r.rank) == 0
