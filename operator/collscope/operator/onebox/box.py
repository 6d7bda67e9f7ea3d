"""The whole data path on one machine: simulated nodes, their agents, the job's rank processes.

For each simulated node ``node-<i>``: a kubelet-like pods tree under ``<root>/node-<i>/pods``
where every rank's pod has its ring volume
(``<uid>/volumes/kubernetes.io~empty-dir/collscope-trace/``, docs/design.md, "Pod contract"),
and a real node agent (``python -m collscope.nodeagent --discovery kubelet ... run``)
listening on the node's own loopback address ``127.0.0.<i + 2>`` (all on one port, as a
DaemonSet's pods would be on their nodes' IPs), whose hardware is simulated under
``<root>/node-<i>/hw`` (``hardware.NodeHardware``: one GPU and one HCA per rank of the node,
rank r on GPU and HCA ``r % ranks_per_node``; ``onebox.nodeagent`` runs the agent on it).
From the onset, the injected fault's hardware side shows there (``hardware.SYMPTOMS``: a
NIC's link down, an XID, clocks capped), unless ``hw_symptoms=False``; ``hardware=False``
runs the agents without any.
For each rank: a process running ``rank.main`` (the real plugin, ctypes).
The ranks share their chunk counters through one memory-mapped file (``state="mmap"``), or
through the TCP fabric a workload on a cluster uses (``state="tcp"``: a ``fabric.Server`` in
this process on ``127.0.0.1``, one ``fabric.Client`` per rank).

    with box.OneBox(box.Layout(nodes=2, ranks_per_node=4), root, plugin) as b:
        b.start(injection)
        ... b.agent_url(node) ...
        b.kill_rank(3); b.freeze_rank(2); b.stop_agent("node-1"); b.start_agent("node-1")
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from types import TracebackType
from typing import Final, Literal

import httpx

from collscope.nodeagent import podcontract
from collscope.operator import errors
from collscope.operator.onebox import fabric, faults, nccl, rank
from collscope.operator.onebox import hardware as hardware_

NAMESPACE: Final = "ml"
# A rank's ring appears at its first ncclCommInitRank; spawned processes import numpy-free
# modules only, so 8 of them are up within a few seconds even on 2 busy cores.
START_TIMEOUT_S: Final = 30.0
# The agents' hardware sampling period: half the node default (1 s), so that a fault's
# hardware sample is in the window a Diagnosis pulls ~2 s after the onset.
HW_INTERVAL_S: Final = 0.5


@dataclasses.dataclass(frozen=True)
class Layout:
    """``nodes`` x ``ranks_per_node`` ranks of job ``job``; rank r runs on node r // per node."""

    nodes: int = 2
    ranks_per_node: int = 4
    job: str = "onebox"

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    def node_of(self, r: int) -> str:
        return f"node-{r // self.ranks_per_node}"

    def pod_of(self, r: int) -> str:
        return f"{self.job}-{r}"

    def node_names(self) -> list[str]:
        return [f"node-{i}" for i in range(self.nodes)]

    def ranks_by_node(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for r in range(self.world):
            out.setdefault(self.node_of(r), []).append(r)
        return out

    def address_of(self, node: str) -> str:
        return f"127.0.0.{int(node.rsplit('-', 1)[1]) + 2}"


def find_plugin(explicit: str | None = None) -> pathlib.Path:
    """The built plugin: ``explicit``, else ``$COLLSCOPE_PLUGIN``, else ``native/build``."""
    env = explicit or os.environ.get("COLLSCOPE_PLUGIN")
    if env:
        path = pathlib.Path(env)
        if not path.is_file():
            raise errors.PluginError(f"COLLSCOPE_PLUGIN={env}: no such file")
        return path
    here = pathlib.Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / "native" / "build" / nccl.LIB_NAME
        if cand.is_file():
            return cand
        if (parent / "native" / "Makefile").is_file():
            raise errors.PluginError(
                f"the NCCL profiler plugin is not built: run `make -C {parent / 'native'}` "
                f"(or set COLLSCOPE_PLUGIN to a built {nccl.LIB_NAME})"
            )
    raise errors.PluginError(f"set COLLSCOPE_PLUGIN to a built {nccl.LIB_NAME}")


def free_port(hosts: list[str]) -> int:
    """A TCP port free on every one of ``hosts`` (checked by binding; racy but local)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = int(s.getsockname()[1])
        ok = True
        for h in hosts[1:]:
            with socket.socket() as s:
                try:
                    s.bind((h, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise errors.PluginError("no TCP port free on every loopback address")


class OneBox:
    """Owns the processes; ``close`` (or ``with``) ends every one of them."""

    def __init__(
        self,
        layout: Layout,
        root: pathlib.Path,
        plugin: pathlib.Path,
        *,
        timing: rank.Timing | None = None,
        seed: int = 0,
        agent_sample_interval_s: float = 0.1,
        state: Literal["mmap", "tcp"] = "mmap",
        hardware: bool = True,
        hw_symptoms: bool = True,
    ) -> None:
        self.layout, self.root, self.plugin = layout, root, plugin
        self.timing, self.seed = timing or rank.Timing(), seed
        self.sample_interval_s = agent_sample_interval_s
        self.uids = {r: str(uuid.UUID(int=(seed << 64) + r + 1)) for r in range(layout.world)}
        self.port = free_port([layout.address_of(n) for n in layout.node_names()])
        root.mkdir(parents=True, exist_ok=True)
        self.fabric: fabric.Server | None = None
        self.shared: rank.State
        if state == "tcp":
            self.fabric = fabric.Server(("127.0.0.1", 0), layout.world, self.timing.nchannels)
            self.fabric.start()
            host, port = self.fabric.address
            self.state_arg = f"tcp://{host}:{port}"
            self.shared = fabric.Client((host, port), layout.world, self.timing.nchannels, None)
        else:
            path = root / "shared.bin"
            self.state_arg = str(path)
            self.shared = rank.Shared(path, layout.world, self.timing.nchannels)
        self.ranks: dict[int, subprocess.Popen[bytes]] = {}
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.injection: faults.Injection | None = None
        self.hw: dict[str, hardware_.NodeHardware] = {}
        if hardware:
            for node in layout.node_names():
                self.hw[node] = hardware_.NodeHardware.build(
                    root / node / "hw", layout.ranks_per_node, seed=seed
                )
        self.hw_symptoms = hw_symptoms
        self._timers: list[threading.Timer] = []

    # -- layout on disk ------------------------------------------------------------------
    def pods_dir(self, node: str) -> pathlib.Path:
        return self.root / node / "pods"

    def trace_dir(self, r: int) -> pathlib.Path:
        return (
            self.pods_dir(self.layout.node_of(r))
            / self.uids[r]
            / "volumes"
            / "kubernetes.io~empty-dir"
            / podcontract.TRACE_VOLUME
        )

    def agent_url(self, node: str) -> str:
        return f"http://{self.layout.address_of(node)}:{self.port}"

    # -- processes -----------------------------------------------------------------------
    def start(self, injection: faults.Injection | None = None) -> None:
        """Agents first (as on a cluster the DaemonSet is there before the job), then ranks."""
        self.injection = injection
        for node in self.layout.node_names():
            self.start_agent(node)
        for r in range(self.layout.world):
            self.trace_dir(r).mkdir(parents=True, exist_ok=True)
            spec = rank.RankSpec(
                rank=r, local_rank=r % self.layout.ranks_per_node, world=self.layout.world,
                nnodes=self.layout.nodes, node=self.layout.node_of(r),
                pod=self.layout.pod_of(r), namespace=NAMESPACE, trace_dir=str(self.trace_dir(r)),
                plugin=str(self.plugin), timing=self.timing, injection=injection, seed=self.seed,
            )  # fmt: skip
            self.start_rank(spec)
        self.wait_ready()

    def arm(self, onset_s: float) -> None:
        """The injected fault (if any) acts from wall time ``onset_s`` on, in the ranks and,
        unless ``hw_symptoms`` is off, in its culprits' simulated hardware."""
        self.shared.arm(int(onset_s * 1e9))
        inj = self.injection
        if inj is None or not self.hw_symptoms or not self.hw:
            return
        timer = threading.Timer(max(0.0, onset_s - time.time()), self.show_fault, (inj,))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def show_fault(self, inj: faults.Injection) -> None:
        """The hardware side of ``inj`` on each culprit rank's GPU and HCA (now)."""
        for r in inj.ranks:
            node = self.hw.get(self.layout.node_of(r))
            if node is not None:
                node.apply(inj.kind, r % self.layout.ranks_per_node)

    def start_rank(self, spec: rank.RankSpec) -> None:
        log = (self.root / f"rank-{spec.rank}.log").open("ab")
        cmd = [sys.executable, "-m", "collscope.operator.onebox.rank", rank.spec_json(spec),
               self.state_arg]  # fmt: skip
        # The dormant probe, as the webhook injects it (issue 18): armed through the agent only.
        env = {**os.environ, **rank.probe_env(spec, os.environ.get("PYTHONPATH", ""))}
        self.ranks[spec.rank] = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
        log.close()
        node = self.hw.get(spec.node)
        if node is not None:  # NVML lists the process on its GPU, as a CUDA context would
            node.add_process(self.ranks[spec.rank].pid, self.uids[spec.rank])
            node.set_pids(spec.local_rank, [self.ranks[spec.rank].pid])

    def start_agent(self, node: str) -> None:
        log = (self.root / f"agent-{node}.log").open("ab")
        hw = self.hw.get(node)
        entry = ["collscope.nodeagent"] if hw is None else [
            "collscope.operator.onebox.nodeagent", "--hw-root", str(hw.root)
        ]  # fmt: skip
        cmd = [
            sys.executable, "-m", *entry,
            "--discovery", "kubelet", "--kubelet-pods-dir", str(self.pods_dir(node)),
            "--ring-volume", podcontract.TRACE_VOLUME, "--host", self.layout.address_of(node),
            "--port", str(self.port), "--node-name", node, "--auth", "none",
            *(["--no-hardware"] if hw is None else []),
            "--sample-interval-s", f"{self.sample_interval_s:g}", "run",
        ]  # fmt: skip
        self.pods_dir(node).mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "NODE_NAME": node}
        if hw is not None:  # the device map reads the simulated sysfs
            env["COLLSCOPE_SYS_ROOT"] = str(hw.sys_root)
            env["COLLSCOPE_HW_INTERVAL_S"] = f"{HW_INTERVAL_S:g}"
        self.agents[node] = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
        log.close()

    def stop_agent(self, node: str) -> None:
        p = self.agents.pop(node, None)
        if p is not None:
            p.kill()
            p.wait(10)

    def kill_rank(self, r: int) -> None:
        """SIGKILL rank ``r``'s process (and reap it)."""
        p = self.ranks[r]
        p.kill()
        p.wait(10)

    def freeze_rank(self, r: int) -> None:
        """SIGSTOP rank ``r``'s process: alive, every thread stopped (``close`` kills it)."""
        self.ranks[r].send_signal(signal.SIGSTOP)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until every agent lists every ring of its node (the ranks initialised)."""
        end = time.monotonic() + timeout_s
        want = self.layout.ranks_by_node()
        pending = set(want)
        while pending:
            for node in sorted(pending):
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    got = httpx.get(f"{self.agent_url(node)}/v1/ranks", timeout=1.0).json()
                    seen = {x.get("rank") for x in got.get("ranks", [])}
                    if set(want[node]) <= seen:
                        pending.discard(node)
            for node, p in self.agents.items():
                if p.poll() is not None:
                    raise errors.PluginError(
                        f"agent of {node} exited ({p.returncode}); see "
                        f"{self.root / f'agent-{node}.log'}"
                    )
            dead = [r for r, p in self.ranks.items() if p.poll() is not None]
            if dead:
                raise errors.PluginError(f"rank process(es) {dead} exited at start")
            if pending and time.monotonic() > end:
                raise errors.PluginError(f"agents of {sorted(pending)} saw no rings in time")
            if pending:
                time.sleep(0.2)

    def close(self) -> None:
        for t in self._timers:
            t.cancel()
        if self.fabric is not None or isinstance(self.shared, rank.Shared):
            self.shared.stop()  # (a closed fabric has nothing left to stop)
        for p in self.ranks.values():
            try:
                p.wait(2)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for node in list(self.agents):
            p = self.agents.pop(node)
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if self.fabric is not None:
            self.shared.close()
            self.fabric.close()
            self.fabric = None

    def __enter__(self) -> OneBox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
