"""The CRDs in crds/: structural, complete, and accepting what the operator writes (validated
with the ``crds`` fixture of conftest.py)."""

from __future__ import annotations

import copy
import datetime
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from collscope.operator.analysis import diagnosis
from collscope.operator.domain import policy, status

NOW = datetime.datetime(2026, 11, 22, 21, 0, 0, tzinfo=datetime.UTC)


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for key, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("name", ["trainingjobs", "diagnoses"])
def test_crd_is_structural_and_typed(crds: Any, name: str) -> None:
    crd = crds.load(name)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"{name}.collscope.dev"
    assert crd["spec"]["group"] == "collscope.dev"
    assert crd["spec"]["names"]["plural"] == name
    assert "collscope" in crd["spec"]["names"]["categories"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    python_types: dict[str, type | tuple[type, ...]] = {
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
    }
    for path, node in walk(crds.schema(name)):
        assert "type" in node, f"{name}{path}: no type"
        if node["type"] == "object" and path != ".metadata":
            assert "properties" in node or "additionalProperties" in node, f"{name}{path}"
            assert not ("properties" in node and "additionalProperties" in node), f"{name}{path}"
        if node["type"] == "array":
            assert isinstance(node.get("items"), dict), f"{name}{path}: array without items"
        for key in node.get("required", ()):
            assert key in node["properties"], f"{name}{path}: required {key} not defined"
        for value in node.get("enum", ()):
            assert isinstance(value, python_types[node["type"]]), f"{name}{path}: {value!r}"
        if node.get("x-kubernetes-list-type") == "map":
            assert set(node["x-kubernetes-list-map-keys"]) <= set(node["items"]["required"])


def columns(crds: Any, name: str) -> list[tuple[str, str]]:
    (version,) = crds.load(name)["spec"]["versions"]
    return [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]


def test_printer_columns_are_the_issues(crds: Any) -> None:
    assert [n for n, _ in columns(crds, "trainingjobs")] == [
        "Ranks",
        "Nodes",
        "Phase",
        "Health",
        "Age",
    ]
    assert [n for n, _ in columns(crds, "diagnoses")] == [
        "Job", "Trigger", "Category", "Culprit Node", "Rank", "Confidence", "Component", "Phase",
        "Action", "Age", "GPU", "NIC", "Message",
    ]  # fmt: skip
    (version,) = crds.load("diagnoses")["spec"]["versions"]
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority")]
    assert wide == ["GPU", "NIC", "Message"]  # kubectl get diagnoses -o wide


@pytest.mark.parametrize("name", ["trainingjobs", "diagnoses"])
def test_every_list_is_bounded(crds: Any, name: str) -> None:
    """An object past etcd's 1.5 MiB cannot be written: every array says how long it may get."""
    unbounded = [p for p, n in walk(crds.schema(name)) if n["type"] == "array"]
    unbounded = [p for p in unbounded if "maxItems" not in dict(walk(crds.schema(name)))[p]]
    assert unbounded == []


@pytest.mark.parametrize("name", ["trainingjobs", "diagnoses"])
def test_printer_columns_point_at_schema_fields(crds: Any, name: str) -> None:
    schema = crds.schema(name)
    for column, path in columns(crds, name):
        node = schema
        parts = path.lstrip(".").split(".")
        if parts[0] == "metadata":
            continue
        for part in parts:
            assert part in node["properties"], f"{column}: {path} not in the schema"
            node = node["properties"][part]


def test_short_names(crds: Any) -> None:
    assert crds.load("trainingjobs")["spec"]["names"]["shortNames"] == ["tj"]
    assert crds.load("diagnoses")["spec"]["names"]["shortNames"] == ["diag"]


def test_category_enums_are_the_category_table(crds: Any) -> None:
    props = crds.schema("diagnoses")["properties"]["status"]["properties"]
    assert props["category"]["enum"] == list(diagnosis.CATEGORY_NAMES)
    assert props["result"]["properties"]["category"]["enum"] == list(diagnosis.CATEGORY_NAMES)
    remediable = crds.schema("trainingjobs")["properties"]["spec"]["properties"]["diagnosis"]
    enum = remediable["properties"]["remediation"]["properties"]["categories"]["items"]["enum"]
    assert set(enum) == {c.value.name for c in diagnosis.Category if c.value.hardware}


def test_diagnosis_phases_match_the_state_machine(crds: Any) -> None:
    props = crds.schema("diagnoses")["properties"]["status"]["properties"]
    assert props["phase"]["enum"] == list(status.TRANSITIONS)


_ANALYZED: dict[str, dict[str, Any]] = {}


def analyzed(fault: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``collscope analyze --json`` on a simulated 16-rank bundle (cached per fault)."""
    if fault not in _ANALYZED:
        out = tmp_path_factory.mktemp(f"bundle-{fault}") / "b"
        cli = [sys.executable, "-m", "collscope.operator.cli"]
        sim = ["simulate", "--ranks", "16", "--gpus-per-node", "8", "--duration", "6"]
        sim += ["--fault", fault, "--onset", "2", "--seed", "1", "--out", str(out)]
        if fault != "none":
            sim += ["--target", "5"]
        subprocess.run([*cli, *sim], check=True, capture_output=True, timeout=60)
        done = subprocess.run(
            [*cli, "analyze", str(out), "--json"],
            check=False,  # exits non-zero when it finds an anomaly; stdout is what counts
            capture_output=True,
            text=True,
            timeout=60,
        )
        _ANALYZED[fault] = json.loads(done.stdout)
    return _ANALYZED[fault]


@pytest.mark.parametrize("fault", ["nic-down", "none"])
def test_status_schema_accepts_a_real_analysis(
    crds: Any, fault: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    raw = analyzed(fault, tmp_path_factory)
    assert raw["anomaly"] is (fault != "none")
    check = crds.validator("diagnoses", "status")
    check.validate({"phase": "Diagnosed", "result": raw})  # as printed, nulls included
    d = diagnosis.Diagnosis.model_validate(raw)
    built = status.diagnosis_status(d, phase="Diagnosed", generation=1, conditions=None, now=NOW)
    check.validate(built)
    if fault == "nic-down":
        assert built["category"] == "hang.network" and built["culpritRank"] == 5


def test_status_schema_accepts_flow_culprits(crds: Any) -> None:
    d = diagnosis.Diagnosis(
        anomaly=True,
        trigger="slow",
        category="slow.network",
        culprits=[
            diagnosis.Culprit(component="link", score=0.8, switch="leaf-3", job="job-1"),
            diagnosis.Culprit(rank=3, component="nic", score=0.5, group="job-1/dp-0"),
            diagnosis.Culprit(
                rank=4, gpu=2, gpu_uuid="GPU-8c1f", nic="mlx5_2", component="gpu", score=0.4
            ),
        ],
        confidence=0.8,
        precision="node",
    )
    crds.validator("diagnoses", "status").validate(
        status.diagnosis_status(d, phase="Diagnosed", generation=2, conditions=None, now=NOW)
    )


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("category",), "hang.bogus"),
        (("phase",), "Done"),
        (("result", "category"), "slow.everything"),
        (("result", "confidence"), 1.5),
        (("result", "culprits", 0, "component"), "cpu"),
        (("result", "culprits", 0, "rank"), -1),
        (("result", "schema"), "collscope.diagnosis/v2"),
        (("conditions", 0, "status"), "Maybe"),
        (("actions", 0, "outcome"), "Sort of"),
    ],
)
def test_status_schema_rejects_bad_values(crds: Any, path: tuple[Any, ...], value: Any) -> None:
    good: dict[str, Any] = {
        "phase": "Remediated",
        "category": "hang.gpu",
        "result": {
            "schema": "collscope.diagnosis/v1",
            "anomaly": True,
            "category": "hang.gpu",
            "culprits": [{"rank": 2, "component": "gpu", "score": 0.9}],
            "confidence": 0.9,
        },
        "conditions": [
            {"type": "Diagnosed", "status": "True", "reason": "HangGpu", "lastTransitionTime": "x"}
        ],
        "actions": [{"action": "cordon", "outcome": "Done", "time": "2026-11-22T21:00:00Z"}],
    }
    check = crds.validator("diagnoses", "status")
    check.validate(good)
    bad = copy.deepcopy(good)
    node: Any = bad
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        check.validate(bad)


def test_diagnosis_spec_validation(crds: Any) -> None:
    check = crds.validator("diagnoses", "spec")
    check.validate({"trainingJob": {"name": "llama"}, "trigger": "manual"})
    for bad in (
        {"trainingJob": {"name": "llama"}, "trigger": "panic"},
        {"trigger": "hang"},
        {"trainingJob": {"name": ""}, "trigger": "hang"},
        {"trainingJob": {"name": "x"}, "trigger": "hang", "requestedActions": ["reboot"]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            check.validate(bad)


def test_trainingjob_spec_validation(crds: Any) -> None:
    check = crds.validator("trainingjobs", "spec")
    good = {
        "owner": {"apiVersion": "batch/v1", "kind": "Job", "name": "llama", "uid": "u"},
        "parallelism": {"tp": 8, "pp": 2, "dp": 4, "order": "tp-cp-ep-dp-pp"},
        "diagnosis": {
            "trigger": {"intervalSeconds": 1, "throughputDrop": 0.5},
            "sampling": {"maxRanks": 10},
            "remediation": {"dryRun": True, "categories": ["hang.gpu"]},
        },
    }
    check.validate(good)
    for path, value in [
        (("parallelism", "tp"), 0),
        (("parallelism", "order"), "tp-dp"),
        (("diagnosis", "sampling", "maxRanks"), 0),
        (("diagnosis", "trigger", "throughputDrop"), 1),
        (("diagnosis", "trigger", "intervalSeconds"), 0.01),
        (("diagnosis", "remediation", "categories"), ["hang.not_entered"]),
        (("diagnosis", "remediation", "confidenceThreshold"), 2),
    ]:
        bad = copy.deepcopy(good)
        node: Any = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            check.validate(bad)


def test_trainingjob_needs_a_selector_or_owner_rule(crds: Any) -> None:
    spec = crds.schema("trainingjobs")["properties"]["spec"]
    (rule,) = spec["x-kubernetes-validations"]
    assert rule["rule"] == "has(self.selector) || has(self.owner)"


def test_trainingjob_remediation_fields_are_the_policy_keys(crds: Any) -> None:
    """Every key ``policy.RemediationPolicy.merged`` reads can be set through the API, and the
    API accepts no remediation key the policy would refuse."""
    crd = crds.load("trainingjobs")
    props = dict(walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))
    remediation = props[".spec.diagnosis.remediation"]["properties"]
    assert set(remediation) == set(policy.KEYS)
