"""The composition root: builds a running node agent from ``settings.Settings``.

Wires discovery -> sampler -> window -> service -> HTTP server, plus the capabilities written in
their own modules: ``hardware.Sampler`` (counters), ``stacks.dump`` (py-spy) and
``flightrecorder.trigger`` (PyTorch's debug pipe). Tests build ``Agent`` with fakes of the same
interface (``hardware=``, ``stacks=``, ``flightrecorder=``); ``main()`` with the real ones.

Process ids: a ring header carries the writer's ``getpid()``, which is the host pid only when
the training container shares the host's PID namespace; with ``hostPID: true`` on the agent and
a normal training pod, the two differ: ``procs.host_pid`` maps them (``/proc/*/status`` NSpid,
the pod uid in ``/proc/*/cgroup``) for py-spy, Flight Recorder and NVML's process list.

Only training processes: whatever stacks and Flight Recorder dumpers are injected, the agent
wraps them (``stacks.guarded``, ``flightrecorder.guarded``) so that a pid reaches them only if
``procs.TrainingProcesses`` places it in a pod holding a discovered ring (or, outside pods, it
is still a ring's writer); a pid named in a request, or written in a ring header by a tenant,
gets no further.
"""

from __future__ import annotations

import functools
import pathlib
import threading
import time
from collections.abc import Callable, Sequence

import pydantic

from collscope.nodeagent import (
    auth,
    discovery,
    flightrecorder,
    frdump,
    hardware,
    launchers,
    liveness,
    procs,
    sampler,
    server,
    service,
    settings,
    stacks,
    window,
)
from collscope.nodeagent.hardware import devicemap


class Agent:
    """Everything one node runs; ``start()`` and ``stop()`` the threads."""

    def __init__(
        self,
        config: settings.Settings,
        *,
        hardware_sampler: hardware.Sampler | service.Hardware | None = None,
        stacks_dumper: service.Dumper | None = None,
        fr_dumper: service.RankDumper | None = None,
        proc_root: pathlib.Path | None = pathlib.Path("/proc"),
        clock_ns: Callable[[], int] = time.time_ns,
        devices: service.Devices | None = None,
        reviewer: auth.Reviewer | None = None,
    ) -> None:
        self.config = config
        self.window = window.Window(
            window_s=config.window.window_s, memory_cap_bytes=config.window.memory_cap_bytes
        )
        self.sampler = sampler.Sampler(
            discovery.Discovery(config.discovery),
            self.window,
            config.sampling,
            rescan_interval_s=config.discovery.rescan_interval_s,
            clock_ns=clock_ns,
            rank_env=None if proc_root is None else functools.partial(_writer_environ, proc_root),
        )
        self.hardware = hardware_sampler
        if devices is None and proc_root is not None:
            # Each ring's writer -> GPU and NIC: NVML's view when sampled, else /proc and sysfs.
            nvml = hardware_sampler if isinstance(hardware_sampler, hardware.Sampler) else None
            sys_root = pathlib.Path(config.hardware.sys_root)
            devices = devicemap.DeviceMap(nvml, sys_root=sys_root, proc_root=proc_root)
        self.targets = procs.TrainingProcesses(self._pods, self._writers, proc_root=proc_root)
        refusal = self.targets.refusal
        self.service = service.Service(
            config.node_name,
            self.sampler,
            hardware=hardware_sampler,
            stacks=None if stacks_dumper is None else stacks.guarded(stacks_dumper, refusal),
            flightrecorder=None
            if fr_dumper is None
            else flightrecorder.guarded(fr_dumper, refusal),
            host_pid=None if proc_root is None else functools.partial(_host_pid, proc_root),
            probe=None if proc_root is None else liveness.ProcessProbe(proc_root),
            devices=devices,
            clock_ns=clock_ns,
        )
        # Live while the loop ticked within 20 periods (and at least 5 s: a GC pause or a
        # slow disk must not get the pod restarted).
        live_s = max(5.0, 20 * config.sampling.sample_interval_s)
        # reviewer None with config.auth.mode "kubernetes": the in-cluster TokenReview/SAR one.
        self.server = server.Server(self.service, config, reviewer=reviewer, live_max_age_s=live_s)

    def _pods(self) -> set[str]:
        """The uids of the pods holding a ring the agent follows."""
        return {t.pod_uid for t in self.sampler.rings() if t.pod_uid and t.health != "retired"}

    def _writers(self) -> list[tuple[int, int]]:
        """(host pid, pid in its namespace) of the writers of rings found outside any pod."""
        out = []
        for t in self.sampler.rings():
            if t.pod_uid is None and t.identity is not None and t.health != "retired":
                host = self.service.host_pid(t)
                if host is not None:
                    out.append((host, t.identity.pid))
        return out

    def start(self) -> None:
        self.sampler.start()
        if isinstance(self.hardware, hardware.Sampler):
            self.hardware.start()
        self.server.start()

    def stop(self) -> None:
        self.server.stop()
        if isinstance(self.hardware, hardware.Sampler):
            self.hardware.stop()
        self.sampler.stop()


def _host_pid(proc_root: pathlib.Path, pid: int, pod_uid: str | None) -> int | None:
    return procs.host_pid(pid, pod_uid, proc_root=proc_root)


# A process's initial environment is a few KiB; the cap bounds what a tenant can make us read.
ENVIRON_MAX_BYTES = 1 << 20


def _writer_environ(proc_root: pathlib.Path, t: sampler.Tracked) -> dict[str, str] | None:
    """The environment of a ring's writer (``/proc/<host pid>/environ``, the host pid found in
    the ring's pod), for a header without a rank (``launchers.resolve``); None if unreadable."""
    i = t.identity
    pid = None if i is None else _host_pid(proc_root, i.pid, t.pod_uid)
    if pid is None:
        return None
    try:
        with (proc_root / str(pid) / "environ").open("rb") as f:
            return launchers.parse_environ(f.read(ENVIRON_MAX_BYTES))
    except OSError:
        return None


def default_hardware(config: settings.Settings) -> hardware.Sampler:
    """The real hardware sampler: NVML, netlink and RDMA sysfs, each optional."""
    return hardware.Sampler(
        hardware.default_sources(sys_root=pathlib.Path(config.hardware.sys_root)),
        node=config.node_name,
        interval_s=config.hardware.hw_interval_s,
        history_s=config.window.window_s,
    )


def stacks_dumper(pyspy: str, *, max_running: int = stacks.MAX_RUNNING) -> service.Dumper:
    """``stacks.dump`` as the service calls it, at most ``max_running`` py-spy at once."""
    slots = threading.BoundedSemaphore(max_running)

    def dump(pids: Sequence[int], timeout_s: float) -> pydantic.BaseModel:
        return stacks.dump(pids, timeout_s=timeout_s, pyspy=pyspy, slots=slots)

    return dump


def fr_dumper(
    proc_root: pathlib.Path = pathlib.Path("/proc"),
    *,
    limits: frdump.ParseLimits = frdump.DEFAULT_LIMITS,
) -> service.RankDumper:
    """``flightrecorder.trigger`` for (rank, pid) pairs: each process's debug pipe is found in
    its environment and reached through ``<proc_root>/<pid>/root`` (its mount namespace); one
    ``frdump.Parser`` bounds the dump parsers running at once across requests."""
    parser = frdump.Parser(limits)

    def dump(
        targets: Sequence[tuple[int, int]], timeout_s: float
    ) -> flightrecorder.FlightRecorderReport:
        found: list[flightrecorder.Target] = []
        failed: list[flightrecorder.RankFailure] = []
        for rank, pid in targets:
            try:
                raw = (proc_root / str(pid) / "environ").read_bytes()
            except OSError as e:
                failed.append(flightrecorder.RankFailure(rank=rank, reason=f"pid {pid}: {e}"))
                continue
            env = dict(
                kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv
            )
            t = flightrecorder.target(rank, env, root=proc_root / str(pid) / "root")
            if t is None:
                reason = f"pid {pid}: {flightrecorder.PIPE_ENV} is not set"
                failed.append(flightrecorder.RankFailure(rank=rank, reason=reason))
            else:
                found.append(t)
        report = flightrecorder.trigger(found, timeout_s=timeout_s, parser=parser)
        errs = sorted([*report.errors, *failed], key=lambda f: f.rank)
        return report.model_copy(update={"errors": errs})

    return dump
