"""Carries out remediation decisions against the cluster (DESIGN.md §7): the policy decides
(``policy.decide``), the cluster-wide circuit breaker gates (``breaker.Breaker``, its state in a
ConfigMap so a restarted or standby operator continues with it), ``remediation.plan`` marks the
node (cordon, taint, label, annotations) and ``remediation.undo`` releases exactly what
collscope added. No kopf here: the handlers call ``remediate``/``release`` and turn the returned
actions into status and Events.

Every breaker read-modify-write happens under one ``asyncio.Lock`` (one active operator replica
acts at a time under kopf peering).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from collscope.operator import breaker, errors, ids, kube, metrics, policy, remediation, status
from collscope.operator.analysis import diagnosis

STATE_KEY = "state"
SUMMARY_KEY = "summary"


@dataclass
class Remediator:
    api: kube.Cluster
    namespace: str  # of the breaker ConfigMap
    configmap: str
    breaker_settings: breaker.BreakerSettings
    defaults: policy.RemediationPolicy
    meters: metrics.OperatorMetrics
    clock: Callable[[], float] = time.time
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

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
        await self.api.write_configmap(
            self.namespace,
            self.configmap,
            {STATE_KEY: json.dumps(brk.state.to_dict()), SUMMARY_KEY: json.dumps(summary)},
        )

    async def remediate(
        self,
        diag: str,
        result: diagnosis.Diagnosis,
        overrides: Mapping[str, Any] | None,
        now: datetime.datetime,
    ) -> tuple[list[dict[str, Any]], bool]:
        """Actions for Diagnosis ``diag`` (``ns/name``) and whether a node was marked."""
        try:
            pol = self.defaults.merged(overrides)
        except errors.PolicyError as e:
            return [self._action("cordon", "Skipped", now, message=f"bad policy: {e}")], False
        decision = policy.decide(pol, result)
        node = decision.node
        if not decision.act or node is None:
            return [self._action("cordon", "Skipped", now, node, decision.reason)], False
        async with self.lock:
            total = await self.api.count_nodes()
            brk = await self.load()
            if decision.dry_run:
                verdict = brk.check(node, total)
                outcome = "DryRun" if verdict.allowed else "Blocked"
                msg = f"{decision.reason} ({verdict.reason})"
                return [self._action("cordon", outcome, now, node, msg)], False
            verdict = brk.acquire(node, total)
            if not verdict.allowed:
                await self.save(brk, total)
                return [self._action("cordon", "Blocked", now, node, verdict.reason)], False
            current = await self.api.get_node(node)
            if current is None:
                brk.release(node)
                await self.save(brk, total)
                return [self._action("cordon", "Failed", now, node, "node not found")], False
            category = result.category or "unknown"
            ops = remediation.plan(current, diag, category, now)
            try:
                if ops:
                    await self.api.patch_node(node, ops)
            except errors.KubeError as e:
                brk.release(node)
                await self.save(brk, total)
                return [self._action("cordon", "Failed", now, node, str(e))], False
            await self.save(brk, total)
        rec = remediation.Record.from_json(
            _annotation(ops, remediation.RECORD_ANNOTATION) or "{}"
        ) if ops else None  # fmt: skip
        if rec is None:
            return [
                self._action("cordon", "Skipped", now, node, "already held by collscope")
            ], False
        actions = []
        for kind, added in (("cordon", rec.cordoned), ("taint", rec.tainted),
                            ("label", rec.labelled), ("annotate", True)):  # fmt: skip
            note = decision.reason if added else "already present, not ours to undo"
            actions.append(self._action(kind, "Done" if added else "Skipped", now, node, note))
        return actions, True

    async def release(self, diag: str | None, node: ids.NodeName) -> bool:
        """Undo the marks placed on ``node`` for ``diag`` (None: whatever collscope holds
        there, ``collscope uncordon``); True when something was removed."""
        async with self.lock:
            current = await self.api.get_node(node)
            ops = [] if current is None else remediation.undo(current, diag)
            if ops:
                await self.api.patch_node(node, ops)
            if ops or current is None:
                total = await self.api.count_nodes()
                brk = await self.load()
                brk.release(node)
                await self.save(brk, total)
            if ops:
                self.meters.remediations.labels(outcome="Released").inc()
            return bool(ops)

    async def reset(self, by: str) -> dict[str, Any]:
        """A human closes the breaker (``collscope breaker reset``); its summary after."""
        async with self.lock:
            total = await self.api.count_nodes()
            brk = await self.load()
            brk.reset(by)
            await self.save(brk, total)
            return brk.summary(total)

    async def summary(self) -> dict[str, Any]:
        total = await self.api.count_nodes()
        return (await self.load()).summary(total)

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


def _annotation(ops: list[dict[str, Any]], key: str) -> str | None:
    """The value an annotation gets in a ``remediation.plan`` patch."""
    for op in ops:
        value = op.get("value")
        if op["path"].endswith("/annotations") and isinstance(value, dict) and key in value:
            return str(value[key])
        if op["path"].endswith("/" + key.replace("/", "~1")):
            return str(value)
    return None
