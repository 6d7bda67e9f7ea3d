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

Each is declared once in ``VARIABLES`` (``collscope.nodeagent.envsettings``).

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
from typing import Any

from collscope.nodeagent import envsettings
from collscope.operator import errors
from collscope.operator.onebox import fabric, faults, nccl, rank

log = logging.getLogger("collscope.workload")

# After its own ranks exit, pod 0 keeps serving this long so the other pods' ranks read the
# stop (they sync every few ms) instead of losing their coordinator first.
LINGER_S = 3.0


@dataclasses.dataclass(frozen=True)
class Settings:
    world: int
    index: int
    coordinator: tuple[str, int]
    plugin: str
    trace_dir: str
    ranks_per_pod: int = 4
    pod: str = ""
    namespace: str = ""
    node: str = ""
    fault: str | None = None
    fault_ranks: tuple[int, ...] = ()
    onset_s: float = 20.0
    duration_s: float = 0.0
    seed: int = 0

    @property
    def pods(self) -> int:
        return self.world // self.ranks_per_pod

    def ranks(self) -> range:
        """The global ranks of this pod."""
        return range(self.index * self.ranks_per_pod, (self.index + 1) * self.ranks_per_pod)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read once (``VARIABLES``); a ``SettingsError`` names the variable that is missing or
        unusable, or that does not fit the others."""
        found = envsettings.values(env, VARIABLES)
        found.setdefault("pod", env.get("HOSTNAME", "").strip())
        return _fitted(cls(**found))


def _fitted(s: Settings) -> Settings:
    """``s`` if its values fit together; the fault's ranks dropped when there is no fault."""
    if s.world % s.ranks_per_pod:
        raise errors.SettingsError(
            "WORLD_SIZE",
            str(s.world),
            f"not a multiple of COLLSCOPE_WORKLOAD_RANKS_PER_POD={s.ranks_per_pod}",
        )
    if s.index >= s.pods:
        raise errors.SettingsError(
            "JOB_COMPLETION_INDEX", str(s.index), f"the job has {s.pods} pods"
        )
    if s.fault is None:
        return dataclasses.replace(s, fault_ranks=())
    name = "COLLSCOPE_WORKLOAD_FAULT_RANKS"
    if not s.fault_ranks:
        raise errors.SettingsError(name, "", f"not set (the ranks {s.fault} hits)")
    if not all(0 <= r < s.world for r in s.fault_ranks):
        text = ",".join(map(str, s.fault_ranks))
        raise errors.SettingsError(name, text, f"ranks are 0..{s.world - 1}")
    return s


def plugin_path(value: str) -> str:
    """``NCCL_PROFILER_PLUGIN`` as NCCL reads it: a path, or a name ``X`` meaning
    ``libnccl-profiler-X.so`` on the library search path (the webhook sets a full path)."""
    if "/" in value or value.endswith(".so"):
        return value
    return nccl.LIB_NAME.replace("collscope", value)


def _fault(raw: str) -> str | None:
    if raw == "none":
        return None
    if raw not in faults.NAMES:
        raise ValueError(f"not one of {', '.join(faults.NAMES)}")
    return raw


def _ranks(raw: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in raw.split(","))
    except ValueError as e:
        raise ValueError("not comma-separated ranks") from e


_INJECTED = " (is the pod annotated collscope.dev/diagnose and the webhook running?)"
_SECONDS = envsettings.number(minimum=0, unit="a number of seconds")
Var = envsettings.Var

# What a pod reads, in the order checked (the module docstring's table says who sets each).
VARIABLES: tuple[envsettings.Var[Any], ...] = (
    Var("WORLD_SIZE", envsettings.integer(minimum=2), "ranks in the job", "world", required=True),
    Var("COLLSCOPE_WORKLOAD_RANKS_PER_POD", envsettings.integer(minimum=1),
        "rank processes per pod", "ranks_per_pod"),
    Var("JOB_COMPLETION_INDEX", envsettings.integer(minimum=0), "this pod's index", "index",
        required=True),
    Var("COLLSCOPE_WORKLOAD_COORDINATOR", fabric.parse_address, "host:port of pod 0's fabric",
        "coordinator", required=True),
    Var("COLLSCOPE_WORKLOAD_FAULT", _fault, "the fault, or none", "fault"),
    Var("COLLSCOPE_WORKLOAD_FAULT_RANKS", _ranks, "the culprit ranks", "fault_ranks"),
    Var("NCCL_PROFILER_PLUGIN", plugin_path, "the plugin", "plugin", required=True,
        hint=_INJECTED),
    Var("COLLSCOPE_TRACE_DIR", envsettings.text, "the ring volume", "trace_dir",
        required=True, hint=_INJECTED),
    Var("POD_NAME", envsettings.text, "the pod (else HOSTNAME)", "pod"),
    Var("POD_NAMESPACE", envsettings.text, "the pod's namespace", "namespace"),
    Var("NODE_NAME", envsettings.text, "the pod's node", "node"),
    Var("COLLSCOPE_WORKLOAD_ONSET_S", _SECONDS, "the fault's delay after all joined",
        "onset_s"),
    Var("COLLSCOPE_WORKLOAD_DURATION_S", _SECONDS, "the run's length (0: no end)",
        "duration_s"),
)  # fmt: skip


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
