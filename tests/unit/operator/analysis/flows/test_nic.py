"""Inside a slow DP group: the member whose NIC carries only slow hops is the culprit NIC.

Each case is one job alone on a 16-server fabric (4 leaves of 4, 4 spines), servers spread over
the leaves, one NIC at 1/2.5 bandwidth from 30 s of 60 (about 10 steps of baseline before).
"""

from __future__ import annotations

import functools

import pytest

from collscope.operator.analysis import diagnosis
from collscope.operator.analysis.flows import engine, explain, findings, nic
from collscope.operator.simulator.flows import config
from collscope.operator.simulator.flows import engine as simulator

from .conftest import as_table

SERVERS = (0, 4, 8, 12, 1, 5, 9, 13)  # one per leaf in turn: every ring and pipeline crosses


@functools.lru_cache(maxsize=8)
def _run(
    pacing: config.RingPacing, pp: int, dp: int, faulty: bool = True
) -> tuple[simulator.FlowSimResult, engine.FlowReport, diagnosis.Diagnosis]:
    job = config.JobSpec(name="j", servers=SERVERS[: pp * dp], pp=pp, dp=dp)
    faults = (config.FlowFault("slow-group", f"j/pp{pp - 1}/tp2", 30.0),) if faulty else ()
    cfg = config.FlowSimConfig(
        fabric=config.Fabric(servers=16, servers_per_leaf=4, spines=4, ring_pacing=pacing),
        jobs=(job,),
        duration_s=60.0,
        faults=faults,
        seed=3,
    )
    res = simulator.simulate(cfg)
    report = engine.analyze(as_table(res), job=res.job)
    return res, report, engine.to_diagnosis(report)


def _localise(pacing: config.RingPacing, pp: int, dp: int) -> tuple[str, nic.Localisation, str]:
    """(the slow NIC's endpoint, the slow group's localisation, the group's NIC evidence)."""
    res, report, d = _run(pacing, pp, dp)
    (f,) = [f for f in report.findings if f.level == "group"]
    where = nic.localise(
        report.flows, report.parallelism, f.group, f.since_ns, findings.FindingSettings()
    )
    note = explain.nic_note(where, f.name, report.flows, report.topology)
    assert note in d.evidence
    return res.truth.faults[0].nic or "", where, note


def test_the_nic_is_the_one_member_whose_in_and_out_hops_are_both_slow() -> None:
    # each hop timed alone: the slow NIC's two ring hops are slow, every other hop is not
    _, report, d = _run("link", 1, 3)
    truth, where, note = _localise("link", 1, 3)
    eps = report.flows.endpoints
    (culprit,) = [eps[c] for c in where.candidates]
    assert culprit == truth
    for m in where.members:
        slow = {h.kind for h in m.hops if h.slow}
        if eps[m.endpoint] == truth:
            assert slow == {"in", "out"}
        else:  # a neighbour: only the hop it shares with the slow NIC
            (shared,) = [h for h in m.hops if h.slow]
            assert eps[shared.peer] == truth
    top = d.culprits[0]
    assert (top.endpoint, top.component) == (truth, "nic")
    assert top.rank is not None and top.node is not None and top.gpu == 2
    assert all(c.score < top.score and c.component == "link" for c in d.culprits[1:])
    assert "every hop its NIC carries is slow" in note


def test_pp_flows_single_out_the_nic_when_every_ring_hop_is_as_slow() -> None:
    # a flow-controlled ring: all its links last as long as the slowest, so the ring hops of
    # every member are slow; only the slow NIC's PP flows are slow too
    _, report, d = _run("ring", 2, 3)
    truth, where, _ = _localise("ring", 2, 3)
    eps = report.flows.endpoints
    assert all(h.slow for m in where.members for h in m.hops if h.kind in ("in", "out"))
    assert [eps[c] for c in where.candidates] == [truth]
    for m in where.members:
        pp_slow = [h.slow for h in m.hops if h.kind == "pp"]
        assert pp_slow == [eps[m.endpoint] == truth]
    assert (d.culprits[0].endpoint, d.culprits[0].component) == (truth, "nic")


def test_without_pp_flows_a_paced_ring_names_every_member_and_says_why() -> None:
    _, _, d = _run("ring", 1, 4)
    truth, where, note = _localise("ring", 1, 4)
    assert where.nic is None and len(where.candidates) == 4 and not where.pp
    members = [c for c in d.culprits if c.group == d.culprits[0].group]
    assert {c.component for c in members} == {"nic"} and len({c.score for c in members}) == 1
    assert truth in {c.endpoint for c in members}
    assert "cannot choose" in note and "no PP flows" in note


@pytest.mark.parametrize("pacing", ["ring", "link"])
def test_a_ring_of_two_names_both_members_with_equal_scores(pacing: config.RingPacing) -> None:
    _, _, d = _run(pacing, 1, 2)
    truth, where, note = _localise(pacing, 1, 2)
    assert len(where.candidates) == 2
    assert [c.component for c in d.culprits] == ["nic", "nic"]
    assert d.culprits[0].score == d.culprits[1].score
    assert truth in {c.endpoint for c in d.culprits}
    assert "a ring of two members carries the same two links" in note


def test_a_healthy_ring_has_no_slow_hop() -> None:
    _, report, d = _run("link", 2, 3, faulty=False)
    assert not d.anomaly
    for g in range(len(report.parallelism.group_label)):
        where = nic.localise(report.flows, report.parallelism, g, 0, findings.FindingSettings())
        assert not where.candidates
        assert all(not h.slow for m in where.members for h in m.hops)
