"""The operator's Kubernetes API adapter: the few calls handlers make, typed, with the client's
exceptions translated here and nowhere else (STYLE habit 6).

It wraps the official ``kubernetes`` client (synchronous) and runs each call in a worker thread,
so kopf's event loop never blocks. kopf authenticates itself the same way when this client is
installed (it piggybacks on ``kubernetes`` configuration), so both talk to the same cluster.
Answers are plain dicts as the API server sends them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import kubernetes
import urllib3

from collscope.operator import errors, ids, owners

GROUP = "collscope.dev"
VERSION = "v1alpha1"
TRAININGJOBS = "trainingjobs"
# Owner kinds the walk in owners.resolve looks up; anything else is never read, so RBAC needs
# only get on these. Kind -> (group, plural); the version comes from the ownerReference.
READABLE_OWNERS: Mapping[str, tuple[str, str]] = {
    "Job": ("batch", "jobs"),
    "StatefulSet": ("apps", "statefulsets"),
    "ReplicaSet": ("apps", "replicasets"),
}


class Kube:
    """Async facade over one ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self._objects = kubernetes.client.CustomObjectsApi(api_client)

    @classmethod
    def from_environment(cls) -> Kube:
        """In a pod: its service account; elsewhere: the current kubeconfig context."""
        try:
            kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
        return cls(kubernetes.client.ApiClient())

    async def owner_metadata(
        self, owner: owners.OwnerRef, namespace: ids.Namespace
    ) -> Mapping[str, Any] | None:
        """An owner's ``metadata``; None when its kind is not read or it is gone/forbidden."""
        known = READABLE_OWNERS.get(owner.kind)
        if known is None:
            return None
        group, plural = known
        version = owner.api_version.rpartition("/")[2]
        try:
            obj = await asyncio.to_thread(
                self._objects.get_namespaced_custom_object,
                group,
                version,
                namespace,
                plural,
                owner.name,
            )
        except kubernetes.client.ApiException as e:
            if e.status in (403, 404):
                return None
            raise errors.KubeError(
                f"reading {owner.kind} {namespace}/{owner.name}: {e.reason}"
            ) from e
        except urllib3.exceptions.HTTPError as e:
            raise errors.KubeError(f"reading {owner.kind} {namespace}/{owner.name}: {e}") from e
        if not isinstance(obj, Mapping):
            raise errors.KubeError(f"reading {owner.kind} {namespace}/{owner.name}: not an object")
        meta: Mapping[str, Any] = obj.get("metadata") or {}
        return meta

    async def create_trainingjob(self, body: Mapping[str, Any]) -> bool:
        """Create a TrainingJob; False when one of that name exists already."""
        namespace = body["metadata"]["namespace"]
        try:
            await asyncio.to_thread(
                self._objects.create_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                TRAININGJOBS,
                dict(body),
            )
        except kubernetes.client.ApiException as e:
            if e.status == 409:
                return False
            raise errors.KubeError(
                f"creating TrainingJob {namespace}/{body['metadata']['name']}: {e.reason}"
            ) from e
        except urllib3.exceptions.HTTPError as e:
            raise errors.KubeError(f"creating TrainingJob in {namespace}: {e}") from e
        return True
