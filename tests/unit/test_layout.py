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
