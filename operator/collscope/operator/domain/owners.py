"""The workload an opted-in pod belongs to, and the TrainingJob that stands for it.

Pods are grouped by their *top* controller: the object a user created and will delete when the
job is over. Pod -> controller chains of common training workloads:

    Job:              Pod -> Job
    JobSet:           Pod -> Job -> JobSet
    PyTorchJob/MPIJob/TFJob (Kubeflow): Pod -> PyTorchJob
    StatefulSet:      Pod -> StatefulSet
    LeaderWorkerSet:  Pod -> StatefulSet -> LeaderWorkerSet
    Deployment:       Pod -> ReplicaSet -> Deployment

``resolve`` walks ``metadata.ownerReferences`` (the entry with ``controller: true``) upward with an
injected ``lookup`` that reads an owner's metadata, stopping at a kind known to be top-level, at
an object with no controller, or where the lookup cannot see (RBAC, deleted): the last object
reached is the workload. Kinds in ``TOP_LEVEL`` are never looked up (no RBAC needed for them);
``INTERMEDIATE`` and unknown kinds are. A pod with no controller is not grouped (``None``):
such pods need a TrainingJob with a pod selector, created by hand.

The TrainingJob is owned by the workload (``controller: false``: the workload does not control
it; ``blockOwnerDeletion: false``: no extra RBAC on the workload's finalizers), so Kubernetes
garbage-collects it with the workload.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from collscope.operator.domain import groups, ids, resources

TOP_LEVEL = frozenset(
    {"JobSet", "PyTorchJob", "MPIJob", "TFJob", "XGBoostJob", "PaddleJob", "JAXJob", "TrainJob",
     "LeaderWorkerSet", "RayJob", "RayCluster", "Deployment", "VolcanoJob"}
)  # fmt: skip
OPT_IN_ANNOTATION = "collscope.dev/diagnose"
INTERMEDIATE = frozenset({"Job", "StatefulSet", "ReplicaSet"})
MAX_DEPTH = 5  # longest real chain above is 2; a cycle or a deep custom stack stops here
NAME_MAX = 253  # DNS-1123 subdomain, the limit for a custom resource's name
_HASH_LEN = 8


@dataclass(frozen=True)
class OwnerRef:
    """An object that owns another (the fields of a Kubernetes ownerReference)."""

    api_version: str
    kind: str
    name: str
    uid: str

    @classmethod
    def of(cls, ref: Mapping[str, Any]) -> OwnerRef:
        return cls(str(ref["apiVersion"]), str(ref["kind"]), str(ref["name"]), str(ref["uid"]))

    def as_owner_reference(self) -> dict[str, Any]:
        """The ownerReference a TrainingJob carries for its workload."""
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }

    def as_spec_owner(self) -> dict[str, str]:
        """``TrainingJob.spec.owner``."""
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
        }


Lookup = Callable[[OwnerRef, ids.Namespace], Awaitable[Mapping[str, Any] | None]]


def controller_of(metadata: Mapping[str, Any]) -> OwnerRef | None:
    """The ``controller: true`` owner of an object, if any."""
    for ref in metadata.get("ownerReferences") or ():
        if ref.get("controller") and all(ref.get(k) for k in ("apiVersion", "kind", "name", "uid")):
            return OwnerRef.of(ref)
    return None


async def resolve(
    pod_metadata: Mapping[str, Any], lookup: Lookup, max_depth: int = MAX_DEPTH
) -> OwnerRef | None:
    """The workload of a pod: its top controller as far as ``lookup`` can see."""
    namespace = ids.Namespace(str(pod_metadata.get("namespace", "")))
    current = controller_of(pod_metadata)
    seen: set[str] = set()
    for _ in range(max_depth):
        if current is None or current.uid in seen:
            break
        seen.add(current.uid)
        if current.kind in TOP_LEVEL:
            return current
        meta = await lookup(current, namespace)
        parent = None if meta is None else controller_of(meta)
        if parent is None:
            return current
        current = parent
    return current


def is_opted_in(metadata: Mapping[str, Any]) -> bool:
    """A pod (or template) carrying ``collscope.dev/diagnose: "true"``."""
    value = (metadata.get("annotations") or {}).get(OPT_IN_ANNOTATION)
    return isinstance(value, str) and value.lower() == "true"


def trainingjob_name(owner: OwnerRef) -> ids.TrainingJobName:
    """A stable, valid TrainingJob name for a workload: ``<kind>-<name>``, lowercase.

    Too long or with characters a name may not hold, it is cut and given a hash of the full
    ``kind/name`` so two workloads never share a TrainingJob.
    """
    base = f"{owner.kind.lower()}-{owner.name.lower()}"
    clean = re.sub(r"[^a-z0-9.-]", "-", base).strip("-.")
    if clean == base and len(base) <= NAME_MAX:
        return ids.TrainingJobName(base)
    digest = hashlib.sha256(f"{owner.kind}/{owner.name}".encode()).hexdigest()[:_HASH_LEN]
    head = clean[: NAME_MAX - _HASH_LEN - 1].rstrip("-.")
    return ids.TrainingJobName(f"{head}-{digest}" if head else digest)


def trainingjob_body(
    owner: OwnerRef, namespace: ids.Namespace, parallelism: str | None = None
) -> dict[str, Any]:
    """The TrainingJob created for a workload, owned by it; ``parallelism`` is the pod's
    ``collscope.dev/parallelism`` annotation (raises ``ParallelismError`` when unusable)."""
    spec: dict[str, Any] = {"owner": owner.as_spec_owner()}
    if parallelism is not None:
        par = groups.parse(parallelism)
        spec["parallelism"] = par.model_dump(exclude_defaults=True) | {
            k: getattr(par, k) for k in ("tp", "pp", "dp")
        }
    return {
        "apiVersion": "collscope.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {
            "name": trainingjob_name(owner),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "collscope"},
            "ownerReferences": [owner.as_owner_reference()],
        },
        "spec": spec,
    }


def workload_of(trainingjob: resources.TrainingJob) -> dict[str, Any] | None:
    """The workload a TrainingJob stands for, as an Event's target (``kopf.event`` takes a
    body): ``spec.owner``, else its ownerReference; None for a hand-written TrainingJob with a
    selector. collscope's Events go there too, where ``kubectl describe pytorchjob/...`` (or
    jobset, job) shows them to the job's owner."""
    meta = trainingjob.metadata
    ref = trainingjob.spec.owner
    if ref is None or not ref.model_fields_set:  # absent or {}: the ownerReference
        first = next(iter(meta.get("ownerReferences") or ()), None)
        ref = None if not first else resources.OwnerRef.model_validate(first)
    if ref is None or not all((ref.api_version, ref.kind, ref.name)):
        return None
    return {
        "apiVersion": ref.api_version,
        "kind": ref.kind,
        "metadata": {
            "name": ref.name,
            "namespace": str(meta.get("namespace", "")),
            "uid": ref.uid,
        },
    }


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy a Kubernetes LabelSelector (``matchLabels`` and
    ``matchExpressions`` with In, NotIn, Exists, DoesNotExist, all ANDed), as the API server
    reads ``TrainingJob.spec.selector``. An empty selector matches nothing here (it would
    select every pod of the namespace: never what a hand-written TrainingJob means); an
    unknown operator matches nothing."""
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for e in expressions:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True
