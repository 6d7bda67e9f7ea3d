"""``collscope-operator`` (also ``python -m collscope.operator``): the composition root.

``main()`` reads the environment once (``settings.Settings.from_env``), builds the Kubernetes
adapter (in-cluster service account or the current kubeconfig), the agent directory (the
``COLLSCOPE_AGENT_URL`` template), the metrics registry (served on ``COLLSCOPE_METRICS_PORT``),
registers every handler on a fresh kopf registry (``build``) and runs kopf cluster-wide with
its liveness endpoint on ``COLLSCOPE_HEALTH_PORT`` (``/healthz``).

Peering: the ``ClusterKopfPeering`` named by ``COLLSCOPE_PEERING`` (mandatory then; the chart
names one after the release so no other kopf operator shares it), else kopf's default
(``default`` when it exists, else standalone); give each replica a distinct
``COLLSCOPE_PRIORITY`` for an active/standby pair.

Arguments are parsed before anything touches the network: ``--help`` and ``--version`` never
reach a cluster. ``--log-level`` and ``--log-format`` override ``COLLSCOPE_LOG_LEVEL`` and
``COLLSCOPE_LOG_FORMAT``; logging (kopf's loggers included) is configured before kopf starts.
Exit status: 0 stopped, 2 bad arguments or settings.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence

import kopf
import prometheus_client

from collscope.nodeagent import envsettings, logs, version
from collscope.operator import errors
from collscope.operator.clients import kube
from collscope.operator.controller import (
    diagnosis_handlers,
    handlers,
    profile_handlers,
    state,
    trigger_loop,
    webhook,
)
from collscope.operator.domain import jobs, metrics, settings

log = logging.getLogger("collscope.operator")


def build(
    config: settings.Settings,
    api: kube.Cluster,
    directory: jobs.AgentDirectory,
    *,
    meters: metrics.OperatorMetrics | None = None,
    clock: Callable[[], float] = time.time,
) -> tuple[kopf.OperatorRegistry, state.OperatorState]:
    """Every handler on a new registry, and the state they share (kopf's ``memo``)."""
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    trigger_loop.register(registry, config)
    diagnosis_handlers.register(registry)
    profile_handlers.register(registry)
    if config.webhook_port:
        webhook.register(registry, config.injection)
    shared = state.OperatorState.create(api, config, directory, meters=meters, clock=clock)

    @kopf.on.probe(id="trainingjobs", registry=registry)
    def watched(memo: state.OperatorState, **_: object) -> int:
        return len(memo.jobs)

    return registry, shared


def webhook_server(config: settings.Settings) -> kopf.WebhookServer:
    """HTTPS with the mounted certificate; plain HTTP without one (behind a TLS proxy)."""
    if not config.webhook_cert_dir:
        return kopf.WebhookServer(addr="0.0.0.0", port=config.webhook_port, insecure=True)
    d = config.webhook_cert_dir.rstrip("/")
    return kopf.WebhookServer(
        addr="0.0.0.0", port=config.webhook_port,
        certfile=f"{d}/tls.crt", pkeyfile=f"{d}/tls.key",
    )  # fmt: skip


def configure_kopf(
    ks: kopf.OperatorSettings, config: settings.Settings, *, priority: int, peering: str
) -> None:
    """kopf's settings at startup: peering, Event posting, exit behaviour, the webhook."""
    ks.peering.priority = priority
    if peering:  # our own peering object: never shared with other kopf operators
        ks.peering.name = peering
        ks.peering.mandatory = True
    ks.posting.level = 20  # logging.INFO: Events for every action
    # A trigger tick lasts at most an agent timeout: let timers finish it on exit/pause
    # instead of being orphaned.
    ks.background.instant_exit_timeout = 2.0
    if config.webhook_port:
        ks.admission.server = webhook_server(config)


def parser() -> argparse.ArgumentParser:
    d = settings.Settings()
    p = argparse.ArgumentParser(
        prog="collscope-operator",
        description="Run the collscope operator cluster-wide against the current Kubernetes "
        "context (in a pod: its service account; else $KUBECONFIG or ~/.kube/config). It "
        "watches TrainingJobs, polls their sampled ranks' agents, writes Diagnoses and, by "
        "policy, cordons faulty nodes. Configured by COLLSCOPE_* variables (settings.py; the "
        "chart sets them).",
    )
    p.add_argument("--version", action="version", version=version.line("collscope-operator"))
    for var in settings.VARIABLES:  # --log-level, --log-format
        if var.flag:
            envsettings.add_flag(p, var, d)
    return p


def configure(args: argparse.Namespace, env: dict[str, str]) -> settings.Settings:
    """Environment first, then the flags given (only those present), each checked as its
    variable is."""
    config = settings.Settings.from_env(env)
    return envsettings.overrides(config, settings.VARIABLES, args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)  # --help, --version and bad flags exit here
    try:
        config = configure(args, dict(os.environ))
        logs.configure(config.log_level, config.log_format)
        priority = int(os.environ.get("COLLSCOPE_PRIORITY", "0") or 0)
        peering = os.environ.get("COLLSCOPE_PEERING", "").strip()
        api = kube.Cluster.from_environment_cluster()
    except (errors.CollscopeError, ValueError) as e:
        print(f"collscope-operator: error: {e}", file=sys.stderr)
        return 2
    log.info(
        "%s starting: log level %s, peering %s (priority %d), metrics on :%s, health on :%s",
        version.line("collscope-operator"),
        config.log_level,
        peering or "kopf's default",
        priority,
        config.metrics_port or "-",
        config.health_port or "-",
    )
    meters = metrics.OperatorMetrics()
    if config.metrics_port:
        prometheus_client.start_http_server(config.metrics_port, registry=meters.registry)
    registry, shared = build(
        config, api, jobs.template_directory(config.agents.url_template), meters=meters
    )
    liveness = f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None

    @kopf.on.startup(registry=registry)
    def configure_startup(settings: kopf.OperatorSettings, **_: object) -> None:
        configure_kopf(settings, config, priority=priority, peering=peering)

    asyncio.run(
        kopf.operator(registry=registry, clusterwide=True, memo=shared, liveness_endpoint=liveness)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
