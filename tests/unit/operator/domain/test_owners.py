"""Workload of an opted-in pod (controller chains of real training workloads) and the name and
ownerReference of its TrainingJob."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collscope.operator import errors
from collscope.operator.domain import ids, owners, resources


def ref(kind: str, name: str, api: str = "v1", *, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": f"uid-{kind}-{name}",
            "controller": controller}  # fmt: skip


class Cluster:
    """Owner metadata by (kind, name); records every lookup made."""

    def __init__(self, objects: Mapping[tuple[str, str], Mapping[str, Any] | None]) -> None:
        self.objects = objects
        self.looked_up: list[tuple[str, str, str]] = []

    async def lookup(self, owner: owners.OwnerRef, ns: ids.Namespace) -> Mapping[str, Any] | None:
        self.looked_up.append((owner.kind, owner.name, ns))
        return self.objects.get((owner.kind, owner.name))


def resolve(pod_refs: list[dict[str, Any]], cluster: Cluster) -> owners.OwnerRef | None:
    meta = {"name": "p", "namespace": "ml", "ownerReferences": pod_refs}
    return asyncio.run(owners.resolve(meta, cluster.lookup))


def test_plain_job() -> None:
    cluster = Cluster({("Job", "train"): {"name": "train"}})
    got = resolve([ref("Job", "train", "batch/v1")], cluster)
    assert got == owners.OwnerRef("batch/v1", "Job", "train", "uid-Job-train")
    assert cluster.looked_up == [("Job", "train", "ml")]


def test_jobset_through_its_job() -> None:
    js = ref("JobSet", "llama", "jobset.x-k8s.io/v1alpha2")
    cluster = Cluster({("Job", "llama-workers-0"): {"ownerReferences": [js]}})
    got = resolve([ref("Job", "llama-workers-0", "batch/v1")], cluster)
    assert got is not None and (got.kind, got.name) == ("JobSet", "llama")


def test_leaderworkerset_through_its_statefulset() -> None:
    lws = ref("LeaderWorkerSet", "serve", "leaderworkerset.x-k8s.io/v1")
    cluster = Cluster({("StatefulSet", "serve-0"): {"ownerReferences": [lws]}})
    got = resolve([ref("StatefulSet", "serve-0", "apps/v1")], cluster)
    assert got is not None and got.kind == "LeaderWorkerSet"


def test_top_level_kinds_are_not_looked_up() -> None:
    cluster = Cluster({})
    got = resolve([ref("PyTorchJob", "bert", "kubeflow.org/v1")], cluster)
    assert got is not None and got.kind == "PyTorchJob"
    assert cluster.looked_up == []


def test_unreadable_owner_stops_the_walk_there() -> None:
    got = resolve([ref("StatefulSet", "sts", "apps/v1")], Cluster({("StatefulSet", "sts"): None}))
    assert got is not None and got.kind == "StatefulSet"


def test_non_controller_refs_and_bare_pods_are_not_grouped() -> None:
    assert resolve([], Cluster({})) is None
    assert resolve([ref("Job", "j", controller=False)], Cluster({})) is None


def test_cycles_end() -> None:
    a, b = ref("Job", "a"), ref("Job", "b")
    cluster = Cluster(
        {("Job", "a"): {"ownerReferences": [b]}, ("Job", "b"): {"ownerReferences": [a]}}
    )
    got = resolve([a], cluster)
    assert got is not None and len(cluster.looked_up) == 2


def test_opt_in() -> None:
    assert owners.is_opted_in({"annotations": {"collscope.dev/diagnose": "true"}})
    assert owners.is_opted_in({"annotations": {"collscope.dev/diagnose": "True"}})
    assert not owners.is_opted_in({"annotations": {"collscope.dev/diagnose": "false"}})
    assert not owners.is_opted_in({"annotations": None})
    assert not owners.is_opted_in({})


def test_owner_reference_lets_the_workload_collect_the_trainingjob() -> None:
    o = owners.OwnerRef("batch/v1", "Job", "train", "u1")
    assert o.as_owner_reference() == {
        "apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u1",
        "controller": False, "blockOwnerDeletion": False,
    }  # fmt: skip
    assert o.as_spec_owner() == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "train",
        "uid": "u1",
    }


def test_trainingjob_name_plain() -> None:
    assert (
        owners.trainingjob_name(owners.OwnerRef("v1", "PyTorchJob", "bert", "u"))
        == "pytorchjob-bert"
    )


DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@given(kind=st.sampled_from(["Job", "JobSet", "X_Kind"]), name=st.text(min_size=1, max_size=300))
def test_trainingjob_name_is_always_valid(kind: str, name: str) -> None:
    got = owners.trainingjob_name(owners.OwnerRef("v1", kind, name, "u"))
    assert len(got) <= owners.NAME_MAX
    assert DNS1123.match(got), got


@pytest.mark.parametrize("name", ["A", "a_b", "x" * 300])
def test_mangled_names_do_not_collide(name: str) -> None:
    a = owners.trainingjob_name(owners.OwnerRef("v1", "Job", name, "u"))
    b = owners.trainingjob_name(owners.OwnerRef("v1", "Job", name + "y", "u"))
    assert a != b


def test_trainingjob_body() -> None:
    o = owners.OwnerRef("batch/v1", "Job", "train", "u1")
    body = owners.trainingjob_body(o, ids.Namespace("ml"), "tp=8,pp=2,dp=4")
    assert body["metadata"]["name"] == "job-train" and body["metadata"]["namespace"] == "ml"
    assert body["metadata"]["ownerReferences"] == [o.as_owner_reference()]
    assert body["spec"] == {
        "owner": o.as_spec_owner(),
        "parallelism": {"tp": 8, "pp": 2, "dp": 4},
    }
    odd = owners.trainingjob_body(o, ids.Namespace("ml"), "tp=2,dp=2,cp=2,order=dp-tp-cp-ep-pp")
    assert odd["spec"]["parallelism"] == {
        "tp": 2,
        "pp": 1,
        "dp": 2,
        "cp": 2,
        "order": "dp-tp-cp-ep-pp",
    }
    assert "parallelism" not in owners.trainingjob_body(o, ids.Namespace("ml"))["spec"]
    with pytest.raises(errors.ParallelismError):
        owners.trainingjob_body(o, ids.Namespace("ml"), "tp=oops")


def test_trainingjob_body_matches_the_crd(crds: Any) -> None:
    o = owners.OwnerRef("jobset.x-k8s.io/v1alpha2", "JobSet", "llama", "u")
    body = owners.trainingjob_body(o, ids.Namespace("ml"), "tp=8,dp=2,order=tp-cp-ep-pp-dp")
    crds.validator("trainingjobs", "spec").validate(body["spec"])


def test_label_selectors_as_the_api_server_reads_them() -> None:
    labels = {"app": "llama", "role": "worker", "tier": "gpu"}
    assert owners.selector_matches({"matchLabels": {"app": "llama"}}, labels)
    assert not owners.selector_matches({"matchLabels": {"app": "bert"}}, labels)
    expr: list[dict[str, Any]] = [
            {"key": "role", "operator": "In", "values": ["worker", "master"]},
            {"key": "tier", "operator": "NotIn", "values": ["cpu"]},
            {"key": "app", "operator": "Exists"},
            {"key": "debug", "operator": "DoesNotExist"}]  # fmt: skip
    assert owners.selector_matches({"matchLabels": {"app": "llama"}, "matchExpressions": expr},
                                   labels)  # fmt: skip
    for i, flip in enumerate(([], ["cpu", "gpu"], None, None)):
        broken = [dict(e) for e in expr]
        if flip is not None:
            broken[i]["values"] = flip
        else:
            broken[i]["operator"] = {"Exists": "DoesNotExist", "DoesNotExist": "Exists"}[
                broken[i]["operator"]
            ]
        assert not owners.selector_matches({"matchExpressions": broken}, labels), broken[i]
    assert owners.selector_matches(
        {"matchExpressions": [{"key": "x", "operator": "NotIn", "values": ["a"]}]}, labels
    )  # NotIn holds for a missing label, as in Kubernetes
    # An empty selector would take every pod of the namespace: never meant here.
    assert not owners.selector_matches({}, labels)
    assert not owners.selector_matches({"matchLabels": {}, "matchExpressions": []}, labels)
    assert not owners.selector_matches(
        {"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}, labels
    )


def test_events_also_go_to_the_workload() -> None:
    """The TrainingJob's workload (spec.owner, else its ownerReference) as an Event target."""
    ref = owners.OwnerRef("kubeflow.org/v1", "PyTorchJob", "llama", "u-1")
    tj = owners.trainingjob_body(ref, ids.Namespace("ml"))
    want = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "llama", "namespace": "ml", "uid": "u-1"}}  # fmt: skip
    assert owners.workload_of(resources.TrainingJob.parse(tj)) == want
    del tj["spec"]["owner"]
    assert owners.workload_of(resources.TrainingJob.parse(tj)) == want  # the ownerReference
    by_hand = {"metadata": {"name": "x", "namespace": "ml"}, "spec": {"selector": {}}}
    assert owners.workload_of(resources.TrainingJob.parse(by_hand)) is None
