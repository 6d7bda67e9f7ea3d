"""The one-box job on a cluster: one pod of an Indexed Job, launching its rank processes.

``python -m collscope.operator.onebox.workload`` is the command of the workload image
(``examples/workload/``). Like ``torchrun --nproc-per-node``, each pod starts
``COLLSCOPE_WORKLOAD_RANKS_PER_POD`` rank processes (``rank.main``: the real plugin through
ctypes, the ring AllReduce of the one-box) with ``RANK = index * ranks_per_pod + local``; the
ranks of all pods exchange their chunk counters through the TCP fabric (``fabric``), served by
pod index 0 and reached through the Job's headless Service. What it reads (``Settings``):

| variable | from | meaning |
| --- | --- | --- |
| ``JOB_COMPLETION_INDEX`` | the Indexed Job | this pod's index |
| ``WORLD_SIZE`` | the manifest | ranks in the job |
| ``COLLSCOPE_WORKLOAD_RANKS_PER_POD`` | the manifest | rank processes per pod (default 4) |
| ``COLLSCOPE_WORKLOAD_COORDINATOR`` | the manifest | ``host:port`` of pod 0's fabric |
| ``COLLSCOPE_WORKLOAD_FAULT`` | the manifest | a ``faults.NAMES`` entry, or empty for none |
| ``COLLSCOPE_WORKLOAD_FAULT_RANKS`` | the manifest | comma-separated culprit ranks |
| ``COLLSCOPE_WORKLOAD_ONSET_S`` | the manifest | the fault acts this long after all joined |
| ``COLLSCOPE_WORKLOAD_DURATION_S`` | the manifest | all stop (exit 0) this long after; 0: never |
| ``NCCL_PROFILER_PLUGIN`` | the webhook | the plugin's path (or NCCL's short name) |
| ``COLLSCOPE_TRACE_DIR`` | the webhook | the tmpfs ring volume |
| ``POD_NAME`` ``POD_NAMESPACE`` ``NODE_NAME`` | the webhook (downward API) | ring identity |

The onset and the stop are armed by the coordinator once every rank has joined (so the test
driving it never needs to reach into the cluster's pod network). Exit status: 0 when every
rank process exited 0, else 1; SIGTERM (the Job deleted) is passed on to the ranks.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from types import FrameType

from collscope.operator import errors
from collscope.operator.onebox import fabric, faults, nccl, rank

log = logging.getLogger("collscope.workload")

# After its own ranks exit, pod 0 keeps serving this long so the other pods' ranks read the
# stop (they sync every few ms) instead of losing their coordinator first.
LINGER_S = 3.0


@dataclasses.dataclass(frozen=True)
class Settings:
    index: int
    world: int
    ranks_per_pod: int
    coordinator: tuple[str, int]
    plugin: str
    trace_dir: str
    pod: str
    namespace: str
    node: str
    fault: str | None
    fault_ranks: tuple[int, ...]
    onset_s: float
    duration_s: float
    seed: int = 0

    @property
    def pods(self) -> int:
        return self.world // self.ranks_per_pod

    def ranks(self) -> range:
        """The global ranks of this pod."""
        return range(self.index * self.ranks_per_pod, (self.index + 1) * self.ranks_per_pod)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read once; a ``SettingsError`` names the variable that is missing or unusable."""

        def need(name: str, hint: str = "") -> str:
            value = env.get(name, "").strip()
            if not value:
                raise errors.SettingsError(name, "", f"not set{hint}")
            return value

        def integer(name: str, default: int | None = None, minimum: int = 0) -> int:
            text = env.get(name, "").strip()
            if not text and default is not None:
                return default
            text = need(name)
            try:
                value = int(text)
            except ValueError as e:
                raise errors.SettingsError(name, text, "not an integer") from e
            if value < minimum:
                raise errors.SettingsError(name, text, f"must be >= {minimum}")
            return value

        def seconds(name: str, default: float) -> float:
            text = env.get(name, "").strip()
            try:
                value = float(text) if text else default
            except ValueError as e:
                raise errors.SettingsError(name, text, "not a number of seconds") from e
            if value < 0:
                raise errors.SettingsError(name, text, "must be >= 0")
            return value

        injected = " (is the pod annotated collscope.dev/diagnose and the webhook running?)"
        world = integer("WORLD_SIZE", minimum=2)
        per_pod = integer("COLLSCOPE_WORKLOAD_RANKS_PER_POD", 4, minimum=1)
        if world % per_pod:
            raise errors.SettingsError(
                "WORLD_SIZE",
                str(world),
                f"not a multiple of COLLSCOPE_WORKLOAD_RANKS_PER_POD={per_pod}",
            )
        index = integer("JOB_COMPLETION_INDEX", minimum=0)
        if index >= world // per_pod:
            raise errors.SettingsError(
                "JOB_COMPLETION_INDEX", str(index), f"the job has {world // per_pod} pods"
            )
        coordinator_text = need("COLLSCOPE_WORKLOAD_COORDINATOR")
        try:
            coordinator = fabric.parse_address(coordinator_text)
        except ValueError as e:
            name = "COLLSCOPE_WORKLOAD_COORDINATOR"
            raise errors.SettingsError(name, coordinator_text, str(e)) from e
        fault = env.get("COLLSCOPE_WORKLOAD_FAULT", "").strip() or None
        if fault == "none":
            fault = None
        if fault is not None and fault not in faults.NAMES:
            raise errors.SettingsError(
                "COLLSCOPE_WORKLOAD_FAULT", fault, f"not one of {', '.join(faults.NAMES)}"
            )
        fault_ranks: tuple[int, ...] = ()
        if fault is not None:
            text = need("COLLSCOPE_WORKLOAD_FAULT_RANKS", f" (the ranks {fault} hits)")
            try:
                fault_ranks = tuple(int(x) for x in text.split(","))
            except ValueError as e:
                raise errors.SettingsError(
                    "COLLSCOPE_WORKLOAD_FAULT_RANKS", text, "not comma-separated ranks"
                ) from e
            if not all(0 <= r < world for r in fault_ranks):
                raise errors.SettingsError(
                    "COLLSCOPE_WORKLOAD_FAULT_RANKS", text, f"ranks are 0..{world - 1}"
                )
        return cls(
            index=index,
            world=world,
            ranks_per_pod=per_pod,
            coordinator=coordinator,
            plugin=plugin_path(need("NCCL_PROFILER_PLUGIN", injected)),
            trace_dir=need("COLLSCOPE_TRACE_DIR", injected),
            pod=env.get("POD_NAME", "") or env.get("HOSTNAME", ""),
            namespace=env.get("POD_NAMESPACE", ""),
            node=env.get("NODE_NAME", ""),
            fault=fault,
            fault_ranks=fault_ranks,
            onset_s=seconds("COLLSCOPE_WORKLOAD_ONSET_S", 20.0),
            duration_s=seconds("COLLSCOPE_WORKLOAD_DURATION_S", 0.0),
        )


def plugin_path(value: str) -> str:
    """``NCCL_PROFILER_PLUGIN`` as NCCL reads it: a path, or a name ``X`` meaning
    ``libnccl-profiler-X.so`` on the library search path (the webhook sets a full path)."""
    if "/" in value or value.endswith(".so"):
        return value
    return nccl.LIB_NAME.replace("collscope", value)


def specs(s: Settings) -> list[rank.RankSpec]:
    """One ``RankSpec`` per rank process of this pod."""
    injection = None
    if s.fault is not None:
        mine = any(r in s.fault_ranks for r in s.ranks())
        # Injection.node is the truth for the demo's verdict; only the culprit's pod knows it.
        injection = faults.Injection(s.fault, s.fault_ranks, 0.0, s.node if mine else "")
    out = []
    for r in s.ranks():
        spec = rank.RankSpec(
            rank=r, local_rank=r - s.ranks().start, world=s.world, nnodes=s.pods, node=s.node,
            pod=s.pod, namespace=s.namespace, trace_dir=s.trace_dir, plugin=s.plugin,
            timing=rank.Timing(), injection=injection, seed=s.seed,
        )  # fmt: skip
        out.append(spec)
    return out


def coordinator(s: Settings) -> fabric.Server:
    """Pod 0's fabric, on every interface at the coordinator's port."""
    return fabric.Server(
        ("0.0.0.0", s.coordinator[1]),  # reached through the headless Service
        s.world,
        rank.Timing().nchannels,
        onset_after_s=s.onset_s if s.fault is not None else None,
        duration_s=s.duration_s or None,
    ).start()


def run(s: Settings) -> int:
    """Serve the fabric (pod 0), run this pod's ranks to the end; the exit status."""
    server = coordinator(s) if s.index == 0 else None
    host, port = s.coordinator
    if server is not None:
        host = "127.0.0.1"  # our own ranks need no DNS
    procs = []
    for spec in specs(s):
        cmd = [sys.executable, "-m", "collscope.operator.onebox.rank", rank.spec_json(spec),
               f"tcp://{host}:{port}"]  # fmt: skip
        procs.append(subprocess.Popen(cmd))

    def forward(signum: int, frame: FrameType | None) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [p.wait() for p in procs]
    if server is not None:
        time.sleep(LINGER_S)
        server.close()
    log.info("ranks %s exited %s", list(s.ranks()), codes)
    return 0 if all(c == 0 for c in codes) else 1


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        settings = Settings.from_env(os.environ)
    except errors.SettingsError as e:
        print(f"collscope workload: error: {e}", file=sys.stderr)
        sys.exit(2)
    log.info(
        "pod %d of %d: ranks %s, fault %s on %s, coordinator %s:%d",
        settings.index, settings.pods, list(settings.ranks()), settings.fault,
        settings.fault_ranks, *settings.coordinator,
    )  # fmt: skip
    sys.exit(run(settings))


if __name__ == "__main__":
    main()
