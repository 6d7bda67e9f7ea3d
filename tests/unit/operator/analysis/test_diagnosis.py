"""The Diagnosis record: JSON shape of docs/spec/bundle-v1.md, round trip, the category table."""

from __future__ import annotations

import json
import pathlib
import re

import pydantic
import pytest

from collscope.operator.analysis import diagnosis

# Field names of the "Diagnosis" section of docs/spec/bundle-v1.md (precision is our extension).
SPEC_FIELDS = {
    "schema",
    "anomaly",
    "trigger",
    "detected_at",
    "category",
    "culprits",
    "confidence",
    "evidence",
}
SPEC_CULPRIT_FIELDS = {"rank", "node", "pod", "gpu", "component", "comm", "channel", "peer"}
SPEC_CATEGORIES = {
    "hang.not_entered": "hang",
    "hang.inconsistent": "hang",
    "hang.network": "hang",
    "hang.gpu": "hang",
    "hang.process": "hang",
    "hang.node": "hang",
    "slow.compute": "slow",
    "slow.network": "slow",
    "slow.mixed": "slow",
    "slow.host": "slow",
}


def _diag() -> diagnosis.Diagnosis:
    return diagnosis.Diagnosis(
        anomaly=True,
        trigger="hang",
        detected_at=1_732_001_234_000_000_000,
        category="hang.network",
        culprits=[
            diagnosis.Culprit(
                rank=12,
                node="gpu-node-02",
                pod="llama-12",
                gpu=4,
                nic="mlx5_4",
                component="nic",
                comm="0x1f3a",
                channel=3,
                peer=13,
                score=0.93,
            )
        ],
        confidence=0.9,
        evidence=["rank 12 sent 40 chunks, 31 delivered"],
        precision="rank",
    )


def test_to_json_round_trips() -> None:
    d = _diag()
    back = diagnosis.Diagnosis.model_validate_json(d.to_json())
    assert back == d
    assert back.culprits[0].peer == 13 and back.evidence == d.evidence


def test_to_json_uses_the_spec_field_names() -> None:
    doc = json.loads(_diag().to_json())
    assert set(doc) >= SPEC_FIELDS
    assert set(doc) - SPEC_FIELDS <= {"precision"}
    assert doc["schema"] == "collscope.diagnosis/v1" == diagnosis.DIAGNOSIS_SCHEMA
    assert "schema_" not in doc
    culprit = doc["culprits"][0]
    assert SPEC_CULPRIT_FIELDS | {"score"} <= set(culprit)
    assert culprit["rank"] == 12 and culprit["component"] == "nic" and culprit["score"] == 0.93


def test_healthy_diagnosis_has_null_trigger_and_category() -> None:
    doc = json.loads(diagnosis.Diagnosis(anomaly=False, evidence=["checked"]).to_json())
    assert doc["anomaly"] is False
    assert doc["trigger"] is None and doc["category"] is None and doc["detected_at"] is None
    assert doc["culprits"] == [] and doc["evidence"] == ["checked"]


def test_reader_accepts_the_spec_sample_and_ignores_unknown_fields() -> None:
    sample = {
        "schema": "collscope.diagnosis/v1",
        "anomaly": True,
        "trigger": "slow",
        "detected_at": 5,
        "category": "slow.compute",
        "culprits": [{"rank": 1, "component": "gpu", "score": 1.0, "future": "x"}],
        "confidence": 0.5,
        "evidence": [],
        "added_in_v2": 1,
    }
    d = diagnosis.Diagnosis.model_validate(sample)
    assert d.trigger == "slow" and d.culprits[0].rank == 1 and d.culprits[0].node is None


@pytest.mark.parametrize(
    ("field", "value"),
    [("confidence", 1.5), ("confidence", -0.1), ("trigger", "crash")],
)
def test_out_of_range_diagnosis_is_rejected(field: str, value: object) -> None:
    with pytest.raises(pydantic.ValidationError):
        diagnosis.Diagnosis.model_validate({"anomaly": True, field: value})


@pytest.mark.parametrize(("field", "value"), [("score", 1.01), ("rank", -1), ("component", "disk")])
def test_out_of_range_culprit_is_rejected(field: str, value: object) -> None:
    base: dict[str, object] = {"rank": 0, "component": "gpu", "score": 0.5}
    with pytest.raises(pydantic.ValidationError):
        diagnosis.Culprit.model_validate(base | {field: value})


def test_categories_are_the_spec_table() -> None:
    assert set(diagnosis.CATEGORY_NAMES) == set(SPEC_CATEGORIES)
    assert len(diagnosis.CATEGORY_NAMES) == len(set(diagnosis.CATEGORY_NAMES))
    for cat in diagnosis.Category:
        info = cat.value
        assert info.trigger == SPEC_CATEGORIES[info.name]
        assert info.name.startswith(info.trigger + ".")
        assert info.meaning and info.action


def test_the_spec_document_lists_every_category() -> None:
    spec = pathlib.Path(__file__).resolve().parents[4] / "docs" / "spec" / "bundle-v1.md"
    listed = re.findall(r"^\| `((?:hang|slow)\.\w+)` \|", spec.read_text(), re.MULTILINE)
    assert listed == list(diagnosis.CATEGORY_NAMES)


@pytest.mark.parametrize("cat", list(diagnosis.Category))
def test_from_name_inverts_the_name(cat: diagnosis.Category) -> None:
    assert diagnosis.Category.from_name(cat.value.name) is cat


def test_from_name_rejects_unknown() -> None:
    with pytest.raises(ValueError, match=r"hang\.disk"):
        diagnosis.Category.from_name("hang.disk")


def test_category_components_and_hardware_flags() -> None:
    c = diagnosis.Category
    assert c.HANG_NETWORK.value.component == "nic" and c.HANG_NETWORK.value.hardware
    assert c.HANG_GPU.value.component == "gpu" and c.HANG_GPU.value.hardware
    assert c.SLOW_HOST.value.component == "host"
    for software in (c.HANG_NOT_ENTERED, c.HANG_INCONSISTENT):
        # a software fault must never make remediation cordon a node
        assert software.value.component == "software" and not software.value.hardware


def test_category_info_is_frozen() -> None:
    info = diagnosis.Category.HANG_GPU.value
    with pytest.raises(AttributeError):
        info.hardware = False  # type: ignore[misc]
