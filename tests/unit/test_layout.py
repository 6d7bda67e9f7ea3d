"""Guards for the source layout of STYLE.md: source roots are not packages, and every
subpackage is listed in pyproject.toml (or it silently goes missing from the wheel)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ("operator", "nodeagent")


def test_source_roots_are_not_packages() -> None:
    for root in SOURCE_ROOTS:
        assert not (ROOT / root / "__init__.py").exists(), (
            f"{root}/__init__.py shadows the standard library's '{root}' module"
        )
        assert not (ROOT / root / "collscope" / "__init__.py").exists(), (
            f"{root}/collscope must stay an implicit namespace package"
        )


def test_stdlib_operator_is_not_shadowed_from_repo_root() -> None:
    # -S: no site-packages, so an editable install cannot preload the real module and hide a
    # shadowing operator/__init__.py in the current directory.
    out = subprocess.run(
        [sys.executable, "-S", "-c", "import operator; print(operator.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    assert not out.startswith(str(ROOT)), f"'import operator' resolved to {out}"


def test_every_subpackage_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    package_dir = config["tool"]["setuptools"]["package-dir"]
    found: set[str] = set()
    for root in SOURCE_ROOTS:
        for py in (ROOT / root / "collscope").rglob("*.py"):
            rel = py.parent.relative_to(ROOT / root)
            found.add(".".join(rel.parts))
    assert found, "no Python sources found under the source roots"
    assert found <= listed, f"subpackages missing from pyproject packages: {found - listed}"
    for name, path in package_dir.items():
        assert (ROOT / path).is_dir(), f"package-dir {name} -> {path} does not exist"


MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400
WHY = "Why one module:"


def _sources() -> list[Path]:
    return sorted(p for root in SOURCE_ROOTS for p in (ROOT / root / "collscope").rglob("*.py"))


def test_no_function_is_longer_than_80_lines() -> None:
    """Issue 13's measure of a readable room: a function that does not fit on a screen and a
    half is two functions (decorators and docstring included, as the reader sees them)."""
    import ast

    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_a_long_module_says_why_it_is_one() -> None:
    """A module over 400 lines carries, in its docstring, a paragraph starting 'Why one
    module:' (issue 13): length is allowed where it is a decision, not where it accumulated."""
    import ast

    unexplained = []
    for path in _sources():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if WHY not in doc:
                unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not unexplained, f"modules over {MAX_MODULE_LINES} lines without '{WHY}': {unexplained}"
