"""Diagnoses do not pile up: the newest N of a job stay, finished older ones go, except the one a
node still marked by collscope names."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, cast

from collscope.operator.clients import kube
from collscope.operator.controller import trigger_loop
from collscope.operator.controller.state import OperatorState
from collscope.operator.domain import remediation, resources, retention, settings


def diag(i: int, *, job: str = "j", phase: str = "Diagnosed", action: str | None = "none",
         node: str | None = None) -> dict[str, Any]:  # fmt: skip
    st: dict[str, Any] = {"phase": phase}
    if action is not None:
        st["action"] = action
    if node is not None:
        st["culpritNode"] = node
    return {
        "metadata": {"name": f"{job}-{i:02d}", "creationTimestamp": f"2026-11-22T21:{i:02d}:00Z"},
        "spec": {"trainingJob": {"name": job}, "trigger": "hang"},
        "status": st,
    }


def names(objs: list[resources.Diagnosis]) -> list[str]:
    return [o.metadata["name"] for o in objs]


def test_the_newest_stay_and_only_finished_older_ones_go() -> None:
    raw = [diag(i) for i in range(6)] + [diag(i, job="other") for i in range(9)]
    raw[1] = diag(1, phase="Analyzing", action=None)  # still running
    raw[2] = diag(2, action="pending")  # waiting for its re-check
    raw[3] = diag(3, phase="Failed", action="none")
    objs = [resources.Diagnosis.parse(o) for o in raw]
    assert names(retention.beyond(reversed(objs), job="j", keep=2)) == ["j-00", "j-03"]
    assert retention.beyond(objs, job="j", keep=20) == []


def test_a_diagnosis_a_marked_node_names_is_kept() -> None:
    record = remediation.Record("ml/j-01", cordoned=True, tainted=True, labelled=True, at="t")
    held = {"metadata": {"annotations": {remediation.RECORD_ANNOTATION: record.to_json()}}}
    broken = {"metadata": {"annotations": {remediation.RECORD_ANNOTATION: "{"}}}
    assert retention.named_by_marks([held, {"metadata": {}}, None, broken]) == {"ml/j-01"}


class FakeApi:
    def __init__(self, objs: list[dict[str, Any]], nodes: dict[str, Any]) -> None:
        self.objs, self.nodes = objs, nodes
        self.deleted: list[str] = []

    async def list_diagnoses(self, namespace: str) -> list[dict[str, Any]]:
        return self.objs

    async def get_node(self, name: str) -> dict[str, Any] | None:
        return self.nodes.get(name)

    async def delete_diagnosis(self, namespace: str, name: str) -> None:
        self.deleted.append(name)


def test_retain_deletes_beyond_n_but_not_the_record_of_a_held_node() -> None:
    record = remediation.Record("ml/j-01", cordoned=True, tainted=True, labelled=True, at="t")
    marked = {"metadata": {"annotations": {remediation.RECORD_ANNOTATION: record.to_json()}}}
    objs = [diag(0, node="n1"), diag(1, node="n1", phase="Remediated", action="cordoned")]
    objs += [diag(i, node="n1", action="held") for i in range(2, 6)]
    api = FakeApi(objs, {"n1": marked})
    cfg = dataclasses.replace(settings.Settings(), diagnosis_retention=3)
    state = OperatorState.create(cast(kube.Cluster, api), cfg, lambda n, ip: None)
    gone = asyncio.run(trigger_loop.retain(state, "ml", "j", logging.getLogger("test")))
    assert gone == api.deleted == ["j-00", "j-02"]  # j-01 is why n1 is cordoned
