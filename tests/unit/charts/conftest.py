"""The ``chart`` fixture shared by the chart tests: paths, values, and rendering with Helm's
own engine.

Rendering uses ``helm-python-sdk`` (a dev dependency: Helm's Go SDK behind ctypes; no cluster,
no ``helm`` binary); where it is not installed the rendering tests skip and say so. Conftest
modules cannot be imported by name under ``--import-mode=importlib``, hence one fixture object
rather than importable helpers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml


class ChartFiles:
    root = Path(__file__).resolve().parents[3]
    dir = root / "charts" / "collscope"
    namespace = "collscope-system"

    def values(self) -> dict[str, Any]:
        """values.yaml as shipped."""
        values: dict[str, Any] = yaml.safe_load((self.dir / "values.yaml").read_text())
        return values

    def render(
        self, values: dict[str, Any] | None = None, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """Every object rendered with ``values`` over the defaults (release "collscope")."""
        chart_mod = pytest.importorskip("helm_python.chart", reason="helm-python-sdk missing")
        chart = chart_mod.Chart.load(str(self.dir))
        out = chart.render(values or {}, name="collscope", namespace=namespace or self.namespace)
        docs: list[dict[str, Any]] = []
        for path, text in sorted(out.items()):
            if path.endswith(".yaml"):
                docs += [d for d in yaml.safe_load_all(text) if d]
        return docs

    @staticmethod
    def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
        """The one object of ``kind`` (and ``name``) among ``docs``."""
        hits = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
        assert len(hits) == 1, f"{len(hits)} {kind} {name or ''} rendered"
        return hits[0]

    @staticmethod
    def env(container: dict[str, Any]) -> dict[str, str]:
        """Plain ``value`` env of a container (downward-API entries left out)."""
        return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


@pytest.fixture
def chart() -> ChartFiles:
    return ChartFiles()
