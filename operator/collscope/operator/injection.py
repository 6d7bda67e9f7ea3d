"""The mutating webhook's JSON Patch for an opted-in pod (DESIGN.md §1).

A pod whose annotations carry ``collscope.dev/diagnose: "true"`` gets:

- a volume ``collscope-plugin`` (``emptyDir``) and an init container ``collscope-plugin`` that
  copies ``libnccl-profiler-collscope.so`` from the collscope image into it;
- a volume ``collscope-trace`` (``emptyDir`` with ``medium: Memory``): the rings live in tmpfs,
  where the node agent finds them under the kubelet's pod volume directory;
- in every app container: both volumes mounted (the plugin read-only), ``NCCL_PROFILER_PLUGIN``
  set to the plugin's full path, ``COLLSCOPE_TRACE_DIR``, and the downward-API values the
  plugin writes into its ring header (``POD_NAME``, ``POD_NAMESPACE``, ``NODE_NAME``).

Rules: pods without the annotation are untouched ([]); anything the pod already has wins (an env
var, volume, init container or mount path of the same name is kept as it is and ours skipped),
so applying the patch and computing it again yields [] (idempotent). Lists the pod lacks are
added whole; lists it has are appended to (``/-``), so the patch applies to the pod as sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collscope.operator import owners, patches

PLUGIN_VOLUME = "collscope-plugin"
TRACE_VOLUME = "collscope-trace"
INIT_CONTAINER = "collscope-plugin"
PLUGIN_FILE = "libnccl-profiler-collscope.so"

Op = patches.Op


@dataclass(frozen=True)
class InjectionSettings:
    """What the webhook injects; defaults match the chart's image layout."""

    image: str = "ghcr.io/collscope/collscope-agent:0.1.0"  # holds the built plugin
    image_plugin_path: str = f"/opt/collscope/lib/{PLUGIN_FILE}"  # where the image keeps it
    plugin_dir: str = "/opt/collscope-plugin"  # mount path of the plugin volume in the pod
    trace_dir: str = "/run/collscope"  # mount path of the tmpfs ring volume
    # tmpfs counts against the pod's memory; 8 ranks x 8 MiB rings fit with room to spare.
    trace_size_limit: str = "128Mi"
    ring_bytes: int | None = None  # COLLSCOPE_RING_BYTES when set; the plugin's default else

    @property
    def plugin_path(self) -> str:
        return f"{self.plugin_dir}/{PLUGIN_FILE}"


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def env_vars(settings: InjectionSettings) -> list[dict[str, Any]]:
    """Env added to each app container (names the plugin reads: native/src/ring.c)."""
    env: list[dict[str, Any]] = [
        {"name": "NCCL_PROFILER_PLUGIN", "value": settings.plugin_path},
        {"name": "COLLSCOPE_TRACE_DIR", "value": settings.trace_dir},
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        _field_env("NODE_NAME", "spec.nodeName"),
    ]
    if settings.ring_bytes is not None:
        env.append({"name": "COLLSCOPE_RING_BYTES", "value": str(settings.ring_bytes)})
    return env


def volumes(settings: InjectionSettings) -> list[dict[str, Any]]:
    return [
        {"name": PLUGIN_VOLUME, "emptyDir": {}},
        {
            "name": TRACE_VOLUME,
            "emptyDir": {"medium": "Memory", "sizeLimit": settings.trace_size_limit},
        },
    ]


def init_container(settings: InjectionSettings) -> dict[str, Any]:
    return {
        "name": INIT_CONTAINER,
        "image": settings.image,
        "command": ["cp", settings.image_plugin_path, f"{settings.plugin_dir}/{PLUGIN_FILE}"],
        "volumeMounts": [{"name": PLUGIN_VOLUME, "mountPath": settings.plugin_dir}],
        # A file copy: small requests keep the pod's effective requests unchanged.
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True},
    }


def mounts(settings: InjectionSettings) -> list[dict[str, Any]]:
    return [
        {"name": PLUGIN_VOLUME, "mountPath": settings.plugin_dir, "readOnly": True},
        {"name": TRACE_VOLUME, "mountPath": settings.trace_dir},
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
    for i, container in enumerate(spec.get("containers") or ()):
        base = patches.pointer("spec", "containers", str(i))
        ops += _append(container.get("env"), f"{base}/env", env_vars(settings), "name")
        # A mount path already in use (or our volume mounted elsewhere) is the user's choice.
        taken = {m.get("name") for m in container.get("volumeMounts") or ()}
        wanted = [m for m in mounts(settings) if m["name"] not in taken]
        ops += _append(container.get("volumeMounts"), f"{base}/volumeMounts", wanted, "mountPath")
    return ops
