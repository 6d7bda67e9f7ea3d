"""k-sigma diagnoses of each injected fault, end to end from simulated flows to a Diagnosis."""

from __future__ import annotations

import json
from collections.abc import Callable

from collscope.operator.analysis import diagnosis
from collscope.operator.analysis.flows import engine, table
from collscope.operator.simulator.flows import engine as simulator

Report = Callable[..., tuple[simulator.FlowSimResult, engine.FlowReport]]
S = 1_000_000_000


def _diagnose(
    flow_report: Report, *args: str | None
) -> tuple[simulator.FlowSimResult, engine.FlowReport, diagnosis.Diagnosis]:
    res, report = flow_report(*args)
    return res, report, engine.to_diagnosis(report)


def test_healthy_fabric_raises_no_alarm(flow_report: Report) -> None:
    _, report, d = _diagnose(flow_report)
    assert not d.anomaly and d.category is None and not d.culprits
    assert not report.findings
    assert any("jobs" in e and "DP" in e for e in d.evidence)  # what was recognised


def test_congested_spine_is_the_culprit(flow_report: Report) -> None:
    res, _, d = _diagnose(flow_report, "congested-switch")
    fault = res.truth.faults[0]
    assert fault.culprit.startswith("spine-")
    assert d.anomaly and d.trigger == "slow" and d.category == fault.expected_category
    top = d.culprits[0]
    assert top.switch == fault.culprit and top.rank is None and top.component == "link"
    assert d.detected_at is not None and 0 < d.detected_at - fault.onset < 30 * S
    assert d.evidence[0].startswith(f"switch {fault.culprit}:")


def test_congested_leaf_explains_the_rings_and_jobs_it_slows(flow_report: Report) -> None:
    _, report, d = _diagnose(flow_report, "congested-switch", "leaf-01")
    assert [c.switch for c in d.culprits] == ["leaf-01"]
    explained = [f for f in report.findings if f.explained_by]
    assert explained and all("leaf-01" in f.explained_by for f in explained if f.level != "job")
    assert any(e.startswith("also: ") for e in d.evidence)


def test_slow_dp_group_names_its_members(flow_report: Report) -> None:
    res, _, d = _diagnose(flow_report, "slow-group")
    fault = res.truth.faults[0]
    assert d.category == "slow.network"
    group = d.culprits[0].group
    assert group is not None
    members = {c.endpoint for c in d.culprits if c.group == group}
    assert members == set(fault.members)
    first = d.culprits[0]
    assert first.rank is not None and first.node is not None and first.job is not None
    assert "its ring crosses no flagged switch" in d.evidence[0]


def test_slow_job_is_compute_not_network(flow_report: Report) -> None:
    res, report, d = _diagnose(flow_report, "slow-job")
    fault = res.truth.faults[0]
    assert d.category == "slow.compute" and len(d.culprits) == 1
    job = report.recognition.job(d.culprits[0].job or "")
    assert job is not None
    assert {report.flows.endpoints[e] for e in job.endpoints} == set(fault.members)
    assert "not the network" in d.evidence[0]
    assert d.detected_at is not None and 0 < d.detected_at - fault.onset < 20 * S


def test_culprit_extensions_stay_out_of_collective_json() -> None:
    plain = diagnosis.Culprit(rank=3, component="nic", score=0.5)
    switch = diagnosis.Culprit(switch="spine-01", component="link", score=0.9)
    doc = json.loads(diagnosis.Diagnosis(anomaly=True, culprits=[plain, switch]).to_json())
    assert "switch" not in doc["culprits"][0] and "job" not in doc["culprits"][0]
    assert doc["culprits"][1]["switch"] == "spine-01" and doc["culprits"][1]["rank"] is None
    back = diagnosis.Diagnosis.model_validate_json(json.dumps(doc))
    assert back.culprits[1].switch == "spine-01"


def test_combine_lets_collectives_lead() -> None:
    coll = diagnosis.Diagnosis(
        anomaly=True,
        trigger="hang",
        category="hang.network",
        culprits=[diagnosis.Culprit(rank=5, component="nic", score=0.9)],
        confidence=0.9,
        evidence=["rank 5 ..."],
    )
    flows = diagnosis.Diagnosis(
        anomaly=True,
        trigger="slow",
        category="slow.network",
        culprits=[diagnosis.Culprit(switch="leaf-01", component="link", score=0.8)],
        evidence=["switch leaf-01: ..."],
    )
    healthy = diagnosis.Diagnosis(anomaly=False, evidence=["nothing"])
    both = engine.combine(coll, flows)
    assert both.category == "hang.network" and both.culprits[0].rank == 5
    assert both.culprits[1].switch == "leaf-01"
    assert both.evidence == ["rank 5 ...", "flows: switch leaf-01: ..."]
    only_flows = engine.combine(healthy, flows)
    assert only_flows.category == "slow.network"
    assert only_flows.evidence[-1] == "collectives: nothing"
    assert not engine.combine(healthy, healthy).anomaly


def test_without_switch_names_a_congested_leaf_still_reads_as_network(
    flow_sim: Callable[..., tuple[simulator.FlowSimResult, table.FlowTable]],
) -> None:
    # NIC telemetry does not know paths: the same flows with empty ``switches``
    res, ft = flow_sim("congested-switch", "leaf-01")
    bare = table.FlowTable.from_columns(
        endpoints=ft.endpoints,
        src=ft.src,
        dst=ft.dst,
        ts=ft.ts,
        nbytes=ft.nbytes,
        duration=ft.duration,
    )
    d = engine.diagnose_flows(bare, job=res.job)
    assert d.anomaly and d.category == "slow.network"
    assert all(c.switch is None for c in d.culprits)
    assert "slower per byte than before" in " ".join(d.evidence)
