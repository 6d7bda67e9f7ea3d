"""Node marks and their undo, applied with the same JSON Patch library kopf uses (jsonpatch):
mark, then undo, gives back the node as it was, whatever marks it already had."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from collscope.operator import errors
from collscope.operator.domain import patches, remediation

NOW = datetime.datetime(2026, 11, 22, 21, 0, 0, tzinfo=datetime.UTC)
DIAG = "ml/llama-hang-1"


def node(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "gpu-node-2", "resourceVersion": "42", "labels": {"zone": "a"}},
        "spec": spec,
    }


def apply(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    return out


def test_marks_a_clean_node() -> None:
    before = node()
    ops = remediation.plan(before, DIAG, "hang.gpu", NOW)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "42"}
    after = apply(before, ops)
    assert after["spec"]["unschedulable"] is True
    assert after["spec"]["taints"] == [
        {"key": "collscope.dev/faulty", "value": "hang.gpu", "effect": "NoSchedule"}
    ]
    assert after["metadata"]["labels"] == {"zone": "a", "collscope.dev/quarantined": "true"}
    ann = after["metadata"]["annotations"]
    assert ann["collscope.dev/diagnosis"] == DIAG
    assert json.loads(ann["collscope.dev/remediation"]) == {
        "diagnosis": DIAG, "cordoned": True, "tainted": True, "labelled": True,
        "at": "2026-11-22T21:00:00Z",
    }  # fmt: skip
    assert remediation.is_held(after) and not remediation.is_held(before)
    assert remediation.plan(after, "ml/other", "hang.gpu", NOW) == []  # held: nothing more
    assert apply(after, remediation.undo(after, DIAG)) == before


def test_keeps_what_was_there() -> None:
    other_taint = {"key": "nvidia.com/gpu-error", "effect": "NoExecute"}
    before = node(unschedulable=True, taints=[other_taint])
    before["metadata"]["annotations"] = {"note": "x"}
    after = apply(before, remediation.plan(before, DIAG, "hang.network", NOW))
    record = remediation.record_of(after)
    assert record is not None and not record.cordoned and record.tainted
    assert after["spec"]["taints"][0] == other_taint and len(after["spec"]["taints"]) == 2
    released = apply(after, remediation.undo(after))
    assert released == before  # still cordoned: someone else did that
    assert released["spec"]["unschedulable"] is True


def test_undo_only_for_its_own_diagnosis() -> None:
    held = apply(node(), remediation.plan(node(), DIAG, "hang.gpu", NOW))
    assert remediation.undo(held, "ml/another") == []
    assert remediation.undo(node()) == []


def test_concurrent_change_fails_the_patch() -> None:
    before = node()
    ops = remediation.plan(before, DIAG, "hang.gpu", NOW)
    moved = copy.deepcopy(before)
    moved["metadata"]["resourceVersion"] = "43"
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        apply(moved, ops)


def test_undo_removes_only_our_taint_even_if_moved() -> None:
    held = apply(node(), remediation.plan(node(), DIAG, "hang.gpu", NOW))
    held["spec"]["taints"].insert(0, {"key": "late", "effect": "NoSchedule"})
    released = apply(held, remediation.undo(held, DIAG))
    assert released["spec"]["taints"] == [{"key": "late", "effect": "NoSchedule"}]


def test_bad_record_is_an_error() -> None:
    broken = node()
    broken["metadata"]["annotations"] = {"collscope.dev/remediation": "{oops"}
    with pytest.raises(errors.RemediationError, match="not a collscope record"):
        remediation.undo(broken)


def test_pointer_escapes() -> None:
    assert patches.pointer("metadata", "labels", "a/b~c") == "/metadata/labels/a~1b~0c"


taint = st.fixed_dictionaries(
    {"key": st.sampled_from(["a", "b", "collscope.dev/faulty"]),
     "effect": st.sampled_from(["NoSchedule", "NoExecute"])}
)  # fmt: skip


@given(
    unschedulable=st.one_of(st.none(), st.booleans()),
    taints=st.one_of(st.none(), st.lists(taint, max_size=3)),
    labels=st.one_of(
        st.none(),
        st.dictionaries(st.sampled_from(["x", "collscope.dev/quarantined"]), st.just("v")),
    ),
    annotations=st.one_of(st.none(), st.dictionaries(st.sampled_from(["y", "z"]), st.just("w"))),
    has_rv=st.booleans(),
)
def test_mark_then_undo_restores_any_node(
    unschedulable: bool | None,
    taints: list[dict[str, str]] | None,
    labels: dict[str, str] | None,
    annotations: dict[str, str] | None,
    has_rv: bool,
) -> None:
    spec: dict[str, Any] = {}
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    if taints is not None:
        spec["taints"] = taints
    meta: dict[str, Any] = {"name": "n"}
    if has_rv:
        meta["resourceVersion"] = "1"
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    before = {"metadata": meta, "spec": spec}
    after = apply(before, remediation.plan(before, DIAG, "slow.network", NOW))
    assert after["spec"]["unschedulable"] is True
    assert any(t["key"] == "collscope.dev/faulty" for t in after["spec"]["taints"])
    assert after["metadata"]["labels"]["collscope.dev/quarantined"]
    restored = apply(after, remediation.undo(after, DIAG))
    # Kubernetes reads an absent map or list as empty and an absent unschedulable as false:
    # compare without those.
    assert _prune(restored) == _prune(before)


def _prune(obj: Any) -> Any:
    if isinstance(obj, dict):
        pruned = {k: _prune(v) for k, v in obj.items()}
        return {k: v for k, v in pruned.items() if v not in ({}, [], False)}
    return obj


def test_node_condition_and_event_say_it_where_kubernetes_tools_look() -> None:
    now = datetime.datetime(2026, 11, 22, 21, 0, tzinfo=datetime.UTC)
    cond = remediation.condition(faulty=True, reason="HangGpu", message="ml/d1", now=now)
    assert cond == {
        "type": "CollscopeFaulty", "status": "True", "reason": "HangGpu", "message": "ml/d1",
        "lastHeartbeatTime": "2026-11-22T21:00:00Z", "lastTransitionTime": "2026-11-22T21:00:00Z",
    }  # fmt: skip
    node = {"metadata": {"name": "n1", "uid": "u1"}}
    ev = remediation.event(node, reason="CollscopeCordoned", message="m", warning=True, now=now)
    assert ev["metadata"]["namespace"] == "default" and ev["metadata"]["name"].startswith("n1.")
    assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}
    assert (ev["type"], ev["reason"], ev["count"]) == ("Warning", "CollscopeCordoned", 1)
