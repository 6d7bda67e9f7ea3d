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
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Sequence

import kopf
import prometheus_client

from collscope.operator import (
    diagnosis_handlers,
    errors,
    handlers,
    jobs,
    kube,
    metrics,
    remediator,
    settings,
    trigger_loop,
    webhook,
)


def build(
    config: settings.Settings,
    api: kube.Cluster,
    directory: jobs.AgentDirectory,
    *,
    meters: metrics.OperatorMetrics | None = None,
    clock: Callable[[], float] = time.time,
) -> tuple[kopf.OperatorRegistry, kopf.Memo]:
    """Every handler on a new registry, and the memo they share."""
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    trigger_loop.register(registry, config)
    diagnosis_handlers.register(registry)
    if config.webhook_port:
        webhook.register(registry, config.injection)
    meters = meters if meters is not None else metrics.OperatorMetrics()
    memo = trigger_loop.add_to_memo(
        handlers.memo_for(api), config=config, directory=directory, meters=meters
    )
    memo.remediator = remediator.Remediator(
        api=api,
        namespace=config.namespace,
        configmap=config.breaker_configmap,
        breaker_settings=config.breaker,
        defaults=config.remediation,
        meters=meters,
        clock=clock,
    )

    @kopf.on.probe(id="trainingjobs", registry=registry)
    def watched(memo: kopf.Memo, **_: object) -> int:
        return len(memo.jobs)

    return registry, memo


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


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = settings.Settings.from_env(os.environ)
        priority = int(os.environ.get("COLLSCOPE_PRIORITY", "0") or 0)
        peering = os.environ.get("COLLSCOPE_PEERING", "").strip()
        api = kube.Cluster.from_environment_cluster()
    except (errors.CollscopeError, ValueError) as e:
        print(f"collscope-operator: error: {e}", file=sys.stderr)
        return 2
    meters = metrics.OperatorMetrics()
    if config.metrics_port:
        prometheus_client.start_http_server(config.metrics_port, registry=meters.registry)
    registry, memo = build(
        config, api, jobs.template_directory(config.agents.url_template), meters=meters
    )
    liveness = f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: object) -> None:
        configure_kopf(settings, config, priority=priority, peering=peering)

    asyncio.run(
        kopf.operator(registry=registry, clusterwide=True, memo=memo, liveness_endpoint=liveness)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
