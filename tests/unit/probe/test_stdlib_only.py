"""The probe runs in whatever Python the training image has, with nothing installed: every
module of ``collscope.probe`` imports the standard library only (import-linter forbids the
known third-party packages; this also catches one nobody thought of)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import collscope.probe

PROBE = Path(next(iter(collscope.probe.__path__)))
SIBLINGS = {"collscope_probe"}  # site/'s modules import each other as top-level names in a pod


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_probe_module_imports_the_standard_library_only() -> None:
    files = sorted(PROBE.rglob("*.py"))
    assert len(files) >= 4
    for f in files:
        foreign = _imports(f) - set(sys.stdlib_module_names) - SIBLINGS
        assert not foreign, f"{f.relative_to(PROBE)} imports {sorted(foreign)}"
