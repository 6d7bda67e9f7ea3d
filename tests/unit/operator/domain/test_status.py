"""Status builders: conditions per the API conventions, the Diagnosis phase machine, stacks
grouped by identity, and TrainingJob status that the CRD schema accepts."""

from __future__ import annotations

import datetime
import itertools
from typing import Any

import pytest

from collscope.operator import errors
from collscope.operator.analysis import diagnosis
from collscope.operator.domain import groups, ids, status

T0 = datetime.datetime(2026, 11, 22, 21, 0, 0, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(seconds=30)


def test_condition_transition_time_moves_only_on_flips() -> None:
    first = status.set_condition(
        None, type_="Ready", status="False", reason="Pending", message="m", generation=1, now=T0
    )
    assert first == [
        {"type": "Ready", "status": "False", "reason": "Pending", "message": "m",
         "lastTransitionTime": "2026-11-22T21:00:00Z", "observedGeneration": 1}
    ]  # fmt: skip
    same = status.set_condition(
        first, type_="Ready", status="False", reason="Still", message="n", generation=2, now=T1
    )
    assert same[0]["lastTransitionTime"] == "2026-11-22T21:00:00Z"
    assert same[0]["reason"] == "Still" and same[0]["observedGeneration"] == 2
    flipped = status.set_condition(
        same, type_="Ready", status="True", reason="Watching", message="", generation=2, now=T1
    )
    assert flipped[0]["lastTransitionTime"] == "2026-11-22T21:00:30Z"


def test_conditions_are_a_map_by_type() -> None:
    c = status.set_condition(
        None, type_="Ready", status="True", reason="A", message="", generation=None, now=T0
    )
    c = status.set_condition(
        c, type_="Degraded", status="False", reason="B", message="", generation=None, now=T0
    )
    c = status.set_condition(
        c, type_="Ready", status="False", reason="C", message="", generation=None, now=T1
    )
    assert [x["type"] for x in c] == ["Degraded", "Ready"]
    assert "observedGeneration" not in c[0]


PHASES: tuple[status.Phase, ...] = ("Detected", "Analyzing", "Diagnosed", "Remediated", "Failed")
ALLOWED = {
    ("Detected", "Analyzing"), ("Analyzing", "Diagnosed"), ("Diagnosed", "Remediated"),
    ("Detected", "Failed"), ("Analyzing", "Failed"), ("Diagnosed", "Failed"),
}  # fmt: skip


@pytest.mark.parametrize(("a", "b"), list(itertools.product(PHASES, PHASES)))
def test_phase_machine(a: status.Phase, b: status.Phase) -> None:
    if a == b or (a, b) in ALLOWED:
        assert status.transition(a, b) == b
    else:
        with pytest.raises(errors.InvalidTransition, match=f"{a} -> {b}"):
            status.transition(a, b)


def test_first_phase_is_anything() -> None:
    assert status.transition(None, "Detected") == "Detected"


def hang() -> diagnosis.Diagnosis:
    return diagnosis.Diagnosis(
        anomaly=True,
        trigger="hang",
        category="hang.not_entered",
        culprits=[diagnosis.Culprit(rank=12, node="gpu-node-02", component="software", score=0.9)],
        confidence=0.9,
        evidence=["rank 12 never entered AllReduce seq 881", *[f"e{i}" for i in range(100)]],
    )


def test_diagnosis_status_fields(crds: Any) -> None:
    s = status.diagnosis_status(hang(), phase="Diagnosed", generation=3, conditions=None, now=T0)
    assert s["category"] == "hang.not_entered" and s["culpritNode"] == "gpu-node-02"
    assert s["culpritRank"] == 12 and s["observedGeneration"] == 3
    assert len(s["result"]["evidence"]) == status.MAX_EVIDENCE
    assert "detected_at" not in s["result"]  # None: left out, a merge patch would delete it
    (cond,) = s["conditions"]
    assert cond["reason"] == "HangNotEntered" and cond["status"] == "True"
    assert cond["message"] == "rank 12 never entered AllReduce seq 881"
    crds.validator("diagnoses", "status").validate(s)


def test_every_culprit_field_is_in_the_crd(crds: Any) -> None:
    # A field the CRD does not declare is pruned by the API server: silently lost.
    props = crds.schema("diagnoses")["properties"]["status"]["properties"]["result"]["properties"]
    declared = set(props["culprits"]["items"]["properties"])
    assert set(diagnosis.Culprit.model_fields) <= declared
    c = diagnosis.Culprit(
        rank=3, component="software", score=0.8, function="torch.nn.functional.linear"
    )
    d = hang().model_copy(update={"culprits": [c]})
    s = status.diagnosis_status(d, phase="Diagnosed", generation=1, conditions=None, now=T0)
    assert s["result"]["culprits"][0]["function"] == "torch.nn.functional.linear"
    crds.validator("diagnoses", "status").validate(s)


def test_healthy_diagnosis_status(crds: Any) -> None:
    s = status.diagnosis_status(
        diagnosis.Diagnosis(anomaly=False), phase="Diagnosed", generation=1, conditions=None, now=T0
    )
    assert "category" not in s and "culpritNode" not in s
    assert s["conditions"][0]["reason"] == "NoAnomaly"
    crds.validator("diagnoses", "status").validate(s)


def test_action_entries(crds: Any) -> None:
    a = status.action("cordon", "DryRun", T0, node="n1", message="would cordon n1")
    assert a == {"action": "cordon", "outcome": "DryRun", "time": "2026-11-22T21:00:00Z",
                 "node": "n1", "message": "would cordon n1"}  # fmt: skip
    s = {"phase": "Remediated", "actions": [a, status.action("stacks", "Done", T1)]}
    crds.validator("diagnoses", "status").validate(s)


def test_stack_groups() -> None:
    wait = ["wait (nccl.py:10)", "all_reduce (dist.py:5)", "step (train.py:40)"]
    stuck = ["load (data.py:3)", "step (train.py:30)"]
    stacks = {ids.Rank(r): wait for r in range(8) if r != 5}
    stacks[ids.Rank(5)] = stuck
    got = status.stack_groups(stacks)
    assert got == [
        {"ranks": [0, 1, 2, 3, 4, 6, 7], "frames": wait},
        {"ranks": [5], "frames": stuck},
    ]
    deep = {ids.Rank(0): [f"f{i}" for i in range(100)]}
    assert len(status.stack_groups(deep)[0]["frames"]) == status.MAX_FRAMES
    many = {ids.Rank(r): [f"f{r}"] for r in range(40)}
    assert len(status.stack_groups(many)) == status.MAX_STACK_GROUPS
    assert status.stack_groups({}) == []


def test_trainingjob_status_matches_the_crd(crds: Any) -> None:
    members = [
        groups.CommMember(ids.CommHash("0xab"), ids.Rank(r), ids.CommRank(r), 4) for r in range(4)
    ]
    where = {ids.Rank(r): ids.NodeName(f"n{r // 2}") for r in range(4)}
    jg = groups.infer(members, 4, where)
    placement = [
        {"rank": r, "pod": f"p{r}", "podUID": f"u{r}", "node": where[ids.Rank(r)], "gpu": r % 2,
         "nic": None}
        for r in (3, 1, 0, 2)
    ]  # fmt: skip
    s = status.trainingjob_status(
        placement=placement,
        job_groups=jg,
        sampled=[ids.Rank(2), ids.Rank(0)],
        phase="Watching",
        health="Healthy",
        generation=1,
        conditions=None,
        now=T0,
        unreachable=[ids.NodeName("n1")],
    )
    assert s["rankCount"] == 4 and s["nodeCount"] == 2
    assert "ranks" not in s and "communicators" not in s  # the per-rank map is the agents'
    assert s["sampledRanks"] == [0, 2]
    assert s["groups"] == {
        "source": "inferred", "communicators": 1, "dp": {"count": 1, "size": 4},
        "tp": {"count": 0, "size": 0}, "pp": {"count": 0, "size": 0},
    }  # fmt: skip
    assert s["unreachableAgents"] == ["n1"] and s["unreachableCount"] == 1
    cond = {c["type"]: c for c in s["conditions"]}
    assert cond["Hung"]["status"] == "False" and cond["Hung"]["reason"] == "NoHang"
    assert cond["Slow"]["status"] == "False" and cond["Ready"]["status"] == "True"
    crds.validator("trainingjobs", "status").validate(s)
    pending = status.trainingjob_status(
        placement=[], job_groups=None, sampled=[], phase="Pending", health="Unknown",
        generation=None, conditions=s["conditions"], now=T1,
    )  # fmt: skip
    ready = {c["type"]: c for c in pending["conditions"]}["Ready"]
    assert ready["status"] == "False" and ready["lastTransitionTime"] == "2026-11-22T21:00:30Z"
    hung = {c["type"]: c for c in pending["conditions"]}["Hung"]
    assert (hung["status"], hung["reason"]) == ("Unknown", "NotWatched")
    crds.validator("trainingjobs", "status").validate(pending)


def test_hung_and_slow_are_conditions_kubectl_wait_reads(crds: Any) -> None:
    def conds(health: status.Health, before: Any = None, now: Any = T0) -> dict[str, Any]:
        s = status.trainingjob_status(
            placement=[{"rank": 0, "node": "n0"}], job_groups=None, sampled=[ids.Rank(0)],
            phase="Diagnosing" if health in ("Hung", "Slow") else "Watching", health=health,
            generation=3, conditions=before, now=now,
            trigger_message="rank 0 stalled 4.1 s in AllReduce; Diagnosis j-hang-1",
        )  # fmt: skip
        crds.validator("trainingjobs", "status").validate(s)
        return {c["type"]: c for c in s["conditions"]}

    healthy = conds("Healthy")
    hung = conds("Hung", list(healthy.values()), T1)
    assert hung["Hung"]["status"] == "True" and hung["Hung"]["reason"] == "HangDetected"
    assert hung["Hung"]["message"].endswith("Diagnosis j-hang-1")
    assert hung["Hung"]["lastTransitionTime"] == "2026-11-22T21:00:30Z"
    assert hung["Hung"]["observedGeneration"] == 3
    assert hung["Slow"]["status"] == "False"
    assert hung["Slow"]["lastTransitionTime"] == "2026-11-22T21:00:00Z"  # did not flip
    slow = conds("Slow")
    assert (slow["Slow"]["status"], slow["Slow"]["reason"]) == ("True", "SlowdownDetected")


@pytest.mark.parametrize("world", [16_384, 131_072])
def test_trainingjob_status_stays_small_at_any_world_size(crds: Any, world: int) -> None:
    """8 GPUs a node, TP 8 x PP 16 x DP world/128, every agent unreachable, the largest sample:
    the status of the largest job stays far below etcd's 1.5 MiB (it was 2.5 MB at 16,384)."""
    import json

    jg = groups.declared(groups.parse(f"tp=8,pp=16,dp={world // 128}"), world)
    placement = ({"rank": r, "node": f"node-{r // 8:05d}"} for r in range(world))
    nodes = [ids.NodeName(f"node-{n:05d}") for n in range(world // 8)]
    s = status.trainingjob_status(
        placement=placement, job_groups=jg, sampled=[ids.Rank(r * 97) for r in range(256)],
        phase="Diagnosing", health="Hung", generation=7, conditions=None, now=T0,
        unreachable=nodes, message="m" * 5000, trigger_message="t" * 50_000,
    )  # fmt: skip
    size = len(json.dumps(s).encode())
    assert size <= 256 * 1024, size
    assert s["rankCount"] == world and s["nodeCount"] == world // 8
    assert s["unreachableCount"] == world // 8 and len(s["unreachableAgents"]) == 64
    assert s["groups"]["dp"] == {"count": 128, "size": world // 128}  # TP x PP groups of DP
    crds.validator("trainingjobs", "status").validate(s)


def test_phase_status_walks_the_machine(crds: Any) -> None:
    check = crds.validator("diagnoses", "status")
    s = status.phase_status(
        None, "Detected", reason="Hang", message="m", generation=1, conditions=None, now=T0
    )
    assert s["phase"] == "Detected" and s["conditions"][0]["status"] == "Unknown"
    check.validate(s)
    s = status.phase_status(
        "Detected", "Analyzing", reason="Pulling", message="", generation=1,
        conditions=s["conditions"], now=T1,
    )  # fmt: skip
    assert s["conditions"][0]["lastTransitionTime"] == "2026-11-22T21:00:00Z"  # still Unknown
    failed = status.phase_status(
        "Analyzing", "Failed", reason="AgentsUnreachable", message="3 of 4 agents down",
        generation=1, conditions=s["conditions"], now=T1,
    )  # fmt: skip
    assert failed["conditions"][0]["status"] == "False"
    check.validate(failed)
    with pytest.raises(errors.InvalidTransition):
        status.phase_status(
            "Failed", "Analyzing", reason="X", message="", generation=1, conditions=None, now=T1
        )
