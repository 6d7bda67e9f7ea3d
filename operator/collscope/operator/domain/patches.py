"""JSON Patch (RFC 6902) building blocks shared by the webhook and node remediation."""

from __future__ import annotations

from typing import Any

Op = dict[str, Any]  # one operation: {"op": "add", "path": "/spec/x", "value": ...}


def pointer(*parts: str) -> str:
    """A JSON Pointer (RFC 6901) from unescaped parts: ``pointer("metadata", "labels", "a/b")``
    is ``/metadata/labels/a~1b``."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)
