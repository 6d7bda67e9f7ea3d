"""Remediation by the real operator (kopf) against kmock: Diagnosed Diagnoses of hardware
categories mark their culprit node (cordon, taint, label, annotations, the CollscopeFaulty
condition, an Event) only once the culprit GPU's hardware samples corroborate the verdict and
still do at the re-check; the circuit breaker stops the cordon past its cap and stays open
(state in a ConfigMap, held set rebuilt from the nodes), dryRun patches nothing, deleting a
Diagnosis releases nothing, ``collscope uncordon`` releases exactly collscope's marks; a failed
analysis ends the Diagnosis Failed, once.

The hardware samples come from a fake of ``remediator.HardwareSource`` put in the memo
(``memo.hardware``), standing for the culprit nodes' agents.

These Diagnoses are posted already ``Diagnosed`` (kmock stores the status given on creation; a
real API server would drop it): remediation acts on the analysis result only, which the
trigger-loop tests produce end to end with real agents.
"""

from __future__ import annotations

import json
from typing import Any, cast

import aiohttp
import kopf
import pytest

pytest.importorskip("kmock")
pytest.importorskip("pytest_asyncio")

from collscope.nodeagent.bundle import models
from collscope.operator.controller import diagnosis_handlers
from collscope.operator.domain import breaker, policy, settings

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning"),
]
JOB = "job-llama"
CONFIG = settings.Settings(
    trigger=settings.TriggerLoopSettings(interval_s=0.5),
    breaker=breaker.BreakerSettings(max_cordons=2, window_s=3600, max_fraction=1.0),
    # The re-check 0.3 s after the corroboration instead of 30 s: the same path, a short test.
    remediation=policy.RemediationPolicy(confirm_delay_s=0.3),
)
ECC = ("gpu1", "ecc_uncorrected_errors_total", 2.0)  # a state: it holds at the re-check


class Hardware:
    """The nodes' hardware samples: two healthy GPUs each, plus ``faults[node]``."""

    def __init__(self, **faults: list[tuple[str, str, float]]) -> None:
        self.faults = dict(faults)
        self.asked: list[str] = []

    async def __call__(self, node: str, since_ns: int, until_ns: int) -> list[models.HwRecord]:
        self.asked.append(node)
        base = [(g, m, 0.0) for g in ("gpu0", "gpu1")
                for m in ("ecc_uncorrected_errors_total", "clocks_event_reasons")]  # fmt: skip
        return [
            models.HwRecord(rank=0, ts=until_ns + late, node=node, device=d, metric=m, value=v)
            for late, rows in ((0, base), (1, self.faults.get(node, [])))
            for d, m, v in rows
        ]


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


def condition(harness: Any, name: str, type_: str = "Confirmed") -> dict[str, Any] | None:
    st = (harness.obj(harness.DIAG, name) or {}).get("status") or {}
    return next((c for c in st.get("conditions") or () if c["type"] == type_), None)


def node_events(harness: Any, node_name: str) -> list[str]:
    return [e["reason"] for e in harness.all("v1/events")
            if e.get("involvedObject", {}).get("name") == node_name]  # fmt: skip


def unmarked(harness: Any, name: str) -> bool:
    n = node(harness, name)
    return not n["spec"].get("unschedulable") and "collscope.dev/diagnosis" not in (
        n["metadata"].get("annotations") or {}
    )


async def uncordon(harness: Any, memo: Any, name: str) -> bool:
    released: bool = await memo.remediator.release(name)
    return released


async def test_confirmed_fault_marks_the_node_and_deletion_keeps_it(
    harness: Any, crds: Any
) -> None:
    trainingjob(harness)
    harness.node("n1", taints=[{"key": "other", "effect": "NoSchedule"}])
    harness.node("n2")
    hardware = Hardware(n1=[ECC])
    async with harness.run(CONFIG, lambda n, ip: None) as memo:
        memo.hardware = hardware
        await post(harness, diagnosed("d1", "n1"))
        got = await harness.until(lambda: actions(harness, "d1"))
        assert {a["action"]: a["outcome"] for a in got} == {
            "cordon": "Done", "taint": "Done", "label": "Done", "annotate": "Done",
        }  # fmt: skip
        assert hardware.asked == ["n1", "n1"]  # corroboration, then the re-check
        d1 = harness.obj(harness.DIAG, "d1")
        assert d1 is not None and d1["status"]["phase"] == "Remediated"
        assert d1["status"]["action"] == "cordoned"
        assert d1["status"]["confirmation"]["state"] == "Confirmed"
        assert d1["status"]["confirmation"]["devices"] == ["gpu1"]
        confirmed = condition(harness, "d1")
        assert confirmed is not None and (confirmed["status"], confirmed["reason"]) == (
            "True", "Confirmed"
        )  # fmt: skip
        assert "uncorrected ECC" in confirmed["message"]
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
        (faulty,) = n1["status"]["conditions"]
        assert (faulty["type"], faulty["status"], faulty["reason"]) == (
            "CollscopeFaulty", "True", "HangGpu"
        )  # fmt: skip
        assert "ml/d1" in faulty["message"]
        assert node_events(harness, "n1") == ["CollscopeCordoned"]
        assert breaker_state(harness)["held"] == ["n1"]
        assert memo.metrics.value("collscope_operator_remediations_total", {"outcome": "Done"}) == 4
        # Deleting the Diagnosis (or the job it belongs to) releases nothing.
        await delete(harness, "d1")
        await harness.until(lambda: harness.obj(harness.DIAG, "d1") is None)
        assert node(harness, "n1")["spec"]["unschedulable"] is True
        assert breaker_state(harness)["held"] == ["n1"]
        # collscope uncordon does, exactly what collscope added, and the breaker forgets n1.
        assert await uncordon(harness, memo, "n1")
        n1 = node(harness, "n1")
        assert n1["spec"]["taints"] == [{"key": "other", "effect": "NoSchedule"}]
        assert "collscope.dev/quarantined" not in (n1["metadata"].get("labels") or {})
        assert "collscope.dev/diagnosis" not in (n1["metadata"].get("annotations") or {})
        (released,) = n1["status"]["conditions"]
        assert (released["status"], released["reason"]) == ("False", "Released")
        assert node_events(harness, "n1") == ["CollscopeCordoned", "CollscopeReleased"]
        assert breaker_state(harness)["held"] == []


async def test_a_diagnosis_deleted_while_its_recheck_waits_is_forgotten(harness: Any) -> None:
    """The pending re-check (``OperatorState.confirmations``) goes with its Diagnosis: kopf
    never comes back to a deleted one, so nothing else would drop it (issue 13)."""
    import dataclasses

    slow = dataclasses.replace(CONFIG, remediation=policy.RemediationPolicy(confirm_delay_s=60))
    trainingjob(harness)
    harness.node("n1")
    async with harness.run(slow, lambda n, ip: None) as memo:
        memo.hardware = Hardware(n1=[ECC])
        await post(harness, diagnosed("d1", "n1"))
        await post(harness, diagnosed("d2", "n1"))
        await harness.until(lambda: len(memo.confirmations) == 2)
        assert memo.confirmations["ml/d1/uid-d1"].state == "Pending"
        await delete(harness, "d1")
        await harness.until(lambda: "ml/d1/uid-d1" not in memo.confirmations)
        assert set(memo.confirmations) == {"ml/d2/uid-d2"}  # the other one still waits
    assert unmarked(harness, "n1")


@pytest.mark.parametrize(
    ("faults", "later", "reason"),
    [
        ([], None, "NotCorroborated"),  # the GPU's samples are healthy
        ([ECC], [], "NotPersistent"),  # gone at the re-check
        ([("gpu1", "clocks_event_reasons", 4.0)], None, "TenantContention"),  # power cap: load
        ([("gpu0", "ecc_uncorrected_errors_total", 5.0)], None, "NotCorroborated"),  # not rank's
    ],
)
async def test_unconfirmed_verdicts_leave_the_node_alone(
    harness: Any, crds: Any, faults: list[Any], later: list[Any] | None, reason: str
) -> None:
    trainingjob(harness)
    harness.node("n1")
    hardware = Hardware(n1=faults)
    async with harness.run(CONFIG, lambda n, ip: None) as memo:
        memo.hardware = hardware
        await post(harness, diagnosed("d1", "n1"))
        if later is not None:
            await harness.until(lambda: condition(harness, "d1"))
            hardware.faults["n1"] = later
        (skip,) = await harness.until(lambda: actions(harness, "d1"))
    assert skip["outcome"] == "Skipped" and skip["message"].startswith(reason)
    d1 = harness.obj(harness.DIAG, "d1")
    assert d1 is not None and d1["status"]["action"] == "not-confirmed"
    assert d1["status"]["phase"] == "Diagnosed"
    assert d1["status"]["confirmation"]["reason"] == reason
    confirmed = condition(harness, "d1")
    assert confirmed is not None and (confirmed["status"], confirmed["reason"]) == ("False", reason)
    crds.validator("diagnoses", "status").validate(
        json.loads(json.dumps(d1["status"], default=dict))
    )
    assert unmarked(harness, "n1") and "conditions" not in (node(harness, "n1").get("status") or {})
    assert node_events(harness, "n1") == ["CollscopeNotConfirmed"]
    assert not [r for r in harness.k if r.method == "PATCH" and str(r.url).endswith("/nodes/n1")]


async def test_a_dead_process_never_cordons_and_says_why(harness: Any) -> None:
    """hang.process on a GPU whose samples would corroborate: still no mark, no hardware read."""
    trainingjob(harness, remediation={"categories": ["hang.gpu"], "confidenceThreshold": 0.0})
    harness.node("n1")
    hardware = Hardware(n1=[ECC])
    async with harness.run(CONFIG, lambda n, ip: None) as memo:
        memo.hardware = hardware
        await post(harness, diagnosed("d1", "n1", category="hang.process", confidence=1.0,
                                      component="host"))  # fmt: skip
        (skip,) = await harness.until(lambda: actions(harness, "d1"))
    assert skip["outcome"] == "Skipped" and "died or froze" in skip["message"]
    confirmed = condition(harness, "d1")
    assert confirmed is not None and confirmed["reason"] == "ProcessDeath"
    assert hardware.asked == [] and unmarked(harness, "n1")


async def test_a_tenant_cannot_lower_the_clusters_floor(harness: Any) -> None:
    """Issue 14's case, end to end: the operator disabled + dry run, the TrainingJob on, dry run
    off, threshold 0, and a diagnosis at confidence 0.05 on a GPU whose samples show a fault."""
    trainingjob(harness, remediation={"enabled": True, "dryRun": False, "confidenceThreshold": 0})
    harness.node("n1")
    config = settings.Settings(
        remediation=policy.RemediationPolicy(enabled=False, dry_run=True, confirm_delay_s=0.1)
    )
    async with harness.run(config, lambda n, ip: None) as memo:
        memo.hardware = Hardware(n1=[ECC])
        await post(harness, diagnosed("d1", "n1", confidence=0.05))
        (skip,) = await harness.until(lambda: actions(harness, "d1"))
    assert skip["outcome"] == "Skipped"
    d1 = harness.obj(harness.DIAG, "d1")
    assert d1 is not None and d1["status"]["action"] == "none"
    confirmed = condition(harness, "d1")
    assert confirmed is not None and confirmed["reason"] == "RemediationDisabled"
    assert "TrainingJob asks enabled=true" in confirmed["message"]
    assert "TrainingJob asks dryRun=false" in confirmed["message"]
    assert unmarked(harness, "n1")
    assert not [r for r in harness.k if r.method == "PATCH" and "nodes" in str(r.url)]


async def test_breaker_stops_the_third_cordon_and_stays_open(harness: Any) -> None:
    trainingjob(harness)
    for n in ("n1", "n2", "n3", "n4"):
        harness.node(n)
    async with harness.run(CONFIG, lambda n, ip: None) as memo:
        memo.hardware = Hardware(n1=[ECC], n2=[ECC], n3=[ECC], n4=[ECC])
        for i, n in enumerate(("n1", "n2", "n3"), 1):
            await post(harness, diagnosed(f"d{i}", n))
            await harness.until(lambda i=i: actions(harness, f"d{i}"))
        (blocked,) = actions(harness, "d3") or []
        assert blocked["outcome"] == "Blocked" and "cap 2" in blocked["message"]
        assert (harness.obj(harness.DIAG, "d3") or {})["status"]["action"] == "blocked"
        assert not node(harness, "n3")["spec"].get("unschedulable")
        assert node(harness, "n2")["spec"]["unschedulable"] is True
        state = breaker_state(harness)
        assert state["state"] == "Open" and state["held"] == ["n1", "n2"]
        assert memo.metrics.value("collscope_operator_breaker_open") == 1
        assert memo.metrics.value("collscope_operator_breaker_nodes_held") == 2
        # Open means open: releasing a node does not close it, the next cordon is refused too.
        assert await uncordon(harness, memo, "n1")
        await post(harness, diagnosed("d4", "n4"))
        (again,) = await harness.until(lambda: actions(harness, "d4"))
        assert again["outcome"] == "Blocked" and "a human must reset it" in again["message"]
        assert not node(harness, "n4")["spec"].get("unschedulable")


async def test_breaker_counts_the_marked_nodes_from_start_up(harness: Any) -> None:
    """A node marked before the operator started (its breaker state lost) counts; one released
    by hand (its marks removed with kubectl) does not."""
    from collscope.operator.domain import remediation

    record = remediation.Record(
        "ml/old", cordoned=True, tainted=True, labelled=True, at="2026-11-22T21:00:00Z"
    )
    harness.k.objects["v1/nodes", None, "n1"] = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "uid": "uid-n1", "resourceVersion": "1",
                     "annotations": {remediation.RECORD_ANNOTATION: record.to_json()}},
        "spec": {"unschedulable": True},
    }  # fmt: skip
    harness.node("n2")
    harness.k.objects["v1/configmaps", "collscope-system", "collscope-breaker"] = {
        "metadata": {"name": "collscope-breaker", "namespace": "collscope-system",
                     "resourceVersion": "1"},
        "data": {"state": json.dumps(breaker.BreakerState(held={"n2"}).to_dict())},  # type: ignore[arg-type]
    }  # fmt: skip
    async with harness.run(CONFIG, lambda n, ip: None):
        await harness.until(lambda: breaker_state(harness).get("held") == ["n1"])


async def test_dry_run_records_and_patches_nothing(harness: Any) -> None:
    trainingjob(harness, remediation={"dryRun": True})
    harness.node("n1")
    async with harness.run(CONFIG, lambda n, ip: None) as memo:
        memo.hardware = Hardware(n1=[ECC])
        await post(harness, diagnosed("d1", "n1"))
        (act,) = await harness.until(lambda: actions(harness, "d1"))
        assert act["outcome"] == "DryRun" and act["message"].startswith("would cordon n1")
        d1 = harness.obj(harness.DIAG, "d1")
        assert d1 is not None and d1["status"]["phase"] == "Diagnosed"
        assert d1["status"]["action"] == "dry-run"
    n1 = node(harness, "n1")
    assert n1["spec"] == {} and "collscope.dev/quarantined" not in n1["metadata"]["labels"]
    patches = [r for r in harness.k if r.method == "PATCH" and "nodes" in str(r.url)]
    assert patches == []
    assert breaker_state(harness)["held"] == []  # a dry run holds nothing
    assert node_events(harness, "n1") == ["CollscopeWouldCordon"]


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

    from collscope.operator.cli import main as cli

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
    config = settings.Settings(
        breaker=breaker.BreakerSettings(max_cordons=1, max_fraction=1.0),
        remediation=policy.RemediationPolicy(confirm_delay_s=0.1),
    )
    async with harness.run(config, lambda n, ip: None) as memo:
        memo.hardware = Hardware(n1=[ECC], n2=[ECC])
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
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "Diagnosed",
        "False",
        "AnalysisFailed",
    )
    assert "no ranks of TrainingJob no-such-job" in cond["message"]


async def test_an_exception_in_analysis_fails_the_diagnosis_once(
    harness: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15: a MemoryError inside analysis (a hostile timestamp asking for 1.8e9 entries)
    marks the Diagnosis Failed with the reason; it is not retried."""
    import asyncio

    from collscope.operator.controller import diagnosis_handlers

    calls: list[str] = []

    async def explode(*_: Any, **__: Any) -> Any:
        calls.append("analyse")
        raise MemoryError

    monkeypatch.setattr(diagnosis_handlers, "analyse", explode)
    trainingjob(harness)
    manual = {
        "apiVersion": "collscope.dev/v1alpha1", "kind": "Diagnosis",
        "metadata": {"name": "boom", "namespace": "ml", "uid": "uid-boom", "resourceVersion": "1"},
        "spec": {"trainingJob": {"name": JOB}, "trigger": "manual"},
    }  # fmt: skip
    async with harness.run(CONFIG, lambda n, ip: None):
        await post(harness, manual)

        def failed() -> dict[str, Any] | None:
            st = (harness.obj(harness.DIAG, "boom") or {}).get("status") or {}
            return dict(st) if st.get("phase") == "Failed" else None

        st = await harness.until(failed)
        await asyncio.sleep(1.5)  # a retry would come within kopf's backoff; none does
    (cond,) = st["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", "AnalysisFailed")
    assert cond["message"] == "analysis failed: MemoryError"
    assert st["action"] == "none" and calls == ["analyse"]


async def test_a_malformed_diagnosis_spec_fails_it_once_naming_the_field(
    harness: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler parses the Diagnosis once (``resources.Diagnosis``); one the CRD's schema
    would refuse (kmock does not check) ends Failed with the field named, never analysed."""
    calls: list[str] = []

    async def analyse(*_: Any, **__: Any) -> Any:
        calls.append("analyse")
        raise AssertionError("not reached")

    monkeypatch.setattr(diagnosis_handlers, "analyse", analyse)
    trainingjob(harness)
    manual = {
        "apiVersion": "collscope.dev/v1alpha1", "kind": "Diagnosis",
        "metadata": {"name": "odd", "namespace": "ml", "uid": "uid-odd", "resourceVersion": "1"},
        "spec": {"trainingJob": {"name": JOB}, "trigger": "manual", "windowSeconds": "soon"},
    }  # fmt: skip
    async with harness.run(CONFIG, lambda n, ip: None):
        await post(harness, manual)

        def failed() -> dict[str, Any] | None:
            st = (harness.obj(harness.DIAG, "odd") or {}).get("status") or {}
            return dict(st) if st.get("phase") == "Failed" else None

        st = await harness.until(failed)
    (cond,) = st["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", "AnalysisFailed")
    assert cond["message"].startswith("Diagnosis spec.windowSeconds: Input should be a valid")
    assert st["action"] == "none" and calls == []


async def test_events_go_to_the_diagnosis_and_the_workload(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[tuple[str, str, str, str]] = []
    for level in ("warn", "info"):
        monkeypatch.setattr(
            kopf, level,
            lambda obj, *, reason, message, level=level: posted.append(
                (level, obj["kind"], reason, message)
            ),
        )  # fmt: skip
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "w", "namespace": "ml"}}
    raw = {"apiVersion": "collscope.dev/v1alpha1", "kind": "Diagnosis", "metadata": {}}
    diag = kopf.Body(cast(kopf.RawBody, raw))
    diagnosis_handlers.event(
        diag, job, "d1", warning=True, reason="Diagnosed", message="hang.gpu rank 5"
    )
    diagnosis_handlers.event(diag, None, "d1", warning=False, reason="R", message="m")
    assert posted == [
        ("warn", "Diagnosis", "Diagnosed", "hang.gpu rank 5"),
        ("warn", "Job", "Diagnosed", "Diagnosis d1: hang.gpu rank 5"),
        ("info", "Diagnosis", "R", "m"),
    ]


class LatestOnly:
    """The API as ``process`` sees it: the Diagnosis's latest state; every write recorded."""

    def __init__(self, latest: dict[str, Any] | None) -> None:
        self.latest = latest
        self.writes: list[tuple[str, Any]] = []

    async def get_diagnosis(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.latest

    def __getattr__(self, name: str) -> Any:
        async def write(*args: Any, **kwargs: Any) -> None:
            self.writes.append((name, args))

        return write


@pytest.mark.asyncio
@pytest.mark.parametrize("latest", ["remediated", "gone"])
async def test_a_retry_with_a_stale_body_is_judged_on_the_latest_status(latest: str) -> None:
    """kopf may retry with a body older than the handler's own status patches (the watch has
    not caught up): on that body the Diagnosis looks new and would be analysed again, its
    result rewritten. ``process`` reads the status from the API instead."""
    import logging
    import types

    now = diagnosed("d1", "n1")
    now["status"]["actions"] = [
        {"action": "cordon", "outcome": "Skipped", "time": "2026-11-28T10:00:00Z"}
    ]
    api = LatestOnly(now if latest == "remediated" else None)
    state = types.SimpleNamespace(diagnoses_seen=set(), kube=api)
    stale = {"trainingJob": {"name": JOB}, "trigger": "hang", "incident": "d1"}
    await diagnosis_handlers.process(
        name="d1", namespace="ml", body=cast(kopf.Body, {}), spec=cast(kopf.Spec, stale),
        status=cast(kopf.Status, {}), meta=cast(kopf.Meta, {"uid": "uid-d1"}),
        memo=cast(Any, state), logger=logging.getLogger("test"),
    )  # fmt: skip
    assert api.writes == []  # not analysed again: no phase, no result, no event written
