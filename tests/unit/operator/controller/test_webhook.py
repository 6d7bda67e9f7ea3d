"""The injection webhook served by the real operator (kopf's webhook server, plain HTTP on
127.0.0.1) answering AdmissionReviews as the API server sends them: opted-in pods get the
plugin patch, others none; a pod that already has everything gets no patch (idempotent); a pod
the handler fails on is admitted unchanged with a warning, never denied."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import logging
import socket
from typing import Any

import aiohttp
import jsonpatch
import pytest

pytest.importorskip("kmock")
pytest.importorskip("pytest_asyncio")

import kopf

from collscope.operator.controller import webhook
from collscope.operator.domain import injection, settings

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "llama-", "namespace": "ml", "annotations": annotations},
        "spec": {"containers": [{"name": "trainer", "image": "pytorch"}]},
    }  # fmt: skip


async def review(url: str, obj: dict[str, Any]) -> dict[str, Any]:
    body = {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "req-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE", "namespace": "ml", "object": obj, "dryRun": False,
            "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
        },
    }  # fmt: skip
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as answer:
        assert answer.status == 200, await answer.text()
        got: dict[str, Any] = (await answer.json())["response"]
        return got


async def test_opted_in_pods_get_the_plugin_and_others_nothing(harness: Any) -> None:
    port = free_port()
    config = settings.Settings(webhook_port=port)
    server = kopf.WebhookServer(addr="127.0.0.1", port=port, insecure=True)
    url = f"http://127.0.0.1:{port}/inject"
    async with harness.run(config, lambda n, ip: None, webhook=server):
        opted = pod({"collscope.dev/diagnose": "true"})
        for _ in range(100):  # the webhook server starts with the operator
            try:
                got = await review(url, opted)
                break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
        assert got["allowed"] is True and got["uid"] == "req-1" and got["patchType"] == "JSONPatch"
        ops = json.loads(base64.b64decode(got["patch"]))
        patched = jsonpatch.apply_patch(copy.deepcopy(opted), ops)
        expected = jsonpatch.apply_patch(
            copy.deepcopy(opted), injection.patch(opted, injection.InjectionSettings())
        )
        assert patched == expected
        (trainer,) = patched["spec"]["containers"]
        assert {"name": "NCCL_PROFILER_PLUGIN", "value": config.injection.plugin_path} in (
            trainer["env"]
        )
        assert [c["name"] for c in patched["spec"]["initContainers"]] == ["collscope-plugin"]
        # Idempotent: the injected pod gets no further patch.
        again = await review(url, patched)
        assert again["allowed"] is True and "patch" not in again
        plain = await review(url, pod({}))
        assert plain["allowed"] is True and "patch" not in plain
        # A pod the handler raises on (an env that is not a list): admitted, unchanged, warned.
        broken = pod({"collscope.dev/diagnose": "true"})
        broken["spec"]["containers"][0]["env"] = "RANK=0"
        hurt = await review(url, broken)
        assert hurt["allowed"] is True and "patch" not in hurt and "status" not in hurt
        (warning,) = hurt["warnings"]
        assert warning.startswith(webhook.FAILED) and "AttributeError" in warning
        # A pod with its own profiler plugin: chained behind ours, and the creator is told.
        inspector = pod({"collscope.dev/diagnose": "true"})
        inspector["spec"]["containers"][0]["env"] = [
            {"name": "NCCL_PROFILER_PLUGIN", "value": "libnccl-profiler-inspector.so"}
        ]
        chained = await review(url, inspector)
        assert (
            chained["allowed"] is True
            and "libnccl-profiler-inspector.so" in (chained["warnings"][0])
        )
        env = jsonpatch.apply_patch(inspector, json.loads(base64.b64decode(chained["patch"])))[
            "spec"
        ]["containers"][0]["env"]
        assert {"name": "COLLSCOPE_NEXT_PROFILER_PLUGIN",
                "value": "libnccl-profiler-inspector.so"} in env  # fmt: skip


async def test_any_failure_admits_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    """``answer`` turns whatever the patch computation raises into no patch and a warning."""

    def boom(body: Any, config: Any) -> list[Any]:
        raise RuntimeError("x" * 1000)

    def bad_ops(body: Any, config: Any) -> list[Any]:
        return [{"op": "replace", "path": "/spec/nothing/0", "value": 1}]

    log = logging.getLogger("test.webhook")
    opted = pod({"collscope.dev/diagnose": "true"})
    for plan in (boom, bad_ops):
        ops, warnings = webhook.answer(opted, injection.InjectionSettings(), log, plan)
        assert ops == [] and len(warnings) == 1 and warnings[0].startswith(webhook.FAILED)
        assert len(warnings[0]) <= webhook.WARNING_MAX
    assert [r.levelname for r in caplog.records] == ["ERROR", "ERROR"]
    assert all(r.exc_info for r in caplog.records)
