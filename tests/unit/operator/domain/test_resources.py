"""domain/resources.py: the typed TrainingJob and Diagnosis against their CRDs (one source for
the schema: a field on one side only, or a type or enum that differs, fails here, naming the
path), their defaults, leniency to unknown fields and the errors naming a wrong field."""

from __future__ import annotations

import enum
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from collscope.operator import errors
from collscope.operator.analysis import diagnosis
from collscope.operator.domain import jobs, owners, resources

ROOT = Path(__file__).resolve().parents[4]
SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}

# Paths where the model is looser than the CRD on purpose, and what checks them instead.
LOOSER = {
    # analysis/diagnosis.py keeps category a str (a Literal there would tie analysis to the
    # CRD); test_result_category_names_are_the_crds checks the names.
    "status.result.category",
}


def crd_shape(node: dict[str, Any]) -> dict[str, Any]:
    """The parts of an openAPIV3Schema node both sides must agree on."""
    shape: dict[str, Any] = {"type": node.get("type")}
    if "enum" in node:
        shape["enum"] = sorted(node["enum"])
    if "properties" in node:
        shape["properties"] = {k: crd_shape(v) for k, v in node["properties"].items()}
    if isinstance(node.get("additionalProperties"), dict):
        shape["additionalProperties"] = crd_shape(node["additionalProperties"])
    if isinstance(node.get("items"), dict):
        shape["items"] = crd_shape(node["items"])
    return shape


def model_shape(annotation: Any) -> dict[str, Any]:
    """The same parts, from a model field's annotation."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:  # StrictBool, constrained numbers
        return model_shape(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        assert len(inner) == 1, f"a union the CRD cannot say: {annotation}"
        return model_shape(inner[0])
    if origin is typing.Literal:
        values = typing.get_args(annotation)
        return {"type": SCALARS[type(values[0])], "enum": sorted(values)}
    if origin is list:
        return {"type": "array", "items": model_shape(typing.get_args(annotation)[0])}
    if origin is dict:
        return {
            "type": "object",
            "additionalProperties": model_shape(typing.get_args(annotation)[1]),
        }
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"type": "string", "enum": sorted(m.value for m in annotation)}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {
            "type": "object",
            "properties": {
                f.alias or name: model_shape(f.annotation)
                for name, f in annotation.model_fields.items()
            },
        }
    if annotation in SCALARS:
        return {"type": SCALARS[annotation]}
    raise AssertionError(f"no CRD type for {annotation!r}")


def differences(crd: dict[str, Any], model: dict[str, Any], path: str) -> list[str]:
    out = []
    if crd["type"] != model["type"]:
        return [f"{path}: the CRD says {crd['type']}, the model {model['type']}"]
    if crd.get("enum") != model.get("enum") and not (path in LOOSER and "enum" not in model):
        out.append(f"{path}: enum {crd.get('enum')} in the CRD, {model.get('enum')} in the model")
    props_c, props_m = crd.get("properties", {}), model.get("properties", {})
    out += [f"{path}.{k}: in the CRD, not in the model" for k in sorted(props_c.keys() - props_m)]
    out += [f"{path}.{k}: in the model, not in the CRD" for k in sorted(props_m.keys() - props_c)]
    for k in sorted(props_c.keys() & props_m.keys()):
        out += differences(props_c[k], props_m[k], f"{path}.{k}")
    for part, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        if (part in crd) != (part in model):
            out.append(f"{path}{suffix}: {part} on one side only")
        elif part in crd:
            out += differences(crd[part], model[part], f"{path}{suffix}")
    return out


CASES = [
    ("trainingjobs", "spec", resources.TrainingJobSpec),
    ("trainingjobs", "status", resources.TrainingJobStatus),
    ("diagnoses", "spec", resources.DiagnosisSpec),
    ("diagnoses", "status", resources.DiagnosisStatus),
]


@pytest.mark.parametrize(("plural", "part", "model"), CASES)
def test_the_models_are_the_crds(crds: Any, plural: str, part: str, model: type) -> None:
    crd = crd_shape(crds.schema(plural)["properties"][part])
    assert differences(crd, model_shape(model), part) == []


def test_the_comparison_names_what_differs() -> None:
    crd = crd_shape({"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "string", "enum": ["x", "y"]},
        "c": {"type": "array", "items": {"type": "string"}},
    }})  # fmt: skip

    class M(BaseModel):
        a: float
        b: typing.Literal["x"]
        d: int

    assert differences(crd, model_shape(M), "spec") == [
        "spec.c: in the CRD, not in the model",
        "spec.d: in the model, not in the CRD",
        "spec.a: the CRD says integer, the model number",
        "spec.b: enum ['x', 'y'] in the CRD, ['x'] in the model",
    ]


def test_result_category_names_are_the_crds(crds: Any) -> None:
    result = crds.schema("diagnoses")["properties"]["status"]["properties"]["result"]
    assert sorted(result["properties"]["category"]["enum"]) == sorted(diagnosis.CATEGORY_NAMES)


def test_defaults_are_what_the_code_read_before() -> None:
    spec = resources.TrainingJobSpec.parse(None)
    assert spec.selector is None and spec.owner is None and spec.parallelism is None
    trig = spec.diagnosis.trigger
    assert (trig.interval_seconds, trig.hang_floor_seconds, trig.throughput_drop) == (None,) * 3
    assert spec.diagnosis.sampling.max_ranks is None
    assert spec.diagnosis.remediation.overrides() == {}
    d = resources.DiagnosisSpec.parse({})
    assert (d.training_job.name, d.trigger, d.incident, d.window_seconds) == ("", None, None, None)
    assert d.requested_actions == []
    st = resources.DiagnosisStatus.parse({})
    assert st.phase is None and st.actions is None and st.result is None
    assert jobs.analysis_settings(spec) == jobs.analysis_settings(resources.TrainingJobSpec())


def test_unknown_fields_are_ignored() -> None:
    spec = resources.TrainingJobSpec.parse({
        "future": {"x": 1},
        "diagnosis": {"trigger": {"hangFloorSeconds": 3, "newKnob": True}, "other": []},
        "parallelism": {"tp": 2, "zz": 9},
    })  # fmt: skip
    assert spec.diagnosis.trigger.hang_floor_seconds == 3.0
    assert spec.parallelism is not None and spec.parallelism.as_text() == "tp=2"
    obj = resources.Diagnosis.parse({
        "apiVersion": "collscope.dev/v1alpha1", "kind": "Diagnosis", "metadata": {"name": "d"},
        "spec": {"trainingJob": {"name": "j", "uid": "?"}, "trigger": "hang", "later": 1},
        "status": {"phase": "Diagnosed", "newStatus": {"a": 1}, "result": {
            "schema": "collscope.diagnosis/v1", "anomaly": False, "newer": 2}},
    })  # fmt: skip
    assert obj.spec.training_job.name == "j" and obj.status.result is not None
    assert (
        resources.Diagnosis.parse({"metadata": {}, "spec": None, "status": None}).status.phase
        is None
    )


@pytest.mark.parametrize(
    ("model", "data", "named"),
    [
        (resources.TrainingJobSpec, {"diagnosis": {"trigger": {"intervalSeconds": "fast"}}},
         "TrainingJob spec.diagnosis.trigger.intervalSeconds: "),
        (resources.TrainingJobSpec, {"selector": {"matchExpressions": [{"key": "a",
                                                                        "operator": "Is"}]}},
         "TrainingJob spec.selector.matchExpressions[0].operator: "),
        (resources.TrainingJobSpec, {"diagnosis": {"remediation": {"dryRun": "yes"}}},
         "TrainingJob spec.diagnosis.remediation.dryRun: "),
        (resources.DiagnosisSpec, {"trainingJob": {"name": 7}},
         "Diagnosis spec.trainingJob.name: "),
        (resources.DiagnosisStatus, {"actions": "none"}, "Diagnosis status.actions: "),
    ],
)  # fmt: skip
def test_a_wrong_type_names_the_field(model: Any, data: dict[str, Any], named: str) -> None:
    with pytest.raises(errors.SpecError) as got:
        model.parse(data)
    assert str(got.value).startswith(named), str(got.value)
    assert "(got " in str(got.value)
    assert isinstance(got.value, ValueError)


def test_a_whole_object_names_its_part() -> None:
    with pytest.raises(errors.SpecError, match=r"^TrainingJob spec\.owner\.name: .*\(got 3\)"):
        resources.TrainingJob.parse({"spec": {"owner": {"name": 3}}})


def test_remediation_overrides_are_the_keys_given() -> None:
    spec = resources.TrainingJobSpec.parse(
        {"diagnosis": {"remediation": {"dryRun": False, "categories": ["hang.gpu"]}}}
    )
    assert spec.diagnosis.remediation.overrides() == {"dryRun": False, "categories": ["hang.gpu"]}


def test_parallelism_as_the_annotation() -> None:
    par = resources.Parallelism
    assert par.model_validate({"dp": 4, "tp": 2, "order": "tp-cp-ep-dp-pp"}).as_text() == (
        "tp=2,dp=4,order=tp-cp-ep-dp-pp"
    )
    assert par.model_validate({}).as_text() == ""


def test_the_example_trainingjob_parses() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "trainingjob.yaml").read_text())
    tj = resources.TrainingJob.parse(doc)
    assert tj.spec.selector is not None and tj.spec.selector.as_dict() == {
        "matchLabels": {"app": "bert-large"}
    }
    assert tj.spec.parallelism is not None
    assert tj.spec.parallelism.as_text() == "tp=4,pp=4,dp=8,order=tp-cp-ep-dp-pp"
    assert jobs.analysis_settings(tj.spec).trigger.hang_floor_s == 3.0
    assert tj.spec.diagnosis.sampling.max_ranks == 16
    assert tj.spec.diagnosis.remediation.overrides() == {
        "enabled": True, "dryRun": True, "confidenceThreshold": 0.9,
        "categories": ["hang.gpu", "hang.network"],
    }  # fmt: skip
    assert owners.workload_of(tj) is None  # a selector: no workload to tell
