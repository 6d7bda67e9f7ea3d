"""values.schema.json validates values.yaml, rejects bad values, and agrees with the code's
defaults (policy.RemediationPolicy, breaker.BreakerSettings)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from collscope.operator.domain import breaker, policy

CHART = Path(__file__).resolve().parents[3] / "charts" / "collscope"


def default_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def validator() -> jsonschema.Draft7Validator:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_values_yaml_is_valid() -> None:
    errors = [e.message for e in validator().iter_errors(default_values())]
    assert errors == []


def _set(values: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(values)
    node = out
    *parents, last = path.split(".")
    for key in parents:
        node = node[key]
    node[last] = value
    return out


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("remediation.confidenceThreshold", 1.5),
        ("remediation.categories", ["hang.gpuu"]),
        ("remediation.dryrun", True),  # a typo of dryRun must not be silently ignored
        ("breaker.maxFraction", -0.1),
        ("breaker.maxCordons", "two"),
        ("breaker.windowSeconds", 0),
        ("operator.agentURL", "http://{host}:9464"),
        ("operator.triggerIntervalSeconds", 0),
        ("agent.port", 70000),
        ("agent.nvml.mode", "cdi"),
        ("agent.nvml.libraryPath", "/usr/lib/libc.so.6"),
        ("agent.kubeletPodsDir", "var/lib/kubelet/pods"),
        ("agent.memoryCapBytes", 1024),
        ("webhook.tls", "letsencrypt"),
        ("image.pullPolicy", "Sometimes"),
        ("operator.image.digest", "sha256:abc"),  # too short: a typo, not a digest
        ("agent.image.digest", "latest"),
        ("operator.logFormat", "logfmt"),
        ("agent.logLevel", "TRACE"),
        ("metrics.serviceMonitor.interval", "soon"),
        ("unknownTopLevel", 1),
    ],
)
def test_bad_values_are_rejected(path: str, value: Any) -> None:
    assert not validator().is_valid(_set(default_values(), path, value))


def test_remediation_defaults_are_the_codes() -> None:
    values = default_values()
    assert policy.RemediationPolicy.from_values(values["remediation"]) == policy.RemediationPolicy()
    b = breaker.BreakerSettings()
    assert values["breaker"] == {
        "maxCordons": b.max_cordons,
        "windowSeconds": b.window_s,
        "maxFraction": b.max_fraction,
    }


def test_schema_categories_are_the_analysis_categories() -> None:
    from collscope.operator.analysis import diagnosis

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["definitions"]["category"]["enum"]) == set(diagnosis.CATEGORY_NAMES)


def test_global_is_accepted_so_the_chart_works_as_a_subchart() -> None:
    # A parent chart's values as Helm hands them to this subchart: its own keys plus `global`.
    parent = yaml.safe_load("global: {foo: bar, imageRegistry: registry.example}")
    values = {**default_values(), "global": parent["global"]}
    assert [e.message for e in validator().iter_errors(values)] == []
    assert not validator().is_valid({**values, "global": "bar"})  # still an object


def test_image_digests_are_accepted() -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    values = _set(_set(default_values(), "operator.image.digest", digest), "agent.image.digest", "")
    assert validator().is_valid(values)
