"""The mutating webhook's JSON Patch for an opted-in pod (docs/design.md, "Pod contract"; the
names come from ``collscope.nodeagent.podcontract``, which the node agent reads too).

A pod whose annotations carry ``collscope.dev/diagnose: "true"`` gets:

- a volume ``collscope-plugin`` (``emptyDir``) and an init container ``collscope-plugin`` that
  copies ``libnccl-profiler-collscope.so`` from the collscope image into it;
- a volume ``collscope-trace`` (``emptyDir`` with ``medium: Memory``): the rings live in tmpfs,
  where the node agent finds them under the kubelet's pod volume directory;
- in every app container: both volumes mounted (the plugin read-only), ``NCCL_PROFILER_PLUGIN``
  set to the plugin's full path, ``COLLSCOPE_TRACE_DIR``, and the downward-API values the
  plugin writes into its ring header (``POD_NAME``, ``POD_NAMESPACE``, ``NODE_NAME``).

- in every app container, unless the pod is annotated ``collscope.dev/flight-recorder: "false"``,
  what PyTorch needs for the agent to take a Flight Recorder dump of a live rank
  (``flight_recorder_env``): ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (torch 2.13 keeps 2,000 entries
  by default, older torch none; its NCCL debug pipe exists only when the size is > 0) and
  ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` (the pipe's stem, in the ring volume: a FIFO takes no
  space). A container that sets the buffer size under either of torch's names
  (``TORCH_FR_BUFFER_SIZE`` too, ``0`` included) or names its own pipe keeps its choice. The
  dump itself goes where torch puts it (``~/.cache/torch/comm_lib_trace_rank_<rank>`` unless
  the pod says otherwise), where the agent looks: a few MB per rank kept out of the tmpfs, whose
  size limit evicts the pod when exceeded.

- the dormant EROICA probe (``collscope.probe``'s ``site/``: ``sitecustomize.py`` +
  ``collscope_probe.py``, standard library only) copied by the same init container into
  ``<plugin_dir>/probe`` and put first on ``PYTHONPATH`` with ``COLLSCOPE_PROBE=dormant``
  (``probe_env``): it sleeps until the node agent arms it (``POST /v1/profile``). A container
  that sets ``PYTHONPATH`` by value gets ours prepended. One that does not may still have one
  from its image's ``ENV``, which the webhook cannot see and a pod-level ``PYTHONPATH`` would
  hide (breaking the training's imports): such a container gets the probe only when the pod is
  annotated ``collscope.dev/probe: "on"`` (the owner says the image sets none). ``"off"`` opts
  out everywhere; a ``PYTHONPATH`` from ``valueFrom`` cannot be prepended to and is left alone.

Rules: pods without the annotation are untouched ([]); anything the pod already has wins (an env
var, volume, init container or mount path of the same name is kept as it is and ours skipped),
so applying the patch and computing it again yields [] (idempotent). Lists the pod lacks are
added whole; lists it has are appended to (``/-``), so the patch applies to the pod as sent.

One exception, plugins side by side (issue 15 item 8): NCCL loads a single profiler plugin, so
a container that already names one in ``NCCL_PROFILER_PLUGIN`` (NCCL Inspector, a vendor
plugin) would silently keep it and collscope see nothing. Its entry is replaced by ours and
the original entry (its ``value`` or ``valueFrom``, verbatim, ``none`` included) moves to
``COLLSCOPE_NEXT_PROFILER_PLUGIN``, which the native plugin loads and forwards every call to;
``displaced`` lists them so the webhook can warn. A container that sets
``COLLSCOPE_NEXT_PROFILER_PLUGIN`` itself arranged the chain and is left alone. A value coming
from ``envFrom`` cannot be seen here: our explicit entry overrides it, unforwarded.

The init container passes the Pod Security Standards' *restricted* profile (non-root uid,
no privilege escalation, every capability dropped, the runtime's default seccomp profile), so
injection never makes a pod that a restricted namespace would have admitted rejected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collscope.nodeagent import podcontract
from collscope.operator.domain import owners, patches

PLUGIN_VOLUME = "collscope-plugin"
INIT_CONTAINER = "collscope-plugin"
PLUGIN_FILE = "libnccl-profiler-collscope.so"
FR_OPT_OUT_ANNOTATION = "collscope.dev/flight-recorder"  # "false": no Flight Recorder env
PROBE_ANNOTATION = "collscope.dev/probe"  # "off": no probe; "on": set PYTHONPATH when unset
# torch reads the buffer size under both names (FlightRecorder.hpp), ProcessGroupNCCL's pipe
# under the second only: setting the second is right for every torch; either set is the pod's.
FR_BUFFER_ENVS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
# torch 2.13's default size (FlightRecorder.hpp): ~2 MB of host memory per rank with stacks.
FR_BUFFER_ENTRIES = 2000
# The init container's user: any non-root uid can copy the plugin (0644 in the image) into the
# emptyDir (created 0777). 65532 is the distroless "nonroot" user, a common choice.
INIT_UID = 65532

Op = patches.Op


@dataclass(frozen=True)
class InjectionSettings:
    """What the webhook injects; defaults match the chart's image layout."""

    image: str = "ghcr.io/collscope/collscope-agent:0.1.0"  # holds the built plugin
    image_plugin_path: str = f"/opt/collscope/lib/{PLUGIN_FILE}"  # where the image keeps it
    image_probe_dir: str = "/opt/collscope/probe"  # the dormant probe in the image (Dockerfile)
    plugin_dir: str = "/opt/collscope-plugin"  # mount path of the plugin volume in the pod
    trace_dir: str = podcontract.TRACE_DIR  # mount path of the tmpfs ring volume
    # tmpfs counts against the pod's memory; 8 ranks x 8 MiB rings fit with room to spare.
    trace_size_limit: str = "128Mi"
    ring_bytes: int | None = None  # COLLSCOPE_RING_BYTES when set; the plugin's default else

    @property
    def plugin_path(self) -> str:
        return f"{self.plugin_dir}/{PLUGIN_FILE}"

    @property
    def probe_dir(self) -> str:
        """Where the pod finds the probe: ``cp -R`` puts the image's directory here."""
        return f"{self.plugin_dir}/{self.image_probe_dir.rstrip('/').rsplit('/', 1)[-1]}"


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def env_vars(settings: InjectionSettings) -> list[dict[str, Any]]:
    """Env added to each app container (names the plugin reads: native/src/ring.c)."""
    env: list[dict[str, Any]] = [
        {"name": podcontract.PLUGIN_ENV, "value": settings.plugin_path},
        {"name": podcontract.TRACE_DIR_ENV, "value": settings.trace_dir},
        *(_field_env(name, path) for name, path in podcontract.DOWNWARD_API),
    ]
    if settings.ring_bytes is not None:
        env.append({"name": podcontract.RING_BYTES_ENV, "value": str(settings.ring_bytes)})
    return env


def flight_recorder_env(
    settings: InjectionSettings, container: Mapping[str, Any], *, has_trace_dir: bool = True
) -> list[dict[str, Any]]:
    """Env making a Flight Recorder dump of ``container`` possible, less what it sets itself
    (the buffer size under either of torch's names, the pipe). No pipe unless the ring volume
    is at ``trace_dir`` (``has_trace_dir``): torch fails its process group's start when it
    cannot make the FIFO."""
    have = {e.get("name") for e in container.get("env") or ()}
    env: list[dict[str, Any]] = []
    if not have & set(FR_BUFFER_ENVS):
        env.append({"name": FR_BUFFER_ENVS[1], "value": str(FR_BUFFER_ENTRIES)})
    if podcontract.FR_PIPE_ENV not in have and has_trace_dir:
        stem = f"{settings.trace_dir}/fr_pipe_rank_"  # torch adds <rank>.pipe
        env.append({"name": podcontract.FR_PIPE_ENV, "value": stem})
    return env


def flight_recorder_wanted(pod: Mapping[str, Any]) -> bool:
    """False when the pod opted out of the Flight Recorder env (annotation ``"false"``)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(FR_OPT_OUT_ANNOTATION, "true")).strip().lower() != "false"


def probe_wanted(pod: Mapping[str, Any]) -> str:
    """The pod's probe annotation: ``off``, ``on`` or ``auto`` (unset or anything else)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = str(annotations.get(PROBE_ANNOTATION, "")).strip().lower()
    if value in ("off", "false", "0"):
        return "off"
    return "on" if value in ("on", "true", "1") else "auto"


def probe_env(
    settings: InjectionSettings, container: Mapping[str, Any], base: str, wanted: str
) -> tuple[list[Op], list[dict[str, Any]]]:
    """What puts the probe first on the container's ``PYTHONPATH`` (module docstring): an op
    replacing its entry by ``<probe_dir>:<its value>``, or an entry to add (``wanted == "on"``
    only), each with ``COLLSCOPE_PROBE``; nothing when off, already there, or not safely
    possible."""
    if wanted == "off":
        return [], []
    mode = {"name": podcontract.PROBE_ENV, "value": podcontract.PROBE_DORMANT}
    found = [j for j, e in enumerate(container.get("env") or ()) if e.get("name") == "PYTHONPATH"]
    if not found:
        path = {"name": "PYTHONPATH", "value": settings.probe_dir}
        return ([], [path, mode]) if wanted == "on" else ([], [])
    j = found[-1]  # the last entry of a name is effective
    entry = container["env"][j]
    if "valueFrom" in entry:
        return [], []
    value = str(entry.get("value") or "")
    if value.split(":", maxsplit=1)[0] == settings.probe_dir:
        return [], [mode]  # a second pass: only what may still be missing
    joined = f"{settings.probe_dir}:{value}" if value else settings.probe_dir
    new = {"name": "PYTHONPATH", "value": joined}
    return [{"op": "replace", "path": f"{base}/env/{j}", "value": new}], [mode]


def volumes(settings: InjectionSettings) -> list[dict[str, Any]]:
    return [
        {"name": PLUGIN_VOLUME, "emptyDir": {}},
        {
            "name": podcontract.TRACE_VOLUME,
            "emptyDir": {"medium": "Memory", "sizeLimit": settings.trace_size_limit},
        },
    ]


def init_container(settings: InjectionSettings) -> dict[str, Any]:
    return {
        "name": INIT_CONTAINER,
        "image": settings.image,
        # cp alone (the image may have no shell): the plugin file and the probe directory.
        "command": [
            "cp",
            "-R",
            settings.image_plugin_path,
            settings.image_probe_dir,
            f"{settings.plugin_dir}/",
        ],
        "volumeMounts": [{"name": PLUGIN_VOLUME, "mountPath": settings.plugin_dir}],
        # A file copy: small requests keep the pod's effective requests unchanged.
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": INIT_UID,
            "runAsGroup": INIT_UID,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def mounts(settings: InjectionSettings) -> list[dict[str, Any]]:
    return [
        {"name": PLUGIN_VOLUME, "mountPath": settings.plugin_dir, "readOnly": True},
        {"name": podcontract.TRACE_VOLUME, "mountPath": settings.trace_dir},
    ]


def _append(
    existing: Sequence[Mapping[str, Any]] | None,
    path: str,
    items: Sequence[Mapping[str, Any]],
    key: str,
) -> list[Op]:
    """Ops adding the ``items`` whose ``key`` is not already used in ``existing``."""
    used = {e.get(key) for e in existing or ()}
    new = [dict(i) for i in items if i[key] not in used]
    if not new:
        return []
    if existing is None:
        return [{"op": "add", "path": path, "value": new}]
    return [{"op": "add", "path": f"{path}/-", "value": i} for i in new]


def patch(pod: Mapping[str, Any], settings: InjectionSettings) -> list[Op]:
    """The JSON Patch injecting collscope into ``pod``; [] when not opted in or done already."""
    if not owners.is_opted_in(pod.get("metadata") or {}):
        return []
    spec = pod.get("spec") or {}
    ops: list[Op] = []
    ops += _append(spec.get("volumes"), "/spec/volumes", volumes(settings), "name")
    ops += _append(
        spec.get("initContainers"), "/spec/initContainers", [init_container(settings)], "name"
    )
    with_fr = flight_recorder_wanted(pod)
    with_probe = probe_wanted(pod)
    for i, container in enumerate(spec.get("containers") or ()):
        base = patches.pointer("spec", "containers", str(i))
        ops += _chain_plugin(container, base, settings)
        # A mount path already in use (or our volume mounted elsewhere) is the user's choice.
        have = container.get("volumeMounts") or ()
        taken = {m.get("name") for m in have}
        wanted = [m for m in mounts(settings) if m["name"] not in taken]
        paths = {m.get("mountPath"): m.get("name") for m in have}
        trace = podcontract.TRACE_VOLUME
        ring_dir = paths.get(settings.trace_dir, trace) == trace and (
            trace not in taken or paths.get(settings.trace_dir) == trace
        )
        env = env_vars(settings)
        if with_fr:
            env += flight_recorder_env(settings, container, has_trace_dir=ring_dir)
        probe_ops, probe_vars = probe_env(settings, container, base, with_probe)
        ops += probe_ops
        env += probe_vars
        ops += _append(container.get("env"), f"{base}/env", env, "name")
        ops += _append(container.get("volumeMounts"), f"{base}/volumeMounts", wanted, "mountPath")
    return ops


@dataclass(frozen=True)
class Displaced:
    """A container's own profiler plugin, moved behind ours (``COLLSCOPE_NEXT_PROFILER_PLUGIN``)."""

    container: str
    entry: Mapping[str, Any]  # the original env entry: ``value`` or ``valueFrom``

    def describe(self) -> str:
        source = self.entry.get("value")
        shown = repr(source) if source is not None else "a valueFrom reference"
        return (
            f"container {self.container!r} set {podcontract.PLUGIN_ENV}={shown}: NCCL loads one "
            "profiler plugin, so collscope's now loads and forwards every call to it "
            f"({podcontract.NEXT_PLUGIN_ENV})"
        )


def _own_plugin(container: Mapping[str, Any], settings: InjectionSettings) -> list[int]:
    """Indexes of the container's ``NCCL_PROFILER_PLUGIN`` entries that are not ours, when
    they are to be chained (none when the container arranged ``COLLSCOPE_NEXT_PROFILER_PLUGIN``
    itself)."""
    env = container.get("env") or ()
    if any(e.get("name") == podcontract.NEXT_PLUGIN_ENV for e in env):
        return []
    ours = {"name": podcontract.PLUGIN_ENV, "value": settings.plugin_path}
    return [
        j for j, e in enumerate(env) if e.get("name") == podcontract.PLUGIN_ENV and dict(e) != ours
    ]


def displaced(pod: Mapping[str, Any], settings: InjectionSettings) -> list[Displaced]:
    """The plugins ``patch`` moves behind collscope's, one per container that has one."""
    if not owners.is_opted_in(pod.get("metadata") or {}):
        return []
    out = []
    for container in (pod.get("spec") or {}).get("containers") or ():
        found = _own_plugin(container, settings)
        if found:
            entry = dict(container["env"][found[-1]])  # the last entry of a name is effective
            entry.pop("name", None)
            out.append(Displaced(str(container.get("name", "")), entry))
    return out


def _chain_plugin(container: Mapping[str, Any], base: str, settings: InjectionSettings) -> list[Op]:
    """Ops putting our plugin in front of the container's own: its entries replaced by ours,
    the effective one copied to ``COLLSCOPE_NEXT_PROFILER_PLUGIN``; [] when there is none."""
    found = _own_plugin(container, settings)
    if not found:
        return []
    env = container["env"]
    ops: list[Op] = [
        {"op": "replace", "path": f"{base}/env/{j}",
         "value": {"name": podcontract.PLUGIN_ENV, "value": settings.plugin_path}}
        for j in found
    ]  # fmt: skip
    nxt = {k: v for k, v in env[found[-1]].items() if k != "name"}
    chained = {"name": podcontract.NEXT_PLUGIN_ENV, **nxt}
    ops.append({"op": "add", "path": f"{base}/env/-", "value": chained})
    return ops


def forwarded(pod: Mapping[str, Any]) -> list[str]:
    """Containers of an admitted pod whose own plugin collscope's forwards to (for the
    operator's Warning Event on the live pod)."""
    return [
        str(c.get("name", ""))
        for c in (pod.get("spec") or {}).get("containers") or ()
        if any(e.get("name") == podcontract.NEXT_PLUGIN_ENV for e in c.get("env") or ())
    ]


def is_injected(pod: Mapping[str, Any]) -> bool:
    """Whether the webhook patched this pod (its init container is there)."""
    inits = (pod.get("spec") or {}).get("initContainers") or ()
    return any(c.get("name") == INIT_CONTAINER for c in inits)
