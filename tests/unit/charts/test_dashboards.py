"""The Grafana dashboard and the alerting rules name only metrics the code exports, and the
chart renders them into a sidecar ConfigMap and a PrometheusRule.

Exported names come from the registries themselves: the agent's with an empty window and a
hardware source giving one record of every metric it knows, the operator's as built. A family
with no sample yet still names itself, so no traffic is needed; counters add ``_total``,
histograms ``_bucket``/``_sum``/``_count``, as the exposition does.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import registry

from collscope.nodeagent import discovery, service, settings, window
from collscope.nodeagent import metrics as agent_metrics
from collscope.nodeagent import sampler as ringsampler
from collscope.nodeagent.hardware import sampler, source
from collscope.operator.domain import metrics as operator_metrics

CHART = pathlib.Path(__file__).resolve().parents[3] / "charts" / "collscope"
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}
# PromQL words that look like names: operators, modifiers, constants.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "Inf", "NaN"}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^{}]*\}|\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_VARIABLES = re.compile(r"\$\{?\w+\}?")
_NAME = re.compile(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\(?)")


class EveryMetric(source.Source):
    name = "fake-all"

    def sample(self, now_ns: int) -> list[source.Reading]:
        out = [source.Reading("gpu0", m, 1.0) for m in agent_metrics.HW]
        return [*out, source.Reading("mlx5_0/1", "rdma_out_of_sequence", 1.0)]


def names(reg: registry.CollectorRegistry) -> set[str]:
    return {m.name + s for m in reg.collect() for s in SUFFIXES[m.type]}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    trace = tmp_path_factory.mktemp("trace")
    config = settings.DiscoverySettings(mode="directory", trace_root=str(trace))
    win = window.Window(window_s=30, memory_cap_bytes=1 << 20)
    loop = ringsampler.Sampler(discovery.Discovery(config), win, settings.SamplingSettings())
    hw = sampler.Sampler([EveryMetric()], node="n", history_s=30)
    hw.sample_once()
    agent = agent_metrics.make_registry(service.Service("n", loop, hardware=hw))
    return names(agent) | names(operator_metrics.OperatorMetrics().registry)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, labels, keywords removed)."""
    for pattern in (_STRINGS, _MATCHERS, _GROUPING, _VARIABLES):
        expr = pattern.sub(" ", expr)
    expr = re.sub(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b", " ", expr)
    return {n for n, call in _NAME.findall(expr) if not call.strip() and n not in KEYWORDS}


def dashboard_exprs() -> list[str]:
    out = []
    for path in sorted((CHART / "dashboards").glob("*.json")):
        dash = json.loads(path.read_text())
        out += [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
        for var in dash.get("templating", {}).get("list", []):
            query = var.get("query")
            if isinstance(query, dict):
                # label_values(<metric>, <label>): only the first argument is a metric.
                m = re.fullmatch(r"label_values\((.+),\s*\w+\)", query["query"])
                out.append(m.group(1) if m else query["query"])
    return out


def rules() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load((CHART / "rules" / "collscope.yaml").read_text())
    return [r for g in groups for r in g["rules"]]


def test_the_extractor_finds_names_and_only_names() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(a_bucket{x="y"}[$__rate_interval])))'
        " * on (job) group_left () (count by (job) (b_total)) > bool 2^30 and c:d offset 5m"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c:d"}


def test_every_dashboard_expression_names_exported_metrics(exported: set[str]) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) > 20
    for expr in exprs:
        used = metric_names(expr)
        assert used, f"no metric in {expr!r}"
        assert used <= exported, f"{sorted(used - exported)} not exported ({expr!r})"


def test_every_rule_expression_names_exported_metrics(exported: set[str]) -> None:
    alerts = {r["alert"]: r for r in rules()}
    # What issue 16 asks the rules to cover, by the metric each watches.
    for metric in ("collscope_operator_triggers_total", "collscope_operator_diagnoses_total",
                   "collscope_operator_breaker_open", "collscope_operator_agent_errors_total",
                   "process_cpu_seconds_total"):  # fmt: skip
        assert any(metric in metric_names(r["expr"]) for r in alerts.values()), metric
    for name, rule in alerts.items():
        used = metric_names(rule["expr"])
        assert used and used <= exported, f"{name}: {sorted(used - exported)} not exported"
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]


def test_the_old_names_are_gone(exported: set[str]) -> None:
    assert not {"collscope_hardware_value", "collscope_rank_op_rate_per_second"} & exported
    assert not [n for n in exported if n.endswith("_per_second") and "rank" in n]
    assert "collscope_operator_breaker_nodes_held" in exported
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= exported


def test_chart_renders_dashboard_and_rules(chart: Any) -> None:
    assert not [d for d in chart.render() if d["kind"] in {"PrometheusRule", "ConfigMap"}
                and d["metadata"]["name"].endswith("-dashboards")]  # fmt: skip
    on = {
        "dashboards": {"enabled": True, "annotations": {"grafana_folder": "ml"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kps"}},
    }
    docs = chart.render(on)
    cm = chart.find(docs, "ConfigMap", "collscope-dashboards")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "ml"}
    shipped = json.loads((CHART / "dashboards" / "collscope.json").read_text())
    assert json.loads(cm["data"]["collscope.json"]) == shipped
    kubernetes_validate.validate(cm, "1.28.0", strict=True)
    rule = chart.find(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kps"
    groups = yaml.safe_load((CHART / "rules" / "collscope.yaml").read_text())
    assert rule["spec"]["groups"] == groups  # Prometheus' {{ $labels }} left for Prometheus
    other = chart.render({"dashboards": {"enabled": True, "namespace": "monitoring"}})
    assert chart.find(other, "ConfigMap", "collscope-dashboards")["metadata"]["namespace"] == (
        "monitoring"
    )
