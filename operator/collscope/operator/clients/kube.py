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

from collscope.operator import errors
from collscope.operator.domain import ids, owners

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


DIAGNOSES = "diagnoses"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


def _failed(what: str, e: Exception) -> errors.KubeError:
    reason = e.reason if isinstance(e, kubernetes.client.ApiException) else str(e)
    return errors.KubeError(f"{what}: {reason}")


class Cluster(Kube):
    """The calls of the trigger loop, the Diagnosis handlers and remediation.

    A subclass so the TrainingJob auto-creation above keeps its small surface; ``__main__``
    builds this one. Every answer is a plain dict; not found is ``None`` where that is normal.
    """

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        super().__init__(api_client)
        self._core = kubernetes.client.CoreV1Api(api_client)

    async def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except kubernetes.client.ApiException as e:
            if e.status == 404:
                return None
            raise _failed(what, e) from e
        except urllib3.exceptions.HTTPError as e:
            raise _failed(what, e) from e

    async def create_diagnosis(self, body: Mapping[str, Any]) -> bool:
        """Create a Diagnosis; False when one of that name exists (the dedupe of incidents)."""
        ns = body["metadata"]["namespace"]
        what = f"creating Diagnosis {ns}/{body['metadata']['name']}"
        try:
            await asyncio.to_thread(
                self._objects.create_namespaced_custom_object,
                GROUP, VERSION, ns, DIAGNOSES, dict(body),
            )  # fmt: skip
        except kubernetes.client.ApiException as e:
            if e.status == 409:
                return False
            raise _failed(what, e) from e
        except urllib3.exceptions.HTTPError as e:
            raise _failed(what, e) from e
        return True

    async def patch_status(
        self, plural: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Merge ``status`` into the object's status subresource."""
        await self._call(
            f"patching {plural} {namespace}/{name} status",
            self._objects.patch_namespaced_custom_object_status,
            GROUP, VERSION, namespace, plural, name, {"status": dict(status)},
            _content_type=MERGE_PATCH,
        )  # fmt: skip

    async def list_diagnoses(self, namespace: str) -> list[dict[str, Any]]:
        """Every Diagnosis of a namespace (``retention``: a job's, by ``spec.trainingJob``)."""
        got = await self._call(
            f"listing Diagnoses in {namespace}",
            self._objects.list_namespaced_custom_object, GROUP, VERSION, namespace, DIAGNOSES,
        )  # fmt: skip
        return [dict(o) for o in (got or {}).get("items") or []]

    async def get_diagnosis(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Diagnosis as the API server holds it now; None when it is gone."""
        return await self._get_custom("Diagnosis", DIAGNOSES, namespace, name)

    async def delete_diagnosis(self, namespace: str, name: str) -> None:
        """Delete a Diagnosis; one already gone is not an error."""
        await self._call(
            f"deleting Diagnosis {namespace}/{name}",
            self._objects.delete_namespaced_custom_object,
            GROUP, VERSION, namespace, DIAGNOSES, name,
        )  # fmt: skip

    async def get_trainingjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get_custom("TrainingJob", TRAININGJOBS, namespace, name)

    async def _get_custom(
        self, kind: str, plural: str, namespace: str, name: str
    ) -> dict[str, Any] | None:
        """One of our custom resources as the API server holds it now; None when it is gone."""
        obj = await self._call(
            f"reading {kind} {namespace}/{name}",
            self._objects.get_namespaced_custom_object,
            GROUP, VERSION, namespace, plural, name,
        )  # fmt: skip
        return None if obj is None else dict(obj)

    async def annotate_trainingjob(
        self, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None:
        """Merge ``annotations`` into a TrainingJob's (``profile_handlers``' own request)."""
        await self._call(
            f"annotating TrainingJob {namespace}/{name}",
            self._objects.patch_namespaced_custom_object,
            GROUP, VERSION, namespace, TRAININGJOBS, name,
            {"metadata": {"annotations": dict(annotations)}},
            _content_type=MERGE_PATCH,
        )  # fmt: skip

    async def get_node(self, name: str) -> dict[str, Any] | None:
        """A Node as the API server sends it (camelCase keys), None when gone."""
        client = self._core.api_client
        obj = await self._call(f"reading Node {name}", self._core.read_node, name)
        return None if obj is None else dict(client.sanitize_for_serialization(obj))

    async def list_nodes(self) -> list[dict[str, Any]]:
        """Every Node (the breaker's node count and its held set, rebuilt from the marks)."""
        nodes = await self._call("listing Nodes", self._core.list_node)
        if nodes is None:
            return []
        client = self._core.api_client
        return [dict(client.sanitize_for_serialization(n)) for n in nodes.items or []]

    async def patch_node_status(self, name: str, conditions: list[dict[str, Any]]) -> None:
        """Set Node conditions (a strategic merge: the list merges by ``type``, so other
        conditions, the kubelet's included, stay as they are)."""
        await self._call(
            f"patching Node {name} status", self._core.patch_node_status, name,
            {"status": {"conditions": conditions}}, _content_type=STRATEGIC_MERGE_PATCH,
        )  # fmt: skip

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Post a core v1 Event (a Node's go to ``default``, as the kubelet's do)."""
        await self._call(
            f"posting an Event in {namespace}",
            self._core.create_namespaced_event, namespace, dict(body),
        )  # fmt: skip

    async def patch_node(self, name: str, ops: list[dict[str, Any]]) -> None:
        """Apply a JSON Patch (RFC 6902) to a Node (``remediation.plan``/``undo``)."""
        await self._call(
            f"patching Node {name}", self._core.patch_node, name, ops, _content_type=JSON_PATCH
        )

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        """The ``data`` of a ConfigMap, None when it does not exist."""
        cm = await self._call(
            f"reading ConfigMap {namespace}/{name}",
            self._core.read_namespaced_config_map, name, namespace,
        )  # fmt: skip
        return None if cm is None else dict(cm.data or {})

    async def write_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """Create the ConfigMap, or merge ``data`` into it when it exists."""
        body = kubernetes.client.V1ConfigMap(
            metadata=kubernetes.client.V1ObjectMeta(name=name, namespace=namespace),
            data=dict(data),
        )
        what = f"writing ConfigMap {namespace}/{name}"
        try:
            await asyncio.to_thread(self._core.create_namespaced_config_map, namespace, body)
            return
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise _failed(what, e) from e
        except urllib3.exceptions.HTTPError as e:
            raise _failed(what, e) from e
        await self._call(
            what, self._core.patch_namespaced_config_map, name, namespace, {"data": dict(data)},
            _content_type=MERGE_PATCH,
        )  # fmt: skip

    @classmethod
    def from_environment_cluster(cls, kubeconfig: str | None = None) -> Cluster:
        """``kubeconfig`` when given; else in a pod its service account, elsewhere the current
        kubeconfig context. ``KubeError`` when none can be loaded."""
        conf = kubernetes.client.Configuration()
        try:
            if kubeconfig is None:
                try:
                    kubernetes.config.load_incluster_config(conf)  # type: ignore[no-untyped-call]
                    return cls(kubernetes.client.ApiClient(conf))
                except kubernetes.config.ConfigException:
                    pass
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=conf
            )
        except (kubernetes.config.ConfigException, OSError) as e:
            raise errors.KubeError(f"no cluster to talk to: {e}") from e
        return cls(kubernetes.client.ApiClient(conf))
