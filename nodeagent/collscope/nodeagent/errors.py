"""Errors raised by the node agent, its public bundle module and its ring reader.

Hierarchy::

    CollscopeError                      root of everything collscope raises on purpose
    ├── BundleError(ValueError)         a trace bundle that does not follow docs/spec/bundle-v1.md
    │   └── BundleFormatError           one precise defect: file, line, field and reason
    ├── RingError                       a trace ring file (native/include/collscope_ring.h)
    │   ├── RingCorrupt(ValueError)     bad magic, sizes, bounds or counters: file, region,
    │   │                               offset/field and reason
    │   ├── RingVersionMismatch         a ring written by a plugin whose layout version this
    │   │                               reader does not know
    │   └── RingRankUnset(ValueError)   a ring dumped as records whose writer had no ``RANK``,
    │                                   and no rank was given in its place
    ├── HardwareError                   a hardware counter source (hardware/: NVML, netlink,
    │   │                               RDMA sysfs)
    │   ├── HardwareUnavailable         the source is absent on this node (no driver, no GPU,
    │   │                               no RDMA device): reported as a status, not a failure
    │   └── HardwareReadError           a present source failed to read a counter
    ├── FlightRecorderError             a PyTorch Flight Recorder dump (flightrecorder.py)
    │   ├── FlightRecorderUnavailable   the rank has no debug pipe, or nobody reads it
    │   └── FlightRecorderDumpInvalid(ValueError)  a dump that is not a pickled dict of plain
    │                                   containers in the documented shape
    ├── SettingsError(ValueError)       a bad environment variable or flag of either binary
    │                                   (the agent's or the operator's), named
    └── ApiError                        a request the agent's HTTP API refuses or cannot serve
        ├── QueryError(ValueError)      a bad HTTP query parameter, named (HTTP 400)
        ├── UnavailableError            a capability the agent runs without (HTTP 503)
        └── ReviewUnavailable           the API server did not review a caller's token
                                        (auth.py; HTTP 503, not a refusal)

The operator's ``AgentError`` (``collscope.operator.errors``) is the other side of the wire:
an agent that answered badly or not at all, as its client sees it.

Foreign exceptions (``OSError``, ``json.JSONDecodeError``, pydantic's ``ValidationError``,
``tarfile`` and ``gzip`` errors) are translated where they are caught, always ``from`` the
original, so a caller handles one family. ``OSError`` from opening or mapping a ring file is
left as it is: a missing file is not a corrupt one. NVML (``pynvml.NVMLError``) and netlink
(``pyroute2`` ``NetlinkError``) errors become ``HardwareError`` in the hardware source that
calls them, and nowhere else.
"""

from __future__ import annotations


class CollscopeError(Exception):
    """Root of every error collscope raises on purpose."""


class BundleError(CollscopeError, ValueError):
    """A trace bundle cannot be read as docs/spec/bundle-v1.md describes."""


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


class RingRankUnset(RingError, ValueError):  # noqa: N818 - a state, like RingVersionMismatch
    """A ring's writer had no ``RANK`` and the caller gave none: its records cannot be ranked."""

    def __init__(self, file: str) -> None:
        self.file = file
        super().__init__(f"{file}: RANK was not set in the writing process")


class SettingsError(CollscopeError, ValueError):
    """A setting of the agent or the operator that cannot be used; ``name`` is the environment
    variable or flag, ``str()`` is ``NAME='value': reason`` (``NAME: reason`` when empty)."""

    def __init__(self, name: str, value: str, reason: str) -> None:
        self.name = name
        self.value = value
        self.reason = reason
        super().__init__(f"{name}={value!r}: {reason}" if value else f"{name}: {reason}")


class ApiError(CollscopeError):
    """A request the agent's HTTP API refuses (a bad parameter) or cannot serve now."""


class QueryError(ApiError, ValueError):
    """A bad request to the agent's HTTP API; ``parameter`` names what to fix."""

    def __init__(self, parameter: str, reason: str) -> None:
        self.parameter = parameter
        self.reason = reason
        super().__init__(f"parameter '{parameter}': {reason}")


class UnavailableError(ApiError):
    """A capability (hardware counters, stacks, Flight Recorder) this agent does not have."""


class ReviewUnavailable(ApiError):  # noqa: N818 - a state, like UnavailableError
    """No TokenReview or SubjectAccessReview answer (API server down, our own token missing):
    the request is answered 503, never allowed."""


class HardwareError(CollscopeError):
    """A hardware counter source (NVML, netlink, RDMA sysfs) could not be read."""


class HardwareUnavailable(HardwareError):  # noqa: N818 - a state, not a failure
    """The source is absent on this node: no NVIDIA driver or GPU, no RDMA device.

    The agent keeps working; the sampler reports the source as unavailable with ``str()``
    as the reason, e.g. ``NVML: NVML Shared Library Not Found``.
    """


class HardwareReadError(HardwareError):
    """A present source failed to read, e.g. ``gpu3: nvmlDeviceGetPowerUsage: GPU is lost``."""


class FlightRecorderError(CollscopeError):
    """A PyTorch Flight Recorder dump could not be triggered, collected or read."""


class FlightRecorderUnavailable(FlightRecorderError):  # noqa: N818 - a state, not a failure
    """The rank's debug pipe is missing or has no reader (Flight Recorder not configured,
    trace buffer off, or the process is gone)."""


class FlightRecorderDumpInvalid(FlightRecorderError, ValueError):  # noqa: N818 - a state
    """A dump file that is not a pickled dict of plain containers in the documented shape;
    ``str()`` names the file and the reason."""

    def __init__(self, file: str, reason: str) -> None:
        self.file = file
        self.reason = reason
        super().__init__(f"{file}: {reason}")
