"""The agent's HTTP wire models (``/v1/``): public, the operator imports this module.

Everything here is JSON over HTTP; times are CLOCK_REALTIME ns (``_ns``), durations carry their
unit in the name. Fields are added, never renamed or removed, within ``v1``; unknown fields are
ignored when reading, so an older operator can read a newer agent. Bundle records on the wire
(``/v1/window``) are docs/spec/bundle-v1.md lines, not models from this module, or, when the
request's ``Accept`` names ``application/vnd.collscope.columns.v1``, the same records as column
arrays (``bundle/columnar.py`` documents that layout) plus a ``liveness`` table: each requested
rank's writer as seen now (``liveness.py``; the ``liveness.jsonl`` lines of the spec, which the
JSON-lines form leaves out so that operators from before it still read it). ``/v1/export``
writes them as the bundle's ``liveness.jsonl``.

Workloads: the agent keys what it holds by (workload, rank), the workload being the pod uid of
the ring's pod (``RankInfo.workload``; ``dir-<hash>`` for a ring in no pod), since two jobs on
one node each have a rank 0. ``workloads=<uid>,<uid>`` (a query parameter, or the requests'
``workloads`` field) limits an answer or an action to those workloads' ranks: the operator
names the pods of one job. Without it an answer is what it always was, except on a node where
two workloads hold a rank that the request is about: then it is refused with 400 (parameter
``workloads``) rather than mixed. ``TriggerSummary.workload`` says whose a summary is. A rank of
a stacks or Flight Recorder request whose process is not visible on the host is an error of that
rank in the report (``StackError.rank``, pid None), no longer a 400 for the whole request.
All of this was added within ``v1``: an agent before it rejects ``workloads=`` as an unknown
parameter and leaves ``RankInfo.workload`` out, so the operator names workloads only to agents
that list them.

Endpoints (``server.py``)::

    GET  /v1/ranks                                   RanksResponse
    GET  /v1/summaries?ranks=1,2&window_s=5          SummariesResponse (&workloads=..)
    GET  /v1/window?ranks=..&since=..&until=..       bundle-v1 records, application/x-ndjson
                                                     (&workloads=..)
                                                     (or columnar, by Accept: see above)
    GET  /v1/hardware?since=..&until=..              HardwareResponse
    POST /v1/stacks          StacksRequest           the stacks report (py-spy), as JSON
    POST /v1/flightrecorder  FlightRecorderRequest   the Flight Recorder report, as JSON
    POST /v1/profile         ProfileRequest          ProfileArmed (arms the ranks' probes)
    GET  /v1/profile?id=..                           ProfileReport (β, μ, sigma per function)
    GET  /v1/export?since=..&until=..                a bundle-v1 .tar.gz (&workloads=..)
    GET  /metrics  /livez  /readyz                   Prometheus text, HealthResponse x2
    any error                                        ErrorResponse (400, 404, 503, 500)
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from collscope.nodeagent.bundle import models

API_VERSION: Literal["v1"] = "v1"
Health = Literal["opening", "live", "stale", "finalized", "error", "retired"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class RankInfo(_Wire):
    """One ring on this node: who wrote it (identity from its header) and how it is doing.

    ``health``: ``live`` (heartbeat fresh), ``stale`` (no heartbeat for ``stale_after_s``: the
    process is wedged or dead, its last state is still served), ``finalized`` (all its
    communicators closed), ``error`` (unreadable, see ``error``), ``retired`` (the file is
    gone; what was read stays in the window), ``opening`` (not read yet).
    """

    rank: int | None
    local_rank: int | None = None
    world_size: int | None = None
    pid: int | None = None  # the writer's pid in its own namespace (its ring header)
    host_pid: int | None = None  # the same process on the host; None when not visible
    hostname: str = ""
    pod_name: str = ""
    pod_namespace: str = ""
    pod_uid: str | None = None
    # What the agent keys this ring's data by, with its rank: the pod uid from the kubelet's
    # path (never from the header), ``dir-<hash>`` outside a pod; None from older agents.
    workload: str | None = None
    node: str = ""
    ring_path: str
    health: Health
    error: str = ""
    ring_errors: int = 0
    events_missed: int = 0
    heartbeat_ns: int | None = None
    last_sample_ns: int | None = None
    comms_open: int | None = None
    nccl_version: str = ""
    plugin_version: str = ""
    window_from_ns: int | None = None
    window_to_ns: int | None = None
    # The device map (``hardware/devicemap.py``): the writer's GPU (NVML index, UUID, PCI bus
    # id; ``gpu_source`` says how it was found) and the NIC NCCL uses from it (``nic``; ``nics``
    # the candidates left when it is None). What could not be resolved says why in
    # ``unresolved`` ("gpu: no NVML; ..."), never a guess.
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    gpu_pci_bus_id: str | None = None
    gpu_source: str = ""
    nic: str | None = None
    nics: list[str] = Field(default_factory=list)
    nic_source: str = ""
    unresolved: str = ""


class RanksResponse(_Wire):
    api: Literal["v1"] = API_VERSION
    node: str
    now_ns: int
    ranks: list[RankInfo]


class InFlightOp(_Wire):
    """An operation in flight at the rank's latest sample, one per communicator.

    ``idle_ns``: at the sample, the smallest ``idle_ns`` of its flows (time since anything of
    the op moved), or the time since it started when it has no flows yet. ``stalled_ns`` adds
    the age of the sample: the stall as of ``now_ns`` of the response.
    """

    comm: str
    seq: int
    op: str
    bytes: int
    start_ns: int
    sampled_ns: int
    idle_ns: int
    stalled_ns: int
    flows: int


class CommActivity(_Wire):
    """Completions of one communicator in the summary window."""

    comm: str
    ops: int
    bytes: int
    mean_interval_ns: float | None  # between consecutive completions; None under 2 ops


class TriggerSummary(_Wire):
    """What the operator's trigger (Mycroft Algorithm 1, CCL-D §4.2.1) needs of one rank over
    ``(now - window_s, now]``: completions, throughput, op intervals and the op in flight."""

    rank: int
    window_s: float
    from_ns: int
    to_ns: int
    health: Health
    completed_ops: int
    completed_bytes: int
    throughput_bytes_per_s: float
    mean_op_interval_ns: float | None  # mean over communicators of their mean interval
    last_completion_ns: int | None  # latest completion held for the rank (any time)
    comms: list[CommActivity]
    in_flight: list[InFlightOp]  # most stalled first
    workload: str | None = None  # whose rank it is (RankInfo.workload); None: older agents
    pod_uid: str | None = None


class SummariesResponse(_Wire):
    api: Literal["v1"] = API_VERSION
    node: str
    now_ns: int
    summaries: list[TriggerSummary]


class HealthResponse(_Wire):
    """``/livez`` and ``/readyz``: ``ok`` with 200, otherwise 503 and ``reason``."""

    status: Literal["ok", "unavailable"]
    reason: str = ""
    last_tick_ns: int | None = None
    tick_age_s: float | None = None
    rings: int = 0


class SourceInfo(_Wire):
    """One hardware source: NVML, NIC counters, RDMA counters."""

    name: str
    available: bool
    reason: str = ""


class HardwareResponse(_Wire):
    api: Literal["v1"] = API_VERSION
    node: str
    sources: list[SourceInfo]
    records: list[models.HwRecord]
    gpu_processes: dict[int, int] = Field(default_factory=dict)  # pid -> GPU index


Seconds = Annotated[float, Field(gt=0, le=120)]


class StacksRequest(_Wire):
    """Which processes to dump: ranks on this node (of ``workloads``: see the module
    docstring), or raw pids (both: the union)."""

    ranks: list[int] | None = None
    pids: list[int] | None = None
    workloads: list[str] | None = None
    timeout_s: Seconds = 5.0


class FlightRecorderRequest(_Wire):
    """Ranks on this node whose Flight Recorder to dump (None: all).

    ``max_entries``: keep only the newest that many entries of each process group in each
    dump (None: all). A dump holds up to ``TORCH_NCCL_TRACE_BUFFER_SIZE`` entries (often 2,000,
    about 1 MB of JSON per rank); the operator's summary needs the last few.

    ``raw``: also each rank's dump file unchanged, in base64 (``raw_b64`` of each dump, or
    ``raw_omitted`` with the reason; 32 MiB of files per answer at most), for PyTorch's own
    ``torch.distributed.flight_recorder``; ``max_entries`` does not trim it. An agent before
    this field ignores it and sends neither.
    """

    ranks: list[int] | None = None
    workloads: list[str] | None = None  # see the module docstring
    timeout_s: Seconds = 10.0
    max_entries: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    raw: bool = False


class ErrorResponse(_Wire):
    error: str
    parameter: str | None = None


ProfileId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class ProfileRequest(_Wire):
    """Arm the dormant probes of ranks on this node (None: all) for ``window_s`` seconds.

    Every probe starts within its poll period (0.5 s) of the request and stops after the window
    or at ``now + window_s + grace_s``, whichever comes first (``profiling.py``).
    """

    id: ProfileId
    ranks: list[Annotated[int, Field(ge=0)]] | None = None
    window_s: Annotated[float, Field(gt=0, le=60)] = 10.0
    hz: Annotated[float, Field(ge=1, le=1000)] = 100.0
    grace_s: Annotated[float, Field(ge=0, le=60)] = 5.0
    workloads: list[str] | None = None  # the job's pod uids (see the module docstring)


class ProfileArmed(_Wire):
    """What a ``ProfileRequest`` armed: the ranks whose trace directory got the arm file."""

    id: str
    node: str
    deadline_ns: int
    ranks: list[int]


ProfileState = Literal["pending", "armed", "done", "failed", "no probe"]


class ResourceUse(_Wire):
    """One metric of a rank's GPU or NIC over the profiling window (the agent's hw sampler)."""

    device: str
    metric: str
    mean: float
    max: float
    samples: int


class RankProfile(_Wire):
    """One rank's probe after a request: ``pending`` (not answered yet, deadline ahead),
    ``armed`` (sampling), ``done`` (``patterns`` and ``resources`` hold the window),
    ``failed`` (the probe could not profile: ``reason``), ``no probe`` (no process of the
    rank answered before the deadline: not injected, opted out, or not Python)."""

    rank: int
    state: ProfileState
    reason: str = ""
    pid: int | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    samples: int = 0
    patterns: list[models.FunctionPattern] = Field(default_factory=list)
    resources: list[ResourceUse] = Field(default_factory=list)


class ProfileReport(_Wire):
    id: str
    node: str
    deadline_ns: int | None = None  # None: no request of this id on this node
    ranks: list[RankProfile] = Field(default_factory=list)
