"""The replay's ticks after the last record before a gap (``engine.AnalysisSettings``'s
``idle_replay_s`` / ``idle_replay_periods``): as long as ``idle()`` says, asked as the replay
goes, so that it can grow with the step measured so far."""

from __future__ import annotations

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import diagnosis, engine

from .conftest import COMM, DURATION_NS, NBYTES, RANKS, T0, Ring, job

S = 1_000_000_000


def _gapped(ring: Ring) -> tables.Bundle:
    # The healthy ring (3 s of records), then one record 80 days later.
    b = tables.BundleBuilder(ring.build("healthy").job)
    for rec in ring.build("healthy").iter_records():
        b.add_record(rec)
    b.add_hw(rank=0, ts=ring.end + 80 * 86_400 * S, node="n0", device="gpu0", metric="p", value=1)
    return b.build()


def test_ticks_after_the_last_record_follow_idle_as_it_grows(ring: Ring) -> None:
    bundle = _gapped(ring)
    span = bundle.time_span()
    assert span is not None
    first, last = span
    calls: list[int] = []

    def idle_of(seconds: int) -> list[int]:
        def idle() -> int:
            calls.append(seconds)
            return seconds * S

        return list(engine._ticks(bundle, first, last, S, idle))

    short, long = idle_of(300), idle_of(3000)
    assert calls  # asked while replaying, not once up front
    # Ticks before the gap's jump: the records' ~4 s plus idle, then the jump and ``last``.
    assert 300 <= len(short) <= 300 + 10 and 3000 <= len(long) <= 3000 + 10
    assert short[-1] == long[-1] == last


def _ticks_replayed(d: diagnosis.Diagnosis) -> int:
    return int(d.evidence[0].split(" ticks of ")[0].rsplit(" ", 1)[1])


def test_a_job_of_100_s_steps_is_replayed_8_steps_past_its_last_record() -> None:
    # 10 AllReduces 100 s apart (the measured step: baseline.period_ns), then 3,000 s of
    # nothing and one hardware sample. The replay ticks 1.2 s (the floor at 100 ms sampling)
    # + 8 steps after the last completion, not the 300 s minimum: a hang of such a job gets as
    # long as its threshold (up to floor + hang_k x step) to be judged.
    b = tables.BundleBuilder(job())
    for r in range(RANKS):
        b.add_comm(rank=r, ts=T0 - S, comm=COMM, comm_rank=r, nranks=RANKS, nnodes=2)
    step = 100 * S
    for seq in range(10):
        for r in range(RANKS):
            start = T0 + seq * step + r * 100_000
            b.add_op(
                rank=r, ts=start + DURATION_NS, comm=COMM, seq=seq, op="AllReduce",
                nbytes=NBYTES, start=start, end=start + DURATION_NS, algo="Ring",
                proto="Simple", channels=1,
            )  # fmt: skip
    b.add_hw(rank=0, ts=T0 + 9 * step + 3000 * S, node="n0", device="gpu0", metric="p", value=1)
    bundle = b.build()
    d = engine.diagnose(bundle)
    assert not d.anomaly
    before_gap = 9 * 100  # ticks up to the last completion
    assert before_gap + 8 * 100 <= _ticks_replayed(d) <= before_gap + 8 * 100 + 5
    fixed = engine.diagnose(bundle, engine.AnalysisSettings(idle_replay_periods=0.0))
    assert before_gap + 300 <= _ticks_replayed(fixed) <= before_gap + 300 + 5
