"""Human renderings of a Diagnosis."""

from __future__ import annotations

from collscope.operator.analysis import diagnosis
from collscope.operator.domain import report


def _diag() -> diagnosis.Diagnosis:
    return diagnosis.Diagnosis(
        anomaly=True,
        trigger="hang",
        detected_at=3_000_000_000,
        category="hang.network",
        culprits=[
            diagnosis.Culprit(
                rank=12, node="gpu-node-01", gpu=4, nic="mlx5_4", component="nic", score=0.9
            )
        ],
        confidence=0.85,
        evidence=["rank 12 sent 40 chunks, 31 delivered"],
    )


def test_summary_names_culprit_cause_and_action() -> None:
    text = report.summary(_diag(), source="b", start_ns=1_000_000_000)
    assert "hang.network" in text and "t=2.00s" in text
    assert "rank 12 (gpu-node-01, GPU 4, mlx5_4)" in text
    assert "action:" in text and "rank 12 sent 40 chunks" in text


def test_summary_healthy() -> None:
    text = report.summary(
        diagnosis.Diagnosis(anomaly=False, evidence=["checked 4 ranks"]), source="b"
    )
    assert "no anomaly" in text and "checked 4 ranks" in text


def test_wide_table_has_printer_columns() -> None:
    text = report.diagnoses_wide(_diag(), name="d1", job="j", age_s=3)
    head, row = text.splitlines()
    assert head.split()[:4] == ["NAME", "JOB", "TRIGGER", "CATEGORY"]
    assert "gpu-node-01" in row and "12" in row.split()
    assert "Healthy" not in text  # no phase the CRD does not have
    assert report.diagnoses_wide(None, name="d1", job="j", age_s=3) == (
        "No resources found in default namespace."
    )
