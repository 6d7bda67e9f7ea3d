"""kopf handlers of collscope-operator: kopf kwargs in, pure functions, results out.

So far: TrainingJobs for opted-in workloads. Pods are watched with ``kopf.on.event`` only, which
writes nothing to them (no finalizer, no kopf annotations: user pods are not ours to mark). For
each opted-in pod the workload is resolved (``owners.resolve``, reading Jobs/StatefulSets/
ReplicaSets through ``kube.Kube``) and its TrainingJob created once, owned by the workload so
Kubernetes deletes it with the workload.

Handlers are attached to a registry by ``register`` (no import-time registration, so tests and
``__main__`` choose the registry); the API adapter arrives in ``memo.kube`` and the names of
TrainingJobs known to exist in ``memo.trainingjobs`` (a set), which saves an API call per pod
event. ``on.event`` errors are only logged by kopf, so failures here are logged and the next
event of the same pod tries again. ``memo.locks`` serialises the pods of one workload. Each
opted-in pod's node and host IP are noted in ``memo.pods`` (``jobs.Pods``) under its
TrainingJob, where the trigger loop (``trigger_loop.py``) finds the agents of the job's nodes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from collscope.operator import errors, ids, jobs, kube, owners

PARALLELISM_ANNOTATION = "collscope.dev/parallelism"


def register(registry: kopf.OperatorRegistry) -> None:
    """Attach every handler of this module to ``registry``."""
    kopf.on.event(
        "v1",
        "pods",
        annotations={owners.OPT_IN_ANNOTATION: kopf.PRESENT},
        registry=registry,
    )(opted_in_pod)


def memo_for(api: kube.Kube) -> kopf.Memo:
    """The operator's shared state, passed to ``kopf.operator(memo=...)``."""
    return kopf.Memo(kube=api, trainingjobs=set(), locks={}, pods=jobs.Pods())


async def opted_in_pod(
    event: kopf.RawEvent,
    body: kopf.Body,
    memo: kopf.Memo,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    **_: Any,
) -> None:
    """Make sure the workload of an opted-in pod has its TrainingJob."""
    meta = body.get("metadata") or {}
    pods: jobs.Pods = memo.pods
    if event.get("type") == "DELETED" or not owners.is_opted_in(meta):
        pods.forget(str(meta.get("namespace", "")), str(meta.get("name", "")))
        return
    api: kube.Kube = memo.kube
    known: set[tuple[str, str]] = memo.trainingjobs
    namespace = ids.Namespace(str(meta.get("namespace", "")))
    try:
        owner = await owners.resolve(meta, api.owner_metadata)
    except errors.KubeError as e:
        logger.warning("cannot resolve the workload of pod %s: %s", meta.get("name"), e)
        return
    if owner is None:
        logger.info(
            "pod %s has no controller: create a TrainingJob with a pod selector",
            meta.get("name"),
        )
        return
    name = owners.trainingjob_name(owner)
    pod_status = body.get("status") or {}
    place = jobs.PodPlace(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node=str((body.get("spec") or {}).get("nodeName") or ""),
        host_ip=str(pod_status.get("hostIP") or ""),
    )
    pods.note((namespace, name), place)
    # kopf handles pods concurrently: the pods of one workload wait for each other here, so the
    # TrainingJob is created once instead of once plus a 409 per pod.
    locks: dict[tuple[str, str], asyncio.Lock] = memo.locks
    async with locks.setdefault((namespace, name), asyncio.Lock()):
        await _ensure_trainingjob(
            api, known=known, owner=owner, namespace=namespace, meta=meta, logger=logger
        )


async def _ensure_trainingjob(
    api: kube.Kube,
    *,
    known: set[tuple[str, str]],
    owner: owners.OwnerRef,
    namespace: ids.Namespace,
    meta: Any,
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> None:
    name = owners.trainingjob_name(owner)
    if (namespace, name) in known:
        return
    parallelism = (meta.get("annotations") or {}).get(PARALLELISM_ANNOTATION)
    try:
        tj = owners.trainingjob_body(owner, namespace, parallelism)
    except errors.ParallelismError as e:
        logger.warning("ignoring %s on pod %s: %s", PARALLELISM_ANNOTATION, meta.get("name"), e)
        tj = owners.trainingjob_body(owner, namespace)
    try:
        created = await api.create_trainingjob(tj)
    except errors.KubeError as e:
        logger.warning("cannot create TrainingJob %s/%s: %s", namespace, name, e)
        return
    known.add((namespace, name))
    if created:
        logger.info("created TrainingJob %s/%s for %s %s", namespace, name, owner.kind, owner.name)
