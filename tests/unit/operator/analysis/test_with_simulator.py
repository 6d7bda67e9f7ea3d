"""Analysis on simulated 16-rank jobs, judged against the simulator's ground truth.

The cases are a small, fast slice of bench/accuracy.py (which sweeps many seeds and sizes):
each simulation takes well under a second. Seeds were picked among ones diagnosed correctly
today, spread so that culprits fall on both nodes; a failure here is a regression in
detection, category or culprit, not in a tuned number.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import pytest

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import diagnosis, engine, groups
from collscope.operator.simulator import config, truth
from collscope.operator.simulator import engine as simulator

Sim16 = Callable[..., simulator.SimResult]

HEALTHY = [("ring", 100), ("ring", 101), ("tree", 100), ("tree", 101)]
# (fault, algo, seed); seed 5 puts the culprit on the first node, the others on the second
HANGS = [
    ("nic-down", "ring", 2),
    ("nic-down", "tree", 5),
    ("not-entered", "ring", 3),
    ("not-entered", "tree", 0),
    ("inconsistent", "ring", 5),
    ("inconsistent", "tree", 1),
    ("gpu-hang", "ring", 4),
    ("gpu-hang", "tree", 2),
]
SLOW = [
    ("gpu-power-limit", "ring", 0),
    ("gpu-power-limit", "tree", 3),
    ("background-compute", "ring", 5),
    ("background-compute", "tree", 1),
    ("pcie-downgrade", "ring", 2),
    ("pcie-downgrade", "tree", 4),
    ("nic-slow", "ring", 2),
    ("nic-slow", "tree", 0),
    ("background-traffic", "ring", 1),
    ("background-traffic", "tree", 3),
    ("proxy-delay", "ring", 0),
    ("proxy-delay", "tree", 4),
    ("mixed-slow", "ring", 0),
    ("mixed-slow", "tree", 2),
]


def _check_well_formed(d: diagnosis.Diagnosis) -> None:
    assert 0.0 <= d.confidence <= 1.0
    assert d.evidence and all(e.strip() for e in d.evidence)
    assert all(0.0 <= c.score <= 1.0 for c in d.culprits)
    back = diagnosis.Diagnosis.model_validate_json(d.to_json())
    assert back == d


@pytest.mark.parametrize(("algo", "seed"), HEALTHY)
def test_healthy_job_raises_no_alarm(sim16: Sim16, algo: str, seed: int) -> None:
    d = engine.diagnose(sim16("none", algo, seed).bundle)
    assert d.anomaly is False, d.evidence
    assert d.category is None and d.culprits == [] and d.detected_at is None
    _check_well_formed(d)


@pytest.mark.parametrize(("fault", "algo", "seed"), HANGS)
def test_hang_is_found_with_category_and_culprit(
    sim16: Sim16, fault: str, algo: str, seed: int
) -> None:
    res = sim16(fault, algo, seed)
    assert truth.Fault.from_name(fault).value.hang
    d = engine.diagnose(res.bundle)
    assert d.anomaly and d.trigger == "hang"
    assert d.category == res.truth.expected_category, d.evidence
    assert d.culprits[0].rank in res.truth.culprit_ranks, (d.culprits, res.truth)
    category = diagnosis.Category.from_name(str(d.category))
    assert d.culprits[0].component == category.value.component
    assert res.truth.onset is not None and d.detected_at is not None
    assert d.detected_at >= res.truth.onset  # never before the fault
    assert d.culprits[0].node == res.truth.culprit_node
    _check_well_formed(d)


@pytest.mark.parametrize(("fault", "algo", "seed"), SLOW)
def test_slowdown_is_found_with_category(sim16: Sim16, fault: str, algo: str, seed: int) -> None:
    res = sim16(fault, algo, seed)
    d = engine.diagnose(res.bundle)
    assert d.anomaly and d.trigger == "slow"
    assert d.category == res.truth.expected_category, d.evidence
    assert d.culprits[0].rank in res.truth.culprit_ranks, (d.culprits, res.truth)
    assert res.truth.onset is not None and d.detected_at is not None
    assert d.detected_at >= res.truth.onset
    _check_well_formed(d)


def test_sampling_covers_every_dp_group_of_the_simulated_job(sim16: Sim16) -> None:
    b = sim16("none", "ring", 100).bundle
    g = groups.build(b)
    assert len(g.of_kind("tp")) == 2 and all(len(c.members) == 8 for c in g.of_kind("tp"))
    assert len(g.of_kind("dp")) == 8 and all(len(c.nodes) == 2 for c in g.of_kind("dp"))
    picked = groups.sample_ranks(g, b.job, 10)
    assert len(picked) == 10
    assert all(set(picked) & set(c.members) for c in g.of_kind("dp"))


def test_inferred_layout_matches_the_declared_one(sim16: Sim16) -> None:
    declared = groups.build(sim16("none", "ring", 100).bundle)
    inferred = groups.build(sim16("none", "ring", 100, declared=False).bundle)
    assert sorted((c.kind, c.members) for c in inferred.comms) == sorted(
        (c.kind, c.members) for c in declared.comms
    )


def test_hang_is_found_without_a_declared_layout(sim16: Sim16) -> None:
    res = sim16("nic-down", "ring", 2, declared=False)
    assert res.bundle.job.parallelism is None
    d = engine.diagnose(res.bundle)
    assert d.category == "hang.network" and d.culprits[0].rank in res.truth.culprit_ranks


def test_sampling_a_victim_still_finds_the_culprit(sim16: Sim16) -> None:
    res = sim16("gpu-hang", "ring", 4)
    (culprit,) = res.truth.culprit_ranks
    victim = (culprit + 8) % 16  # its DP peer on the other node
    d = engine.diagnose(res.bundle, sampled=[victim])
    assert d.evidence[0].startswith(f"trigger (hang): rank {victim} ")
    assert d.category == "hang.gpu" and d.culprits[0].rank == culprit


def _without_hw(b: tables.Bundle) -> tables.Bundle:
    """The bundle as live windows carry it today: no hardware samples."""
    return dataclasses.replace(b, hw=b.hw[:0])


@pytest.mark.parametrize(("algo", "seed"), [("ring", 2), ("tree", 5)])
def test_nic_down_on_a_two_rank_path_without_hw_names_both_ends(
    sim16: Sim16, algo: str, seed: int
) -> None:
    # 16 ranks = tp 8 x dp 2: the culprit's only inter-node traffic is its 2-rank DP ring with
    # one peer on the other node, so every blocked flow runs between the same two NICs and a
    # dead NIC at either end looks the same. Both are named, equal, with the counter to read.
    res = sim16("nic-down", algo, seed)
    (culprit,) = res.truth.culprit_ranks
    peer = (culprit + 8) % 16
    d = engine.diagnose(_without_hw(res.bundle))
    assert d.category == "hang.network"
    assert sorted((c.rank, c.score) for c in d.culprits) == sorted([(culprit, 1.0), (peer, 1.0)])
    assert d.confidence <= 0.5
    nic = f"mlx5_{culprit % 8}"
    assert any(
        "cannot tell which NIC stopped" in e
        and f"the link state of {nic} on gpu-node-00 and the link state of {nic} on gpu-node-01"
        in e
        for e in d.evidence
    )
    with_hw = engine.diagnose(res.bundle)  # the simulated agent saw the port go down
    assert [(c.rank, c.score) for c in with_hw.culprits] == [(culprit, 1.0), (peer, 0.5)]


@functools.lru_cache(maxsize=4)
def _sim32(algo: config.Algo, seed: int) -> simulator.SimResult:
    # tp 8 x dp 4 on four nodes: every DP ring hop is inter-node. 8 s with onset at 4 s, as
    # sim16 (conftest) does.
    return simulator.simulate(
        config.SimConfig(
            ranks=32,
            tp=8,
            pp=1,
            dp=4,
            duration_s=8.0,
            onset_s=4.0,
            algo=algo,
            dp_mode="allreduce" if algo == "tree" else "rs-ag",
            fault=truth.Fault.NIC_DOWN,
            seed=seed,
        )
    )


@pytest.mark.parametrize(("algo", "seed"), [("ring", 0), ("tree", 1)])
def test_nic_down_in_a_dp_group_over_four_nodes_is_found_without_hw(
    algo: config.Algo, seed: int
) -> None:
    # The dead NIC carries two blocked hops of the DP operation (what it sends and what is sent
    # to it), each neighbour's NIC one: the collective evidence alone names it.
    res = _sim32(algo, seed)
    (culprit,) = res.truth.culprit_ranks
    d = engine.diagnose(_without_hw(res.bundle))
    assert d.category == "hang.network"
    assert d.culprits[0].rank == culprit and d.culprits[0].component == "nic"
    assert all(c.score < 1.0 for c in d.culprits[1:])
    assert not any("cannot tell" in e for e in d.evidence)
