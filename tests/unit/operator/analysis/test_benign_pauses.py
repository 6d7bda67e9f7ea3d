"""Benign pauses are not anomalies (issue 12): a checkpoint, an evaluation pass, one wide round.

A pause of every rank outside collectives is the job's schedule; Mycroft §4.3's throughput and
interval rules see it as a fall, so the slow path first asks whether any watched rank waited
*inside* a collective longer than its baseline (``trigger._waited``). Two mechanisms made that
question answer yes for a checkpoint, or spoil what comes after one:

- the ranks that do not write wait in ``dist.barrier()``, on NCCL a 4-byte AllReduce; CCL-D
  §4.2.1 says such a barrier is not a collective to judge, and time in it is the pause itself;
- Algorithm 1 line 9 learns the normal pace from ticks where nothing looked slow; a paused
  tick is not the job's pace, and learned it made a long pause the median normal.

The end-to-end tests run collscope's simulator with its benign events (``simulator.benign``)
and require no anomaly, and the same fault as without a pause when one follows it.
"""

from __future__ import annotations

import dataclasses

import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import diagnosis, engine, trigger
from collscope.operator.simulator import config, truth
from collscope.operator.simulator import engine as simulator

S = 1_000_000_000
MS = 1_000_000
SETTINGS = trigger.TriggerSettings(
    window_s=2.0,
    hang_floor_s=1.5,
    barrier_max_bytes=4,
    throughput_drop=0.5,
    interval_growth=2.0,
    repeat_ticks=3,
    normal_min_ticks=3,
)


def _checkpoint(
    pause_s: float,
    barrier_bytes: int | None,
    *,
    end_s: float = 0.0,
    wide: bool = False,
    at_s: int = 7,
) -> tables.Bundle:
    """Ranks 0, 1: a 1 MiB AllReduce every 100 ms (10 ms each) from 1 s to ``at_s``; then rank 0
    writes a checkpoint for ``pause_s`` while rank 1 waits in a ``barrier_bytes`` AllReduce
    on the world communicator (its samples show no progress; None: no barrier, both ranks
    outside NCCL); then training resumes. ``wide``: 0.5 s before the pause rank 0 waits 300 ms
    for rank 1 in one AllReduce (one wide round)."""
    b = tables.BundleBuilder(models.Job(world_size=2))
    for r in range(2):
        b.add_comm(rank=r, ts=0, comm="0xa", comm_rank=r, nranks=2)
        b.add_comm(rank=r, ts=0, comm="0xw", comm_rank=r, nranks=2)
    pause, resume = at_s * S, at_s * S + int(pause_s * S)
    seq = 0

    def train(t0: int, t1: int) -> None:
        nonlocal seq
        for t in range(t0, t1, 100 * MS):
            for r in range(2):
                late = wide and r == 0 and t == pause - 500 * MS
                b.add_op(rank=r, ts=t + 10 * MS, comm="0xa", seq=seq, op="AllReduce",
                         nbytes=1 << 20, start=t - (300 * MS if late else 0),
                         end=t + 10 * MS)  # fmt: skip
            seq += 1

    train(S, pause)
    if barrier_bytes is None:
        train(resume, resume + int(max(end_s, 6.0) * S))
        return b.build()
    for ts in range(pause + 100 * MS, resume, 100 * MS):
        flow = (0, 0, tables.SEND, 1, 0, 0, -1, 0, -1, ts - pause)
        b.add_state(rank=1, ts=ts, comm="0xw", seq=0, op="AllReduce", nbytes=barrier_bytes,
                    start=pause, flows=[flow])  # fmt: skip
    for r in range(2):
        b.add_op(rank=r, ts=resume + MS, comm="0xw", seq=0, op="AllReduce", nbytes=barrier_bytes,
                 start=resume if r == 0 else pause, end=resume + MS)  # fmt: skip
    train(resume + 100 * MS, resume + int(max(end_s, 6.0) * S))
    return b.build()


def _replay(
    bundle: tables.Bundle, settings: trigger.TriggerSettings = SETTINGS
) -> tuple[trigger.TriggerState, list[trigger.TriggerResult]]:
    span = bundle.time_span()
    assert span is not None
    state = trigger.TriggerState((0, 1), settings, interval_ns=100 * MS)
    hits = [h for t in range(span[0] + S, span[1], S) if (h := state.update(bundle, t))]
    return state, hits


@pytest.mark.parametrize(("nbytes", "alarm"), [(4, False), (8, True)])
def test_waiting_in_a_barrier_is_the_pause_not_a_slow_collective(nbytes: int, alarm: bool) -> None:
    # Throughput falls to zero for 5 s. Rank 1 sits in a 4-byte AllReduce the whole time:
    # a barrier (CCL-D §4.2.1), waiting for rank 0, who is outside communication, so
    # nobody waited inside a collective. Without the barrier rule in ``_waited`` the barrier
    # (no baseline: it runs once) counted as a wait and the pause fired as a slowdown.
    # Eight bytes is data, not a barrier: a 5 s wait in it is an anomaly.
    _, hits = _replay(_checkpoint(5.0, nbytes))
    assert bool(hits) is alarm


def test_a_span_without_collectives_longer_than_a_step_is_a_pause() -> None:
    # Both ranks leave NCCL for 8 s (no barrier at all). Just before, rank 0 waited 300 ms
    # in one AllReduce: one wide round, above its baseline, in a 6 s window for the first
    # three ticks of the pause. Without ``_idle`` that one wait passed for the ranks waiting
    # inside collectives, and the pause's falling throughput fired as a slowdown; a silence
    # of every watched rank longer than a step (here 100 ms) is no step at all.
    wide = dataclasses.replace(SETTINGS, window_s=6.0)
    _, hits = _replay(_checkpoint(8.0, None, wide=True, at_s=12), wide)
    assert hits == []


def test_a_paused_tick_is_not_learned_as_the_normal_pace() -> None:
    # 20 s of checkpoint against 6 s of training before it: learned (Algorithm 1 line 9 on
    # ticks where nothing "looked slow"), the paused ticks would be the median of the normal
    # throughput, ~0, and a slowdown after the checkpoint could never halve it.
    state, hits = _replay(_checkpoint(20.0, 4, end_s=4.0))
    assert hits == []
    normal = state.base.normal_throughput(0, SETTINGS.normal_min_ticks)
    assert normal is not None and normal > 5e6  # 1 MiB per 100 ms: ~10 MB/s


def _eval_pass() -> tables.Bundle:
    """Ranks 0, 1 train from 1 s to 9 s: a 1 MiB TP AllReduce (comm 0xt) and a DP
    AllReduce (0xd) every 100 ms. Then 12 s of evaluation: the TP AllReduce every 40 ms
    (forward only, a faster pace), no DP. Then training again, as before, for 6 s."""
    b = tables.BundleBuilder(models.Job(world_size=2))
    for r in range(2):
        for c in ("0xt", "0xd"):
            b.add_comm(rank=r, ts=0, comm=c, comm_rank=r, nranks=2)
    seq = {"0xt": 0, "0xd": 0}

    def run(t0: int, t1: int, every: int, comms: tuple[str, ...]) -> None:
        for t in range(t0, t1, every):
            for c in comms:
                for r in range(2):
                    b.add_op(rank=r, ts=t + 10 * MS, comm=c, seq=seq[c], op="AllReduce",
                             nbytes=1 << 20, start=t, end=t + 10 * MS)  # fmt: skip
                seq[c] += 1

    run(S, 9 * S, 100 * MS, ("0xt", "0xd"))
    run(9 * S, 21 * S, 40 * MS, ("0xt",))
    run(21 * S, 27 * S, 100 * MS, ("0xt", "0xd"))
    return b.build()


def test_a_window_without_one_of_the_ranks_communicators_is_not_its_normal_pace() -> None:
    # The evaluation pass runs TP three times as often as training and no DP. Its ticks see
    # nothing slow (throughput is up), so Algorithm 1 line 9 would learn them: 12 eval
    # ticks against 6 of training, and the TP interval normal became the eval's 40 ms;
    # training's 100 ms after it then read as "interval doubled". A window in which a
    # communicator the rank runs every step went silent holds another workload.
    bundle = _eval_pass()
    state = trigger.TriggerState((0, 1), SETTINGS, interval_ns=100 * MS)
    tp = bundle.comm_index("0xt")
    assert tp is not None
    span = bundle.time_span()
    assert span is not None
    for t in range(span[0] + S, 21 * S, S):
        assert state.update(bundle, t) is None
    normal = state.base.normal_interval(0, tp, SETTINGS.normal_min_ticks)
    assert normal is not None and normal > 80 * MS


SCALES = (1.0, 20.0)
STEP_S_PER_SCALE = 0.16  # a step of the default workload per unit of compute scale


def _simulate(
    scale: float, events: tuple[tuple[config.BenignKind, float], ...], fault: str = "none"
) -> tuple[truth.Truth, diagnosis.Diagnosis]:
    """16 ranks (TP8 x DP2, two nodes), sampled on per-rank phases at 100 ms, clocks 50 ms
    apart; ``events`` (kind, length) start at 40 % of the base run, the run is longer by
    them, and ``fault`` (on rank 12) starts at 60 % of the base run plus them."""
    w = config.Workload()
    w = dataclasses.replace(
        w, fwd_compute_ms=w.fwd_compute_ms * scale, bwd_compute_ms=w.bwd_compute_ms * scale
    )
    base = max(10.0, 20 * STEP_S_PER_SCALE * scale)
    shift = sum(length for _, length in events)
    sim = simulator.simulate(
        config.SimConfig(
            ranks=16, tp=8, pp=1, dp=2, duration_s=base + shift, onset_s=0.6 * base + shift,
            fault=truth.Fault.from_name(fault), target=12, seed=1, clock_skew_ms=50.0,
            sample_phase=True, workload=w,
            benign=tuple(config.Benign(k, 0.4 * base, length) for k, length in events),
        )
    )  # fmt: skip
    return sim.truth, engine.diagnose(sim.bundle)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize(
    "events",
    [(("checkpoint", 8.0),), (("eval", 10.0),), (("wide-round", 0.6),)],
    ids=["checkpoint", "eval", "wide-round"],
)
def test_benign_pauses_raise_nothing(
    scale: float, events: tuple[tuple[config.BenignKind, float], ...]
) -> None:
    tr, d = _simulate(scale, events)
    assert tr.culprit_ranks == [] and tr.expected_category is None
    assert not d.anomaly, d.evidence


def test_a_fault_after_an_evaluation_pass_is_still_found() -> None:
    tr, d = _simulate(1.0, (("eval", 10.0),), fault="nic-slow")
    assert d.category == tr.expected_category == "slow.network"
    assert d.culprits and d.culprits[0].rank == 12
