"""Settings of collscope-operator: frozen dataclasses grouped by concern, read once from the
environment by ``Settings.from_env()`` (called from ``__main__.main``, never at import).

Environment (every variable optional; the bad one is named in ``SettingsError``):

- ``COLLSCOPE_TRIGGER_INTERVAL_S`` (1): how often the trigger loop runs per TrainingJob;
- ``COLLSCOPE_TRIGGER_WINDOW_S`` (5): seconds of records pulled per tick from sampled ranks;
- ``COLLSCOPE_DIAGNOSIS_WINDOW_S`` (10): seconds pulled around a trigger for root cause;
- ``COLLSCOPE_DIAGNOSIS_RETENTION`` (20): Diagnoses kept per TrainingJob (``retention``);
- ``COLLSCOPE_AGENT_URL`` (``https://{node_ip}:{port}``): where a node's agent listens; a
  template with ``{node}`` (node name), ``{node_ip}`` (the pod's ``status.hostIP``) and
  ``{port}`` (``COLLSCOPE_AGENT_PORT``, 9464: the chart's ``agent.port``);
- ``COLLSCOPE_AGENT_TIMEOUT_S`` (1), ``COLLSCOPE_AGENT_RETRIES`` (1);
- ``COLLSCOPE_AGENT_CA_FILE`` (empty: the system's CAs): the CA bundle agents' certificates are
  verified against; ``COLLSCOPE_AGENT_SERVER_NAME`` (empty: the URL's host): the name those
  certificates carry (one certificate serves every node's agent, reached by IP);
  ``COLLSCOPE_AGENT_TOKEN_FILE`` (the pod's ServiceAccount token; empty: none): the bearer
  token presented to agents, read again when the kubelet rotates it, sent over https only;
- ``COLLSCOPE_NAMESPACE`` (``collscope-system``): where the breaker ConfigMap lives;
- ``COLLSCOPE_REMEDIATION`` (``{}``): the Helm ``remediation:`` values as JSON (camelCase keys
  of ``policy.RemediationPolicy``);
- ``COLLSCOPE_BREAKER_MAX_CORDONS`` (2), ``COLLSCOPE_BREAKER_WINDOW_S`` (3600),
  ``COLLSCOPE_BREAKER_MAX_FRACTION`` (0.05);
- ``COLLSCOPE_METRICS_PORT`` (9465; 0 disables), ``COLLSCOPE_HEALTH_PORT`` (8080; 0 disables);
- ``COLLSCOPE_WEBHOOK_PORT`` (0 = no injection webhook; the chart uses 9443),
  ``COLLSCOPE_WEBHOOK_CERT_DIR`` (``tls.crt``/``tls.key`` of a cert-manager Secret; empty: plain
  HTTP, for a TLS-terminating proxy or tests), ``COLLSCOPE_PLUGIN_IMAGE`` (the image holding
  the plugin, copied into pods by the injected init container);
- ``COLLSCOPE_LOG_LEVEL`` (``INFO``: every trigger, diagnosis and remediation decision),
  ``COLLSCOPE_LOG_FORMAT`` (``text``; ``json``: one object per line), for kopf's loggers too
  (``collscope.nodeagent.logs``); ``--log-level``/``--log-format`` override them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar, cast

from collscope.nodeagent import logs
from collscope.operator import errors
from collscope.operator.domain import breaker, injection, policy

DEFAULT_AGENT_URL: Final = "https://{node_ip}:{port}"
DEFAULT_AGENT_PORT: Final = 9464
SA_TOKEN: Final = "/var/run/secrets/kubernetes.io/serviceaccount/token"
T = TypeVar("T")


@dataclass(frozen=True)
class TriggerLoopSettings:
    # Mycroft polls the sampled ranks every second (docs/design.md, "Data path" 5); a
    # TrainingJob may ask for a longer interval (spec.diagnosis.trigger.intervalSeconds), never
    # a shorter one.
    interval_s: float = 1.0
    # Records per tick: the trigger window Δ (2 s) plus margin for a late agent sample.
    window_s: float = 5.0
    # Re-ask the agents which ranks they hold at most this often while some pod has no rank.
    rediscover_s: float = 5.0
    # Records pulled on a tick where a rank joins the rotating sample (analysis.rotation): its
    # communicators' baselines are learned from its own history (CCL-D's Tbase from the first
    # 3 s of rounds seen), so it must reach back past a slowdown that began while the rank was
    # away: one rotation period (6 s for 16 DP groups, 21 s for 64) plus Δ. The agents keep
    # 120 s.
    join_history_s: float = 30.0
    # A slowdown episode of a communicator ends after this many ticks without a slow trigger
    # on it (and never before one rotation period plus a visit, jobs.JobRuntime.quiet_ticks);
    # the next trigger there opens a new Diagnosis. Ten ticks: longer than the repetition
    # counter's three, so a streak broken by one healthy tick is not a new incident.
    episode_quiet_ticks: int = 10


@dataclass(frozen=True)
class AgentSettings:
    # The DaemonSet uses hostNetwork and agent.port, so the node's IP reaches it. {port} is
    # replaced by ``port`` in from_env; the directory fills {node} and {node_ip}.
    url_template: str = DEFAULT_AGENT_URL.replace("{port}", str(DEFAULT_AGENT_PORT))
    port: int = DEFAULT_AGENT_PORT
    timeout_s: float = 1.0  # below the trigger interval: one slow agent must not hold a tick
    retries: int = 1
    # TLS and the token (agents authorize with TokenReview + SubjectAccessReview, which the
    # chart grants the operator: collscope.dev agents/data, agents/stacks,
    # agents/flightrecorder).
    ca_file: str = ""
    server_name: str = ""
    token_file: str = SA_TOKEN


@dataclass(frozen=True)
class Settings:
    trigger: TriggerLoopSettings = field(default_factory=TriggerLoopSettings)
    agents: AgentSettings = field(default_factory=AgentSettings)
    # History pulled for root cause: enough for the stall, Δ and the slow baseline (engine).
    diagnosis_window_s: float = 10.0
    # Diagnoses kept per TrainingJob, newest first (``retention``): a flapping job opens one a
    # minute; 20 is a day's worth of real incidents and a few kilobytes each in etcd.
    diagnosis_retention: int = 20
    # py-spy per rank on an anomaly (the agent's own limit; the HTTP call waits 2 s longer).
    stacks_timeout_s: float = 3.0
    # Flight Recorder dumps on a trigger (the agent's own limit; the HTTP call waits 2 s
    # longer). torch checks the dump pipe every TORCH_NCCL_COORD_CHECK_MILSEC (1 s by default,
    # notes/kubernetes.md §6) and then writes the dump: 5 s leaves room for a slow disk.
    flight_recorder_timeout_s: float = 5.0
    namespace: str = "collscope-system"
    breaker_configmap: str = "collscope-breaker"
    remediation: policy.RemediationPolicy = field(default_factory=policy.RemediationPolicy)
    breaker: breaker.BreakerSettings = field(default_factory=breaker.BreakerSettings)
    metrics_port: int = 9465
    health_port: int = 8080
    webhook_port: int = 0
    webhook_cert_dir: str = ""
    injection: injection.InjectionSettings = field(default_factory=injection.InjectionSettings)
    # INFO shows each trigger, diagnosis and remediation decision; WARNING only what went wrong.
    log_level: str = "INFO"
    log_format: logs.LogFormat = "text"  # json for a log collector

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Settings from ``env`` (pass ``os.environ``); defaults for what is absent."""

        def get(name: str, parse: Callable[[str], T], default: T) -> T:
            raw = env.get(name)
            if raw is None or raw == "":
                return default
            try:
                return parse(raw)
            except (ValueError, errors.PolicyError) as e:
                raise errors.SettingsError(name, raw, str(e)) from e

        d = cls()
        b = d.breaker
        port = get("COLLSCOPE_AGENT_PORT", _port, d.agents.port)
        template = get("COLLSCOPE_AGENT_URL", _template, DEFAULT_AGENT_URL)
        template = template.replace("{port}", str(port))
        return cls(
            trigger=TriggerLoopSettings(
                interval_s=get("COLLSCOPE_TRIGGER_INTERVAL_S", _positive, d.trigger.interval_s),
                window_s=get("COLLSCOPE_TRIGGER_WINDOW_S", _positive, d.trigger.window_s),
            ),
            agents=AgentSettings(
                url_template=template,
                port=port,
                timeout_s=get("COLLSCOPE_AGENT_TIMEOUT_S", _positive, d.agents.timeout_s),
                retries=get("COLLSCOPE_AGENT_RETRIES", int, d.agents.retries),
                ca_file=get("COLLSCOPE_AGENT_CA_FILE", str, d.agents.ca_file),
                server_name=get("COLLSCOPE_AGENT_SERVER_NAME", str, d.agents.server_name),
                token_file=env.get("COLLSCOPE_AGENT_TOKEN_FILE", d.agents.token_file),
            ),
            diagnosis_window_s=get("COLLSCOPE_DIAGNOSIS_WINDOW_S", _positive, 10.0),
            diagnosis_retention=get("COLLSCOPE_DIAGNOSIS_RETENTION", _at_least_one, 20),
            namespace=get("COLLSCOPE_NAMESPACE", str, d.namespace),
            remediation=get("COLLSCOPE_REMEDIATION", _policy, d.remediation),
            breaker=_breaker(
                max_cordons=get("COLLSCOPE_BREAKER_MAX_CORDONS", int, b.max_cordons),
                window_s=get("COLLSCOPE_BREAKER_WINDOW_S", _positive, b.window_s),
                max_fraction=get("COLLSCOPE_BREAKER_MAX_FRACTION", float, b.max_fraction),
            ),
            metrics_port=get("COLLSCOPE_METRICS_PORT", int, d.metrics_port),
            health_port=get("COLLSCOPE_HEALTH_PORT", int, d.health_port),
            webhook_port=get("COLLSCOPE_WEBHOOK_PORT", int, d.webhook_port),
            webhook_cert_dir=get("COLLSCOPE_WEBHOOK_CERT_DIR", str, d.webhook_cert_dir),
            injection=injection.InjectionSettings(
                image=get("COLLSCOPE_PLUGIN_IMAGE", str, d.injection.image)
            ),
            log_level=get("COLLSCOPE_LOG_LEVEL", _log_level, d.log_level),
            log_format=get("COLLSCOPE_LOG_FORMAT", _log_format, d.log_format),
        )


def _breaker(*, max_cordons: int, window_s: float, max_fraction: float) -> breaker.BreakerSettings:
    try:
        return breaker.BreakerSettings(
            max_cordons=max_cordons, window_s=window_s, max_fraction=max_fraction
        )
    except errors.PolicyError as e:
        names = "COLLSCOPE_BREAKER_MAX_CORDONS, _WINDOW_S or COLLSCOPE_BREAKER_MAX_FRACTION"
        values = f"{max_cordons}, {window_s:g}, {max_fraction:g}"
        raise errors.SettingsError(names, values, str(e)) from e


def _at_least_one(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError(f"{raw!r} is below 1")
    return value


def _positive(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError("must be > 0")
    return value


def _log_level(raw: str) -> str:
    if raw.upper() not in logs.LEVELS:
        raise ValueError(f"must be one of {', '.join(logs.LEVELS)}")
    return raw.upper()


def _log_format(raw: str) -> logs.LogFormat:
    if raw not in logs.FORMATS:
        raise ValueError("must be 'text' or 'json'")
    return cast(logs.LogFormat, raw)


def _template(raw: str) -> str:
    try:
        raw.format(node="n", node_ip="127.0.0.1", port=1)
    except (KeyError, IndexError) as e:
        raise ValueError(f"only {{node}}, {{node_ip}} and {{port}} may appear ({e})") from e
    return raw


def _port(raw: str) -> int:
    value = int(raw)
    if not 1 <= value <= 65535:
        raise ValueError("must be a TCP port in [1, 65535]")
    return value


def _policy(raw: str) -> policy.RemediationPolicy:
    values = json.loads(raw)
    if not isinstance(values, dict):
        raise ValueError("must be a JSON object")
    return policy.RemediationPolicy.from_values(values)
