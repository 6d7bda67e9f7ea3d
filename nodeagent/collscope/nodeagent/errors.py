"""Errors raised by the node agent and its public bundle module.

Hierarchy::

    CollscopeError                      root of everything collscope raises on purpose
    └── BundleError(ValueError)         a trace bundle that does not follow spec/bundle-v1.md
        └── BundleFormatError           one precise defect: file, line, field and reason

Foreign exceptions (``OSError``, ``json.JSONDecodeError``, pydantic's ``ValidationError``,
``tarfile`` and ``gzip`` errors) are translated where they are caught, always ``from`` the
original, so a caller handles one family.
"""

from __future__ import annotations


class CollscopeError(Exception):
    """Root of every error collscope raises on purpose."""


class BundleError(CollscopeError, ValueError):
    """A trace bundle cannot be read as spec/bundle-v1.md describes."""


class BundleFormatError(BundleError):
    """A precise defect in a bundle: which file, which line, which field, and why.

    ``str()`` is one line an SRE can act on, e.g.
    ``records.jsonl:17: field 'flows[2].done': must be >= 0 (got -3)``.
    """

    def __init__(
        self, file: str, reason: str, *, line: int | None = None, field: str | None = None
    ) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.reason = reason
        where = file if line is None else f"{file}:{line}"
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{reason}")
