"""The composition root: every handler registered, metrics named, bad settings named."""

from __future__ import annotations

from typing import Any

import kopf
import kubernetes
import pytest
from prometheus_client import exposition

from collscope.operator import __main__ as main
from collscope.operator.clients import kube
from collscope.operator.domain import metrics, settings


def handler_ids(registry: Any) -> set[str]:
    return {h.id for h in registry._changing.get_all_handlers()} | {
        h.id for h in registry._spawning.get_all_handlers()
    } | {h.id for h in registry._watching.get_all_handlers()} | {
        h.id for h in registry._webhooks.get_all_handlers()
    }  # fmt: skip


def cluster() -> kube.Cluster:
    conf = kubernetes.client.Configuration(host="http://127.0.0.1:9")
    return kube.Cluster(kubernetes.client.ApiClient(conf))


def test_build_registers_every_handler() -> None:
    registry, memo = main.build(settings.Settings(), cluster(), lambda n, ip: None)
    ids = handler_ids(registry)
    assert {"trigger", "process", "opted_in_pod"} <= {i.split("/")[0] for i in ids}
    assert "release" not in ids  # issue 14: deleting a Diagnosis never releases a node
    assert not any(i.startswith("inject") for i in ids)  # no webhook unless a port is given
    assert memo.jobs == {} and memo.remediator.configmap == "collscope-breaker"
    hooked, _ = main.build(settings.Settings(webhook_port=9443), cluster(), lambda n, ip: None)
    assert "inject" in handler_ids(hooked)


def test_metrics_are_prefixed() -> None:
    m = metrics.OperatorMetrics()
    m.triggers.labels(kind="hang", namespace="ml", trainingjob="llama").inc()
    m.triggers.labels(kind="hang", namespace="ml", trainingjob="bert").inc()
    m.diagnoses.labels(category="hang.gpu", namespace="ml", trainingjob="llama").inc()
    m.analysis_seconds.observe(0.3)
    m.agent_errors.labels(node="n1").inc()
    m.breaker_open.set(1)
    m.nodes_held.set(2)
    text = exposition.generate_latest(m.registry).decode()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
             if line and not line.startswith("#")}  # fmt: skip
    ours = {n for n in names if not n.startswith("process_")}
    assert ours and all(n.startswith("collscope_operator_") for n in ours)
    assert "process_cpu_seconds_total" in names  # prometheus_client's ProcessCollector
    assert m.value("collscope_operator_triggers_total", {"kind": "hang"}) == 2  # summed
    assert m.value("collscope_operator_triggers_total", {"trainingjob": "bert"}) == 1
    assert m.value("collscope_operator_breaker_open") == 1
    assert m.value("collscope_operator_breaker_nodes_held") == 2


def test_main_names_a_bad_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLLSCOPE_TRIGGER_INTERVAL_S", "soon")
    assert main.main([]) == 2
    assert "COLLSCOPE_TRIGGER_INTERVAL_S='soon'" in capsys.readouterr().err


@pytest.mark.asyncio
@pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")
async def test_liveness_endpoint_reports_the_watched_jobs(harness: Any) -> None:
    import asyncio
    import socket

    import aiohttp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/healthz"
    async with harness.run(settings.Settings(), lambda n, ip: None, liveness=url):
        body: dict[str, Any] = {}
        for _ in range(100):
            try:
                async with aiohttp.ClientSession() as http, http.get(url) as answer:
                    assert answer.status == 200
                    body = await answer.json()
                    break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
        assert body["trainingjobs"] == 0


def test_peering_is_ours_when_named() -> None:
    config = settings.Settings.from_env({})
    ks = kopf.OperatorSettings()
    main.configure_kopf(ks, config, priority=100, peering="collscope")
    assert (ks.peering.name, ks.peering.mandatory, ks.peering.priority) == ("collscope", True, 100)
    ks = kopf.OperatorSettings()
    main.configure_kopf(ks, config, priority=0, peering="")
    assert (ks.peering.name, ks.peering.mandatory) == ("default", False)  # kopf's auto-detection


def test_the_flags_are_the_flagged_variables() -> None:
    """``--log-level`` and ``--log-format`` come from their ``settings.VARIABLES`` declarations
    (``envsettings.add_flag``): the help names the variable and its default; a flag given
    overrides the environment, one not given leaves it."""
    text = " ".join(main.parser().format_help().split())
    assert "--log-level {DEBUG,INFO,WARNING,ERROR}" in text
    assert "decision (COLLSCOPE_LOG_LEVEL; default: INFO)" in text
    assert "collector (COLLSCOPE_LOG_FORMAT; default: text)" in text
    env = {"COLLSCOPE_LOG_LEVEL": "warning", "COLLSCOPE_LOG_FORMAT": "json"}
    config = main.configure(main.parser().parse_args(["--log-level", "debug"]), env)
    assert (config.log_level, config.log_format) == ("DEBUG", "json")
