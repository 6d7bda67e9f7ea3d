"""Operator settings from the environment: defaults, parsing, the bad variable named."""

from __future__ import annotations

import re

import pytest

from collscope.operator import __main__ as main
from collscope.operator import errors
from collscope.operator.domain import settings


def test_defaults_without_environment() -> None:
    s = settings.Settings.from_env({})
    assert s == settings.Settings()
    assert s.trigger.interval_s == 1.0 and s.agents.url_template == "https://{node_ip}:9464"
    assert s.agents.token_file.endswith("/serviceaccount/token") and s.agents.ca_file == ""
    assert s.remediation.dry_run is False and s.breaker.max_cordons == 2


def test_values_are_parsed() -> None:
    s = settings.Settings.from_env({
        "COLLSCOPE_TRIGGER_INTERVAL_S": "0.5",
        "COLLSCOPE_AGENT_URL": "http://agent-{node}:9464",
        "COLLSCOPE_REMEDIATION": '{"dryRun": true, "confidenceThreshold": 0.9}',
        "COLLSCOPE_BREAKER_MAX_CORDONS": "5",
        "COLLSCOPE_METRICS_PORT": "0",
        "COLLSCOPE_NAMESPACE": "ops",
    })  # fmt: skip
    assert s.trigger.interval_s == 0.5 and s.agents.url_template == "http://agent-{node}:9464"
    assert s.remediation.dry_run and s.remediation.confidence_threshold == 0.9
    assert s.breaker.max_cordons == 5 and s.metrics_port == 0 and s.namespace == "ops"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("COLLSCOPE_TRIGGER_INTERVAL_S", "0"),
        ("COLLSCOPE_TRIGGER_INTERVAL_S", "fast"),
        ("COLLSCOPE_AGENT_URL", "http://{host}:9464"),
        ("COLLSCOPE_REMEDIATION", '{"dryrun": true}'),
        ("COLLSCOPE_REMEDIATION", "[1]"),
        ("COLLSCOPE_BREAKER_MAX_FRACTION", "2"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(errors.SettingsError, match=name):
        settings.Settings.from_env({name: value})


def test_the_agent_port_reaches_the_url() -> None:
    s = settings.Settings.from_env({"COLLSCOPE_AGENT_PORT": "19464"})
    assert s.agents.url_template == "https://{node_ip}:19464" and s.agents.port == 19464
    s = settings.Settings.from_env(
        {"COLLSCOPE_AGENT_PORT": "7", "COLLSCOPE_AGENT_URL": "http://{node}.agents:{port}"}
    )
    assert s.agents.url_template == "http://{node}.agents:7"
    with pytest.raises(errors.SettingsError, match="COLLSCOPE_AGENT_PORT"):
        settings.Settings.from_env({"COLLSCOPE_AGENT_PORT": "70000"})
    s = settings.Settings.from_env({"COLLSCOPE_AGENT_TOKEN_FILE": ""})
    assert s.agents.token_file == ""


def test_log_level_and_format_from_the_environment_then_the_flags() -> None:
    env = {"COLLSCOPE_LOG_LEVEL": "debug", "COLLSCOPE_LOG_FORMAT": "json"}
    s = main.configure(main.parser().parse_args([]), env)
    assert (s.log_level, s.log_format) == ("DEBUG", "json")
    s = main.configure(main.parser().parse_args(["--log-format", "text"]), env)
    assert (s.log_level, s.log_format) == ("DEBUG", "text")
    for name, value in (("COLLSCOPE_LOG_LEVEL", "LOUD"), ("COLLSCOPE_LOG_FORMAT", "xml")):
        with pytest.raises(errors.SettingsError, match=name):
            settings.Settings.from_env({name: value})


def test_the_docstring_lists_every_variable_read() -> None:
    assert settings.__doc__ is not None
    listed = set(re.findall(r"``(COLLSCOPE_[A-Z_]+)``", settings.__doc__))
    assert listed == {v.env for v in settings.VARIABLES}
    with pytest.raises(errors.SettingsError, match=r"^COLLSCOPE_BREAKER_MAX_CORDONS='-1': "):
        settings.Settings.from_env({"COLLSCOPE_BREAKER_MAX_CORDONS": "-1"})
