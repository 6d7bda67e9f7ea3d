"""kopf handlers of collscope-operator: kopf kwargs in, pure functions, results out.

So far: TrainingJobs for opted-in workloads. Pods are watched with ``kopf.on.event`` only, which
writes nothing to them (no finalizer, no kopf annotations: user pods are not ours to mark). For
each opted-in pod the workload is resolved (``owners.resolve``, reading Jobs/StatefulSets/
ReplicaSets through ``kube.Kube``) and its TrainingJob created once, owned by the workload so
Kubernetes deletes it with the workload.

Handlers are attached to a registry by ``register`` (no import-time registration, so tests and
``__main__`` choose the registry); the shared state arrives as kopf's ``memo``
(``state.OperatorState``): the API adapter in ``kube`` and the names of TrainingJobs known to
exist in ``trainingjobs`` (a set), which saves an API call per pod event. ``on.event`` errors
are only logged by kopf, so failures here are logged and the next event of the same pod tries
again. ``locks`` serialises the pods of one workload. Each opted-in pod's node and host IP are
noted in ``pods`` (``jobs.Pods``) under its
TrainingJob, where the trigger loop (``trigger_loop.py``) finds the agents of the job's nodes.

Hand-written TrainingJobs (issue 15 item 7): one with ``spec.selector`` (a LabelSelector) owns
the opted-in pods of its namespace whose labels it selects (``owners.selector_matches``). The
selectors are kept in ``selectors`` by an ``on.event`` handler on TrainingJobs, and the
opted-in pods seen in ``seen`` (labels and place), so a TrainingJob written after its pods
finds them at once. A pod a selector claims is noted under that TrainingJob and gets no
TrainingJob of its own (a workload TrainingJob made before the selector one was seen keeps its
name but loses the pod).

Warnings on the live pod (issue 15 items 6 and 8), once per pod: ``NotInjected`` when an
opted-in pod runs without the plugin (the webhook was down or failed, and admitted it
unchanged), ``ProfilerPluginChained`` when its own profiler plugin was moved behind collscope's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from collscope.nodeagent import podcontract
from collscope.operator import errors
from collscope.operator.clients import kube
from collscope.operator.controller.state import OperatorState, Selectors
from collscope.operator.domain import ids, injection, jobs, owners, resources

PARALLELISM_ANNOTATION = "collscope.dev/parallelism"


def register(registry: kopf.OperatorRegistry) -> None:
    """Attach every handler of this module to ``registry``."""
    kopf.on.event(
        "v1",
        "pods",
        annotations={owners.OPT_IN_ANNOTATION: kopf.PRESENT},
        registry=registry,
    )(opted_in_pod)
    kopf.on.event(kube.GROUP, kube.VERSION, kube.TRAININGJOBS, registry=registry)(trainingjob_event)


def claimed_by(selectors: Selectors, namespace: str, labels: dict[str, str]) -> str | None:
    """The TrainingJob whose selector takes a pod of ``namespace`` (first by name), if any."""
    for (ns, name), selector in sorted(selectors.items()):
        if ns == namespace and owners.selector_matches(selector, labels):
            return name
    return None


async def trainingjob_event(
    event: kopf.RawEvent,
    body: kopf.Body,
    memo: OperatorState,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    **_: Any,
) -> None:
    """Keep ``OperatorState.selectors`` in step with TrainingJobs carrying ``spec.selector``; a
    new or changed selector takes the opted-in pods already seen. A spec that does not parse
    (``resources.TrainingJobSpec``; the CRD's schema refuses it) selects nothing, logged."""
    meta = body.get("metadata") or {}
    key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
    selectors = memo.selectors
    selector = None
    if event.get("type") != "DELETED":
        try:
            selector = resources.TrainingJobSpec.parse(body.get("spec")).selector
        except errors.SpecError as e:
            logger.warning("%s: its selector is ignored", e)
    if selector is None:
        selectors.pop(key, None)
        return
    selectors[key] = selector.as_dict()
    pods, seen = memo.pods, memo.seen
    for (ns, _pod), (labels, place) in sorted(seen.items()):
        if ns == key[0] and claimed_by(selectors, ns, labels) == key[1]:
            pods.forget(ns, _pod)
            pods.note(key, place)


async def opted_in_pod(
    event: kopf.RawEvent,
    body: kopf.Body,
    memo: OperatorState,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    **_: Any,
) -> None:
    """Make sure the workload of an opted-in pod has its TrainingJob."""
    meta = body.get("metadata") or {}
    pods, seen = memo.pods, memo.seen
    pod_key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
    if event.get("type") == "DELETED" or not owners.is_opted_in(meta):
        pods.forget(*pod_key)
        seen.pop(pod_key, None)
        warned = memo.warned
        warned.difference_update({w for w in warned if w[0] == str(meta.get("uid", ""))})
        return
    _warn_once(body, memo.warned)
    api: kube.Kube = memo.kube
    known = memo.trainingjobs
    namespace = ids.Namespace(str(meta.get("namespace", "")))
    pod_status = body.get("status") or {}
    place = jobs.PodPlace(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node=str((body.get("spec") or {}).get("nodeName") or ""),
        host_ip=str(pod_status.get("hostIP") or ""),
    )
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    seen[pod_key] = (labels, place)
    claimed = claimed_by(memo.selectors, namespace, labels)
    if claimed is not None:  # a hand-written TrainingJob's selector takes the pod
        pods.forget(*pod_key)
        pods.note((namespace, claimed), place)
        return
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
    pods.note((namespace, name), place)
    # kopf handles pods concurrently: the pods of one workload wait for each other here, so the
    # TrainingJob is created once instead of once plus a 409 per pod.
    async with memo.locks.setdefault((namespace, name), asyncio.Lock()):
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


def _warn_once(body: kopf.Body, warned: set[tuple[str, str]]) -> None:
    """Warning Events on an opted-in pod the webhook could not inject, or whose own profiler
    plugin it chained behind collscope's; once per pod uid and reason."""
    uid = str((body.get("metadata") or {}).get("uid", ""))
    notes: list[tuple[str, str]] = []
    if not injection.is_injected(body):
        notes.append(
            (
                "NotInjected",
                "opted in to collscope but admitted without its plugin "
                "(the webhook was unreachable or failed): no diagnosis for this pod",
            )
        )
    chained = injection.forwarded(body)
    if chained:
        notes.append(
            (
                "ProfilerPluginChained",
                f"containers {', '.join(chained)} named their own "
                f"NCCL profiler plugin: collscope's loads it and forwards every call "
                f"({podcontract.NEXT_PLUGIN_ENV})",
            )
        )
    for reason, message in notes:
        if uid and (uid, reason) not in warned:
            warned.add((uid, reason))
            kopf.warn(body, reason=reason, message=message)
