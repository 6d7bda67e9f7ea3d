"""Shared fixture for operator tests: the CRDs of crds/ as JSON Schema validators.

``jsonschema`` (Draft 4, whose boolean ``exclusiveMinimum`` is OpenAPI 3.0's) validates against
``openAPIV3Schema`` after the OpenAPI-only ``nullable`` becomes a type union and the
``x-kubernetes-*`` extensions are dropped; the API server's own extra checks (CEL rules,
list-map keys) are not emulated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

CRDS = Path(__file__).resolve().parents[3] / "crds"


class Crds:
    """Reads ``crds/collscope.dev_<plural>.yaml``."""

    def load(self, plural: str) -> dict[str, Any]:
        data: dict[str, Any] = yaml.safe_load((CRDS / f"collscope.dev_{plural}.yaml").read_text())
        return data

    def schema(self, plural: str) -> dict[str, Any]:
        schema: dict[str, Any] = self.load(plural)["spec"]["versions"][0]["schema"][
            "openAPIV3Schema"
        ]
        return schema

    def validator(self, plural: str, part: str) -> jsonschema.Draft4Validator:
        """A validator for ``spec`` or ``status`` of that CRD."""
        schema = to_jsonschema(self.schema(plural)["properties"][part])
        jsonschema.Draft4Validator.check_schema(schema)
        return jsonschema.Draft4Validator(schema)


def to_jsonschema(node: Any) -> Any:
    """OpenAPI 3.0 structural schema -> JSON Schema (nullable -> type union, x-* dropped)."""
    if isinstance(node, list):
        return [to_jsonschema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if out.pop("nullable", False):
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


@pytest.fixture
def crds() -> Crds:
    return Crds()
