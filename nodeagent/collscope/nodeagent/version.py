"""The installed collscope version, for every binary's ``--version``.

Read from the package metadata (``pyproject.toml``'s ``version``), so there is one source.
A source tree that was never installed has no metadata: it says so instead of guessing.
"""

from __future__ import annotations

import importlib.metadata
import platform


def version() -> str:
    """``0.1.0``, or ``unknown (not installed)``."""
    try:
        return importlib.metadata.version("collscope")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def line(prog: str) -> str:
    """What ``PROG --version`` prints: ``collscope-agent 0.1.0 (Python 3.11.9)``."""
    return f"{prog} {version()} (Python {platform.python_version()})"
