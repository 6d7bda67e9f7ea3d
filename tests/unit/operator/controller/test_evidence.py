"""Which ranks evidence is collected from: the incident's communicator, whatever its kind."""

from __future__ import annotations

import pytest

from collscope.operator.analysis import diagnosis
from collscope.operator.analysis import groups as analysis_groups
from collscope.operator.controller import evidence
from collscope.operator.domain import groups, jobs, resources


@pytest.mark.parametrize("incident", ["hang/0xab/17", "slow/0xab", "slow/0xab@1767225605123"])
def test_incident_members_name_the_communicator(incident: str) -> None:
    rt = jobs.JobRuntime()
    comm = analysis_groups.Communicator(
        index=0, comm_id="0xab", members=(0, 2), nodes=(), kind="dp", p2p=False
    )
    rt.groups = groups.JobGroups("inferred", (comm,), (), (), ())
    none = diagnosis.Diagnosis(anomaly=True, trigger="slow")
    assert evidence._incident_members(rt, resources.DiagnosisSpec(incident=incident), none) == [
        0,
        2,
    ]
    assert (
        evidence._incident_members(rt, resources.DiagnosisSpec(incident="slow/0xcd@1"), none) == []
    )
