"""kubectl's table of a custom resource, from the CRD's printer columns: what `collscope demo`
prints is what `kubectl get diagnoses -o wide` prints."""

from __future__ import annotations

import datetime
import itertools
import re
from typing import Any

import pytest

from collscope.operator.analysis import diagnosis
from collscope.operator.domain import printer, report

NOW = datetime.datetime(2026, 11, 22, 21, 0, 0, tzinfo=datetime.UTC)


def _diag(**extra: Any) -> diagnosis.Diagnosis:
    fields: dict[str, Any] = {
        "anomaly": True,
        "trigger": "hang",
        "category": "hang.gpu",
        "confidence": 0.93,
        "culprits": [
            diagnosis.Culprit(
                rank=5, node="node-1", gpu=1, nic="mlx5_1", component="gpu", score=0.9
            )
        ],
        "evidence": ["rank 5 never finished AllReduce seq 42\n(GPU 1 at 0 % SM)", "more"],
    }
    return diagnosis.Diagnosis(**(fields | extra))


def test_the_package_copy_has_the_crds_columns(crds: Any) -> None:
    assert printer.columns_of(crds.load("diagnoses")) == printer.diagnosis_columns()


def test_demo_table_is_kubectl_get_diagnoses_wide() -> None:
    """Written out by kubectl's rules: NAME then the CRD's columns in order, priority 1 ones
    with -o wide, tabwriter padding 3, a missing value (no remediation: ACTION) empty, a
    message cut at its newline with '...', the age since creationTimestamp."""
    got = report.diagnoses_wide(_diag(), name="demo-hang-7", job="demo", age_s=13, now=NOW)
    assert got == (
        "NAME          JOB    TRIGGER   CATEGORY   CULPRIT NODE   RANK   CONFIDENCE   "
        "COMPONENT   PHASE       ACTION   AGE   GPU   NIC      MESSAGE\n"
        "demo-hang-7   demo   hang      hang.gpu   node-1         5      0.93         "
        "gpu         Diagnosed            13s   1     mlx5_1   "
        "rank 5 never finished AllReduce seq 42..."
    )


def test_header_is_every_crd_column_upper_cased(crds: Any) -> None:
    (version,) = crds.load("diagnoses")["spec"]["versions"]
    want = ["NAME"] + [c["name"].upper() for c in version["additionalPrinterColumns"]]
    head = report.diagnoses_wide(_diag(), name="d", job="j", age_s=1).splitlines()[0]
    assert re.split(r" {3,}", head) == want


def test_no_anomaly_has_no_invented_phase() -> None:
    quiet = diagnosis.Diagnosis(anomaly=False, trigger="slow", confidence=1.0, evidence=[])
    head, row = report.diagnoses_wide(quiet, name="d", job="j", age_s=200, now=NOW).splitlines()
    starts = [m.start() for m in re.finditer(r"(?:^| {3})(\S[^ ]*(?: \S+)*)", head)]
    starts = [s if s == 0 else s + 3 for s in starts] + [len(row) + 1]
    names = [head[a:b].strip() for a, b in itertools.pairwise(starts)]
    cells = dict(zip(names, [row[a:b].strip() for a, b in itertools.pairwise(starts)], strict=True))
    assert cells["PHASE"] == "Diagnosed" and cells["CONFIDENCE"] == "1"
    assert cells["AGE"] == "3m20s" and cells["CATEGORY"] == ""
    assert "Healthy" not in row


def test_without_wide_the_priority_columns_hide() -> None:
    obj = report.diagnosis_object(_diag(), name="d", job="j", created=NOW)
    text = printer.table([obj], printer.diagnosis_columns(), wide=False, now=NOW)
    assert text.splitlines()[0].split()[-1] == "AGE" and "MESSAGE" not in text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-5, "<invalid>"), (-1, "0s"), (0, "0s"), (119, "119s"), (120, "2m"), (125, "2m5s"),
     (600, "10m"), (10_799, "179m"), (10_800, "3h"), (11_000, "3h3m"), (8 * 3600, "8h"),
     (47 * 3600, "47h"), (48 * 3600, "2d"), (50 * 3600, "2d2h"), (8 * 86400, "8d"),
     (800 * 86400, "2y70d"), (3000 * 86400, "8y")],
)  # fmt: skip
def test_age_is_kubectls(seconds: int, text: str) -> None:
    assert printer.human_duration(seconds) == text


@pytest.mark.parametrize(
    ("x", "text"),
    [(0.93, "0.93"), (1.0, "1"), (0.0, "0"), (1e-05, "1e-05"), (0.0001, "0.0001"),
     (123456.0, "123456"), (1234567.0, "1.234567e+06"), (-2.5, "-2.5"),
     (1 / 3, "0.3333333333333333")],
)  # fmt: skip
def test_numbers_print_as_go_does(x: float, text: str) -> None:
    assert printer.go_float(x) == text


def test_cells_by_type() -> None:
    col = printer.Column("X", "integer", ".a")
    assert printer.cell(col, 3.0, NOW) == "3" and printer.cell(col, None, NOW) == ""
    assert printer.cell(printer.Column("B", "boolean", ".b"), True, NOW) == "true"
    when = printer.Column("Age", "date", ".c")
    assert printer.cell(when, "not a time", NOW) == "<invalid>"
    assert printer.lookup({"a": {"b": 1}}, ".a.b") == 1 and printer.lookup({}, ".a.b") is None
