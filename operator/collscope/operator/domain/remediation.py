"""Node marks for a hardware Diagnosis, and their undo, as JSON Patches (RFC 6902).

Marking a culprit node (docs/design.md, "Data path" 7) means, in one patch:

- cordon: ``spec.unschedulable: true`` (what ``kubectl cordon`` sets);
- taint ``collscope.dev/faulty=<category>:NoSchedule`` (the value says why, e.g. ``hang.gpu``);
- label ``collscope.dev/quarantined: "true"`` (select held nodes: ``kubectl get nodes -l ...``);
- annotation ``collscope.dev/diagnosis: <namespace>/<name>`` pointing at the Diagnosis;
- annotation ``collscope.dev/remediation``: a JSON record of which of the marks above collscope
  *added*, e.g. ``{"diagnosis": "ml/llama-hang-1", "cordoned": false, "tainted": true,
  "labelled": true, "at": "2026-11-22T21:00:00Z"}``: a node someone else had cordoned before
  is not uncordoned by ``undo`` (NVSentinel records ``cordon-by`` for the same reason).

Alongside the marks, where Kubernetes tools look (node-problem-detector style, so NVSentinel-like
remediators can act on it): the Node condition ``CollscopeFaulty`` (``condition``, patched on
``nodes/status``; True while marked, False with reason ``Released`` after) and Events on the
Node (``event``: ``CollscopeCordoned``, ``CollscopeNotConfirmed``, ``CollscopeReleased``...).

The marks outlive the job and the Diagnosis: deleting either releases nothing (a faulty GPU
must not go back into the pool with them). A node is released by ``collscope uncordon NODE``
(``undo`` with no Diagnosis).

Every patch starts with a ``test`` of ``metadata.resourceVersion``: taints are a list that a
merge patch would replace whole, so the read-modify-write must fail (HTTP 422) rather than
overwrite a concurrent change; the caller re-reads the node and plans again.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from collscope.operator import errors
from collscope.operator.domain import patches

TAINT_KEY = "collscope.dev/faulty"
CONDITION_TYPE = "CollscopeFaulty"
EVENT_SOURCE = "collscope-operator"
EVENT_NAMESPACE = "default"  # a Node's Events live there, as the kubelet's do
TAINT_EFFECT = "NoSchedule"
LABEL_KEY = "collscope.dev/quarantined"
DIAGNOSIS_ANNOTATION = "collscope.dev/diagnosis"
RECORD_ANNOTATION = "collscope.dev/remediation"

Op = patches.Op


@dataclass(frozen=True)
class Record:
    """Which marks collscope added to a node, for which Diagnosis, when."""

    diagnosis: str  # "<namespace>/<name>"
    cordoned: bool
    tainted: bool
    labelled: bool
    at: str  # RFC 3339

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Record:
        try:
            data = json.loads(text)
            return cls(
                diagnosis=str(data["diagnosis"]),
                cordoned=bool(data["cordoned"]),
                tainted=bool(data["tainted"]),
                labelled=bool(data["labelled"]),
                at=str(data["at"]),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise errors.RemediationError(
                f"annotation {RECORD_ANNOTATION} is not a collscope record: {text!r}"
            ) from e


def record_of(node: Mapping[str, Any]) -> Record | None:
    """collscope's record on a node, if collscope holds it."""
    text = (node.get("metadata", {}).get("annotations") or {}).get(RECORD_ANNOTATION)
    return None if text is None else Record.from_json(str(text))


def _rv_test(node: Mapping[str, Any]) -> list[Op]:
    rv = node.get("metadata", {}).get("resourceVersion")
    return [] if rv is None else [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}]


def _put(node: Mapping[str, Any], section: str, field: str, values: Mapping[str, str]) -> list[Op]:
    """Add keys to a map under ``section`` (e.g. metadata.labels), creating the map if absent."""
    existing = node.get(section, {}).get(field)
    if existing is None:
        return [{"op": "add", "path": patches.pointer(section, field), "value": dict(values)}]
    return [
        {"op": "add", "path": patches.pointer(section, field, k), "value": v}
        for k, v in values.items()
    ]


def plan(
    node: Mapping[str, Any], diagnosis: str, category: str, now: datetime.datetime
) -> list[Op]:
    """The patch marking ``node`` for ``diagnosis`` (``ns/name``); [] when collscope holds it.

    Marks already present (cordoned by someone else, our taint or label left over) are left
    alone and recorded as not added by collscope.
    """
    if record_of(node) is not None:
        return []
    spec = node.get("spec") or {}
    labels = node.get("metadata", {}).get("labels") or {}
    ops = _rv_test(node)
    if "spec" not in node:
        ops.append({"op": "add", "path": "/spec", "value": {}})
    cordoned = not spec.get("unschedulable", False)
    if cordoned:
        ops.append({"op": "add", "path": "/spec/unschedulable", "value": True})
    taints = spec.get("taints")
    tainted = not any(t.get("key") == TAINT_KEY for t in taints or ())
    if tainted:
        taint = {"key": TAINT_KEY, "value": category, "effect": TAINT_EFFECT}
        if taints is None:
            ops.append({"op": "add", "path": "/spec/taints", "value": [taint]})
        else:
            ops.append({"op": "add", "path": "/spec/taints/-", "value": taint})
    labelled = LABEL_KEY not in labels
    if labelled:
        ops += _put(node, "metadata", "labels", {LABEL_KEY: "true"})
    at = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    record = Record(diagnosis, cordoned=cordoned, tainted=tainted, labelled=labelled, at=at)
    ops += _put(
        node,
        "metadata",
        "annotations",
        {DIAGNOSIS_ANNOTATION: diagnosis, RECORD_ANNOTATION: record.to_json()},
    )
    return ops


def undo(node: Mapping[str, Any], diagnosis: str | None = None) -> list[Op]:
    """The patch removing exactly the marks collscope added; [] when it holds nothing here.

    With ``diagnosis``, only marks made for that Diagnosis are released (deleting one Diagnosis
    must not release a node held for another); ``None`` releases whatever collscope holds
    (``collscope uncordon NODE``).
    """
    record = record_of(node)
    if record is None or (diagnosis is not None and record.diagnosis != diagnosis):
        return []
    spec = node.get("spec") or {}
    meta = node.get("metadata", {})
    ops = _rv_test(node)
    if record.cordoned and "unschedulable" in spec:
        ops.append({"op": "remove", "path": "/spec/unschedulable"})
    if record.tainted:
        ops += _remove_from_list(spec.get("taints") or [], TAINT_KEY)
    if record.labelled:
        ops += _remove_keys(meta.get("labels"), "labels", {LABEL_KEY})
    ops += _remove_keys(
        meta.get("annotations"), "annotations", {DIAGNOSIS_ANNOTATION, RECORD_ANNOTATION}
    )
    return ops


def _remove_from_list(taints: list[Mapping[str, Any]], key: str) -> list[Op]:
    """Remove our taints (each guarded by a ``test`` of its value); the list too if only ours."""
    ours = [i for i, t in enumerate(taints) if t.get("key") == key]
    if ours and len(ours) == len(taints):
        return [{"op": "test", "path": "/spec/taints", "value": taints},
                {"op": "remove", "path": "/spec/taints"}]  # fmt: skip
    ops: list[Op] = []
    for i in reversed(ours):
        path = patches.pointer("spec", "taints", str(i))
        ops += [{"op": "test", "path": path, "value": taints[i]}, {"op": "remove", "path": path}]
    return ops


def _remove_keys(existing: Mapping[str, Any] | None, field: str, keys: set[str]) -> list[Op]:
    """Remove ``keys`` from metadata.<field>; the map too when nothing else is left in it."""
    present = sorted(keys & set(existing or {}))
    if not present:
        return []
    if existing is not None and set(existing) <= keys:
        return [{"op": "remove", "path": patches.pointer("metadata", field)}]
    return [{"op": "remove", "path": patches.pointer("metadata", field, k)} for k in present]


def is_held(node: Mapping[str, Any]) -> bool:
    """Whether collscope holds marks on this node (the breaker's ``held`` set is rebuilt
    from this at start-up)."""
    return record_of(node) is not None


def condition(*, faulty: bool, reason: str, message: str, now: datetime.datetime) -> dict[str, Any]:
    """The ``CollscopeFaulty`` Node condition (``reason`` CamelCase, ``message`` names the
    Diagnosis); merged by ``type`` into ``status.conditions``."""
    at = _rfc3339(now)
    return {
        "type": CONDITION_TYPE,
        "status": "True" if faulty else "False",
        "reason": reason,
        "message": message[:1024],
        "lastHeartbeatTime": at,
        "lastTransitionTime": at,
    }


def event(
    node: Mapping[str, Any], *, reason: str, message: str, warning: bool, now: datetime.datetime
) -> dict[str, Any]:
    """A core v1 Event about ``node`` (named ``<node>.<hex ns>`` as the kubelet names its own)."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    at = _rfc3339(now)
    stamp = int(now.timestamp() * 1e9)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{stamp:x}", "namespace": EVENT_NAMESPACE},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "uid": meta.get("uid") or name,
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": EVENT_SOURCE},
        "reportingComponent": EVENT_SOURCE,
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    }


def _rfc3339(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
