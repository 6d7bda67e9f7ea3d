"""Operator metrics, ``collscope_operator_*``, in one registry per operator (no import-time
globals: tests build their own and read values back).

- ``collscope_operator_triggers_total{kind}``: trigger firings (hang, slow) that opened a new
  incident;
- ``collscope_operator_diagnoses_total{category}``: analyses finished (``none`` = no anomaly);
- ``collscope_operator_analysis_seconds``: window pull + root cause, per Diagnosis;
- ``collscope_operator_agent_errors_total{node}``: agent calls that failed (after retries);
- ``collscope_operator_breaker_open``: 1 while the cordon circuit breaker is open;
- ``collscope_operator_remediations_total{outcome}``: node actions by outcome (Done, DryRun,
  Skipped, Blocked, Failed);
- ``collscope_operator_ticks_total``: trigger-loop ticks over all TrainingJobs.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        p = "collscope_operator_"
        self.triggers = Counter(p + "triggers", "Trigger firings", ["kind"], registry=r)
        self.diagnoses = Counter(p + "diagnoses", "Finished analyses", ["category"], registry=r)
        self.analysis_seconds = Histogram(
            p + "analysis_seconds",
            "Window pull and root-cause analysis per Diagnosis",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.agent_errors = Counter(p + "agent_errors", "Failed agent calls", ["node"], registry=r)
        self.breaker_open = Gauge(p + "breaker_open", "1 while the breaker is open", registry=r)
        self.remediations = Counter(
            p + "remediations", "Node actions by outcome", ["outcome"], registry=r
        )
        self.ticks = Counter(p + "ticks", "Trigger-loop ticks", registry=r)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (0 when absent), e.g. ``value("..._triggers_total")``."""
        got = self.registry.get_sample_value(name, labels or {})
        return 0.0 if got is None else got
