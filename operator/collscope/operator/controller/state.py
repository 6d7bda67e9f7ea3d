"""What the operator's handlers share while it runs: one typed ``OperatorState``.

kopf passes it to every handler as the ``memo`` kwarg (``kopf.operator(memo=...)`` takes any
object; kopf's "Custom memo classes"). kopf gives each Kubernetes object its own memo, made from
the operator's with ``copy.copy``; ``__copy__`` returns the state itself, so every handler of
every object sees the same fields, and a field set later (a test's ``hardware``) too.

Built once by ``OperatorState.create``: by ``__main__.build`` for the daemon and by the one-box
(``onebox/watch.py``), which then notes its pods in ``pods`` as ``handlers.opted_in_pod`` would.
All of it is in memory: an operator restart loses it, and the handlers rebuild it from the API
and the agents (``docs/design.md``, "Data path").
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from collscope.operator.clients import agents, kube
from collscope.operator.controller import remediator
from collscope.operator.domain import jobs, metrics, resources, settings

if TYPE_CHECKING:
    from collscope.operator.controller import profile_handlers

# The field names below are the modules' names: the types are named here, outside the class.
Cluster = kube.Cluster
Settings = settings.Settings
Directory = jobs.AgentDirectory
Metrics = metrics.OperatorMetrics
Remediator = remediator.Remediator
HardwareSource = remediator.HardwareSource
JobKey = jobs.JobKey
Pods = jobs.Pods
Runtimes = dict[jobs.JobKey, jobs.JobRuntime]
Clients = dict[tuple[str, str], agents.AgentClient]  # (node, agent URL) -> its client
Selectors = dict[jobs.JobKey, dict[str, Any]]  # (namespace, TrainingJob) -> its spec.selector
Seen = dict[tuple[str, str], tuple[dict[str, str], jobs.PodPlace]]  # (ns, pod) -> labels, place


@dataclasses.dataclass(eq=False)
class OperatorState:
    """The handlers' shared state (module docstring); each field says who writes it."""

    kube: Cluster  # the Kubernetes API adapter
    settings: Settings
    directory: Directory  # node name and host IP -> its agent's URL
    metrics: Metrics
    remediator: Remediator  # node marks and the circuit breaker (``diagnosis_handlers``)
    # Per TrainingJob, its trigger state between ticks (``trigger_loop``); gone with the job.
    jobs: Runtimes = dataclasses.field(default_factory=dict)
    # The opted-in pods' node and host IP per TrainingJob (``handlers.opted_in_pod``).
    pods: Pods = dataclasses.field(default_factory=Pods)
    clients: Clients = dataclasses.field(default_factory=dict)  # ``trigger_loop.client_for``
    # ``handlers``: TrainingJobs known to exist, a lock per workload, the hand-written
    # TrainingJobs' selectors, the opted-in pods seen, the (pod uid, reason) warned of once.
    trainingjobs: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    locks: dict[tuple[str, str], asyncio.Lock] = dataclasses.field(default_factory=dict)
    selectors: Selectors = dataclasses.field(default_factory=dict)
    seen: Seen = dataclasses.field(default_factory=dict)
    warned: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    # ``diagnosis_handlers``: the Diagnoses analysed, and the pending confirmation re-checks
    # by Diagnosis (both keyed by ``diagnosis_key``); a deleted Diagnosis's re-check goes.
    diagnoses_seen: set[str] = dataclasses.field(default_factory=set)
    confirmations: dict[str, resources.Confirmation] = dataclasses.field(default_factory=dict)
    # ``profile_handlers``: the profiling under way per TrainingJob.
    profiles: dict[JobKey, profile_handlers.Pending] = dataclasses.field(default_factory=dict)
    # Replaces the culprit nodes' agents as the source of hardware samples (tests).
    hardware: HardwareSource | None = None

    @classmethod
    def create(
        cls,
        api: Cluster,
        config: Settings,
        directory: Directory,
        *,
        meters: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> OperatorState:
        """A fresh state: nothing known yet but the settings and the ways to reach out."""
        meters = meters if meters is not None else metrics.OperatorMetrics()
        return cls(
            kube=api,
            settings=config,
            directory=directory,
            metrics=meters,
            remediator=remediator.Remediator(
                api=api,
                namespace=config.namespace,
                configmap=config.breaker_configmap,
                breaker_settings=config.breaker,
                defaults=config.remediation,
                meters=meters,
                clock=clock,
            ),
        )

    def __copy__(self) -> OperatorState:
        return self  # one state for all objects (module docstring)

    def forget_diagnosis(self, key: str) -> None:
        """A deleted Diagnosis (``diagnosis_key``): its pending re-check goes, since kopf never
        comes back to a Diagnosis that is gone, and so does its mark as analysed (a Diagnosis
        made again under the same name has another uid, hence another key)."""
        self.confirmations.pop(key, None)
        self.diagnoses_seen.discard(key)


def diagnosis_key(namespace: str | None, name: str, uid: object) -> str:
    """A Diagnosis's key in ``diagnoses_seen`` and ``confirmations``: ``namespace/name/uid``."""
    return f"{namespace}/{name}/{uid}"
