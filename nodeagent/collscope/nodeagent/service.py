"""What the agent answers, independent of HTTP: ranks, summaries, windows, hardware, exports.

``Service`` ties the sampler and the window to the optional capabilities written elsewhere and
injected here (STYLE habit 10), so that tests pass fakes with the same interface:

- ``hardware``: ``collscope.nodeagent.hardware.Sampler`` (NVML, NIC and RDMA counters);
- ``stacks``: ``collscope.nodeagent.stacks.dump`` (py-spy), called as ``stacks(pids, timeout_s)``;
- ``flightrecorder``: a callable ``([(rank, pid), ...], timeout_s) -> FlightRecorderReport``
  (PyTorch's dump pipe; ``agent.fr_dumper`` adapts ``flightrecorder.trigger``); a request's
  ``max_entries`` trims the report here (``flightrecorder.newest``), ``raw`` adds the files
  (``flightrecorder.exported``);
- ``probe``: ``liveness.ProcessProbe`` (``/proc``), which says whether a ring's writer is
  running, stopped or dead; without it every writer's process state is ``unknown``;
- ``devices``: ``hardware.devicemap.DeviceMap``, each ring's writer -> its GPU and NIC, served
  in ``/v1/ranks``, written into ``job.json`` and used to give each hardware record the rank
  of its device's user; without it GPUs come from NVML's process list alone and NICs are
  unknown.

Hardware records in a window: those of the devices the window's ranks use (by the device
map), each with the lowest such rank, since a sample belongs to a device and analysis joins it
by device (``analysis/hwsamples.py``); a window of all ranks (``/v1/export``) also keeps the
devices no ring uses, with rank 0.

Each may be None: the matching endpoint then answers 503 with ``errors.UnavailableError``.
``server.py`` maps this class to HTTP.

Workloads: the window is keyed by (workload, rank) (``window.py``), and so is every answer. A
request may name ``workloads`` (pod uids; ``RankInfo.workload``): it sees and acts on those
workloads' ranks only; one that names none is answered as before unless two workloads hold a
rank it is about (``selection.py`` says when it is refused instead of mixed). Summaries of all
ranks list each (workload, rank) apart. A rank whose writer's pid cannot be resolved on the
host (hidden, or a forged ring header) is that rank's error in the stacks or Flight Recorder
report, not the request's.

Why one module: every endpoint's answer is put together here from the sampler, the window and
the injected capabilities; ``hw_owners`` and the helpers at the end are what would move out first.
"""

from __future__ import annotations

import pathlib
import tempfile
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import pydantic

from collscope.nodeagent import (
    api,
    errors,
    flightrecorder,
    liveness,
    sampler,
    selection,
    stacks,
    summary,
    window,
)
from collscope.nodeagent.bundle import columnar, models, tables, writer
from collscope.nodeagent.hardware import devicemap

_NS = 1_000_000_000
_T = TypeVar("_T")


class Hardware(Protocol):
    """The part of ``hardware.Sampler`` the service uses."""

    def window(self, since_ns: int, until_ns: int) -> list[models.HwRecord]: ...
    def latest(self) -> list[models.HwRecord]: ...
    def statuses(self) -> Sequence[Any]: ...  # objects with name, available, reason
    def gpu_processes(self) -> dict[int, int]: ...


class Devices(Protocol):
    """The part of ``devicemap.DeviceMap`` the service uses."""

    def resolve(
        self, host_pid: int | None, *, local_rank: int | None, key: Hashable
    ) -> devicemap.Placement: ...


Dumper = Callable[[Sequence[int], float], pydantic.BaseModel]
RankDumper = Callable[[Sequence[tuple[int, int]], float], flightrecorder.FlightRecorderReport]


class Service:
    """The agent's answers; thread-safe (the HTTP server calls it from many threads)."""

    def __init__(
        self,
        node: str,
        loop: sampler.Sampler,
        *,
        hardware: Hardware | None = None,
        stacks: Dumper | None = None,
        flightrecorder: RankDumper | None = None,
        host_pid: Callable[[int, str | None], int | None] | None = None,
        probe: liveness.ProcessProbe | None = None,
        devices: Devices | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.node = node
        self.sampler = loop
        self.window: window.Window = loop.window
        self.hardware = hardware
        self.stacks_dumper = stacks
        self.flightrecorder_dumper = flightrecorder
        self.clock_ns = clock_ns
        # (pid in its namespace, pod uid) -> host pid; None: the namespaces are the same.
        self._host_pid = host_pid
        self._pid_cache: dict[tuple[int, int, str | None], int | None] = {}
        self.probe = probe
        self.devices = devices

    # -- ranks and summaries --------------------------------------------------------------
    def ranks(self) -> api.RanksResponse:
        out = []
        for t in self.sampler.rings():
            i, s = t.identity, t.status
            rank = None if i is None else i.rank
            span = None if rank is None else self.window.span(rank, t.workload)
            place = self.placement(t)
            gpu = place.gpu
            out.append(
                api.RankInfo(
                    rank=None if i is None else i.rank,
                    local_rank=None if i is None else i.local_rank,
                    world_size=None if i is None else i.world_size,
                    pid=None if i is None else i.pid,
                    host_pid=self.host_pid(t),
                    hostname="" if i is None else i.hostname,
                    pod_name="" if i is None else i.pod_name,
                    pod_namespace="" if i is None else i.pod_namespace,
                    pod_uid=t.pod_uid,
                    workload=t.workload,
                    node=(i.node_name if i is not None and i.node_name else self.node),
                    ring_path=t.path,
                    health=_health(t.health),
                    error=t.error,
                    ring_errors=t.errors,
                    events_missed=t.missed,
                    heartbeat_ns=None if s is None else s.heartbeat_ns,
                    last_sample_ns=t.last_sample_ns or None,
                    comms_open=None if s is None else s.comms_open,
                    nccl_version="" if i is None else i.nccl_version,
                    plugin_version="" if i is None else i.plugin_version,
                    window_from_ns=None if span is None else span[0],
                    window_to_ns=None if span is None else span[1],
                    gpu_index=None if gpu is None else gpu.index,
                    gpu_uuid=None if gpu is None else gpu.uuid,
                    gpu_pci_bus_id=None if gpu is None else gpu.pci_bus_id,
                    gpu_source=place.gpu_source,
                    nic=place.nic,
                    nics=list(place.nics),
                    nic_source=place.nic_source,
                    unresolved=place.unresolved,
                )
            )
        out.sort(key=lambda r: (r.rank is None, r.rank or 0, r.ring_path))
        return api.RanksResponse(node=self.node, now_ns=self.clock_ns(), ranks=out)

    def summaries(
        self,
        ranks: Sequence[int] | None,
        window_s: float,
        workloads: Sequence[str] | None = None,
    ) -> api.SummariesResponse:
        """One summary per (workload, rank) asked for (``select``; all ranks: each key)."""
        now = self.clock_ns()
        known = self._rings()
        wanted = self.select(ranks, workloads, unique=False)
        # The summary window plus two sampling periods' slack for the latest state sample.
        slack = 2 * int(self.sampler.config.sample_interval_s * _NS)
        since = now - int(window_s * _NS) - slack
        out = []
        for w, keys in selection.by_workload(wanted).items():
            rs = [r for _, r in keys]
            view = self.window.bundle(_job(rs), keys=keys, since_ns=since, until_ns=now)
            for key in keys:
                rings = known[key]
                sampled = max((t.last_sample_ns for t in rings), default=0) or None
                s = summary.summarize(
                    view,
                    key[1],
                    now_ns=now,
                    window_s=window_s,
                    sampled_ns=sampled,
                    health=_best(rings),
                    last_completion_ns=self.window.last_completion(key[1], w),
                )
                out.append(s.model_copy(update={"workload": w, "pod_uid": rings[0].pod_uid}))
        out.sort(key=lambda s: (s.rank, s.workload or ""))
        return api.SummariesResponse(node=self.node, now_ns=now, summaries=out)

    def select(
        self, ranks: Sequence[int] | None, workloads: Sequence[str] | None, *, unique: bool = True
    ) -> list[window.Key]:
        """The (workload, rank) keys a request is about (``selection.select``; ``unique``: the
        answer is keyed by rank alone). ``errors.QueryError`` for a rank without a ring and for
        an ambiguous request."""
        return selection.select(self._rings(), ranks, workloads, unique=unique, node=self.node)

    # -- records --------------------------------------------------------------------------
    def window_lines(
        self,
        ranks: Sequence[int] | None,
        since_ns: int | None,
        until_ns: int | None,
        workloads: Sequence[str] | None = None,
    ) -> Iterator[str]:
        """bundle-v1 records as JSON-lines text blocks (writer's fast formatter), the node's
        hardware samples of the ranks' devices included."""
        b = self.bundle(ranks, since_ns, until_ns, workloads=workloads)
        return writer.record_blocks(b)

    def window_columns(
        self,
        ranks: Sequence[int] | None,
        since_ns: int | None,
        until_ns: int | None,
        workloads: Sequence[str] | None = None,
    ) -> bytes:
        """The same records as ``window_lines``, in the columnar wire form (``columnar``)."""
        return columnar.encode(self.bundle(ranks, since_ns, until_ns, workloads=workloads))

    def bundle(
        self,
        ranks: Sequence[int] | None,
        since_ns: int | None,
        until_ns: int | None,
        *,
        workloads: Sequence[str] | None = None,
        with_hw: bool = True,
    ) -> tables.Bundle:
        """The window of ``ranks`` of ``workloads`` (``select``); hardware records of devices
        no selected rank uses only when neither is named (a whole, unshared node)."""
        keys = self.select(ranks, workloads)
        hw: list[models.HwRecord] = []
        if with_hw and self.hardware is not None:
            hw = self.hardware.window(since_ns or 0, until_ns or self.clock_ns())
        job = self.job(keys)
        whole = ranks is None and workloads is None
        return self.window.bundle(
            job,
            keys=keys,
            since_ns=since_ns,
            until_ns=until_ns,
            hw=hw,
            hw_ranks=hw_owners(job, {h.device for h in hw}, None),  # job: the keys' ranks only
            hw_others=whole,
            liveness=self._liveness(keys),
        )

    def liveness_of(
        self, ranks: Sequence[int] | None, workloads: Sequence[str] | None = None
    ) -> list[models.LivenessRecord]:
        """The writer of each of ``ranks`` (None: all) of ``workloads`` (``select``) as seen
        now: its ring's last heartbeat and its process (``liveness``)."""
        return self._liveness(self.select(ranks, workloads))

    def _liveness(self, keys: Sequence[window.Key]) -> list[models.LivenessRecord]:
        """One record per key, from its newest ring (a rank restarted in a new process has
        written a new ring)."""
        newest: dict[window.Key, sampler.Tracked] = {}
        known = self._rings()
        for key in keys:
            seen = [t for t in known.get(key, ()) if t.status is not None and t.identity]
            if seen:
                newest[key] = max(seen, key=lambda t: t.identity.init_ns if t.identity else 0)
        out = []
        for (_, r), t in sorted(newest.items()):
            assert t.status is not None and t.identity is not None
            out.append(
                liveness.record(
                    r,
                    t.status,
                    observed_ns=t.status_ns or self.clock_ns(),
                    process=self._process(t),
                    finalized=t.health == "finalized",
                )
            )
        return out

    def _process(self, t: sampler.Tracked) -> liveness.ProcState:
        i = t.identity
        if self.probe is None or i is None:
            return "unknown"
        pid = self.host_pid(t)
        if pid is None:
            return "unknown"
        return self.probe.state(pid, ns_pid=i.pid, ring_init_ns=i.init_ns)

    def export(
        self, since_ns: int | None, until_ns: int | None, workloads: Sequence[str] | None = None
    ) -> bytes:
        """The window (of ``workloads``; None: the node's, refused where two hold one rank) as
        a bundle-v1 ``.tar.gz`` (bytes), hardware samples included."""
        b = self.bundle(None, since_ns, until_ns, workloads=workloads)
        with tempfile.TemporaryDirectory(prefix="collscope-export-") as tmp:
            out = writer.write(b, pathlib.Path(tmp) / f"collscope-{self.node}.tar.gz")
            return out.read_bytes()

    def job(self, keys: Sequence[window.Key] | None = None) -> models.Job:
        """``job.json`` of ``keys`` (None: every ring's, keys of one rank must then not
        collide) from what the agent knows: world size, and per rank node, pod, GPU (index and
        UUID) and NIC from the device map."""
        gpus = self.hardware.gpu_processes() if self.hardware is not None else {}
        infos: dict[int, models.RankInfo] = {}
        world = 1
        chosen = None if keys is None else set(keys)
        for t in self.sampler.rings():
            i = t.identity
            if i is None or i.rank is None:
                continue
            if chosen is not None and (t.workload, i.rank) not in chosen:
                continue
            world = max(world, i.world_size or 0, i.rank + 1)
            if i.rank in infos and t.health == "retired":
                continue  # a restarted rank: its live ring says where it runs now
            place = self.placement(t)
            infos[i.rank] = models.RankInfo(
                rank=i.rank,
                node=i.node_name or self.node,
                pod=(f"{i.pod_namespace}/{i.pod_name}" if i.pod_namespace else i.pod_name) or None,
                gpu=place.gpu.index if place.gpu else gpus.get(self.host_pid(t) or -1),
                gpu_uuid=place.gpu.uuid if place.gpu else None,
                nic=place.nic,
                unresolved=place.unresolved or None,
            )
        for _, r in self.window.held() if keys is None else keys:
            world = max(world, r + 1)
        return models.Job(world_size=world, ranks=[infos[r] for r in sorted(infos)])

    # -- hardware, stacks, Flight Recorder ------------------------------------------------
    def hardware_samples(self, since_ns: int | None, until_ns: int | None) -> api.HardwareResponse:
        hw = _need(self.hardware, "hardware counters")
        records = hw.window(since_ns or 0, until_ns or self.clock_ns())
        return api.HardwareResponse(
            node=self.node,
            sources=[
                api.SourceInfo(name=s.name, available=s.available, reason=s.reason)
                for s in hw.statuses()
            ],
            records=records,
            gpu_processes=hw.gpu_processes(),
        )

    def stacks(self, req: api.StacksRequest) -> pydantic.BaseModel:
        """py-spy stacks of ``req.pids`` and of the writers of ``req.ranks`` (of
        ``req.workloads``); a rank whose writer is not visible on the host is that rank's
        ``StackError`` (pid None), the others are still dumped."""
        dump = _need(self.stacks_dumper, "stacks (py-spy)")
        pids = set(req.pids or ())
        hidden: list[stacks.StackError] = []
        for (_, r), rings in self._live(req.ranks, req.workloads) if req.ranks else ():
            for t in rings:
                pid = self.host_pid(t)
                if pid is None:
                    hidden.append(stacks.StackError(pid=None, rank=r, reason=self._hidden(r, t)))
                else:
                    pids.add(pid)
        if not pids and not hidden:
            raise errors.QueryError("ranks", "no rank or pid given")
        report = dump(sorted(pids), req.timeout_s) if pids else stacks.StacksReport()
        if hidden and isinstance(report, stacks.StacksReport):
            report = report.model_copy(update={"errors": [*report.errors, *hidden]})
        return report

    def flightrecorder(self, req: api.FlightRecorderRequest) -> flightrecorder.FlightRecorderReport:
        """Flight Recorder dumps of ``req.ranks`` (None: all) of ``req.workloads``; a rank
        whose writer is not visible on the host is that rank's failure in the report."""
        fr = _need(self.flightrecorder_dumper, "Flight Recorder")
        targets: list[tuple[int, int]] = []
        hidden: list[flightrecorder.RankFailure] = []
        for (_, r), rings in self._live(req.ranks, req.workloads):
            for t in rings:
                pid = self.host_pid(t)
                if pid is None:
                    hidden.append(flightrecorder.RankFailure(rank=r, reason=self._hidden(r, t)))
                else:
                    targets.append((r, pid))
        if not targets and not hidden:
            raise errors.QueryError("ranks", "no rank with a ring on this node")
        report = fr(targets, req.timeout_s) if targets else flightrecorder.FlightRecorderReport()
        if hidden:
            errs = sorted([*report.errors, *hidden], key=lambda f: f.rank)
            report = report.model_copy(update={"errors": errs})
        if req.max_entries is not None:
            report = flightrecorder.newest(report, req.max_entries)
        return flightrecorder.exported(report) if req.raw else report

    # -- health ---------------------------------------------------------------------------
    def livez(self, max_age_s: float) -> api.HealthResponse:
        """Live while the sampling loop ticked within ``max_age_s``."""
        st = self.sampler.stats
        rings = len(self.sampler.rings())
        if st.last_tick_ns == 0:
            return api.HealthResponse(status="unavailable", reason="no tick yet", rings=rings)
        age = (self.clock_ns() - st.last_tick_ns) / _NS
        ok = age <= max_age_s
        return api.HealthResponse(
            status="ok" if ok else "unavailable",
            reason="" if ok else f"last sampling tick {age:.1f} s ago (limit {max_age_s:g} s)",
            last_tick_ns=st.last_tick_ns,
            tick_age_s=age,
            rings=rings,
        )

    # -- helpers --------------------------------------------------------------------------
    def host_pid(self, t: sampler.Tracked) -> int | None:
        """The host pid of a ring's writer (cached per writer); None when not found."""
        i = t.identity
        if i is None:
            return None
        if self._host_pid is None:
            return i.pid
        key = (i.pid, i.init_ns, t.pod_uid)
        if key not in self._pid_cache or self._pid_cache[key] is None:
            self._pid_cache[key] = self._host_pid(i.pid, t.pod_uid)
        return self._pid_cache[key]

    def placement(self, t: sampler.Tracked) -> devicemap.Placement:
        """The GPU and NIC of a ring's writer (the device map; empty without one)."""
        i = t.identity
        if self.devices is None or i is None:
            return devicemap.Placement(unresolved="no device map on this agent")
        return self.devices.resolve(
            self.host_pid(t), local_rank=i.local_rank, key=(i.pid, i.init_ns, t.pod_uid)
        )

    def _hidden(self, rank: int, t: sampler.Tracked) -> str:
        return (
            f"rank {rank}: its process (pid {t.identity.pid if t.identity else '?'} in its "
            "container) is not visible on this host (hostPID? a ring header naming another pid?)"
        )

    def _rings(self) -> dict[window.Key, list[sampler.Tracked]]:
        return selection.rings_by_key(self.sampler.rings())

    def _live(
        self, ranks: Sequence[int] | None, workloads: Sequence[str] | None
    ) -> list[tuple[window.Key, list[sampler.Tracked]]]:
        """The rings still there of each selected key (``select``); a key whose rings are all
        retired is the request's error (no process to act on)."""
        known = self._rings()
        out = []
        for key in self.select(ranks, workloads):
            rings = [t for t in known[key] if t.health != "retired"]
            if not rings:
                raise errors.QueryError("ranks", f"rank {key[1]} has no ring on node {self.node}")
            out.append((key, rings))
        return out


def hw_owners(job: models.Job, devices: set[str], ranks: Sequence[int] | None) -> dict[str, int]:
    """device of a hardware record -> the lowest of ``ranks`` (None: any) whose GPU or NIC it
    is, by ``job.json``: ``gpu<i>``; an RDMA port ``mlx5_0/1`` of a NIC named ``mlx5_0`` or
    ``mlx5_0:1``; a network interface by its name."""
    want = None if ranks is None else set(ranks)
    out: dict[str, int] = {}
    for info in sorted(job.ranks, key=lambda r: r.rank, reverse=True):
        if want is not None and info.rank not in want:
            continue
        if info.gpu is not None and f"gpu{info.gpu}" in devices:
            out[f"gpu{info.gpu}"] = info.rank
        if info.nic is None:
            continue
        hca, _, port = info.nic.partition(":")
        for d in devices:
            d_hca, _, d_port = d.partition("/")
            if d == info.nic or (d_hca == hca and d_port and (not port or port == d_port)):
                out[d] = info.rank
    return out


def _need(thing: _T | None, what: str) -> _T:
    if thing is None:
        raise errors.UnavailableError(f"{what}: not available on this agent")
    return thing


def _health(h: str) -> api.Health:
    allowed: tuple[api.Health, ...] = ("opening", "live", "stale", "finalized", "error", "retired")
    for a in allowed:
        if a == h:
            return a
    return "error"


def _best(rings: list[sampler.Tracked]) -> api.Health:
    order = ("live", "stale", "finalized", "opening", "error", "retired")
    return _health(min((t.health for t in rings), key=order.index))


def _job(ranks: Sequence[int]) -> models.Job:
    return models.Job(world_size=max(ranks, default=0) + 1)
