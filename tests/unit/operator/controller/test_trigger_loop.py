"""The real operator (kopf) against kmock with real node agents over rings of the real plugin:
a stalled rank opens a Diagnosis that is analysed to the right culprit; a healthy job opens
none; an unreachable agent is reported in the TrainingJob's conditions, not fatal; with more
DP groups than ``maxRanks`` the watched ranks rotate over them; a second slowdown on a
communicator opens a second Diagnosis once the first one's episode ended.

Two agents (``agent.Agent`` on 127.0.0.1, port 0) play nodes ``node-a`` (ranks 0, 1) and
``node-b`` (ranks 2, 3); the directory maps node names to their URLs. Pods and the TrainingJob
are pre-created in kmock (with the resourceVersion kmock does not assign).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pydantic
import pytest

pytest.importorskip("kmock")
pytest.importorskip("pytest_asyncio")

from collscope.nodeagent import agent, flightrecorder, frdump, stacks
from collscope.nodeagent import settings as agent_settings
from collscope.operator.domain import settings

NODES = {"node-a": (0, 1), "node-b": (2, 3)}
JOB = "job-llama"
# kmock 0.8's load_bundled() uses importlib.resources.read_binary, deprecated in Python 3.11.
pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning"),
]

FAST = settings.Settings(
    trigger=settings.TriggerLoopSettings(
        interval_s=0.2, window_s=5.0, rediscover_s=0.5, episode_quiet_ticks=3
    ),
    agents=settings.AgentSettings(timeout_s=0.5, retries=0),
    diagnosis_window_s=10.0,
)


def agent_config(trace: pathlib.Path, node: str) -> agent_settings.Settings:
    return agent_settings.Settings(
        node_name=node,
        discovery=agent_settings.DiscoverySettings(
            mode="directory", trace_root=str(trace), rescan_interval_s=0.1
        ),
        sampling=agent_settings.SamplingSettings(sample_interval_s=0.05),
        window=agent_settings.WindowSettings(window_s=30, memory_cap_bytes=16 << 20),
        server=agent_settings.ServerSettings(listen_host="127.0.0.1", listen_port=0),
        auth=agent_settings.AuthSettings(mode="none"),  # plain HTTP on loopback
    )


def fake_pyspy(pids: Sequence[int], timeout_s: float) -> pydantic.BaseModel:
    """The agent's py-spy dumper, same interface: a main thread waiting in NCCL."""
    main = stacks.StackGroup(frames=WAITING, pids=list(pids), thread_names=["MainThread"])
    other = stacks.StackGroup(frames=["poll (threading.py:1)"], pids=list(pids))
    return stacks.StacksReport(groups=[other, main])


WAITING = ["allreduce (nccl.py:12)", "step (train.py:40)"]


def fake_fr(no_fr: set[int]) -> Any:
    """The agent's Flight Recorder dumper, same interface, as torch would dump this job: ranks
    0, 1 and 3 in AllReduce seq 6, rank 2 done with seq 5 (it never entered the next one);
    ranks in ``no_fr`` have no debug pipe."""

    def dump(
        targets: Sequence[tuple[int, int]], timeout_s: float
    ) -> flightrecorder.FlightRecorderReport:
        dumps, failed = [], []
        for rank, pid in targets:
            if rank in no_fr:
                reason = f"pid {pid}: {flightrecorder.PIPE_ENV} is not set"
                failed.append(flightrecorder.RankFailure(rank=rank, reason=reason))
                continue
            last = 5 if rank == 2 else 6
            entries = [
                frdump.Entry(pg_id=0, collective_seq_id=s, profiling_name="nccl:all_reduce",
                             state="completed" if s <= 5 else "scheduled", is_p2p=False)
                for s in range(1, last + 1)
            ]  # fmt: skip
            pg = frdump.PgInfo(id="0", name="0", desc="default_pg", ranks=[0, 1, 2, 3])
            status = frdump.PgStatus(
                id="0", last_enqueued_collective=last, last_started_collective=-1,
                last_completed_collective=5,
            )  # fmt: skip
            dumps.append(
                frdump.RankDump(
                    rank=rank, file=f"/tmp/nccl_trace_rank_{rank}", version="2.5",
                    pg_config=[pg], pg_status=[status], entries=entries,
                )
            )  # fmt: skip
        return flightrecorder.FlightRecorderReport(dumps=dumps, errors=failed)

    return dump


@dataclasses.dataclass
class Job:
    ranks: dict[int, Any]
    urls: dict[str, str]
    agents: dict[str, agent.Agent]
    no_fr: set[int]  # ranks whose Flight Recorder the fake dumper does not find


@pytest.fixture
def job(tmp_path: pathlib.Path, plugin_rank: Any) -> Iterator[Job]:
    ranks: dict[int, Any] = {}
    running: dict[str, agent.Agent] = {}
    urls: dict[str, str] = {}
    no_fr: set[int] = set()
    for node, members in NODES.items():
        trace = tmp_path / node
        for r in members:
            ranks[r] = plugin_rank(trace, r, world=4, pod=f"llama-{r}")
        a = agent.Agent(
            agent_config(trace, node), stacks_dumper=fake_pyspy, fr_dumper=fake_fr(no_fr)
        )
        a.start()
        running[node] = a
        host, port = a.server.address
        urls[node] = f"http://{host}:{port}"
    yield Job(ranks, urls, running, no_fr)
    for a in running.values():
        a.stop()


def cluster(harness: Any, parallelism: dict[str, int] | None = None, max_ranks: int = 2) -> None:
    ns = harness.NS
    k = harness.k
    job_ref = {"apiVersion": "batch/v1", "kind": "Job", "name": "llama", "uid": "uid-job",
               "controller": True}  # fmt: skip
    k.objects["batch/v1/jobs", ns, "llama"] = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "llama", "namespace": ns, "uid": "uid-job", "resourceVersion": "1"},
    }  # fmt: skip
    for node, members in NODES.items():
        harness.node(node)
        for r in members:
            k.objects["v1/pods", ns, f"llama-{r}"] = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"llama-{r}", "namespace": ns, "uid": f"uid-pod-{r}",
                             "resourceVersion": "1", "ownerReferences": [job_ref],
                             "annotations": {"collscope.dev/diagnose": "true"}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
                "status": {"hostIP": "127.0.0.1", "phase": "Running"},
            }  # fmt: skip
    spec: dict[str, Any] = {
        "owner": {"apiVersion": "batch/v1", "kind": "Job", "name": "llama", "uid": "uid-job"}
    }
    if parallelism is not None:
        spec["parallelism"] = parallelism
        spec["diagnosis"] = {"sampling": {"maxRanks": max_ranks}}
    k.objects[harness.TJ, ns, JOB] = {
        "apiVersion": "collscope.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": JOB, "namespace": ns, "uid": "uid-tj", "resourceVersion": "1"},
        "spec": spec,
    }  # fmt: skip


def directory(urls: dict[str, str]) -> Any:
    return lambda node, ip: urls.get(node)


def diagnoses(harness: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = harness.all(harness.DIAG)
    return found


def tj_status(harness: Any) -> dict[str, Any]:
    tj = harness.obj(harness.TJ, JOB) or {}
    return dict(tj.get("status") or {})


def healthy_steps(job: Job, n: int) -> None:
    for _ in range(n):
        for r in sorted(job.ranks):
            job.ranks[r].complete(1)


def plain(obj: Any) -> Any:
    """A kmock object as the JSON an API server would hold."""
    return json.loads(json.dumps(obj, default=dict))


async def test_stalled_rank_opens_a_diagnosis_naming_it(harness: Any, job: Job, crds: Any) -> None:
    cluster(harness)
    healthy_steps(job, 5)
    # Ranks 0, 1 and 3 enter the next AllReduce and wait in it; rank 2 never enters.
    stuck = [job.ranks[r].allreduce() for r in (0, 1, 3)]
    for op in stuck:
        op.advance(1)
    t0 = time.monotonic()
    async with harness.run(FAST, directory(job.urls)) as memo:
        got = await harness.until(lambda: diagnoses(harness), timeout_s=15)
        (diag,) = got
        assert diag["spec"]["trigger"] == "hang" and diag["spec"]["trainingJob"]["name"] == JOB
        name = diag["metadata"]["name"]
        done = await harness.until(
            lambda: (
                "actions" in (harness.obj(harness.DIAG, name) or {}).get("status", {})
                and harness.obj(harness.DIAG, name)
            ),
            timeout_s=15,
        )
        elapsed = time.monotonic() - t0
        st = done["status"]
        assert st["phase"] == "Diagnosed", st
        assert st["culpritRank"] == 2 and st["culpritNode"] == "node-b"
        assert st["category"] == "hang.not_entered"
        assert st["result"]["anomaly"] is True
        # Software category: no node is touched, the skip is recorded.
        assert [a["outcome"] for a in st["actions"]] == ["Skipped"]
        assert st.get("agentErrors", []) == []
        # py-spy stacks per rank, grouped: one group of identical main-thread stacks.
        assert st["stacks"] == [{"ranks": [0, 1, 2, 3], "frames": WAITING}]
        # Flight Recorder dumps of the triggering communicator's ranks, grouped by state.
        fr = st["flightRecorder"]
        assert fr["summary"] == (
            "ranks 0-1,3: entered AllReduce seq 6; rank 2: last completed AllReduce seq 5"
        )
        assert (fr["ranksAsked"], fr["ranksDumped"], fr["notes"]) == (4, 4, [])
        crds.validator("diagnoses", "status").validate(plain(st))
        crds.validator("diagnoses", "spec").validate(plain(diag["spec"]))
        # One Diagnosis per incident although the trigger holds on every tick.
        await harness.until(lambda: memo.metrics.value("collscope_operator_ticks_total") > 10)
        assert len(diagnoses(harness)) == 1
        assert memo.metrics.value("collscope_operator_triggers_total", {"kind": "hang"}) == 1
        assert (
            memo.metrics.value(
                "collscope_operator_diagnoses_total", {"category": "hang.not_entered"}
            )
            == 1
        )
        status = tj_status(harness)
        assert status["health"] == "Hung" and status["lastTrigger"]["diagnosis"] == name
        assert (status["rankCount"], status["nodeCount"]) == (4, 2)
        assert "ranks" not in status  # the per-rank map stays with the agents
        crds.validator("trainingjobs", "status").validate(plain(status))
        cond = {c["type"]: c for c in status["conditions"]}
        assert (cond["Hung"]["status"], cond["Hung"]["reason"]) == ("True", "HangDetected")
        assert cond["Hung"]["message"].endswith(f"Diagnosis {name}")
        # one communicator from the rings' comm records, via the agents: one DP group of 4
        assert status["groups"]["source"] == "inferred" and status["groups"]["communicators"] == 1
        assert status["groups"]["dp"] == {"count": 1, "size": 4}
    node = harness.obj("v1/nodes", "node-b", None)
    assert node is not None and not node["spec"].get("unschedulable")
    print(f"fault onset -> Diagnosed: {elapsed:.2f} s")


async def test_healthy_job_opens_no_diagnosis(harness: Any, job: Job) -> None:
    cluster(harness, parallelism={"tp": 2, "dp": 2})
    healthy_steps(job, 3)
    async with harness.run(FAST, directory(job.urls)) as memo:
        for _ in range(12):  # ~3 s of ticks while the job keeps completing steps
            healthy_steps(job, 1)
            await harness.until(lambda: True)
            await _sleep(0.25)
        status = await harness.until(
            lambda: tj_status(harness).get("health") and tj_status(harness)
        )
        assert status["health"] == "Healthy" and status["phase"] == "Watching"
        # Declared tp=2, dp=2: DP groups {0, 2} and {1, 3}, at least one sampled from each.
        assert status["groups"]["source"] == "declared"
        assert status["groups"]["dp"] == {"count": 2, "size": 2}  # {0, 2} and {1, 3}
        # With maxRanks 2, exactly one from each.
        sampled = set(status["sampledRanks"])
        assert len(sampled & {0, 2}) == 1 and len(sampled & {1, 3}) == 1
        cond = {c["type"]: c for c in status["conditions"]}
        assert cond["AgentsReachable"]["status"] == "True"
        assert cond["Hung"]["status"] == "False" and cond["Slow"]["status"] == "False"
        assert memo.metrics.value("collscope_operator_triggers_total", {"kind": "hang"}) == 0
        # Deleting the TrainingJob stops its timer and drops its trigger state.
        import aiohttp

        url = f"{harness.url}/apis/collscope.dev/v1alpha1/namespaces/ml/trainingjobs/{JOB}"
        async with aiohttp.ClientSession() as http, http.delete(url) as answer:
            assert answer.status < 300
        await harness.until(lambda: ("ml", JOB) not in memo.jobs)
        await harness.until(lambda: harness.obj(harness.TJ, JOB) is None)
    assert diagnoses(harness) == []


async def test_unreachable_agent_is_reported_not_fatal(harness: Any, job: Job) -> None:
    cluster(harness)
    healthy_steps(job, 3)
    urls = {**job.urls, "node-b": "http://127.0.0.1:9"}  # nothing listens on the discard port
    async with harness.run(FAST, directory(urls)) as memo:

        def reported() -> dict[str, Any] | None:
            st = tj_status(harness)
            cond = {c["type"]: c for c in st.get("conditions", [])}
            ok = cond.get("AgentsReachable", {}).get("status") == "False" and st.get("rankCount")
            return st if ok else None

        status = await harness.until(reported)
        cond = {c["type"]: c for c in status["conditions"]}
        assert "node-b" in cond["AgentsReachable"]["message"]
        assert status["unreachableAgents"] == ["node-b"] and status["unreachableCount"] == 1
        assert status["rankCount"] == 2  # node-a's ranks still watched
        ticks = memo.metrics.value("collscope_operator_ticks_total")
        await harness.until(
            lambda: memo.metrics.value("collscope_operator_ticks_total") > ticks + 3
        )
        assert memo.metrics.value("collscope_operator_agent_errors_total", {"node": "node-b"}) >= 1
    assert diagnoses(harness) == []


async def _sleep(s: float) -> None:
    import asyncio

    await asyncio.sleep(s)


async def test_manual_diagnosis_is_analysed(harness: Any, job: Job) -> None:
    import aiohttp

    cluster(harness)
    healthy_steps(job, 5)
    manual = {
        "apiVersion": "collscope.dev/v1alpha1", "kind": "Diagnosis",
        "metadata": {"name": "asked", "namespace": "ml", "uid": "uid-asked",
                     "resourceVersion": "1"},
        "spec": {"trainingJob": {"name": JOB}, "trigger": "manual", "windowSeconds": 5},
    }  # fmt: skip
    async with harness.run(FAST, directory(job.urls)):
        url = f"{harness.url}/apis/collscope.dev/v1alpha1/namespaces/ml/diagnoses"
        async with aiohttp.ClientSession() as http, http.post(url, json=manual) as answer:
            assert answer.status < 300
        done = await harness.until(
            lambda: (
                "actions" in ((harness.obj(harness.DIAG, "asked") or {}).get("status") or {})
                and harness.obj(harness.DIAG, "asked")
            )
        )
    st = done["status"]
    assert st["phase"] == "Diagnosed" and st["result"]["anomaly"] is False
    assert "category" not in st and "stacks" not in st and "flightRecorder" not in st
    cond = {c["type"]: c for c in st["conditions"]}
    assert cond["Diagnosed"]["status"] == "True" and cond["Diagnosed"]["reason"] == "NoAnomaly"
    # Detected -> Analyzing -> Diagnosed, each written once, in order.
    phases = [v["status"]["phase"] for v in harness.k.objects[harness.DIAG, "ml", "asked", :]
              if v is not None and "phase" in (v.get("status") or {})]  # fmt: skip
    seen = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    assert seen == ["Detected", "Analyzing", "Diagnosed"]


async def test_flight_recorder_gaps_are_notes(job: Job) -> None:
    """Collection straight from ``evidence`` (no kopf: kmock cannot make an agent vanish
    between analysis and collection): node-a answers with rank 1 lacking a debug pipe, node-b's
    agent has no Flight Recorder capability (503), node-c's agent does not answer, node-d has
    no agent URL. Every asked rank is accounted for; nothing raises."""
    from typing import cast

    from collscope.operator.analysis import diagnosis
    from collscope.operator.clients import kube
    from collscope.operator.controller import evidence
    from collscope.operator.controller.state import OperatorState
    from collscope.operator.domain import ids, jobs, resources

    job.no_fr.add(1)
    job.agents["node-b"].service.flightrecorder_dumper = None
    urls = {**job.urls, "node-c": "http://127.0.0.1:9"}  # the discard port: nobody listens
    key = ("ml", JOB)
    pods = jobs.Pods()
    rt = jobs.JobRuntime()
    for r, node in enumerate(["node-a", "node-a", "node-b", "node-b", "node-c", "node-d"]):
        pods.note(key, jobs.PodPlace(f"llama-{r}", f"uid-{r}", node, "127.0.0.1"))
        rt.ranks[ids.Rank(r)] = jobs.RankPlace(ids.Rank(r), ids.NodeName(node), f"llama-{r}", "")
    state = OperatorState.create(cast(kube.Cluster, None), FAST, directory(urls))
    state.jobs[key], state.pods = rt, pods
    result = diagnosis.Diagnosis(anomaly=True, trigger="hang")
    fr = await evidence.collect_flight_recorder(
        state,
        "ml",
        job=JOB,
        spec=resources.DiagnosisSpec(trigger="hang"),
        result=result,
        logger=logging.getLogger(),
    )
    assert fr is not None
    assert fr["summary"] == "rank 0: entered AllReduce seq 6"
    assert (fr["ranksAsked"], fr["ranksDumped"]) == (6, 1)
    notes = fr["notes"]
    assert notes[0].startswith("ranks 2-3 on node-b: no dump: agent node-b at http") and (
        "HTTP 503: Flight Recorder: not available on this agent" in notes[0]
    )
    assert notes[1].startswith("rank 4 on node-c: no dump: agent node-c at http://127.0.0.1:9")
    assert notes[2] == "rank 5 on node-d: no dump: no agent URL for this node"
    assert notes[3].startswith("rank 1 on node-a: no Flight Recorder dump: pid ")
    assert notes[3].endswith("TORCH_NCCL_DEBUG_INFO_PIPE_FILE is not set")
    assert len(notes) == 4


async def test_the_sample_rotates_over_more_dp_groups_than_max_ranks(
    harness: Any, job: Job
) -> None:
    # Declared tp=2, dp=2: DP groups {0, 2} and {1, 3}; maxRanks 1: the one slot visits each
    # group for 3 ticks (analysis.rotation: dwell = the trigger's repeat ticks), so both are
    # watched within 6 ticks (1.2 s at FAST's 0.2 s), one rank at a time, and no alarm rises.
    cluster(harness, parallelism={"tp": 2, "dp": 2}, max_ranks=1)
    healthy_steps(job, 3)
    watched: list[tuple[int, ...]] = []
    async with harness.run(FAST, directory(job.urls)) as memo:
        for _ in range(30):  # ~4.5 s of ticks while the job keeps completing steps
            healthy_steps(job, 1)
            rt = memo.jobs.get(("ml", JOB))
            if rt is not None and rt.state is not None and len(rt.state.sampled):  # ranks known
                watched.append(tuple(rt.state.sampled.tolist()))
            await _sleep(0.15)
        rt = memo.jobs[("ml", JOB)]
        assert rt.sampler.current is not None
        plan = rt.sampler.current.plan
        assert (plan.anchors, plan.slots, plan.period_ticks) == ((), 1, 6)
        assert sorted(plan.rotation) in ([0, 1], [0, 3], [1, 2], [2, 3])
        status = tj_status(harness)
        assert len(status["sampledRanks"]) == 1
        assert memo.metrics.value("collscope_operator_triggers_total", {"kind": "slow"}) == 0
    assert {len(w) for w in watched} == {1}
    assert {w[0] for w in watched} == set(plan.rotation)  # each group's rank in turn
    assert diagnoses(harness) == []


class ScriptedTrigger:
    """Stands in for a job's ``analysis.trigger.TriggerState`` (the same three members the loop
    uses): reports a slowdown on the job's only communicator (index 0) while ``slow`` is set.
    The trigger rules have their own tests; this one is about what the loop does with them."""

    def __init__(self, sampled: Any) -> None:
        self.sampled = sampled
        self.slow = False
        self.updates = 0

    def watch(self, sampled: tuple[int, ...], view: Any = None) -> None:
        import numpy as np

        self.sampled = np.asarray(sorted(sampled), dtype=np.int32)

    def update(self, view: Any, t_ns: int, summaries: Any = None) -> Any:
        from collscope.operator.analysis import trigger

        self.updates += 1
        if not self.slow:
            return None
        return trigger.TriggerResult(
            "slow", t_ns, t_ns, t_ns - 1_000_000_000, (2,), 0, None, "scripted slowdown"
        )


async def test_a_second_slowdown_on_a_communicator_opens_a_second_diagnosis(
    harness: Any, job: Job
) -> None:
    cluster(harness)
    healthy_steps(job, 5)
    async with harness.run(FAST, directory(job.urls)) as memo:
        # Once the ranks are known and sampled (the sample, and with it the state, stays).
        rt = await harness.until(
            lambda: (r := memo.jobs.get(("ml", JOB))) and r.state is not None
            and len(r.state.sampled) == 4 and r
        )  # fmt: skip
        fake = rt.state = ScriptedTrigger(rt.state.sampled)
        await harness.until(lambda: fake.updates > 0)
        assert rt.state is fake

        async def ticks(n: int) -> None:
            start = fake.updates
            await harness.until(lambda: fake.updates >= start + n)

        fake.slow = True
        (first,) = await harness.until(lambda: diagnoses(harness))
        await ticks(6)  # still slow: the same episode, no new Diagnosis
        assert len(diagnoses(harness)) == 1
        fake.slow = False
        await ticks(5)  # > episode_quiet_ticks (3): the first slowdown is over
        fake.slow = True
        await harness.until(lambda: len(diagnoses(harness)) == 2)
        await ticks(3)
        got = diagnoses(harness)
        assert len(got) == 2
        names = {d["metadata"]["name"] for d in got}
        second = next(d for d in got if d["metadata"]["name"] != first["metadata"]["name"])
        comm = first["spec"]["incident"].split("@")[0]
        assert comm.startswith("slow/0x") and second["spec"]["incident"].startswith(comm + "@")
        assert first["spec"]["incident"] != second["spec"]["incident"]
        assert all(d["spec"]["trigger"] == "slow" for d in got)
        assert memo.metrics.value("collscope_operator_triggers_total", {"kind": "slow"}) == 2
        status = tj_status(harness)
        assert status["lastTrigger"]["diagnosis"] == second["metadata"]["name"]
        assert set(rt.watched_when) == names  # each analysis replays what its trigger watched


async def test_a_tick_parses_the_spec_once_and_a_malformed_one_fails_it() -> None:
    """``tick`` parses the TrainingJob's spec (``resources.TrainingJobSpec``) before anything
    else: a value of the wrong type fails the tick with the field named (kopf logs it), as the
    hand-read ``intervalSeconds`` did."""
    from typing import cast

    import kopf

    from collscope.operator import errors
    from collscope.operator.clients import kube
    from collscope.operator.controller import trigger_loop
    from collscope.operator.controller.state import OperatorState

    memo = OperatorState.create(cast(kube.Cluster, None), FAST, lambda n, ip: None)
    raw = {"metadata": {"name": JOB, "namespace": "ml"},
           "spec": {"diagnosis": {"trigger": {"intervalSeconds": "fast"}}}}  # fmt: skip
    body = kopf.Body(cast(kopf.RawBody, raw))
    with pytest.raises(errors.SpecError, match=r"spec\.diagnosis\.trigger\.intervalSeconds"):
        await trigger_loop.tick(
            name=JOB, namespace="ml", uid="uid-tj", body=body, spec=body.spec,
            status=body.status, meta=body.meta, patch=kopf.Patch(), memo=memo,
            logger=logging.getLogger(),
        )  # fmt: skip


async def test_declared_groups_come_from_the_parsed_parallelism() -> None:
    from collscope.operator.controller import trigger_loop
    from collscope.operator.domain import ids, jobs, resources

    rt = jobs.JobRuntime()
    for r in range(8):
        rt.ranks[ids.Rank(r)] = jobs.RankPlace(ids.Rank(r), ids.NodeName(f"n{r // 4}"), "p", "")
    spec = resources.TrainingJobSpec.parse({"parallelism": {"dp": 4, "tp": 2}})
    got = trigger_loop.job_groups(spec, rt)
    assert got.source == "declared" and (len(got.tp), len(got.dp)) == (4, 2)
    assert trigger_loop.job_groups(resources.TrainingJobSpec(), rt) is rt.groups
    misfit = resources.TrainingJobSpec.parse({"parallelism": {"tp": 3}})  # 3 does not cover 8
    assert trigger_loop.job_groups(misfit, rt) is rt.groups
