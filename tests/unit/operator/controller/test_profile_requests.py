"""``spec.requestedActions: [profile]`` on a Diagnosis, through the real operator (kopf) against
kmock, the agents faked at ``profiling.arm``/``pull`` and the ranks at ``trigger_loop.discover``:
the job is profiled into that Diagnosis once per addition of ``profile``, its
``status.profiling`` going Requested, Running, Done, the function culprit added after the
verdict's own; a job that says ``off`` or is gone is reported Failed and nothing is armed.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import aiohttp
import pytest

pytest.importorskip("kmock")
pytest.importorskip("pytest_asyncio")

from collscope.nodeagent import api, ids
from collscope.nodeagent.bundle import models
from collscope.operator.controller import profile_handlers, profiling, trigger_loop
from collscope.operator.domain import jobs, settings

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning"),
]

JOB = "job-llama"
W = 8
SLOW = 5
LOADER = "__main__.train;data.load_batch"
STEP = "__main__.train;model.step"
CONFIG = settings.Settings(trigger=settings.TriggerLoopSettings(interval_s=3600))


def rank_profile(r: int, rng: random.Random) -> api.RankProfile:
    load = 0.40 if r == SLOW else 0.05 * rng.uniform(0.95, 1.05)
    pats = [
        models.FunctionPattern(rank=r, fn=LOADER, kind="python", beta=round(load, 4),
                               mu=0.02, sigma=0.01, window_ns=10**10),
        models.FunctionPattern(rank=r, fn=STEP, kind="python", beta=round(0.9 - load, 4),
                               mu=0.95 * rng.uniform(0.98, 1.02), sigma=0.02, window_ns=10**10),
    ]  # fmt: skip
    return api.RankProfile(rank=r, state="done", patterns=pats, samples=1000)


class Agents:
    """``profiling.arm`` and ``pull`` of two nodes of four ranks, rank 5's loader slow."""

    def __init__(self) -> None:
        self.armed: list[str] = []

    async def arm(self, clients: Any, by_node: Any, req_id: str, *, window_s: float,
                  workloads: Any = None) -> Any:  # fmt: skip
        self.armed.append(req_id)
        deadline = time.time_ns() + int(window_s * 1e9)
        return {n: api.ProfileArmed(id=req_id, node=n, deadline_ns=deadline, ranks=list(r))
                for n, r in by_node.items()}, []  # fmt: skip

    async def pull(self, clients: Any, nodes: Any, req_id: str) -> Any:
        rng = random.Random(1)
        ranks = [rank_profile(r, rng) for r in range(W)]
        return {f"node-{n}": api.ProfileReport(id=req_id, node=f"node-{n}", deadline_ns=1,
                                               ranks=ranks[4 * n : 4 * n + 4])
                for n in range(2)}, []  # fmt: skip


@pytest.fixture
def fake_agents(monkeypatch: pytest.MonkeyPatch) -> Agents:
    fake = Agents()

    async def discover(state: Any, key: Any, rt: jobs.JobRuntime, now_s: float) -> list[Any]:
        rt.ranks = {ids.Rank(r): jobs.RankPlace(ids.Rank(r), ids.NodeName(f"node-{r // 4}"),
                                                f"pod-{r}", f"uid-{r}")
                    for r in range(W)}  # fmt: skip
        return []

    monkeypatch.setattr(profiling, "WINDOW_S", 0.2)
    monkeypatch.setattr(profiling, "arm", fake.arm)
    monkeypatch.setattr(profiling, "pull", fake.pull)
    monkeypatch.setattr(trigger_loop, "discover", discover)
    monkeypatch.setattr(trigger_loop, "clients_of", lambda state, key: {})
    return fake


def trainingjob(harness: Any, annotations: dict[str, str] | None = None) -> None:
    harness.k.objects[harness.TJ, harness.NS, JOB] = {
        "apiVersion": "collscope.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": JOB, "namespace": harness.NS, "uid": "uid-tj",
                     "resourceVersion": "1", "annotations": annotations or {}},
        "spec": {"owner": {"apiVersion": "batch/v1", "kind": "Job", "name": "llama"}},
    }  # fmt: skip


def diagnosed(name: str, actions: list[str], job: str = JOB) -> dict[str, Any]:
    """A Diagnosis already analysed (kmock keeps the status posted): a slow.compute verdict on
    rank 5, confident, so nothing else profiles it."""
    result = {
        "schema": "collscope.diagnosis/v1", "anomaly": True, "trigger": "slow",
        "category": "slow.compute", "confidence": 0.9, "evidence": ["rank 5 arrives late"],
        "culprits": [{"rank": SLOW, "node": "node-1", "component": "gpu", "score": 1.0}],
    }  # fmt: skip
    return {
        "apiVersion": "collscope.dev/v1alpha1", "kind": "Diagnosis",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                     "resourceVersion": "1", "generation": 1},
        "spec": {"trainingJob": {"name": job}, "trigger": "manual", "requestedActions": actions},
        "status": {"phase": "Diagnosed", "result": result, "category": "slow.compute",
                   "actions": []},
    }  # fmt: skip


async def send(harness: Any, method: str, name: str = "", body: Any = None) -> None:
    url = f"{harness.url}/apis/collscope.dev/v1alpha1/namespaces/ml/diagnoses"
    headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method, f"{url}/{name}" if name else url, json=body, headers=headers
        ) as answer,
    ):
        assert answer.status < 300, await answer.text()


def profiling_of(harness: Any, name: str) -> dict[str, Any]:
    st = (harness.obj(harness.DIAG, name) or {}).get("status") or {}
    return dict(st.get("profiling") or {})


def in_state(harness: Any, name: str, state: str) -> dict[str, Any] | None:
    got = profiling_of(harness, name)
    return got if got.get("state") == state else None


async def test_profile_requested_on_a_diagnosis(
    harness: Any, crds: Any, fake_agents: Agents
) -> None:
    trainingjob(harness)
    async with harness.run(CONFIG, lambda n, ip: None):
        await send(harness, "POST", body=diagnosed("d1", ["profile"]))
        done = await harness.until(lambda: in_state(harness, "d1", "Done"))
        assert (done["reason"], done["ranksProfiled"]) == ("FunctionFound", W)
        # Rank 5's step is shorter too (it waits less at the collective): named after it.
        assert done["message"] == f"rank {SLOW} {LOADER}; rank {SLOW} {STEP}"
        assert done["id"] == fake_agents.armed[0]
        d1 = harness.obj(harness.DIAG, "d1") or {}
        result = d1["status"]["result"]
        named = [(c["rank"], c["function"]) for c in result["culprits"] if c.get("function")]
        assert named == [(SLOW, LOADER), (SLOW, STEP)]
        assert result["culprits"][0]["component"] == "gpu"  # the verdict's culprit stays first
        assert result["evidence"][0] == "rank 5 arrives late"
        assert result["evidence"][1].startswith(f"functions: rank {SLOW}: {LOADER} β 0.400")
        tj = harness.obj(harness.TJ, JOB) or {}
        assert tj["metadata"]["annotations"][profile_handlers.ANNOTATION] == "auto-d1/1"
        first = result["evidence"]
        crds.validator("diagnoses", "status").validate(
            json.loads(json.dumps(d1["status"], default=dict))
        )
        # Once per addition: an unrelated change leaves it alone; removing and adding it again
        # (a new generation) profiles again, in place of the first profiling's findings.
        await send(harness, "PATCH", "d1", {"metadata": {"labels": {"x": "y"}}})
        await send(harness, "PATCH", "d1", {"spec": {"requestedActions": []},
                                            "metadata": {"generation": 2}})  # fmt: skip
        await send(harness, "PATCH", "d1", {"spec": {"requestedActions": ["profile"]},
                                            "metadata": {"generation": 3}})  # fmt: skip

        # The second profiling's own Done (the first one's stays until it ends). kopf hands a
        # change over again while its patches are in flight: neither that nor the creation
        # handled twice arms a third time or sets the profiling back to Requested.
        def second_done() -> dict[str, Any] | None:
            done = in_state(harness, "d1", "Done") or {}
            return done if done.get("id") == fake_agents.armed[-1] != fake_agents.armed[0] else None

        again = await harness.until(second_done)
        assert again["reason"] == "FunctionFound" and len(fake_agents.armed) == 2
        result = (harness.obj(harness.DIAG, "d1") or {})["status"]["result"]
        assert [c.get("function") for c in result["culprits"]] == [None, LOADER, STEP]
        assert result["evidence"] == first  # the same findings, not twice
    assert len(fake_agents.armed) == 2


async def test_profiling_off_or_no_job_is_reported(harness: Any, fake_agents: Agents) -> None:
    trainingjob(harness, {profile_handlers.ANNOTATION: "off"})
    async with harness.run(CONFIG, lambda n, ip: None):
        await send(harness, "POST", body=diagnosed("d-off", ["stacks", "profile"]))
        await send(harness, "POST", body=diagnosed("d-gone", ["profile"], job="job-gone"))
        off = await harness.until(lambda: in_state(harness, "d-off", "Failed"))
        gone = await harness.until(lambda: in_state(harness, "d-gone", "Failed"))
        assert off["reason"] == "ProfilingOff" and "collscope.dev/profile=off" in off["message"]
        assert gone["reason"] == "TrainingJobNotFound"
        assert "job-gone" in gone["message"]
        tj = harness.obj(harness.TJ, JOB) or {}
        assert tj["metadata"]["annotations"][profile_handlers.ANNOTATION] == "off"
    assert fake_agents.armed == []
