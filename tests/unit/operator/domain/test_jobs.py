"""Pure steps of the trigger loop: agent discovery, rank mapping, incidents, resampling."""

from __future__ import annotations

from typing import Any

from collscope.nodeagent import api
from collscope.operator.analysis import trigger
from collscope.operator.domain import groups, ids, jobs, resources

NO_GROUPS = groups.JobGroups("inferred", (), (), (), ())


def ranks_answer(node: str, *rings: tuple[int | None, str, str, str]) -> api.RanksResponse:
    return api.RanksResponse(
        node=node,
        now_ns=1,
        ranks=[
            api.RankInfo(rank=r, pod_name=pod, pod_namespace=ns, ring_path=f"/r{r}.ring",
                         health=health)
            for r, pod, ns, health in rings
        ],
    )  # fmt: skip


def place(name: str, node: str) -> jobs.PodPlace:
    return jobs.PodPlace(name=name, uid=f"uid-{name}", node=node, host_ip="10.0.0.1")


def test_template_directory_formats_node_and_ip() -> None:
    url = jobs.template_directory("http://{node_ip}:9464")
    assert url("n1", "10.0.0.7") == "http://10.0.0.7:9464"
    assert url("n1", "") is None  # not scheduled yet: no IP, no agent
    by_name = jobs.template_directory("http://agent-{node}.collscope:9464")
    assert by_name("n1", "") == "http://agent-n1.collscope:9464"


def test_pods_forget_and_nodes() -> None:
    pods = jobs.Pods()
    pods.note(("ml", "tj"), place("p0", "n1"))
    pods.note(("ml", "tj"), place("p1", ""))
    assert pods.nodes(("ml", "tj")) == {"n1": "10.0.0.1"}
    pods.forget("ml", "p0")
    pods.forget("ml", "unknown")
    assert list(pods.by_job[("ml", "tj")]) == ["p1"]


def test_rank_placement_keeps_only_the_jobs_pods_on_their_node() -> None:
    pods = {"p0": place("p0", "n1"), "p1": place("p1", "n1"), "p2": place("p2", "n2")}
    answers = {
        "n1": ranks_answer("n1", (0, "p0", "ml", "live"), (1, "p1", "ml", "stale"),
                           (7, "other", "ml", "live"), (9, "p0", "prod", "live"),
                           (None, "p1", "ml", "opening")),
        "n2": ranks_answer("n2", (2, "p2", "ml", "live"), (3, "p1", "ml", "live"),
                           (4, "p2", "ml", "error")),
    }  # fmt: skip
    got = jobs.rank_placement("ml", pods, answers)
    assert {r: (p.node, p.pod) for r, p in got.items()} == {
        0: ("n1", "p0"), 1: ("n1", "p1"), 2: ("n2", "p2"),
    }  # fmt: skip
    assert jobs.by_node([ids.Rank(r) for r in (2, 0, 1, 5)], got) == {"n1": [0, 1], "n2": [2]}
    job = jobs.bundle_job("tj", got)
    assert job.world_size == 3 and [r.node for r in job.ranks] == ["n1", "n1", "n2"]


def test_rank_placement_carries_the_agents_device_map_into_job_json() -> None:
    pods = {"p0": place("p0", "n1"), "p1": place("p1", "n1")}
    answer = api.RanksResponse(
        node="n1",
        now_ns=1,
        ranks=[
            api.RankInfo(rank=0, pod_name="p0", ring_path="/r0", health="live", gpu_index=4,
                         gpu_uuid="GPU-4", gpu_pci_bus_id="0000:18:00.0", nic="mlx5_2"),
            api.RankInfo(rank=1, pod_name="p1", ring_path="/r1", health="live",
                         unresolved="gpu: no NVML; nic: GPU unknown, 4 NICs to choose from"),
        ],
    )  # fmt: skip
    got = jobs.rank_placement("ml", pods, {"n1": answer})
    job = jobs.bundle_job("tj", got)
    assert [(r.rank, r.node, r.pod, r.gpu, r.gpu_uuid, r.nic, r.unresolved) for r in job.ranks] == [
        (0, "n1", "p0", 4, "GPU-4", "mlx5_2", None),
        (1, "n1", "p1", None, None, None, "gpu: no NVML; nic: GPU unknown, 4 NICs to choose from"),
    ]  # fmt: skip
    # Rank 1's devices are unknown: asked again every 5 s, DEVICE_RETRIES times at most.
    rt = jobs.JobRuntime(ranks=got, pods_seen=frozenset(pods.values()), discovered_at_s=0.0)
    assert not rt.needs_discovery(pods, 1.0, every_s=5)
    assert rt.needs_discovery(pods, 5.0, every_s=5)
    rt.device_asks = jobs.DEVICE_RETRIES
    assert not rt.needs_discovery(pods, 60.0, every_s=5)


def test_incident_names_are_stable_and_distinct() -> None:
    hang = trigger.TriggerResult("hang", 1, 2, 0, (1,), 0, 17, "x")
    slow = trigger.TriggerResult("slow", 1, 2, 0, (1,), 0, 17, "x")
    assert jobs.incident_of(hang, "0xab") == "hang/0xab/17"
    assert jobs.incident_of(slow, "0xab") == "slow/0xab"
    a = jobs.diagnosis_name("job-llama", "hang/0xab/17")
    assert a == jobs.diagnosis_name("job-llama", "hang/0xab/17")
    assert a != jobs.diagnosis_name("job-llama", "hang/0xab/18")
    assert a.startswith("job-llama-hang-") and len(a) == len("job-llama-hang-") + 8
    assert len(jobs.diagnosis_name("j" * 300, "slow/0x1")) <= 253


def test_diagnosis_body_is_owned_by_the_trainingjob(crds: Any) -> None:
    body = jobs.diagnosis_body(
        "ml", "tj", "uid-tj", trigger_kind="hang", incident="hang/0x1/3",
        detected_at="2026-11-22T21:00:00Z", window_s=10.0,
    )  # fmt: skip
    crds.validator("diagnoses", "spec").validate(body["spec"])
    (owner,) = body["metadata"]["ownerReferences"]
    assert owner["kind"] == "TrainingJob" and owner["uid"] == "uid-tj"


def test_discovery_and_resample_follow_the_pods() -> None:
    rt = jobs.JobRuntime()
    pods = {"p0": place("p0", "n1")}
    assert rt.needs_discovery(pods, 0.0, every_s=5)
    rt.pods_seen = frozenset(pods.values())
    rt.discovered_at_s = 0.0
    # p0 has no rank yet (no ring): asked again, but only every 5 s.
    assert not rt.needs_discovery(pods, 1.0, every_s=5)
    assert rt.needs_discovery(pods, 5.0, every_s=5)
    # A changed pod (moved to another node) is asked at once.
    assert rt.needs_discovery({"p0": place("p0", "n2")}, 1.0, every_s=5)
    rt.ranks = {
        ids.Rank(0): jobs.RankPlace(ids.Rank(0), ids.NodeName("n1"), "p0", "u0", gpu=0, nic="ib0")
    }
    assert not rt.needs_discovery(pods, 60.0, every_s=5)
    first = rt.resample(trigger.TriggerSettings(), NO_GROUPS)
    state = rt.state
    assert first == (0,) and state is not None
    assert rt.resample(trigger.TriggerSettings(), NO_GROUPS) == (0,) and rt.state is state
    rt.ranks[ids.Rank(1)] = jobs.RankPlace(ids.Rank(1), ids.NodeName("n2"), "p1", "u1")
    assert rt.resample(trigger.TriggerSettings(), NO_GROUPS) == (0, 1)
    assert rt.state is not state  # a new sample starts a fresh trigger


def test_analysis_settings_apply_trigger_overrides() -> None:
    # unset: derived from the sampling interval and the comm's p99 (trigger.hang_threshold_s)
    assert jobs.analysis_settings(resources.TrainingJobSpec()).trigger.hang_floor_s is None
    spec = {"diagnosis": {"trigger": {"hangFloorSeconds": 3, "throughputDrop": 0.25}}}
    got = jobs.analysis_settings(resources.TrainingJobSpec.parse(spec))
    assert got.trigger.hang_floor_s == 3.0 and got.trigger.throughput_drop == 0.25
    assert got.tick_s == 1.0


def _runtime(world: int, per_node: int) -> jobs.JobRuntime:
    rt = jobs.JobRuntime()
    rt.ranks = {
        ids.Rank(r): jobs.RankPlace(
            ids.Rank(r), ids.NodeName(f"n{r // per_node}"), f"p{r}", f"u{r}"
        )
        for r in range(world)
    }
    return rt


def test_resample_follows_the_rotation_tick_by_tick() -> None:
    # tp=4, dp=2 on 8 ranks: 4 DP groups; maxRanks 2: both slots visit the groups, two at a
    # time for 3 ticks (an anchor would make it ceil(3 / 1) = 3 phases instead of 2).
    jg = groups.declared(groups.parse("tp=4,dp=2"), 8)
    rt = _runtime(8, 2)
    rt.set_max_ranks(2)
    plan = None
    watched = []
    for _ in range(7):
        watched.append(rt.resample(trigger.TriggerSettings(), jg))
        if plan is None:
            state = rt.state
            assert rt.sampler.current is not None
            plan = rt.sampler.current.plan
        assert rt.state is state  # the same trigger state follows the rotation
        rt.advance()
    assert plan is not None and plan.period_ticks == 6 and plan.anchors == ()
    assert watched == [plan.at(t) for t in range(7)]
    assert watched[0] == watched[2] != watched[3] == watched[5]
    assert (rt.tick, rt.ticks_run) == (7, 7)
    # A new plan (a pod moved) starts again at its tick 0 with a fresh trigger state.
    rt.ranks[ids.Rank(7)] = jobs.RankPlace(ids.Rank(7), ids.NodeName("n9"), "p7", "u7b")
    rt.resample(trigger.TriggerSettings(), jg)
    assert rt.tick == 0 and rt.state is not state and rt.ticks_run == 7


def test_a_slowdown_episode_ends_after_quiet_ticks_and_the_next_is_a_new_incident() -> None:
    rt = jobs.JobRuntime()

    def slow(at_s: float) -> trigger.TriggerResult:
        return trigger.TriggerResult("slow", int(at_s * 1e9), 0, 0, (1,), 0, None, "x")

    got = []
    for tick, held in enumerate([1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 1]):
        rt.ticks_run = tick
        if held:
            got.append((tick, rt.slow_incident("0xab", slow(100 + tick), quiet=3)))
    first, second = "slow/0xab@100000", "slow/0xab@110000"
    # Ticks 0-5: one episode (two quiet ticks <= 3); tick 10: four quiet ticks, a new one.
    assert got == [(0, first), (1, first), (2, first), (5, first), (10, second), (11, second)]
    assert jobs.diagnosis_name("tj", first) != jobs.diagnosis_name("tj", second)
    # Another communicator has its own episodes.
    assert rt.slow_incident("0xcd", slow(111), quiet=3) == "slow/0xcd@111000"


def test_a_job_wide_slow_trigger_joins_the_open_episode() -> None:
    """Throughput and interval triggers carry no communicator: the slowdown already diagnosed
    moves them, so they join the most recent open episode rather than open a second Diagnosis
    of it (seen in a one-box run: slow/<comm> then slow/- for one proxy stall)."""
    rt = jobs.JobRuntime()

    def slow(at_s: float) -> trigger.TriggerResult:
        return trigger.TriggerResult("slow", int(at_s * 1e9), 0, 0, (1,), 0, None, "x")

    assert rt.slow_incident(None, slow(100), quiet=3) == "slow/-@100000"  # none open: its own
    rt.ticks_run = 10  # that one is over
    assert rt.slow_incident("0xab", slow(110), quiet=3) == "slow/0xab@110000"
    rt.ticks_run = 11
    assert rt.slow_incident("0xcd", slow(111), quiet=3) == "slow/0xcd@111000"
    rt.ticks_run = 12
    assert rt.slow_incident(None, slow(112), quiet=3) == "slow/0xcd@111000"  # the latest open
    rt.ticks_run = 15  # 0xab quiet for 5 ticks, 0xcd kept open by the job-wide trigger at 12
    assert rt.slow_incident(None, slow(115), quiet=3) == "slow/0xcd@111000"
    rt.ticks_run = 30  # all over: a job-wide trigger opens its own episode again
    assert rt.slow_incident(None, slow(130), quiet=3) == "slow/-@130000"


def test_quiet_ticks_cover_a_whole_rotation() -> None:
    rt = _runtime(8, 2)
    assert rt.quiet_ticks(10) == 10  # no plan yet
    rt.set_max_ranks(2)
    rt.resample(trigger.TriggerSettings(), groups.declared(groups.parse("tp=4,dp=2"), 8))
    assert rt.quiet_ticks(2) == 6 + 3  # period + one visit: each group's watchers had a visit
    assert rt.quiet_ticks(10) == 10


def test_diagnosis_window_reaches_back_one_rotation_period() -> None:
    rt = _runtime(8, 2)
    assert rt.diagnosis_window_s(10.0, 1.0) == 10.0  # no plan yet
    rt.set_max_ranks(2)
    rt.resample(trigger.TriggerSettings(), groups.declared(groups.parse("tp=4,dp=2"), 8))
    assert rt.diagnosis_window_s(10.0, 1.0) == 10.0 + 6  # period 6 ticks of 1 s
    assert rt.diagnosis_window_s(10.0, 2.0) == 10.0 + 12
    rt.set_max_ranks(10)  # 4 DP groups fit: nothing rotates
    rt.resample(trigger.TriggerSettings(), groups.declared(groups.parse("tp=4,dp=2"), 8))
    assert rt.diagnosis_window_s(10.0, 1.0) == 10.0


def test_rank_placement_checks_the_pod_uid_and_keeps_the_workload() -> None:
    """Another tenant's ring on n1 names this job's pod p0 in its header (the writer controls
    it); the agent knows its real pod uid from the kubelet's path: not one of ours."""
    pods = {"p0": place("p0", "n1"), "p1": place("p1", "n1"), "p2": place("p2", "n2")}
    answers = {
        "n1": api.RanksResponse(node="n1", now_ns=1, ranks=[
            api.RankInfo(rank=0, pod_name="p0", pod_uid="uid-p0", workload="uid-p0",
                         ring_path="/a/r0", health="live"),
            api.RankInfo(rank=1, pod_name="p1", pod_uid="uid-p1", workload="uid-p1",
                         ring_path="/c/r1", health="live"),
            api.RankInfo(rank=1, pod_name="p0", pod_uid="uid-evil", workload="uid-evil",
                         ring_path="/b/r1", health="live"),  # listed last: it would win
        ]),
        "n2": ranks_answer("n2", (2, "p2", "ml", "live")),  # an older agent: no workload
    }  # fmt: skip
    got = jobs.rank_placement("ml", pods, answers)
    assert {r: (p.pod, p.pod_uid, p.workload) for r, p in got.items()} == {
        0: ("p0", "uid-p0", "uid-p0"), 1: ("p1", "uid-p1", "uid-p1"), 2: ("p2", "uid-p2", None),
    }  # fmt: skip
    assert jobs.workloads_by_node(got) == {"n1": ["uid-p0", "uid-p1"]}
