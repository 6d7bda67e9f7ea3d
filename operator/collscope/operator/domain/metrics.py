"""Operator metrics, ``collscope_operator_*``, in one registry per operator (no import-time
globals: tests build their own and read values back), with prometheus_client's ``process_*``
metrics of the operator's process.

Series about a TrainingJob carry ``namespace`` and ``trainingjob`` (its name). Not ``job``:
Prometheus gives every scraped series a ``job`` target label (the scrape job: the Service's
name under a ServiceMonitor) and renames a clashing exposed one to ``exported_job``.

- ``collscope_operator_triggers_total{kind,namespace,trainingjob}``: trigger firings (hang,
  slow) that opened a new incident;
- ``collscope_operator_diagnoses_total{category,namespace,trainingjob}``: analyses finished
  (``none`` = no anomaly);
- ``collscope_operator_analysis_seconds``: window pull + root cause, per Diagnosis (histogram);
- ``collscope_operator_agent_errors_total{node}``: agent calls that failed (after retries);
- ``collscope_operator_breaker_open``: 1 while the cordon circuit breaker is open;
- ``collscope_operator_breaker_nodes_held``: nodes collscope holds (marked and not released),
  the breaker's count against its cap;
- ``collscope_operator_remediations_total{outcome}``: node actions by outcome (Done, DryRun,
  Skipped, Blocked, Failed, Released);
- ``collscope_operator_ticks_total``: trigger-loop ticks over all TrainingJobs.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

JOB_LABELS = ["namespace", "trainingjob"]


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, *, process: bool = True) -> None:
        """``process``: also register ``process_*`` (``/proc/self``) in the registry."""
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        p = "collscope_operator_"
        self.triggers = Counter(
            p + "triggers", "Trigger firings that opened an incident", ["kind", *JOB_LABELS],
            registry=r,
        )  # fmt: skip
        self.diagnoses = Counter(
            p + "diagnoses", "Finished analyses", ["category", *JOB_LABELS], registry=r
        )
        self.analysis_seconds = Histogram(
            p + "analysis_seconds",
            "Window pull and root-cause analysis per Diagnosis",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.agent_errors = Counter(p + "agent_errors", "Failed agent calls", ["node"], registry=r)
        self.breaker_open = Gauge(p + "breaker_open", "1 while the breaker is open", registry=r)
        self.nodes_held = Gauge(
            p + "breaker_nodes_held", "Nodes held by collscope (marked, not released)", registry=r
        )
        self.remediations = Counter(
            p + "remediations", "Node actions by outcome", ["outcome"], registry=r
        )
        self.ticks = Counter(p + "ticks", "Trigger-loop ticks", registry=r)
        if process:
            ProcessCollector(registry=r)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The sum of the samples ``name`` whose labels include ``labels`` (0 when none), e.g.
        ``value("collscope_operator_triggers_total", {"kind": "hang"})`` over every job."""
        want = (labels or {}).items()
        return sum(
            s.value
            for m in self.registry.collect()
            for s in m.samples
            if s.name == name and want <= s.labels.items()
        )
