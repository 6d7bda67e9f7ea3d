"""examples/: every manifest parses, opts its pods in the way the operator reads, declares a
layout the operator accepts, and the hand-written TrainingJob validates against the CRD."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml

from collscope.operator.domain import groups, injection, owners, policy

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"
WORKLOADS = ("pytorchjob.yaml", "jobset.yaml", "job.yaml")


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return doc


def pod_templates(node: Any) -> Iterator[dict[str, Any]]:
    """Every pod template (a ``template`` holding a ``spec.containers``) in a workload."""
    if isinstance(node, dict):
        t = node.get("template")
        if isinstance(t, dict) and "containers" in (t.get("spec") or {}):
            yield t
        for v in node.values():
            yield from pod_templates(v)
    elif isinstance(node, list):
        for v in node:
            yield from pod_templates(v)


def test_every_example_is_listed() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(
        (*WORKLOADS, "trainingjob.yaml", "values-dry-run.yaml")
    )


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_pods_are_opted_in_and_injectable(name: str) -> None:
    doc = load(name)
    templates = list(pod_templates(doc["spec"]))
    assert templates, f"{name}: no pod template found"
    for t in templates:
        meta = t["metadata"]
        assert owners.is_opted_in(meta), f"{name}: pod template not opted in"
        text = meta["annotations"].get("collscope.dev/parallelism")
        if text is not None:
            groups.parse(text)  # raises ParallelismError when the operator could not use it
        ops = injection.patch({"metadata": meta, "spec": t["spec"]}, injection.InjectionSettings())
        paths = {op["path"] for op in ops}
        assert "/spec/initContainers" in paths and "/spec/volumes" in paths, (name, paths)


def test_pytorchjob_layout_matches_its_gpus() -> None:
    doc = load("pytorchjob.yaml")
    specs = doc["spec"]["pytorchReplicaSpecs"]
    pods = sum(s["replicas"] for s in specs.values())
    gpus = specs["Master"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    par = groups.parse(
        specs["Master"]["template"]["metadata"]["annotations"]["collscope.dev/parallelism"]
    )
    assert par.tp * par.pp * par.dp == pods * gpus["nvidia.com/gpu"]


def test_trainingjob_validates_against_the_crd(crds: Any) -> None:
    doc = load("trainingjob.yaml")
    assert (doc["apiVersion"], doc["kind"]) == ("collscope.dev/v1alpha1", "TrainingJob")
    crds.validator("trainingjobs", "spec").validate(doc["spec"])
    p = doc["spec"]["parallelism"]
    groups.parse(",".join(f"{k}={v}" for k, v in p.items()))


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of a values file over the chart's defaults (maps merge, rest replace)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_dry_run_values_validate_against_the_chart_schema() -> None:
    schema = json.loads((EXAMPLES.parent / "charts/collscope/values.schema.json").read_text())
    values = load("values-dry-run.yaml")
    defaults = yaml.safe_load((EXAMPLES.parent / "charts/collscope/values.yaml").read_text())
    jsonschema.validate(merge(defaults, values), schema)  # Helm validates the merged values
    assert values["remediation"]["dryRun"] is True
    policy.RemediationPolicy.from_values(values["remediation"])  # the operator reads it as is
