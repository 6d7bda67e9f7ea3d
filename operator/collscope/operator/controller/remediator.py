"""Carries out remediation decisions against the cluster (docs/design.md, "Data path" 7;
issue 14).

Four gates, in order, and the node is touched only past all of them:

1. the policy (``policy.decide``) under the cluster's bounds (``RemediationPolicy.bounded``: a
   TrainingJob may only be stricter): a hardware verdict above the threshold, never a dead
   process, a lost node or a software hang;
2. corroboration (``confirmation.judge``): the culprit device's hardware samples over the
   Diagnosis window, read from its node's agent, show a fault (not only load);
3. persistence (``confirmation.recheck``): ``confirm_delay_s`` later the same fault still holds
   on the same device. ``remediate`` does not wait: it returns a ``Step`` with ``retry_in_s``
   and the handler asks kopf to come back (the state is in ``status.confirmation``, so an
   operator restart in between resumes it);
4. the cluster-wide circuit breaker (``breaker.Breaker``, its state in a ConfigMap, its held set
   rebuilt from the nodes' marks before every cordon and at start-up).

Then ``remediation.plan`` marks the node (cordon, taint, label, annotations), the Node gets the
``CollscopeFaulty`` condition and an Event. A gate that stops the way sets the Diagnosis's
``Confirmed`` condition False with the reason, ``status.action`` to ``not-confirmed`` (or
``none`` with no anomaly or remediation off) and, when a node was named, posts
``CollscopeNotConfirmed`` on it. Nothing here releases a node but ``release`` (``collscope
uncordon``). No kopf here: the handlers patch the returned status and post the Events.

Every breaker read-modify-write happens under one ``asyncio.Lock`` (one active operator replica
acts at a time under kopf peering).

Why one module: the four gates are one sequence with one lock and one record of what was done;
the decisions themselves are already pure modules (``policy``, ``confirmation``, ``breaker``,
``remediation``), and what stays here is their order and the cluster calls between them.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from collscope.nodeagent.bundle import models
from collscope.operator import errors
from collscope.operator.analysis import diagnosis
from collscope.operator.clients import kube
from collscope.operator.domain import (
    breaker,
    confirmation,
    ids,
    metrics,
    policy,
    remediation,
    resources,
    status,
)

STATE_KEY = "state"
SUMMARY_KEY = "summary"
NS = 1_000_000_000
# The agents keep 120 s of samples: a window reaching further back reads nothing more.
MAX_LOOKBACK_S = 120.0

# (node, since_ns, until_ns) -> that node's hardware records; raises errors.AgentError.
HardwareSource = Callable[[ids.NodeName, int, int], Awaitable[Sequence[models.HwRecord]]]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    """What the handler merges into ``Diagnosis.status`` and posts as Events on it; with
    ``retry_in_s`` it comes back that much later (the re-check)."""

    status: dict[str, Any]
    events: list[tuple[bool, str, str]] = field(default_factory=list)  # (warning, reason, msg)
    retry_in_s: float | None = None
    marked: bool = False


@dataclass(frozen=True)
class Request:
    """What ``Remediator.remediate`` decides on for one Diagnosis ``diag`` (``ns/name``): its
    result, the TrainingJob's policy overrides (None: the cluster's policy), ``pending``: its
    ``status.confirmation`` while a re-check is due, its conditions and generation (to set
    ``Confirmed`` over), where the culprit node's hardware samples come from and the Diagnosis
    window (how far back corroboration reads)."""

    diag: str
    result: diagnosis.Diagnosis
    overrides: Mapping[str, Any] | None
    pending: resources.Confirmation | None
    conditions: Sequence[Mapping[str, Any]] | None
    generation: int | None
    hardware: HardwareSource
    window_s: float


@dataclass
class Remediator:
    api: kube.Cluster
    namespace: str  # of the breaker ConfigMap
    configmap: str
    breaker_settings: breaker.BreakerSettings
    defaults: policy.RemediationPolicy  # the cluster's floor
    meters: metrics.OperatorMetrics
    clock: Callable[[], float] = time.time
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def now(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.clock(), datetime.UTC)

    async def load(self) -> breaker.Breaker:
        data = await self.api.read_configmap(self.namespace, self.configmap)
        state = None
        if data and STATE_KEY in data:
            try:
                state = breaker.BreakerState.from_dict(json.loads(data[STATE_KEY]))
            except (ValueError, errors.PolicyError) as e:
                raise errors.RemediationError(f"breaker ConfigMap unreadable: {e}") from e
        return breaker.Breaker(self.breaker_settings, self.clock, state)

    async def save(self, brk: breaker.Breaker, total_nodes: int) -> None:
        summary = brk.summary(total_nodes)
        self.meters.breaker_open.set(1 if brk.status == "Open" else 0)
        self.meters.nodes_held.set(len(brk.state.held))
        await self.api.write_configmap(
            self.namespace,
            self.configmap,
            {STATE_KEY: json.dumps(brk.state.to_dict()), SUMMARY_KEY: json.dumps(summary)},
        )

    async def _synced(self) -> tuple[breaker.Breaker, int]:
        """The breaker with its held set read from the nodes' marks, and the node count."""
        nodes = await self.api.list_nodes()
        brk = await self.load()
        brk.sync_held(
            {ids.NodeName(str(n["metadata"]["name"])) for n in nodes if remediation.is_held(n)}
        )
        return brk, len(nodes)

    async def rebuild(self) -> dict[str, Any]:
        """At start-up: the breaker's held set from the nodes (``remediation.is_held``)."""
        async with self.lock:
            brk, total = await self._synced()
            await self.save(brk, total)
            return brk.summary(total)

    async def remediate(self, req: Request) -> Step:
        """The next step for the Diagnosis ``req.diag``. Each decision is logged at INFO."""
        step = await self._next_step(req)
        log.info("remediation of Diagnosis %s: %s", req.diag, decision_text(step))
        return step

    async def _next_step(self, req: Request) -> Step:
        result, pending, hardware = req.result, req.pending, req.hardware
        now = self.now()
        notes: list[str] = []
        try:
            pol, notes = self.defaults.bounded(req.overrides)
        except errors.PolicyError as e:
            pol, notes = self.defaults, [f"TrainingJob policy ignored ({e}); the cluster's applies"]
        decision = policy.decide(pol, result)
        node = decision.node
        ctx = _Ctx(self, req.diag, result, req.conditions, req.generation, now, notes)
        if not decision.act or node is None:
            quiet = decision.code in ("NoAnomaly", "RemediationDisabled")
            return await ctx.stop(
                decision.code, decision.reason, node, action="none" if quiet else None
            )
        culprit = result.culprits[0]
        if pending is None or pending.state != "Pending":
            since = max(
                (result.detected_at or int(now.timestamp() * NS)) - int(req.window_s * NS),
                int((now.timestamp() - MAX_LOOKBACK_S) * NS),
            )
            records = await _read(hardware, node, since, int(now.timestamp() * NS))
            on_node = [c for c in result.culprits if c.node == culprit.node]
            found = confirmation.judge(
                culprit, records, node_wide=result.trigger == "slow" and len(on_node) >= 2
            )
            if not found.holds:
                return await ctx.stop(found.reason, found.message, node, finding=found)
            recheck_at = now + datetime.timedelta(seconds=pol.confirm_delay_s)
            record = _record("Pending", node, found, now, recheck_at)
            cond = ctx.condition("Unknown", "AwaitingRecheck",
                                 f"{found.message}; re-check at {record['recheckAt']}")  # fmt: skip
            return Step(
                {"confirmation": record, "action": "pending", "conditions": cond},
                [(False, "AwaitingRecheck", f"{node}: {found.message}")],
                retry_in_s=pol.confirm_delay_s,
            )
        recheck_at = status.parse_timestamp(str(pending.recheck_at))
        if now < recheck_at:
            return Step({}, retry_in_s=(recheck_at - now).total_seconds())
        checked = status.parse_timestamp(pending.checked_at)
        first = [confirmation.Symptom(**s.model_dump()) for s in pending.symptoms or []]
        records = await _read(
            hardware, node, int(checked.timestamp() * NS), int(now.timestamp() * NS)
        )
        again = confirmation.recheck(first, records)
        if not again.holds:
            return await ctx.stop(again.reason, again.message, node, finding=again)
        return await self._confirmed(ctx, decision, node, again)

    async def _confirmed(
        self,
        ctx: _Ctx,
        decision: policy.Decision,
        node: ids.NodeName,
        found: confirmation.Finding,
    ) -> Step:
        """Confirmed: through the breaker to the node marks, condition and Event."""
        now, result = ctx.now, ctx.result
        record = _record("Confirmed", node, found, now)
        cond = ctx.condition("True", "Confirmed", found.message)
        why = f"{decision.reason}; confirmed: {found.message}"
        category = result.category or "unknown"
        async with self.lock:
            brk, total = await self._synced()
            if decision.dry_run:
                verdict = brk.check(node, total)
                outcome = "DryRun" if verdict.allowed else "Blocked"
                action = self._action("cordon", outcome, now, node, f"{why} ({verdict.reason})")
                await self._node_event(node, "CollscopeWouldCordon", f"{ctx.diag}: {why}", False)
                return Step({"confirmation": record, "conditions": cond, "actions": [action],
                             "action": "dry-run"})  # fmt: skip
            verdict = brk.acquire(node, total)
            if not verdict.allowed:
                await self.save(brk, total)
                action = self._action("cordon", "Blocked", now, node, verdict.reason)
                await self._node_event(node, "CollscopeBlocked", f"{ctx.diag}: {verdict.reason}")
                return Step({"confirmation": record, "conditions": cond, "actions": [action],
                             "action": "blocked"})  # fmt: skip
            current = await self.api.get_node(node)
            ops = [] if current is None else remediation.plan(current, ctx.diag, category, now)
            try:
                if ops:
                    await self.api.patch_node(node, ops)
            except errors.KubeError as e:
                brk.release(node)
                await self.save(brk, total)
                action = self._action("cordon", "Failed", now, node, str(e))
                return Step({"confirmation": record, "conditions": cond, "actions": [action],
                             "action": "failed"})  # fmt: skip
            if current is None:
                brk.release(node)
            await self.save(brk, total)
        if current is None:
            action = self._action("cordon", "Failed", now, node, "node not found")
            return Step({"confirmation": record, "conditions": cond, "actions": [action],
                         "action": "failed"})  # fmt: skip
        if not ops:
            action = self._action("cordon", "Skipped", now, node, "already held by collscope")
            return Step({"confirmation": record, "conditions": cond, "actions": [action],
                         "action": "held"})  # fmt: skip
        rec = remediation.Record.from_json(_annotation(ops, remediation.RECORD_ANNOTATION) or "{}")
        message = f"{category} ({found.message}); Diagnosis {ctx.diag}"
        await self._node_condition(node, True, status.camel(category), message)
        await self._node_event(node, "CollscopeCordoned", message)
        actions = []
        for kind, added in (("cordon", rec.cordoned), ("taint", rec.tainted),
                            ("label", rec.labelled), ("annotate", True)):  # fmt: skip
            note = why if added else "already present, not ours to undo"
            actions.append(self._action(kind, "Done" if added else "Skipped", now, node, note))
        return Step(
            {"confirmation": record, "conditions": cond, "actions": actions, "action": "cordoned"},
            [(True, "Cordoned", f"{node}: {why}")],
            marked=True,
        )

    async def release(self, node: ids.NodeName) -> bool:
        """Undo what collscope placed on ``node`` (``collscope uncordon``); True when something
        was removed. The node's place in the breaker is freed either way (the held set is read
        from the nodes), so a node someone cleaned by hand stops counting too."""
        now = self.now()
        async with self.lock:
            current = await self.api.get_node(node)
            ops = [] if current is None else remediation.undo(current)
            if ops:
                await self.api.patch_node(node, ops)
            brk, total = await self._synced()
            brk.release(node)
            await self.save(brk, total)
        if ops:
            self.meters.remediations.labels(outcome="Released").inc()
            message = f"released by collscope uncordon at {status.timestamp(now)}"
            await self._node_condition(node, False, "Released", message)
            await self._node_event(node, "CollscopeReleased", message, warning=False)
        return bool(ops)

    async def reset(self, by: str) -> dict[str, Any]:
        """A human closes the breaker (``collscope breaker reset``); its summary after."""
        async with self.lock:
            brk, total = await self._synced()
            brk.reset(by)
            await self.save(brk, total)
            return brk.summary(total)

    async def summary(self) -> dict[str, Any]:
        brk, total = await self._synced()
        return brk.summary(total)

    async def _node_condition(
        self, node: ids.NodeName, faulty: bool, reason: str, message: str
    ) -> None:
        cond = remediation.condition(faulty=faulty, reason=reason, message=message, now=self.now())
        try:
            await self.api.patch_node_status(node, [cond])
        except errors.KubeError as e:  # the marks stand; the condition is a courtesy
            log.warning(
                "cannot set the %s condition of %s: %s", remediation.CONDITION_TYPE, node, e
            )

    async def _node_event(
        self, node: ids.NodeName, reason: str, message: str, warning: bool = True
    ) -> None:
        body = remediation.event(
            {"metadata": {"name": node}}, reason=reason, message=message, warning=warning,
            now=self.now(),
        )  # fmt: skip
        try:
            await self.api.create_event(remediation.EVENT_NAMESPACE, body)
        except errors.KubeError as e:
            log.warning("cannot post Event %s on Node %s: %s", reason, node, e)

    def _action(
        self,
        kind: str,
        outcome: str,
        now: datetime.datetime,
        node: str | None = None,
        message: str = "",
    ) -> dict[str, Any]:
        self.meters.remediations.labels(outcome=outcome).inc()
        return status.action(kind, outcome, now, node=node, message=message)


@dataclass
class _Ctx:
    """One ``remediate`` call's Diagnosis, for the step builders."""

    rem: Remediator
    diag: str
    result: diagnosis.Diagnosis
    conditions: Sequence[Mapping[str, Any]] | None
    generation: int | None
    now: datetime.datetime
    notes: list[str]

    def condition(self, value: status.ConditionStatus, reason: str, message: str) -> Any:
        text = "; ".join([message, *self.notes])
        return status.set_condition(
            self.conditions, type_=status.CONFIRMED, status=value, reason=reason,
            message=text[:2000], generation=self.generation, now=self.now,
        )  # fmt: skip

    async def stop(
        self,
        reason: str,
        message: str,
        node: ids.NodeName | None,
        *,
        action: status.Action | None = None,
        finding: confirmation.Finding | None = None,
    ) -> Step:
        """Not confirmed (or nothing to confirm): the node is not touched."""
        new: dict[str, Any] = {
            "conditions": self.condition("False", reason, message),
            "action": action or "not-confirmed",
            "actions": [
                self.rem._action("cordon", "Skipped", self.now, node, f"{reason}: {message}")
            ],
        }
        if finding is not None and node is not None:
            new["confirmation"] = _record("NotConfirmed", node, finding, self.now)
        events: list[tuple[bool, str, str]] = []
        if action is None:
            events.append((False, "NotConfirmed", f"{reason}: {message}"))
            if node is not None:
                text = f"{self.diag} named this node; not confirmed ({reason}): {message}"
                await self.rem._node_event(node, "CollscopeNotConfirmed", text, warning=False)
        return Step(new, events)


def decision_text(step: Step) -> str:
    """A log line: ``cordoned node-7: cordon Done <why>``, ``pending (re-check in 30 s)``."""
    acts = step.status.get("actions") or []
    text = str(step.status.get("action") or "waiting for the re-check")
    if acts:
        a = acts[0]
        text += f" {a.get('node') or ''}: {a['action']} {a['outcome']} {a.get('message') or ''}"
    if step.retry_in_s is not None:
        text += f" (re-check in {step.retry_in_s:.0f} s)"
    return " ".join(text.split())


def _record(
    state: str,
    node: ids.NodeName,
    found: confirmation.Finding,
    now: datetime.datetime,
    recheck_at: datetime.datetime | None = None,
) -> dict[str, Any]:
    """``Diagnosis.status.confirmation``."""
    out: dict[str, Any] = {
        "state": state,
        "node": node,
        "reason": found.reason,
        "message": found.message[:2000],
        "devices": list(found.devices),
        "symptoms": [asdict(s) for s in found.symptoms][:16],
        "checkedAt": status.precise_timestamp(now),
    }
    if recheck_at is not None:
        out["recheckAt"] = status.precise_timestamp(recheck_at)
    return out


async def _read(
    hardware: HardwareSource, node: ids.NodeName, since_ns: int, until_ns: int
) -> list[models.HwRecord]:
    """The node's samples; none when its agent cannot be asked (judged as no samples)."""
    try:
        return [r for r in await hardware(node, since_ns, until_ns) if r.node in ("", node)]
    except errors.AgentError as e:
        log.warning("no hardware samples from the agent of %s: %s", node, e)
        return []


def _annotation(ops: list[dict[str, Any]], key: str) -> str | None:
    """The value an annotation gets in a ``remediation.plan`` patch."""
    for op in ops:
        value = op.get("value")
        if op["path"].endswith("/annotations") and isinstance(value, dict) and key in value:
            return str(value[key])
        if op["path"].endswith("/" + key.replace("/", "~1")):
            return str(value)
    return None
