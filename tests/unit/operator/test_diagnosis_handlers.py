"""Remediation by the real operator (kopf) against kmock: Diagnosed Diagnoses of hardware
categories mark their culprit node (cordon, taint, label, annotations), the circuit breaker
stops the cordon past its cap and stays open (state in a ConfigMap), dryRun patches nothing,
deleting a Diagnosis releases exactly its marks.

These Diagnoses are posted already ``Diagnosed`` (kmock stores the status given on creation; a
real API server would drop it): remediation acts on the analysis result only, which the
trigger-loop tests produce end to end with real agents.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

pytest.importorskip("kmock")
pytest.importorskip("pytest_asyncio")

from collscope.operator import breaker, settings

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning"),
]
JOB = "job-llama"
CONFIG = settings.Settings(
    trigger=settings.TriggerLoopSettings(interval_s=0.5),
    breaker=breaker.BreakerSettings(max_cordons=2, window_s=3600, max_fraction=1.0),
)


def trainingjob(harness: Any, remediation: dict[str, Any] | None = None) -> None:
    spec: dict[str, Any] = {"owner": {"apiVersion": "batch/v1", "kind": "Job", "name": "llama"}}
    if remediation is not None:
        spec["diagnosis"] = {"remediation": remediation}
    harness.k.objects[harness.TJ, harness.NS, JOB] = {
        "apiVersion": "collscope.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": JOB, "namespace": harness.NS, "uid": "uid-tj",
                     "resourceVersion": "1"},
        "spec": spec,
    }  # fmt: skip


def diagnosed(name: str, node: str, category: str = "hang.gpu", confidence: float = 0.9,
              component: str = "gpu") -> dict[str, Any]:  # fmt: skip
    result = {
        "schema": "collscope.diagnosis/v1", "anomaly": True, "trigger": "hang",
        "category": category, "confidence": confidence, "evidence": ["test"],
        "culprits": [{"rank": 5, "node": node, "gpu": 1, "component": component, "score": 1.0}],
    }  # fmt: skip
    return {
        "apiVersion": "collscope.dev/v1alpha1", "kind": "Diagnosis",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                     "resourceVersion": "1"},
        "spec": {"trainingJob": {"name": JOB}, "trigger": "hang", "incident": name},
        "status": {"phase": "Diagnosed", "result": result, "category": category,
                   "culpritNode": node, "culpritRank": 5},
    }  # fmt: skip


async def post(harness: Any, body: dict[str, Any]) -> None:
    url = f"{harness.url}/apis/collscope.dev/v1alpha1/namespaces/ml/diagnoses"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as answer:
        assert answer.status < 300, await answer.text()


async def delete(harness: Any, name: str) -> None:
    url = f"{harness.url}/apis/collscope.dev/v1alpha1/namespaces/ml/diagnoses/{name}"
    async with aiohttp.ClientSession() as http, http.delete(url) as answer:
        assert answer.status < 300, await answer.text()


def actions(harness: Any, name: str) -> list[dict[str, Any]] | None:
    st = (harness.obj(harness.DIAG, name) or {}).get("status") or {}
    return st.get("actions")


def node(harness: Any, name: str) -> dict[str, Any]:
    got: dict[str, Any] | None = harness.obj("v1/nodes", name, None)
    assert got is not None
    return got


def breaker_state(harness: Any) -> dict[str, Any]:
    cm = harness.obj("v1/configmaps", "collscope-breaker", "collscope-system") or {}
    summary: dict[str, Any] = json.loads((cm.get("data") or {}).get("summary", "{}"))
    return summary


async def test_hardware_fault_marks_the_node_and_deletion_releases_it(
    harness: Any, crds: Any
) -> None:
    trainingjob(harness)
    harness.node("n1", taints=[{"key": "other", "effect": "NoSchedule"}])
    harness.node("n2")
    async with harness.run(CONFIG, lambda n, ip: None) as memo:
        await post(harness, diagnosed("d1", "n1"))
        got = await harness.until(lambda: actions(harness, "d1"))
        assert {a["action"]: a["outcome"] for a in got} == {
            "cordon": "Done", "taint": "Done", "label": "Done", "annotate": "Done",
        }  # fmt: skip
        d1 = harness.obj(harness.DIAG, "d1")
        assert d1 is not None and d1["status"]["phase"] == "Remediated"
        crds.validator("diagnoses", "status").validate(
            json.loads(json.dumps(d1["status"], default=dict))
        )
        n1 = node(harness, "n1")
        assert n1["spec"]["unschedulable"] is True
        assert {"key": "collscope.dev/faulty", "value": "hang.gpu", "effect": "NoSchedule"} in (
            n1["spec"]["taints"]
        )
        assert n1["metadata"]["labels"]["collscope.dev/quarantined"] == "true"
        assert n1["metadata"]["annotations"]["collscope.dev/diagnosis"] == "ml/d1"
        assert breaker_state(harness)["held"] == ["n1"]
        assert memo.metrics.value("collscope_operator_remediations_total", {"outcome": "Done"}) == 4
        # A software category on n2 leaves it alone.
        await post(
            harness, diagnosed("d2", "n2", category="hang.not_entered", component="software")
        )
        (skip,) = await harness.until(lambda: actions(harness, "d2"))
        assert skip["outcome"] == "Skipped" and "not remediated by policy" in skip["message"]
        assert not node(harness, "n2")["spec"].get("unschedulable")
        # Deleting the Diagnosis releases exactly what collscope added.
        await delete(harness, "d1")
        await harness.until(lambda: not node(harness, "n1")["spec"].get("unschedulable"))
        n1 = node(harness, "n1")
        assert n1["spec"]["taints"] == [{"key": "other", "effect": "NoSchedule"}]
        assert "collscope.dev/quarantined" not in (n1["metadata"].get("labels") or {})
        assert "collscope.dev/diagnosis" not in (n1["metadata"].get("annotations") or {})
        await harness.until(lambda: breaker_state(harness).get("held") == [])
        await harness.until(lambda: harness.obj(harness.DIAG, "d1") is None)


async def test_breaker_stops_the_third_cordon_and_stays_open(harness: Any) -> None:
    trainingjob(harness)
    for n in ("n1", "n2", "n3", "n4"):
        harness.node(n)
    async with harness.run(CONFIG, lambda n, ip: None) as memo:
        for i, n in enumerate(("n1", "n2", "n3"), 1):
            await post(harness, diagnosed(f"d{i}", n))
            await harness.until(lambda i=i: actions(harness, f"d{i}"))
        assert actions(harness, "d3") is not None
        (blocked,) = actions(harness, "d3") or []
        assert blocked["outcome"] == "Blocked" and "cap 2" in blocked["message"]
        assert not node(harness, "n3")["spec"].get("unschedulable")
        assert node(harness, "n2")["spec"]["unschedulable"] is True
        state = breaker_state(harness)
        assert state["state"] == "Open" and state["held"] == ["n1", "n2"]
        assert memo.metrics.value("collscope_operator_breaker_open") == 1
        # Open means open: releasing a node does not close it, the next cordon is refused too.
        await delete(harness, "d1")
        await harness.until(lambda: not node(harness, "n1")["spec"].get("unschedulable"))
        await post(harness, diagnosed("d4", "n4"))
        (again,) = await harness.until(lambda: actions(harness, "d4"))
        assert again["outcome"] == "Blocked" and "a human must reset it" in again["message"]
        assert not node(harness, "n4")["spec"].get("unschedulable")


async def test_dry_run_records_and_patches_nothing(harness: Any) -> None:
    trainingjob(harness, remediation={"dryRun": True})
    harness.node("n1")
    async with harness.run(CONFIG, lambda n, ip: None):
        await post(harness, diagnosed("d1", "n1"))
        (act,) = await harness.until(lambda: actions(harness, "d1"))
        assert act["outcome"] == "DryRun" and act["message"].startswith("would cordon n1")
        d1 = harness.obj(harness.DIAG, "d1")
        assert d1 is not None and d1["status"]["phase"] == "Diagnosed"
    n1 = node(harness, "n1")
    assert n1["spec"] == {} and "collscope.dev/quarantined" not in n1["metadata"]["labels"]
    patches = [r for r in harness.k if r.method == "PATCH" and "nodes" in str(r.url)]
    assert patches == []
    assert breaker_state(harness) == {}  # a dry run changes no breaker state either


async def test_low_confidence_is_skipped(harness: Any) -> None:
    trainingjob(harness)
    harness.node("n1")
    async with harness.run(CONFIG, lambda n, ip: None):
        await post(harness, diagnosed("d1", "n1", confidence=0.4))
        (act,) = await harness.until(lambda: actions(harness, "d1"))
        assert act["outcome"] == "Skipped" and "below threshold" in act["message"]
    assert node(harness, "n1")["spec"] == {}


async def test_cli_uncordon_and_breaker_reset(
    harness: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    from collscope.operator import cli

    trainingjob(harness)
    harness.node("n1", unschedulable=True)  # cordoned by someone else before collscope acts
    for n in ("n2", "n3"):
        harness.node(n)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": harness.url}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u"}}],
    }))  # fmt: skip
    kc = ["--kubeconfig", str(kubeconfig)]
    config = settings.Settings(breaker=breaker.BreakerSettings(max_cordons=1, max_fraction=1.0))
    async with harness.run(config, lambda n, ip: None):
        await post(harness, diagnosed("d1", "n1"))
        got = await harness.until(lambda: actions(harness, "d1"))
        assert {a["action"]: a["outcome"] for a in got}["cordon"] == "Skipped"  # not ours
        assert node(harness, "n1")["metadata"]["labels"]["collscope.dev/quarantined"] == "true"
        await post(harness, diagnosed("d2", "n2"))
        (blocked,) = await harness.until(lambda: actions(harness, "d2"))
        assert blocked["outcome"] == "Blocked"
        # The CLI runs its own event loop: in a thread, while kmock serves from this one.
        assert await asyncio.to_thread(cli.main, ["uncordon", "n1", *kc]) == 0
        n1 = node(harness, "n1")
        assert n1["spec"]["unschedulable"] is True  # someone else's cordon stays
        assert "collscope.dev/quarantined" not in n1["metadata"]["labels"]
        assert "taints" not in n1["spec"]
        assert await asyncio.to_thread(cli.main, ["uncordon", "n3", *kc]) == 0
        assert await asyncio.to_thread(cli.main, ["breaker", "reset", *kc]) == 2  # --by required
        assert breaker_state(harness)["state"] == "Open"
        assert await asyncio.to_thread(cli.main, ["breaker", "reset", "--by", "oncall", *kc]) == 0
        assert breaker_state(harness)["state"] == "Closed"
        assert breaker_state(harness)["held"] == []
    out = capsys.readouterr().out
    assert "n1: released" in out and "n3: collscope holds nothing here" in out


async def test_diagnosis_of_an_unknown_job_fails_with_a_clear_condition(harness: Any) -> None:
    manual = {
        "apiVersion": "collscope.dev/v1alpha1", "kind": "Diagnosis",
        "metadata": {"name": "lost", "namespace": "ml", "uid": "uid-lost", "resourceVersion": "1"},
        "spec": {"trainingJob": {"name": "no-such-job"}, "trigger": "manual"},
    }  # fmt: skip
    async with harness.run(CONFIG, lambda n, ip: None):
        await post(harness, manual)

        def failed() -> dict[str, Any] | None:
            st = (harness.obj(harness.DIAG, "lost") or {}).get("status") or {}
            return dict(st) if st.get("phase") == "Failed" else None

        st = await harness.until(failed)
    (cond,) = st["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Diagnosed", "False", "Failed")
    assert "no ranks of TrainingJob no-such-job" in cond["message"]
