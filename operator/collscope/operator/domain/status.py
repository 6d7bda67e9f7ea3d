"""Status builders for TrainingJob and Diagnosis: plain dicts, ready for a merge patch.

Conditions follow the Kubernetes API conventions (``metav1.Condition``): a list keyed by
``type``, ``lastTransitionTime`` changing only when ``status`` flips, a CamelCase ``reason``,
and the ``observedGeneration`` they were computed for. A Diagnosis moves through
``Detected -> Analyzing -> Diagnosed -> Remediated`` or ends ``Failed`` from any state before
the end; ``transition`` refuses anything else so a late or repeated handler run cannot move a
Diagnosis backwards.

Values that are None are left out of every builder's output: in a merge patch (what kopf sends)
a None deletes the key, and the CRD schema has no use for explicit nulls.
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from collscope.operator import errors
from collscope.operator.analysis import diagnosis
from collscope.operator.domain import groups, ids

Phase = Literal["Detected", "Analyzing", "Diagnosed", "Remediated", "Failed"]
JobPhase = Literal["Pending", "Watching", "Diagnosing", "Finished", "Failed"]
Health = Literal["Unknown", "Healthy", "Hung", "Slow"]
ConditionStatus = Literal["True", "False", "Unknown"]
# ``Diagnosis.status.action`` (the ``Action`` printer column): what remediation did about the
# culprit node, in one word. ``pending``: corroborated, waiting for the re-check.
Action = Literal["pending", "cordoned", "dry-run", "blocked", "held", "not-confirmed", "failed",
                 "none"]  # fmt: skip
CONFIRMED = "Confirmed"  # the Diagnosis condition type of the confirmation step

TRANSITIONS: Mapping[Phase, frozenset[Phase]] = {
    "Detected": frozenset({"Analyzing", "Failed"}),
    "Analyzing": frozenset({"Diagnosed", "Failed"}),
    "Diagnosed": frozenset({"Remediated", "Failed"}),
    "Remediated": frozenset(),
    "Failed": frozenset(),
}
MAX_STACK_GROUPS = 16  # a status is read by people; more distinct stacks means "everything"
MAX_FRAMES = 32  # innermost frames kept per stack: where it waits, not how it got there
MAX_EVIDENCE = 64  # keeps Diagnosis objects far below etcd's 1.5 MiB object limit
MAX_SAMPLED_RANKS = 256  # spec.diagnosis.sampling.maxRanks is at most 256
MAX_LISTED_NODES = 64  # nodes named in a list; a count says how many in all
MAX_MESSAGE = 2000  # a condition message people read; the CRD allows 32768
MAX_STATUS_MESSAGE = 512  # Diagnosis.status.message, a cell of kubectl get -o wide
MAX_CULPRITS = 1024  # the CRD's maxItems of result.culprits
MAX_ALTERNATIVES = 16  # the CRD's maxItems of result.alternatives
MAX_AGENT_ERRORS = 64  # Diagnosis.status.agentErrors listed (the CRD's maxItems)


def timestamp(now: datetime.datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes times."""
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def precise_timestamp(now: datetime.datetime) -> str:
    """RFC 3339 in UTC with microseconds (a re-check a fraction of a second away in tests)."""
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_timestamp(text: str) -> datetime.datetime:
    """The inverse of ``timestamp``/``precise_timestamp``; ``ValueError`` when ``text`` is
    not RFC 3339."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def transition(current: Phase | None, new: Phase) -> Phase:
    """``new`` if the Diagnosis may move there from ``current`` (same phase: allowed no-op)."""
    if current is None or current == new or new in TRANSITIONS[current]:
        return new
    raise errors.InvalidTransition(f"Diagnosis phase {current} -> {new} is not allowed")


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    *,
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime.datetime,
) -> list[dict[str, Any]]:
    """The conditions with ``type_`` set; its transition time kept unless ``status`` changed."""
    out: list[dict[str, Any]] = []
    previous = None
    for c in conditions or ():
        if c.get("type") == type_:
            previous = c
        else:
            out.append(dict(c))
    changed = previous is None or previous.get("status") != status
    new: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": (
            timestamp(now) if changed or previous is None else previous["lastTransitionTime"]
        ),
    }
    if generation is not None:
        new["observedGeneration"] = generation
    out.append(new)
    return sorted(out, key=lambda c: str(c["type"]))


def without_none(value: Any) -> Any:
    """``value`` with every None dropped from dicts, recursively."""
    if isinstance(value, Mapping):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [without_none(v) for v in value]
    return value


def result(d: diagnosis.Diagnosis) -> dict[str, Any]:
    """``Diagnosis.status.result``: the bundle-v1 Diagnosis, Nones dropped, evidence capped."""
    data: dict[str, Any] = without_none(d.model_dump(mode="json", by_alias=True))
    data["evidence"] = list(d.evidence[:MAX_EVIDENCE])
    data["culprits"] = data.get("culprits", [])[:MAX_CULPRITS]
    if "alternatives" in data:
        data["alternatives"] = data["alternatives"][:MAX_ALTERNATIVES]
    return data


def diagnosis_status(
    d: diagnosis.Diagnosis,
    *,
    phase: Phase,
    generation: int | None,
    conditions: Sequence[Mapping[str, Any]] | None,
    now: datetime.datetime,
) -> dict[str, Any]:
    """The status of a Diagnosis once analysis has run (phase ``Diagnosed`` or later)."""
    top = d.culprits[0] if d.culprits else None
    found = d.anomaly and d.category is not None
    message = d.evidence[0] if d.evidence else "analysis found nothing wrong"
    status: dict[str, Any] = {
        "phase": phase,
        "result": result(d),
        "category": d.category if found else None,
        "culpritNode": top.node if top else None,
        "culpritRank": top.rank if top else None,
        "culpritGPU": top.gpu if top else None,
        "culpritNIC": top.nic if top else None,
        "component": top.component if top else None,
        "confidence": d.confidence,
        "message": message[:MAX_STATUS_MESSAGE],
        "observedGeneration": generation,
        "conditions": set_condition(
            conditions,
            type_="Diagnosed",
            status="True",
            reason=camel(d.category) if found and d.category else "NoAnomaly",
            message=message,
            generation=generation,
            now=now,
        ),
    }
    return without_none(status)  # type: ignore[no-any-return]


def phase_status(
    current: Phase | None,
    new: Phase,
    *,
    reason: str,
    message: str,
    generation: int | None,
    conditions: Sequence[Mapping[str, Any]] | None,
    now: datetime.datetime,
) -> dict[str, Any]:
    """Status for a Diagnosis entering ``new`` before or instead of a result: ``Detected``,
    ``Analyzing`` (condition ``Diagnosed`` Unknown) or ``Failed`` (``Diagnosed`` False).

    Raises ``InvalidTransition`` when the phase may not follow ``current``.
    """
    phase = transition(current, new)
    cond: ConditionStatus = "False" if phase == "Failed" else "Unknown"
    if phase in ("Diagnosed", "Remediated"):
        cond = "True"
    return without_none(  # type: ignore[no-any-return]
        {
            "phase": phase,
            # Remediated keeps the key evidence in the column (the Action column says what)
            "message": None if phase == "Remediated" else message[:MAX_STATUS_MESSAGE],
            "observedGeneration": generation,
            "conditions": set_condition(
                conditions,
                type_="Diagnosed",
                status=cond,
                reason=reason,
                message=message,
                generation=generation,
                now=now,
            ),
        }
    )


def camel(category: str) -> str:
    """``hang.not_entered`` -> ``HangNotEntered`` (a condition reason)."""
    return "".join(p.capitalize() for p in category.replace(".", "_").split("_"))


def action(
    kind: str, outcome: str, now: datetime.datetime, *, node: str | None = None, message: str = ""
) -> dict[str, Any]:
    """One ``Diagnosis.status.actions`` entry."""
    entry = {"action": kind, "outcome": outcome, "time": timestamp(now), "node": node}
    if message:
        entry["message"] = message
    return without_none(entry)  # type: ignore[no-any-return]


def stack_groups(stacks: Mapping[ids.Rank, Sequence[str]]) -> list[dict[str, Any]]:
    """Ranks grouped by identical stack (frames innermost first), largest group first.

    Hangs show as one big group (ranks waiting in the collective) and a few small ones (the
    culprits, stuck elsewhere): the grid Mycroft and py-spy dumps are read for.
    """
    by_stack: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for rank, frames in stacks.items():
        by_stack[tuple(frames[:MAX_FRAMES])].append(int(rank))
    ordered = sorted(by_stack.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    return [{"ranks": sorted(r), "frames": list(f)} for f, r in ordered[:MAX_STACK_GROUPS]]


def group_counts(job_groups: groups.JobGroups) -> dict[str, Any]:
    """``TrainingJob.status.groups``: per kind, how many groups and the largest one's size.

    Counts, not members: the members of every group of a 131,072-rank job are megabytes (the
    sample's fingerprint in ``sampling`` keeps them, in memory)."""
    out: dict[str, Any] = {"source": job_groups.source, "communicators": len(job_groups.comms)}
    for kind, found in (("tp", job_groups.tp), ("pp", job_groups.pp), ("dp", job_groups.dp)):
        out[kind] = {"count": len(found), "size": max((len(g) for g in found), default=0)}
    return out


def trainingjob_status(
    *,
    placement: Iterable[Mapping[str, Any]],
    job_groups: groups.JobGroups | None,
    sampled: Sequence[ids.Rank],
    phase: JobPhase,
    health: Health,
    generation: int | None,
    conditions: Sequence[Mapping[str, Any]] | None,
    now: datetime.datetime,
    unreachable: Sequence[ids.NodeName] = (),
    message: str = "",
    trigger_message: str = "",
) -> dict[str, Any]:
    """``TrainingJob.status``, bounded whatever the job's size (v1alpha1 since issue 16).

    ``placement`` items are ``{rank, node, ...}``; only their counts are written: the per-rank
    map (rank -> pod, node, GPU, NIC) stays with the node agents (``GET /v1/ranks``) and the
    Diagnosis names its culprits' placement. Lists are cut to ``MAX_SAMPLED_RANKS`` and
    ``MAX_LISTED_NODES`` (``unreachableCount`` says how many in all). The conditions ``Hung`` and
    ``Slow`` follow ``health`` (``Unknown`` when no sampled rank could be read this tick), so
    ``kubectl wait --for=condition=Hung trainingjob.collscope.dev/NAME`` works;
    ``trigger_message`` is the trigger's reason when one fired.
    """
    ranks = 0
    nodes: set[str] = set()
    for p in placement:
        ranks += 1
        if p.get("node"):
            nodes.add(str(p["node"]))
    ready = phase in ("Watching", "Diagnosing")
    down = sorted(set(unreachable))
    status: dict[str, Any] = {
        "phase": phase,
        "health": health,
        "observedGeneration": generation,
        "rankCount": ranks,
        "nodeCount": len(nodes),
        "sampledRanks": sorted(int(r) for r in sampled)[:MAX_SAMPLED_RANKS],
        "unreachableAgents": down[:MAX_LISTED_NODES],
        "unreachableCount": len(down),
        "conditions": set_condition(
            conditions,
            type_="Ready",
            status="True" if ready else "False",
            reason=phase,
            message=(message or f"{ranks} ranks, phase {phase}")[:MAX_MESSAGE],
            generation=generation,
            now=now,
        ),
    }
    for kind, name in (("Hung", "Hang"), ("Slow", "Slowdown")):
        cond: ConditionStatus = "Unknown" if health == "Unknown" else "False"
        reason = "NotWatched" if health == "Unknown" else f"No{name}"
        text = "no sampled rank could be read at the last tick"
        if health == kind:
            cond, reason, text = "True", f"{name}Detected", trigger_message or f"{kind.lower()}"
        elif health != "Unknown":
            text = f"no {name.lower()} at the last tick of the sampled ranks"
        status["conditions"] = set_condition(
            status["conditions"], type_=kind, status=cond, reason=reason,
            message=text[:MAX_MESSAGE], generation=generation, now=now,
        )  # fmt: skip
    if job_groups is not None:
        status["groups"] = group_counts(job_groups)
    return without_none(status)  # type: ignore[no-any-return]
