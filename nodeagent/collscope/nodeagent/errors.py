"""Errors raised by the node agent, its public bundle module and its ring reader.

Hierarchy::

    CollscopeError                      root of everything collscope raises on purpose
    ├── BundleError(ValueError)         a trace bundle that does not follow spec/bundle-v1.md
    │   └── BundleFormatError           one precise defect: file, line, field and reason
    └── RingError                       a trace ring file (native/include/collscope_ring.h)
        ├── RingCorrupt(ValueError)     bad magic, sizes, bounds or counters: file, region,
        │                               offset/field and reason
        └── RingVersionMismatch         a ring written by a plugin whose layout version this
                                        reader does not know

Foreign exceptions (``OSError``, ``json.JSONDecodeError``, pydantic's ``ValidationError``,
``tarfile`` and ``gzip`` errors) are translated where they are caught, always ``from`` the
original, so a caller handles one family. ``OSError`` from opening or mapping a ring file is
left as it is: a missing file is not a corrupt one.
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


class RingError(CollscopeError):
    """A trace ring file cannot be read as native/include/collscope_ring.h lays it out."""


class RingCorrupt(RingError, ValueError):  # noqa: N818 - the name STYLE.md and issue 3 use
    """A precise defect in a ring file: which file, which region, which offset or field, and why.

    ``str()`` is one line, e.g.
    ``/run/collscope/ring-123.bin: header @0x0 field 'magic': expected 0x..., got 0x...``.
    """

    def __init__(
        self,
        file: str,
        reason: str,
        *,
        region: str,
        offset: int | None = None,
        field: str | None = None,
    ) -> None:
        self.file = file
        self.region = region
        self.offset = offset
        self.field = field
        self.reason = reason
        where = region if offset is None else f"{region} @{offset:#x}"
        what = f" field '{field}'" if field else ""
        super().__init__(f"{file}: {where}{what}: {reason}")


class RingVersionMismatch(RingError):  # noqa: N818 - the name issue 3 uses
    """The ring's layout version is not the one this reader was built for."""

    def __init__(self, file: str, found: int, expected: int) -> None:
        self.file = file
        self.found = found
        self.expected = expected
        super().__init__(
            f"{file}: ring layout version {found}, this reader reads version {expected}"
            " (upgrade the node agent and the plugin together)"
        )
