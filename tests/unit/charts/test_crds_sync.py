"""The chart's CRDs are generated from crds/ (charts/sync_crds.py) and never drift."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


def sync_module() -> Any:
    spec = importlib.util.spec_from_file_location("sync_crds", ROOT / "charts" / "sync_crds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chart_crds_match_the_source() -> None:
    stale = sync_module().drift()
    assert stale == [], f"run `python charts/sync_crds.py`: {stale} differ from crds/"


def test_every_source_crd_is_in_the_chart() -> None:
    names = {p.name for p in (ROOT / "crds").glob("*.yaml")}
    assert names and names == {p.name for p in (ROOT / "charts/collscope/crds").glob("*.yaml")}


def test_drift_is_detected_and_repaired(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sync = sync_module()
    target = tmp_path / "crds"
    shutil.copytree(sync.TARGET, target)
    monkeypatch.setattr(sync, "TARGET", target)
    assert sync.drift() == []
    edited = target / "collscope.dev_diagnoses.yaml"
    edited.write_text(edited.read_text() + "# hand edit\n")
    (target / "stray.yaml").write_text("kind: Nothing\n")
    assert sync.drift() == ["collscope.dev_diagnoses.yaml", "stray.yaml"]
    assert sync.main(["--check"]) == 1
    sync.sync()
    assert sync.drift() == []
    assert not (target / "stray.yaml").exists()
