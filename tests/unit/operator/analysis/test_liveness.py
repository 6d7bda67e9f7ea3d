"""Dead, frozen and lost ranks (``analysis.liveness``): their own categories, never hardware.

The traces are the hand-built 4-rank ring of ``conftest`` (ranks 0, 1 on ``n0``, 2, 3 on
``n1``; GPU ``r % 2``), frozen as a NIC or a GPU fault freezes it; liveness rows say what the
node agents saw of each rank's process when the window was pulled (at the end of the ring).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import diagnosis, engine, liveness, placement, trigger, view
from collscope.operator.domain import policy

Ring = Any  # conftest.Ring: conftest modules cannot be imported under --import-mode=importlib
MS = 1_000_000
S = 1_000_000_000
Row = tuple[models.LivenessState, int | None]  # (state, heartbeat) of one rank
FRESH = 50 * MS  # a running writer's heartbeat, as the agent reads it: under 0.6 s old


def with_rows(
    base: tables.Bundle,
    rows: Mapping[int, Row],
    *,
    ts: int,
    hw: Sequence[tuple[int, str, str, float]] = (),
) -> tables.Bundle:
    """``base`` plus one liveness row per rank (state, heartbeat) observed at ``ts``, and
    ``hw`` samples (ts, node, ``"device:metric"``, value)."""
    b = tables.BundleBuilder(base.job)
    b.add_tables(base)
    for rank, (state, beat) in rows.items():
        b.add_liveness(rank=rank, ts=ts, state=state, heartbeat=beat)
    for when, node, device_metric, value in hw:
        device, metric = device_metric.split(":")
        b.add_hw(rank=0, ts=when, node=node, device=device, metric=metric, value=value)
    return b.build()


def alive(ring: Ring, **dead: Row) -> dict[int, Row]:
    rows: dict[int, Row] = {r: ("running", ring.end - FRESH) for r in range(4)}
    for key, value in dead.items():
        rows[int(key.removeprefix("r"))] = value
    return rows


@pytest.mark.parametrize("kind", ["network", "gpu"])
@pytest.mark.parametrize("state", ["dead", "stopped"])
def test_a_dead_or_stopped_rank_is_hang_process_not_the_fabric(
    ring: Ring, kind: str, state: models.LivenessState
) -> None:
    # Rank 2 stopped beating 30 ms before its peers' last progress: it froze their traces as
    # a NIC (or GPU) fault would have; without liveness the verdict is hardware.
    base = ring.build(kind)
    assert engine.diagnose(base).category == f"hang.{kind}"
    d = engine.diagnose(
        with_rows(base, alive(ring, r2=(state, ring.stall_start - 30 * MS)), ts=ring.end)
    )
    assert d.anomaly and d.trigger == "hang" and d.category == "hang.process"
    assert [(c.rank, c.node, c.component) for c in d.culprits] == [(2, "n1", "host")]
    assert d.confidence == 1.0
    text = " ".join(d.evidence)
    assert f"rank 2 (n1, GPU 0): its process is {'gone' if state == 'dead' else 'stopped'}" in text
    assert "0.0 s before the stall began" in text and "3 other rank(s) kept beating" in text
    assert policy.decide(policy.RemediationPolicy(), d).act is False


def test_every_silent_rank_is_named_first_silent_first(ring: Ring) -> None:
    rows = alive(ring, r3=("dead", ring.stall_start - 200 * MS), r2=("stopped", ring.stall_start))
    d = engine.diagnose(with_rows(ring.build("network"), rows, ts=ring.end))
    assert d.category == "hang.process"
    assert [c.rank for c in d.culprits] == [3, 2]
    assert [c.score for c in d.culprits] == [1.0, 1.0]


def test_a_process_killed_after_the_hang_began_is_a_consequence(ring: Ring) -> None:
    # Rank 2's NIC hung the ring; rank 2 itself was killed 2 s later (a watchdog, a user).
    late = ring.stall_start + 2 * S
    d = engine.diagnose(with_rows(ring.build("network"), alive(ring, r2=("dead", late)), ts=late))
    assert d.category == "hang.network" and d.culprits[0].rank == 2


def test_a_heartbeat_alone_names_the_rank_with_less_confidence(ring: Ring) -> None:
    # The agent could not see the process (no host pid): only the heartbeat speaks.
    rows = alive(ring, r2=("unknown", ring.stall_start))
    d = engine.diagnose(with_rows(ring.build("gpu"), rows, ts=ring.end))
    assert d.category == "hang.process" and [c.rank for c in d.culprits] == [2]
    assert d.confidence == 0.8
    # ... but a visible, running process with an old heartbeat (communicators closed) is not
    # silent, and an unknown one whose heartbeat is fresh is heard.
    cases: list[Row] = [("running", ring.stall_start), ("unknown", ring.end - FRESH)]
    for case in cases:
        rows = alive(ring, r2=case)
        d = engine.diagnose(with_rows(ring.build("gpu"), rows, ts=ring.end))
        assert d.category == "hang.gpu", (case, d.evidence)


def test_no_verdict_when_nobody_is_heard(ring: Ring) -> None:
    rows: dict[int, Row] = {r: ("stopped", ring.stall_start) for r in range(4)}
    d = engine.diagnose(with_rows(ring.build("network"), rows, ts=ring.end))
    assert d.category == "hang.network"  # the job stopped as a whole: traces decide


def test_an_exited_rank_is_left_to_the_collective_analysis(ring: Ring) -> None:
    rows = alive(ring, r3=("exited", ring.stall_start - S))
    d = engine.diagnose(with_rows(ring.build("not-entered"), rows, ts=ring.end))
    assert d.category == "hang.not_entered" and d.culprits[0].rank == 3


@pytest.mark.parametrize(
    ("sample", "why"),
    [
        (("gpu0:xid", 79.0), "its GPU reported Xid 79"),
        (("gpu0:xid", 48.0), "its GPU reported Xid 48"),
    ],
)
def test_hardware_evidence_on_the_culprits_gpu_makes_it_hang_gpu(
    ring: Ring, sample: tuple[str, float], why: str
) -> None:
    rows = alive(ring, r2=("dead", ring.stall_start))
    hw = [(ring.stall_start, "n1", sample[0], sample[1])]
    d = engine.diagnose(with_rows(ring.build("network"), rows, ts=ring.end, hw=hw))
    assert d.category == "hang.gpu"
    assert [(c.rank, c.component) for c in d.culprits] == [(2, "gpu")]
    assert any(e == f"rank 2 (n1, GPU 0): {why}" for e in d.evidence), d.evidence
    assert diagnosis.Category.from_name(d.category).value.hardware


def test_uncorrected_ecc_growth_is_hardware_evidence(ring: Ring) -> None:
    rows = alive(ring, r2=("dead", ring.stall_start))
    metric = f"gpu0:{liveness.ECC_METRIC}"
    hw = [(ring.hang_start, "n1", metric, 0.0), (ring.stall_start, "n1", metric, 2.0)]
    d = engine.diagnose(with_rows(ring.build("gpu"), rows, ts=ring.end, hw=hw))
    assert d.category == "hang.gpu" and d.culprits[0].rank == 2
    assert "rank 2 (n1, GPU 0): its GPU's uncorrected ECC error count grew by 2" in d.evidence


@pytest.mark.parametrize(
    "hw",
    [
        [(0, "n1", "gpu0:xid", 45.0)],  # logged when a process with GPU work is killed
        [(0, "n1", "gpu1:xid", 79.0)],  # rank 3's GPU, on the same node: not rank 2's
        [(0, "n0", "gpu0:xid", 79.0)],  # rank 0's GPU: same index, another node
        [(0, "n1", f"gpu0:{liveness.ECC_METRIC}", 3.0)],  # one sample: no growth seen
    ],
)
def test_other_hardware_samples_are_not_evidence(
    ring: Ring, hw: list[tuple[int, str, str, float]]
) -> None:
    rows = alive(ring, r2=("dead", ring.stall_start))
    at = [(ring.stall_start, n, d, v) for _, n, d, v in hw]
    d = engine.diagnose(with_rows(ring.build("network"), rows, ts=ring.end, hw=at))
    assert d.category == "hang.process" and [c.rank for c in d.culprits] == [2]


def test_a_node_whose_agent_is_unreachable_and_ranks_silent_is_lost(ring: Ring) -> None:
    # Node n1's agent did not answer: its ranks 2 and 3 have no records in the window at all.
    base = ring.build("network")
    kept = tables.BundleBuilder(base.job)
    kept.add_tables(view.select(base, ranks=(0, 1)))
    rows: dict[int, Row] = {0: ("running", ring.end - FRESH), 1: ("running", ring.end - FRESH)}
    rows |= {2: ("unreachable", None), 3: ("unreachable", None)}
    d = engine.diagnose(with_rows(kept.build(), rows, ts=ring.end))
    assert d.category == "hang.node" and d.precision == "node"
    culprits = [(c.rank, c.node, c.component) for c in d.culprits]
    assert culprits == [(2, "n1", "host"), (3, "n1", "host")]
    assert d.confidence == 0.6
    assert d.evidence[1].startswith("node n1: its agent did not answer")
    assert policy.decide(policy.RemediationPolicy(), d).act is False


def test_an_unreachable_agent_whose_ranks_spoke_is_not_a_lost_node(ring: Ring) -> None:
    rows: dict[int, Row] = {0: ("running", ring.end - FRESH), 1: ("running", ring.end - FRESH)}
    rows |= {2: ("unreachable", None), 3: ("unreachable", None)}
    d = engine.diagnose(with_rows(ring.build("network"), rows, ts=ring.end))
    assert d.category == "hang.network"  # their state samples go on after the stall began


def test_bundles_without_liveness_analyse_as_before(ring: Ring) -> None:
    for kind in ("network", "gpu", "not-entered", "inconsistent"):
        base = ring.build(kind)
        assert len(base.liveness) == 0
        where = placement.Placement.of(base.job)
        assert liveness.analyze(base, _hang(ring), where=where) is None


@pytest.mark.parametrize(
    "category", [diagnosis.Category.HANG_PROCESS, diagnosis.Category.HANG_NODE]
)
def test_the_new_categories_are_host_hangs_not_hardware(category: diagnosis.Category) -> None:
    info = category.value  # so remediation never cordons on them (test_policy.py)
    assert info.trigger == "hang" and info.component == "host" and info.hardware is False


def _hang(ring: Ring) -> trigger.TriggerResult:
    return trigger.TriggerResult(
        kind="hang", at_ns=ring.end, tick_ns=ring.end, since_ns=ring.stall_start,
        ranks=(0,), comm=0, seq=0, reason="test",
    )  # fmt: skip


def test_the_onset_slack_scales_with_the_sampling_interval(ring: Ring) -> None:
    # The trigger dates a hang by the last progress its state samples showed; at 2 s sampling
    # the culprit may have beaten up to two intervals later. A rank dead 1.5 s after the seen
    # onset started the hang at 2 s sampling (slack 2 x 2 s = 4 s); at 0.1 s sampling (slack
    # its 1 s floor) it died later than the hang began: a consequence. 5 s after is later
    # than either.
    assert liveness.onset_slack_ns(100 * MS) == liveness.onset_slack_ns(500 * MS) == S
    assert liveness.onset_slack_ns(2 * S) == 4 * S
    base = ring.build("network")
    where = placement.Placement.of(base.job)
    hit = _hang(ring)
    for after, interval, process in (
        (1500 * MS, 2 * S, True),
        (1500 * MS, 100 * MS, False),
        (5 * S, 2 * S, False),
    ):
        seen_at = ring.stall_start + 6 * S
        rows: dict[int, Row] = {r: ("running", seen_at - FRESH) for r in range(4)}
        rows[2] = ("dead", ring.stall_start + after)
        b = with_rows(base, rows, ts=seen_at)
        f = liveness.analyze(b, hit, where=where, interval_ns=interval)
        assert (f is not None and f.category is diagnosis.Category.HANG_PROCESS) is process, (
            after,
            interval,
        )
