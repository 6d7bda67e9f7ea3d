"""Settings come from the environment once, with defaults, units and named errors."""

from __future__ import annotations

import pytest

from collscope.nodeagent import __main__ as cli
from collscope.nodeagent import errors, settings


def test_defaults_when_nothing_is_set() -> None:
    s = settings.Settings.from_env({"NODE_NAME": "n1"})
    assert s.node_name == "n1"
    assert s.discovery.mode == "kubelet"
    assert s.discovery.kubelet_pods_dir == "/var/lib/kubelet/pods"
    assert s.sampling.sample_interval_s == 0.1
    assert s.window.window_s == 120.0
    assert s.window.memory_cap_bytes == 256 << 20


def test_environment_overrides() -> None:
    s = settings.Settings.from_env(
        {
            "COLLSCOPE_DISCOVERY": "directory",
            "COLLSCOPE_TRACE_ROOT": "/tmp/rings",
            "COLLSCOPE_SAMPLE_INTERVAL_S": "0.05",
            "COLLSCOPE_WINDOW_S": "30",
            "COLLSCOPE_MEMORY_CAP_BYTES": str(64 << 20),
            "COLLSCOPE_LISTEN_PORT": "0",
        }
    )
    assert s.discovery.mode == "directory" and s.discovery.trace_root == "/tmp/rings"
    assert s.sampling.sample_interval_s == 0.05 and s.window.window_s == 30.0
    assert s.window.memory_cap_bytes == 64 << 20 and s.server.listen_port == 0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("COLLSCOPE_DISCOVERY", "crd"),
        ("COLLSCOPE_SAMPLE_INTERVAL_S", "fast"),
        ("COLLSCOPE_WINDOW_S", "-1"),
        ("COLLSCOPE_WINDOW_S", "inf"),
        ("COLLSCOPE_MEMORY_CAP_BYTES", "12"),
        ("COLLSCOPE_LISTEN_PORT", "70000"),
    ],
)
def test_a_bad_variable_is_named(name: str, value: str) -> None:
    with pytest.raises(errors.SettingsError, match=name) as e:
        settings.Settings.from_env({name: value})
    assert e.value.name == name


def test_flags_override_the_environment() -> None:
    args = cli._parser().parse_args(
        ["run", "--discovery", "directory", "--port", "0", "--auth", "none"]
    )
    s = cli.configure(args, {"COLLSCOPE_DISCOVERY": "kubelet", "COLLSCOPE_LISTEN_PORT": "9"})
    assert s.discovery.mode == "directory" and s.server.listen_port == 0
    args = cli._parser().parse_args(["--window-s", "10", "--auth", "none"])
    assert cli.configure(args, {}).window.window_s == 10.0


def test_export_times() -> None:
    assert cli.parse_time("now", 10**18) == 10**18
    assert cli.parse_time("-2s", 10**18) == 10**18 - 2 * 10**9
    assert cli.parse_time("-1m", 10**18) == 10**18 - 60 * 10**9
    assert cli.parse_time("123", 0) == 123
    with pytest.raises(errors.SettingsError):
        cli.parse_time("yesterday", 0)


def test_authentication_is_on_by_default_and_needs_tls() -> None:
    s = settings.Settings.from_env({"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert s.auth.mode == "kubernetes" and s.auth.api_server == "https://10.0.0.1:443"
    assert s.auth.token_file.endswith("/serviceaccount/token") and s.tls.cert_file == ""
    with pytest.raises(errors.SettingsError, match="COLLSCOPE_TLS_CERT_FILE"):
        settings.check(s)
    with pytest.raises(errors.SettingsError, match="COLLSCOPE_TLS_CERT_FILE"):
        cli.configure(cli._parser().parse_args(["run"]), {})
    tls = {"COLLSCOPE_TLS_CERT_FILE": "/c.crt", "COLLSCOPE_TLS_KEY_FILE": "/c.key"}
    assert settings.check(settings.Settings.from_env(tls)).tls.key_file == "/c.key"
    with pytest.raises(errors.SettingsError, match="COLLSCOPE_TLS_KEY_FILE"):
        settings.check(settings.Settings.from_env({"COLLSCOPE_TLS_CERT_FILE": "/c.crt"}))
    plain = cli.configure(cli._parser().parse_args(["run", "--auth", "none"]), {})
    assert plain.auth.mode == "none"


def test_auth_variables() -> None:
    s = settings.Settings.from_env(
        {
            "KUBERNETES_SERVICE_HOST": "fd00::1",
            "KUBERNETES_SERVICE_PORT": "6443",
            "COLLSCOPE_AUTH_AUDIENCES": "collscope-agent, other",
            "COLLSCOPE_AUTH_CACHE_TTL_S": "30",
            "COLLSCOPE_EXPENSIVE_BURST": "3",
            "COLLSCOPE_MAX_CONNECTIONS_PER_PEER": "16",
        }
    )
    assert s.auth.api_server == "https://[fd00::1]:6443"
    assert s.auth.audiences == ("collscope-agent", "other") and s.auth.cache_ttl_s == 30.0
    assert s.auth.expensive_burst == 3 and s.server.max_connections_per_peer == 16
    with pytest.raises(errors.SettingsError, match="COLLSCOPE_AUTH"):
        settings.Settings.from_env({"COLLSCOPE_AUTH": "off"})


def test_log_level_and_format_from_the_environment_then_the_flags() -> None:
    env = {"COLLSCOPE_LOG_LEVEL": "debug", "COLLSCOPE_LOG_FORMAT": "json", "COLLSCOPE_AUTH": "none"}
    s = cli.configure(cli._parser().parse_args([]), env)
    assert (s.log_level, s.log_format) == ("DEBUG", "json")
    args = cli._parser().parse_args(["--log-level", "warning", "--log-format", "text"])
    s = cli.configure(args, env)
    assert (s.log_level, s.log_format) == ("WARNING", "text")
    with pytest.raises(errors.SettingsError, match="COLLSCOPE_LOG_FORMAT"):
        settings.Settings.from_env({"COLLSCOPE_LOG_FORMAT": "xml"})
