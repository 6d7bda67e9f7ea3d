"""The real operator (kopf 1.45, these handlers) against the kmock Kubernetes emulator: opted-in
pods get one TrainingJob per workload, owned by it; other pods get none; pods are not written.

Needs ``kmock`` and ``pytest-asyncio`` (dev dependencies); skipped where they are missing.
kmock gotchas handled here (notes/kubernetes.md §2): ``load_bundled()`` so kopf sees core
discovery and starts watching; every object carries ``metadata.resourceVersion`` and a uid
(kmock assigns neither); label selectors are not emulated, which these handlers do not use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

kmock_lib = pytest.importorskip("kmock")
pytest.importorskip("pytest_asyncio")

import aiohttp  # noqa: E402
import kopf  # noqa: E402 - after the skips: only meaningful with kmock
import kubernetes  # noqa: E402

from collscope.operator.clients import kube  # noqa: E402
from collscope.operator.controller import handlers  # noqa: E402
from collscope.operator.controller.state import OperatorState  # noqa: E402
from collscope.operator.domain import settings as collscope_settings  # noqa: E402

NS = "ml"
TJ = "collscope.dev/v1alpha1/trainingjobs"
DEADLINE_S = 15.0  # kopf's start (discovery, first list) takes about 1 s; 15 s is generous


def meta(
    name: str, kind: str, *, owner: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{kind}-{name}",
                         "resourceVersion": "1", **extra}  # fmt: skip
    if owner is not None:
        m["ownerReferences"] = [owner]
    return m


def ref(api: str, kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": f"uid-{kind}-{name}",
            "controller": True}  # fmt: skip


def pod(name: str, owner: dict[str, Any] | None, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta(name, "Pod", owner=owner, annotations=annotations),
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }


OPT_IN = {"collscope.dev/diagnose": "true"}


@contextlib.asynccontextmanager
async def operator(emulator: Any) -> AsyncIterator[OperatorState]:
    registry = kopf.OperatorRegistry()
    handlers.register(registry)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=str(emulator.url).rstrip("/"))

    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    settings.posting.enabled = False
    client = kubernetes.client.Configuration(host=str(emulator.url).rstrip("/"))
    api = kube.Cluster(kubernetes.client.ApiClient(client))
    stop = asyncio.Event()
    memo = OperatorState.create(api, collscope_settings.Settings(), lambda n, ip: None)
    task = asyncio.create_task(
        kopf.operator(
            registry=registry,
            settings=settings,
            clusterwide=True,
            stop_flag=stop,
            memo=memo,
        )
    )
    try:
        yield memo
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


async def until(check: Callable[[], bool]) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE_S
    while not check():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.05)


def trainingjob(emulator: Any, name: str) -> dict[str, Any] | None:
    try:
        obj = emulator.objects[TJ, NS, name]
    except KeyError:
        return None
    return None if obj is None else dict(obj)


@pytest.fixture
def cluster(kmock: Any) -> Any:
    kmock.resources.load_bundled()
    kmock.resources[TJ] = kmock_lib.ResourceInfo(
        kind="TrainingJob", singular="trainingjob", namespaced=True,
        verbs={"get", "list", "watch", "create", "patch", "delete"}, subresources={"status"},
    )  # fmt: skip
    kmock.objects["v1/namespaces", None, NS] = {"metadata": {"name": NS, "resourceVersion": "1"}}
    jobset = ref("jobset.x-k8s.io/v1alpha2", "JobSet", "llama")
    kmock.objects["batch/v1/jobs", NS, "llama-workers-0"] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta("llama-workers-0", "Job", owner=jobset),
    }
    kmock.objects["batch/v1/jobs", NS, "bert"] = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta("bert", "Job"),
    }  # fmt: skip
    return kmock


@pytest.mark.asyncio
# kmock 0.8's load_bundled() uses importlib.resources.read_binary, deprecated in Python 3.11.
@pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")
async def test_opted_in_pods_get_one_trainingjob_per_workload(cluster: Any) -> None:
    job = ref("batch/v1", "Job", "llama-workers-0")
    declared = {**OPT_IN, "collscope.dev/parallelism": "tp=1,dp=3"}
    for i in range(3):
        cluster.objects["v1/pods", NS, f"llama-{i}"] = pod(f"llama-{i}", job, declared)
    cluster.objects["v1/pods", NS, "bert-0"] = pod("bert-0", ref("batch/v1", "Job", "bert"), {})
    cluster.objects["v1/pods", NS, "lonely"] = pod("lonely", None, OPT_IN)
    async with operator(cluster):
        await until(lambda: trainingjob(cluster, "jobset-llama") is not None)
        assert trainingjob(cluster, "job-bert") is None  # its only pod is not opted in
        # Through the API (not kmock.objects), so the watch sees the ADDED event.
        late = pod("late-0", ref("batch/v1", "Job", "bert"), OPT_IN)
        async with aiohttp.ClientSession() as http:
            url = f"{str(cluster.url).rstrip('/')}/api/v1/namespaces/{NS}/pods"
            async with http.post(url, json=late) as answer:
                assert answer.status < 300
        await until(lambda: trainingjob(cluster, "job-bert") is not None)
    tj = trainingjob(cluster, "jobset-llama")
    assert tj is not None
    assert tj["spec"]["owner"] == {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                   "name": "llama", "uid": "uid-JobSet-llama"}  # fmt: skip
    assert tj["spec"]["parallelism"] == {"tp": 1, "pp": 1, "dp": 3}
    (owner_ref,) = tj["metadata"]["ownerReferences"]
    assert owner_ref["uid"] == "uid-JobSet-llama" and owner_ref["controller"] is False
    creates = [r for r in cluster if r.method == "POST" and r.resource is not None
               and "trainingjobs" in str(r.resource)]  # fmt: skip
    assert len(creates) == 2  # one per workload, not one per pod
    # Pods are only read: no finalizer, no kopf annotations, no writes at all.
    assert not [
        r for r in cluster if r.method in ("PATCH", "PUT", "DELETE") and "pods" in str(r.url)
    ]
    # ... and none for the pod without a controller ("lonely").
    assert {r.data["metadata"]["name"] for r in creates} == {"jobset-llama", "job-bert"}
    assert "finalizers" not in cluster.objects["v1/pods", NS, "llama-0"]["metadata"]


@pytest.mark.asyncio
@pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")
async def test_a_hand_written_trainingjob_finds_its_pods_by_selector(cluster: Any) -> None:
    """``spec.selector`` (issue 15 item 7): pods without a controller, or whose controller
    collscope does not know, are the job of the TrainingJob selecting them, whether it was
    written before or after them; they get no TrainingJob of their own."""
    selected = {"app": "llama", "role": "worker"}
    for i in range(2):
        p = pod(f"w-{i}", None, OPT_IN)
        p["metadata"]["labels"] = selected
        p["spec"]["nodeName"] = f"gpu-{i}"
        cluster.objects["v1/pods", NS, f"w-{i}"] = p
    owned = pod("owned-0", ref("batch/v1", "Job", "bert"), OPT_IN)
    owned["metadata"]["labels"] = {"app": "llama", "role": "launcher"}
    cluster.objects["v1/pods", NS, "owned-0"] = owned
    cluster.objects[TJ, NS, "llama"] = {
        "apiVersion": "collscope.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": meta("llama", "TrainingJob"),
        "spec": {"selector": {"matchLabels": {"app": "llama"}, "matchExpressions": [
            {"key": "role", "operator": "In", "values": ["worker", "launcher"]}]}},
    }  # fmt: skip
    async with operator(cluster) as memo:
        pods = memo.pods
        await until(lambda: set(pods.by_job.get((NS, "llama"), {})) == {"w-0", "w-1", "owned-0"})
        assert pods.nodes((NS, "llama")) == {"gpu-0": "", "gpu-1": ""}
        # A second, later TrainingJob takes pods already seen.
        async with aiohttp.ClientSession() as http:
            url = f"{str(cluster.url).rstrip('/')}/apis/collscope.dev/v1alpha1/namespaces/{NS}"
            late = {"apiVersion": "collscope.dev/v1alpha1", "kind": "TrainingJob",
                    "metadata": meta("launchers", "TrainingJob"),
                    "spec": {"selector": {"matchLabels": {"role": "launcher"}}}}  # fmt: skip
            async with http.post(f"{url}/trainingjobs", json=late) as answer:
                assert answer.status < 300
        await until(lambda: set(pods.by_job.get((NS, "launchers"), {})) == {"owned-0"})
        assert set(pods.by_job[(NS, "llama")]) == {"w-0", "w-1"}
    # The selected pods' workload got no TrainingJob of its own.
    assert trainingjob(cluster, "job-bert") is None
    assert memo.warned >= {("uid-Pod-w-0", "NotInjected")}  # opted in, never injected


@pytest.mark.asyncio
async def test_a_selector_is_kept_as_parsed_and_a_malformed_spec_selects_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``trainingjob_event`` parses the spec (``resources.TrainingJobSpec``): the selector is
    kept as written; a spec the CRD's schema would refuse drops it, logged with the field."""
    from typing import cast

    config = collscope_settings.Settings()
    memo = OperatorState.create(cast(kube.Cluster, None), config, lambda n, ip: None)
    selector = {"matchLabels": {"app": "llama"},
                "matchExpressions": [{"key": "role", "operator": "Exists"}]}  # fmt: skip
    tj = {"metadata": meta("llama", "TrainingJob"), "spec": {"selector": selector}}
    log = logging.getLogger("test")

    async def seen(body: dict[str, Any], kind: str = "ADDED") -> None:
        event = cast(kopf.RawEvent, {"type": kind, "object": body})
        await handlers.trainingjob_event(event, kopf.Body(cast(kopf.RawBody, body)), memo, log)

    await seen(tj)
    assert memo.selectors == {(NS, "llama"): selector}
    await seen({**tj, "spec": {"selector": selector, "parallelism": {"tp": "eight"}}})
    assert memo.selectors == {}
    assert "TrainingJob spec.parallelism.tp: Input should be a valid integer" in caplog.text
    await seen(tj)
    await seen(tj, "DELETED")
    assert memo.selectors == {}
