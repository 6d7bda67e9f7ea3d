"""Settings of collscope-operator: frozen dataclasses grouped by concern, read once from the
environment by ``Settings.from_env()`` (called from ``__main__.main``, never at import).

Environment (every variable optional; the bad one is named in ``SettingsError``), each declared
once in ``VARIABLES`` (``collscope.nodeagent.envsettings``, the agent's mechanism too):

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
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from collscope.nodeagent import envsettings, logs
from collscope.operator.domain import breaker, injection, policy

DEFAULT_AGENT_URL: Final = "https://{node_ip}:{port}"
DEFAULT_AGENT_PORT: Final = 9464
SA_TOKEN: Final = "/var/run/secrets/kubernetes.io/serviceaccount/token"


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
        base = cls(agents=AgentSettings(url_template=DEFAULT_AGENT_URL))
        config = envsettings.load(base, VARIABLES, env)
        agents = config.agents
        url = agents.url_template.replace("{port}", str(agents.port))
        return replace(config, agents=replace(agents, url_template=url))


def _template(raw: str) -> str:
    try:
        raw.format(node="n", node_ip="127.0.0.1", port=1)
    except (KeyError, IndexError) as e:
        raise ValueError(f"only {{node}}, {{node_ip}} and {{port}} may appear ({e})") from e
    return raw


def _policy(raw: str) -> policy.RemediationPolicy:
    values = json.loads(raw)
    if not isinstance(values, dict):
        raise ValueError("must be a JSON object")
    return policy.RemediationPolicy.from_values(values)


_POSITIVE = envsettings.number(positive=True, unit="a number of seconds")
_PORT = envsettings.integer(0, 65535)  # 0: off
_TEXT = envsettings.text
Var = envsettings.Var

# Every variable the operator reads, once (the module docstring explains each).
VARIABLES: tuple[envsettings.Var[Any], ...] = (
    Var("COLLSCOPE_TRIGGER_INTERVAL_S", _POSITIVE, "seconds between trigger ticks",
        "trigger.interval_s"),
    Var("COLLSCOPE_TRIGGER_WINDOW_S", _POSITIVE, "seconds of records pulled per tick",
        "trigger.window_s"),
    Var("COLLSCOPE_AGENT_PORT", envsettings.integer(1, 65535), "the agents' port",
        "agents.port"),
    Var("COLLSCOPE_AGENT_URL", _template, "an agent's URL, {node}, {node_ip}, {port}",
        "agents.url_template"),
    Var("COLLSCOPE_AGENT_TIMEOUT_S", _POSITIVE, "seconds an agent may take",
        "agents.timeout_s"),
    Var("COLLSCOPE_AGENT_RETRIES", envsettings.integer(minimum=0), "retries of an agent call",
        "agents.retries"),
    Var("COLLSCOPE_AGENT_CA_FILE", _TEXT, "the CA verifying agents", "agents.ca_file"),
    Var("COLLSCOPE_AGENT_SERVER_NAME", _TEXT, "the name agents' certificates carry",
        "agents.server_name"),
    Var("COLLSCOPE_AGENT_TOKEN_FILE", _TEXT, "the bearer token for agents (empty: none)",
        "agents.token_file", keep_empty=True),
    Var("COLLSCOPE_DIAGNOSIS_WINDOW_S", _POSITIVE, "seconds pulled for root cause",
        "diagnosis_window_s"),
    Var("COLLSCOPE_DIAGNOSIS_RETENTION", envsettings.integer(minimum=1),
        "Diagnoses kept per TrainingJob", "diagnosis_retention"),
    Var("COLLSCOPE_NAMESPACE", _TEXT, "where the breaker ConfigMap lives", "namespace"),
    Var("COLLSCOPE_REMEDIATION", _policy, "the remediation policy, JSON", "remediation"),
    Var("COLLSCOPE_BREAKER_MAX_CORDONS", envsettings.integer(), "cordons per window",
        "breaker.max_cordons"),
    Var("COLLSCOPE_BREAKER_WINDOW_S", _POSITIVE, "the breaker's window", "breaker.window_s"),
    Var("COLLSCOPE_BREAKER_MAX_FRACTION", envsettings.number(), "share of nodes per window",
        "breaker.max_fraction"),
    Var("COLLSCOPE_METRICS_PORT", _PORT, "the Prometheus port (0: off)", "metrics_port"),
    Var("COLLSCOPE_HEALTH_PORT", _PORT, "the liveness port (0: off)", "health_port"),
    Var("COLLSCOPE_WEBHOOK_PORT", _PORT, "the injection webhook's port (0: off)",
        "webhook_port"),
    Var("COLLSCOPE_WEBHOOK_CERT_DIR", _TEXT, "the webhook's tls.crt and tls.key",
        "webhook_cert_dir"),
    Var("COLLSCOPE_PLUGIN_IMAGE", _TEXT, "the image holding the plugin", "injection.image"),
    Var("COLLSCOPE_LOG_LEVEL", envsettings.choice(*logs.LEVELS, fold=str.upper),
        "least severe log lines kept, kopf's too; INFO shows every trigger, diagnosis and "
        "remediation decision", "log_level", flag="--log-level", choices=logs.LEVELS,
        flag_type=str.upper),
    Var("COLLSCOPE_LOG_FORMAT", envsettings.choice(*logs.FORMATS),
        "text, or one JSON object per line for a log collector", "log_format",
        flag="--log-format", choices=logs.FORMATS),
)  # fmt: skip
