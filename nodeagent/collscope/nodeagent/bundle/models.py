"""Pydantic models of one bundle line or file, exactly as docs/spec/bundle-v1.md defines them.

Unknown fields are ignored (forward compatibility); a missing required field or a value out of
range is an error. Sample ``records.jsonl`` line::

    {"type": "op", "rank": 3, "ts": 1732001234000000000, "comm": "0x1f3a", "seq": 17,
     "op": "AllReduce", "bytes": 4194304, "dtype": "bf16", "algo": "Ring", "proto": "Simple",
     "channels": 8, "start": 1732001233990000000, "end": 1732001234000000000}

These models are the reference for validation and for the writer; the reader may take a faster
path for hot record types but must accept and reject exactly what these models accept and reject.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA: Literal["collscope.bundle/v1"] = "collscope.bundle/v1"

# Upper bounds are the columns of tables.py: i8 for times, sizes and counts, i4 for ranks,
# channels and peers. Without them a record the model accepts cannot be stored (OverflowError
# in BundleBuilder.build() instead of an error naming the line).
NonNeg = Annotated[int, Field(ge=0, le=2**63 - 1)]
NonNeg32 = Annotated[int, Field(ge=0, le=2**31 - 1)]
Positive32 = Annotated[int, Field(ge=1, le=2**31 - 1)]
# Communicator ids are lowercase hex strings with a 0x prefix, as the plugin prints commHash.
CommHex = Annotated[str, Field(pattern=r"^0x[0-9a-f]+$", max_length=34)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class Parallelism(_Model):
    """Declared parallel layout; ``order`` lists dimensions fastest-varying first (Megatron)."""

    tp: Annotated[int, Field(ge=1)] = 1
    pp: Annotated[int, Field(ge=1)] = 1
    dp: Annotated[int, Field(ge=1)] = 1
    cp: Annotated[int, Field(ge=1)] = 1
    ep: Annotated[int, Field(ge=1)] = 1
    order: str = "tp-cp-ep-dp-pp"

    @model_validator(mode="after")
    def _order_names_each_dimension_once(self) -> Parallelism:
        dims = self.order.split("-")
        if sorted(dims) != sorted(["tp", "cp", "ep", "dp", "pp"]):
            raise ValueError(f"order must name tp, cp, ep, dp, pp once each (got {self.order!r})")
        return self

    @property
    def size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp * self.ep


class RankInfo(_Model):
    """Where one global rank runs; every field but ``rank`` may be unknown."""

    rank: NonNeg
    node: str | None = None
    pod: str | None = None
    gpu: NonNeg | None = None
    nic: str | None = None
    gpu_uuid: str | None = None  # added within v1: NVML's ``GPU-...`` of ``gpu``
    # Added within v1: why the node agent's device map left ``gpu`` or ``nic`` None
    # ("gpu: no NVML; nic: ..."); None when both resolved or nothing was asked.
    unresolved: str | None = None


class Job(_Model):
    """``job.json``."""

    schema_: Literal["collscope.bundle/v1"] = Field(SCHEMA, alias="schema")
    job: str = ""
    world_size: Annotated[int, Field(ge=1)]
    parallelism: Parallelism | None = None
    ranks: list[RankInfo] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Job:
        if self.parallelism is not None and self.parallelism.size != self.world_size:
            raise ValueError(
                f"parallelism product {self.parallelism.size} != world_size {self.world_size}"
            )
        for info in self.ranks:
            if info.rank >= self.world_size:
                raise ValueError(f"rank {info.rank} >= world_size {self.world_size}")
        return self


class _Record(_Model):
    rank: NonNeg32
    ts: NonNeg


class CommRecord(_Record):
    type: Literal["comm"] = "comm"
    comm: CommHex
    comm_rank: NonNeg32
    nranks: Positive32
    nnodes: Positive32 = 1
    name: str = ""

    @model_validator(mode="after")
    def _rank_inside(self) -> CommRecord:
        if self.comm_rank >= self.nranks:
            raise ValueError(f"comm_rank {self.comm_rank} >= nranks {self.nranks}")
        return self


class OpRecord(_Record):
    type: Literal["op"] = "op"
    comm: CommHex
    seq: NonNeg
    op: Annotated[str, Field(min_length=1, max_length=64)]
    bytes: NonNeg
    dtype: str = ""
    algo: str = ""
    proto: str = ""
    channels: NonNeg32 = 0
    start: NonNeg
    end: NonNeg
    peer: NonNeg32 | None = None

    @model_validator(mode="after")
    def _ends_after_start(self) -> OpRecord:
        if self.end < self.start:
            raise ValueError(f"end {self.end} < start {self.start}")
        return self


class SendFlow(_Model):
    channel: NonNeg32
    peer: NonNeg32
    dir: Literal["send"]
    total: NonNeg
    ready: NonNeg
    sent: NonNeg
    done: NonNeg
    idle_ns: NonNeg

    @model_validator(mode="after")
    def _monotone(self) -> SendFlow:
        if not self.ready >= self.sent >= self.done:
            raise ValueError(
                f"need ready >= sent >= done (got {self.ready}, {self.sent}, {self.done})"
            )
        return self


class RecvFlow(_Model):
    channel: NonNeg32
    peer: NonNeg32
    dir: Literal["recv"]
    total: NonNeg
    posted: NonNeg
    done: NonNeg
    consumed: NonNeg
    idle_ns: NonNeg

    @model_validator(mode="after")
    def _monotone(self) -> RecvFlow:
        if not self.posted >= self.done >= self.consumed:
            raise ValueError(
                f"need posted >= done >= consumed (got {self.posted}, {self.done}, {self.consumed})"
            )
        return self


Flow = Annotated[SendFlow | RecvFlow, Field(discriminator="dir")]


class KernelProgress(_Model):
    """GPU-side progress for hops with no proxy: channels whose kernel finished the op."""

    channels: NonNeg32
    done: NonNeg32

    @model_validator(mode="after")
    def _bounded(self) -> KernelProgress:
        if self.done > self.channels:
            raise ValueError(f"done {self.done} > channels {self.channels}")
        return self


class StateRecord(_Record):
    type: Literal["state"] = "state"
    comm: CommHex
    seq: NonNeg
    op: Annotated[str, Field(min_length=1, max_length=64)]
    bytes: NonNeg
    start: NonNeg
    flows: list[Flow] = Field(default_factory=list)
    kernel: KernelProgress | None = None


class HwRecord(_Record):
    type: Literal["hw"] = "hw"
    node: str
    device: str
    metric: str
    value: float


LivenessState = Literal["running", "stopped", "dead", "exited", "unknown", "unreachable"]
LIVENESS_STATES: tuple[LivenessState, ...] = get_args(LivenessState)


class LivenessRecord(_Model):
    """One line of ``liveness.jsonl``: the process writing ``rank``'s ring as seen at ``ts``.

    ``heartbeat``: the last beat of the plugin's heartbeat thread in the ring header (ns, None
    when unknown); ``ts - heartbeat`` is how long the process has been silent. ``state``:
    ``running`` (the process exists and is not stopped), ``stopped`` (SIGSTOP or a tracer:
    ``T``/``t`` in ``/proc/<pid>/stat``), ``dead`` (gone, or a zombie, without having closed
    its communicators), ``exited`` (gone after closing every communicator), ``unknown`` (the
    agent cannot see the process), ``unreachable`` (written by the collector, not the agent:
    the rank's node agent did not answer). Sample::

        {"rank": 5, "ts": 1732001236000000000, "state": "dead", "heartbeat": 1732001234010000000}
    """

    rank: NonNeg32
    ts: NonNeg
    state: LivenessState
    heartbeat: NonNeg | None = None


Record = Annotated[CommRecord | OpRecord | StateRecord | HwRecord, Field(discriminator="type")]


class NetFlow(_Model):
    """One line of ``flows.jsonl`` (black-box input)."""

    ts: NonNeg
    src: str
    dst: str
    bytes: NonNeg
    duration: NonNeg
    switches: list[str] = Field(default_factory=list)


class FunctionPattern(_Model):
    """One line of ``functions.jsonl`` (EROICA behaviour pattern of one function on one rank)."""

    rank: NonNeg
    fn: str
    kind: Literal["python", "kernel", "comm", "memory"]
    beta: Annotated[float, Field(ge=0.0, le=1.0)]
    mu: Annotated[float, Field(ge=0.0, le=1.0)]
    sigma: Annotated[float, Field(ge=0.0, le=1.0)]
    window_ns: NonNeg
