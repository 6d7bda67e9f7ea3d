"""The node agent's settings: frozen, typed, grouped by concern, read from the environment once.

``Settings.from_env(os.environ)`` is called from ``main()`` only (STYLE habits 8 and 9); command
line flags then override single fields (``envsettings.overrides``). Each variable is declared
once, in ``VARIABLES`` (``envsettings.Var``: its parser, doc, field and flag); a bad value raises
``errors.SettingsError`` naming the variable. Variables (defaults in the field comments)::

    COLLSCOPE_DISCOVERY            kubelet | directory
    COLLSCOPE_KUBELET_PODS_DIR     /var/lib/kubelet/pods
    COLLSCOPE_RING_VOLUME          collscope-trace (the emptyDir volume name in training pods)
    COLLSCOPE_TRACE_ROOT           /run/collscope (directory mode: any tree of *.ring files)
    COLLSCOPE_RESCAN_INTERVAL_S    0.5
    COLLSCOPE_SAMPLE_INTERVAL_S    0.1
    COLLSCOPE_STALE_AFTER_S        2.0
    COLLSCOPE_WINDOW_S             120
    COLLSCOPE_MEMORY_CAP_BYTES     268435456
    COLLSCOPE_LISTEN_HOST          0.0.0.0 (the chart: the node's address, status.hostIP)
    COLLSCOPE_LISTEN_PORT          9464
    COLLSCOPE_MAX_CONNECTIONS      1024
    COLLSCOPE_MAX_CONNECTIONS_PER_PEER 128
    COLLSCOPE_TLS_CERT_FILE        (empty: plain HTTP; needs COLLSCOPE_AUTH=none)
    COLLSCOPE_TLS_KEY_FILE         (with the certificate)
    COLLSCOPE_AUTH                 kubernetes | none
    COLLSCOPE_API_SERVER           https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
    COLLSCOPE_AUTH_TOKEN_FILE      /var/run/secrets/kubernetes.io/serviceaccount/token
    COLLSCOPE_AUTH_CA_FILE         /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
    COLLSCOPE_AUTH_AUDIENCES       (empty: the API server's; comma-separated)
    COLLSCOPE_AUTH_CACHE_TTL_S     60
    COLLSCOPE_AUTH_DENIED_TTL_S    10
    COLLSCOPE_EXPENSIVE_BURST      10
    COLLSCOPE_EXPENSIVE_PER_MINUTE 20
    COLLSCOPE_HW_INTERVAL_S        1.0
    COLLSCOPE_SYS_ROOT             /sys
    COLLSCOPE_PYSPY                py-spy
    COLLSCOPE_LOG_LEVEL            INFO (DEBUG | INFO | WARNING | ERROR)
    COLLSCOPE_LOG_FORMAT           text (text | json: one JSON object per line)
    NODE_NAME                      (downward API spec.nodeName; else the host name)
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Mapping
from typing import Any, Literal

from collscope.nodeagent import envsettings, errors, logs, podcontract

DiscoveryMode = Literal["kubelet", "directory"]
AuthMode = Literal["kubernetes", "none"]
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclasses.dataclass(frozen=True, slots=True)
class DiscoverySettings:
    """Where rings are found."""

    # kubelet: <kubelet_pods_dir>/<pod uid>/volumes/kubernetes.io~empty-dir/<volume>/*.ring
    # (docs/design.md, "Pod contract"); directory: any *.ring below trace_root (standalone
    # nodes, tests).
    mode: DiscoveryMode = "kubelet"
    kubelet_pods_dir: str = "/var/lib/kubelet/pods"  # kubelet --root-dir + "pods"
    ring_volume: str = podcontract.TRACE_VOLUME  # the emptyDir the webhook injects into pods
    trace_root: str = podcontract.TRACE_DIR
    # New rings must be seen within a second (issue 4): a scan of a few hundred pod dirs
    # costs about a millisecond, twice a second is cheap.
    rescan_interval_s: float = 0.5


@dataclasses.dataclass(frozen=True, slots=True)
class SamplingSettings:
    """How often rings are read and when a writer counts as gone."""

    # 10 Hz (issue 4): the trigger's state_interval_s; a hang threshold of >= 1.5 s sees
    # about 15 samples of a stall.
    sample_interval_s: float = 0.1
    # The plugin refreshes header.heartbeat_ns every 100 ms (COLLSCOPE_HEARTBEAT_INTERVAL_MS):
    # 20 missed beats is a wedged or dead process, not a busy one.
    stale_after_s: float = 2.0


@dataclasses.dataclass(frozen=True, slots=True)
class WindowSettings:
    """How much is kept in memory."""

    # 120 s (issue 4): Mycroft's trigger looks back seconds; the rest serves exports.
    window_s: float = 120.0
    # 256 MiB: about 200 s of 8 rings x 8 communicators x 32 flows at 10 Hz.
    memory_cap_bytes: int = 256 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class ServerSettings:
    """The HTTP API (server.py) and what bounds it."""

    # The chart binds the node's own address (status.hostIP: the agent uses hostNetwork),
    # not every interface of the node.
    listen_host: str = "0.0.0.0"
    listen_port: int = 9464  # an unassigned port in Prometheus' exporter range
    # Connections held at once, and from one peer address: a slow or idle client holds one
    # until idle_timeout_s; the operator's pulls (one connection per node, kept alive) need
    # few. 128 per peer leaves room for an operator with that many TrainingJobs pulling at
    # once; a tenant pod that opens more is refused with 503, not queued.
    max_connections: int = 1024
    max_connections_per_peer: int = 128
    # The kernel's accept queue (listen backlog): the stdlib server's 5 made the sixth
    # concurrent client wait a SYN retransmit (1 s, the operator's agent timeout).
    backlog: int = 1024
    # A connection with no complete request for this long is closed: a client that sends its
    # headers slowly (slowloris) or nothing, and a kept-alive one gone quiet. Above the
    # operator's 1 s pull interval, so its kept-alive connection is reused.
    idle_timeout_s: float = 10.0
    # A body (stacks, Flight Recorder requests: well under 1 KB) that does not arrive within
    # this, e.g. a Content-Length larger than what is sent: 408.
    body_timeout_s: float = 10.0
    # Each write of a response to a client that does not read: the connection is dropped.
    send_timeout_s: float = 30.0
    # Request limits: a body above max_body_bytes is not a stacks/Flight Recorder request
    # (413); aiohttp refuses a request line or header field above max_field_bytes and more
    # than max_headers headers (400).
    max_body_bytes: int = 64 << 10
    max_field_bytes: int = 8190
    max_headers: int = 64
    # Threads for blocking work, off the event loop: quick reads (summaries, window, metrics)
    # and slow ones (py-spy, Flight Recorder, export) in separate pools, so a burst of slow
    # requests never delays the operator's 1 s pulls.
    quick_workers: int = 4
    slow_workers: int = 4


@dataclasses.dataclass(frozen=True, slots=True)
class TLSSettings:
    """HTTPS. The chart mounts a certificate (cert-manager or chart-generated CA)."""

    cert_file: str = ""  # PEM chain; empty: plain HTTP (one-box demo, tests)
    key_file: str = ""
    # The files are checked this often and loaded again when they changed (cert-manager and
    # the kubelet replace a Secret's files on renewal): no restart.
    reload_interval_s: float = 10.0
    # A TLS handshake not done in this long is dropped (asyncio's default is 60 s).
    handshake_timeout_s: float = 10.0


@dataclasses.dataclass(frozen=True, slots=True)
class AuthSettings:
    """Who may call the API (auth.py): TokenReview + SubjectAccessReview, as kube-rbac-proxy."""

    # kubernetes: every route but /livez and /readyz needs a bearer token that RBAC allows;
    # none: anyone on the network may call it (one-box demo and tests on loopback only).
    mode: AuthMode = "kubernetes"
    api_server: str = ""  # from KUBERNETES_SERVICE_HOST/PORT in from_env
    token_file: str = f"{SA_DIR}/token"  # the agent's own token, re-read on rotation
    ca_file: str = f"{SA_DIR}/ca.crt"  # verifies the API server
    audiences: tuple[str, ...] = ()  # empty: tokens for the API server itself
    # 60 s: a node's agent sees the operator's token every second; this makes it one
    # TokenReview and one SAR a minute per agent (4/s for 128 agents), and a revoked binding
    # still takes effect within a minute. Refusals are kept less, so a fix is seen soon.
    cache_ttl_s: float = 60.0
    denied_ttl_s: float = 10.0
    # py-spy (pauses the target) and Flight Recorder dumps per caller: the operator asks once
    # per node per Diagnosis; a burst of 10 covers several jobs on one node diagnosed at once.
    expensive_burst: int = 10
    expensive_per_minute: float = 20.0


@dataclasses.dataclass(frozen=True, slots=True)
class HardwareSettings:
    """Hardware counters and process inspection."""

    hw_interval_s: float = 1.0  # NVML and NIC counters change slower than the op state
    sys_root: str = "/sys"
    pyspy: str = "py-spy"  # the py-spy executable (notes/kubernetes.md §5)


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """Everything the agent is configured with; see the module docstring for variables."""

    node_name: str = ""
    log_level: str = "INFO"  # COLLSCOPE_LOG_LEVEL: DEBUG | INFO | WARNING | ERROR
    # COLLSCOPE_LOG_FORMAT: text for people, json for a log collector (logs.py).
    log_format: logs.LogFormat = "text"
    discovery: DiscoverySettings = DiscoverySettings()
    sampling: SamplingSettings = SamplingSettings()
    window: WindowSettings = WindowSettings()
    server: ServerSettings = ServerSettings()
    tls: TLSSettings = TLSSettings()
    auth: AuthSettings = AuthSettings()
    hardware: HardwareSettings = HardwareSettings()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Settings from ``env`` (pass ``os.environ``); unset variables keep their default
        (``VARIABLES``). ``check`` then refuses authentication without TLS."""
        base = cls(node_name=socket.gethostname(), auth=AuthSettings(api_server=_api_server(env)))
        return envsettings.load(base, VARIABLES, env)


_SECONDS = envsettings.number(positive=True, unit="a number of seconds")
_COUNT = envsettings.integer(minimum=1)
_TEXT = envsettings.text
Var = envsettings.Var

# Every variable, once: the flags of ``collscope-agent run`` come from those with a flag, in this
# order (``__main__``), their help from ``doc`` and the default of the field.
VARIABLES: tuple[envsettings.Var[Any], ...] = (
    Var("COLLSCOPE_DISCOVERY", envsettings.choice("kubelet", "directory"),
        "find rings in the kubelet's pod volumes, or any *.ring under --trace-root",
        "discovery.mode", flag="--discovery", choices=("kubelet", "directory")),
    Var("COLLSCOPE_KUBELET_PODS_DIR", _TEXT,
        "the kubelet's pod directory, kubelet --root-dir + /pods",
        "discovery.kubelet_pods_dir", flag="--kubelet-pods-dir", metavar="DIR"),
    Var("COLLSCOPE_RING_VOLUME", _TEXT, "the emptyDir volume holding a pod's rings",
        "discovery.ring_volume", flag="--ring-volume", metavar="NAME"),
    Var("COLLSCOPE_TRACE_ROOT", _TEXT, "where --discovery directory looks for *.ring",
        "discovery.trace_root", flag="--trace-root", metavar="DIR"),
    Var("COLLSCOPE_LISTEN_HOST", _TEXT, "address to listen on", "server.listen_host",
        flag="--host"),
    Var("COLLSCOPE_LISTEN_PORT", envsettings.integer(0, 65535), "port to listen on",
        "server.listen_port", flag="--port"),
    Var("COLLSCOPE_SAMPLE_INTERVAL_S", _SECONDS, "seconds between samples of every ring",
        "sampling.sample_interval_s", flag="--sample-interval-s", metavar="S"),
    Var("COLLSCOPE_WINDOW_S", _SECONDS, "seconds of records kept per rank", "window.window_s",
        flag="--window-s", metavar="S"),
    Var("COLLSCOPE_MEMORY_CAP_BYTES", envsettings.integer(minimum=1 << 20),
        "memory cap of the whole window", "window.memory_cap_bytes",
        flag="--memory-cap-bytes", metavar="N"),
    Var(podcontract.NODE_NAME_ENV, _TEXT, "this node's name", "node_name",
        flag="--node-name", shown_default="the host name"),
    Var("COLLSCOPE_AUTH", envsettings.choice("kubernetes", "none"),
        "kubernetes: TokenReview + SubjectAccessReview for every call (needs TLS); none: "
        "serve anyone, a demo on one machine", "auth.mode", flag="--auth",
        choices=("kubernetes", "none")),
    Var("COLLSCOPE_TLS_CERT_FILE", _TEXT, "serve https with this certificate", "tls.cert_file",
        flag="--tls-cert-file", metavar="FILE", shown_default="plain http"),
    Var("COLLSCOPE_TLS_KEY_FILE", _TEXT, "the certificate's private key", "tls.key_file",
        flag="--tls-key-file", metavar="FILE"),
    Var("COLLSCOPE_LOG_LEVEL", envsettings.choice(*logs.LEVELS, fold=str.upper),
        "least severe log lines kept", "log_level", flag="--log-level", choices=logs.LEVELS,
        flag_type=str.upper),
    Var("COLLSCOPE_LOG_FORMAT", envsettings.choice(*logs.FORMATS),
        "text, or one JSON object per line", "log_format", flag="--log-format",
        choices=logs.FORMATS),
    Var("COLLSCOPE_RESCAN_INTERVAL_S", _SECONDS, "seconds between scans for new rings",
        "discovery.rescan_interval_s"),
    Var("COLLSCOPE_STALE_AFTER_S", _SECONDS, "a writer without a heartbeat this long is gone",
        "sampling.stale_after_s"),
    Var("COLLSCOPE_MAX_CONNECTIONS", _COUNT, "connections held at once",
        "server.max_connections"),
    Var("COLLSCOPE_MAX_CONNECTIONS_PER_PEER", _COUNT, "connections held from one address",
        "server.max_connections_per_peer"),
    Var("COLLSCOPE_API_SERVER", _TEXT, "the Kubernetes API server (TokenReview, SAR)",
        "auth.api_server"),
    Var("COLLSCOPE_AUTH_TOKEN_FILE", _TEXT, "the agent's own token", "auth.token_file"),
    Var("COLLSCOPE_AUTH_CA_FILE", _TEXT, "the CA verifying the API server", "auth.ca_file"),
    Var("COLLSCOPE_AUTH_AUDIENCES", envsettings.csv, "token audiences, comma-separated",
        "auth.audiences"),
    Var("COLLSCOPE_AUTH_CACHE_TTL_S", _SECONDS, "seconds an allowed review is kept",
        "auth.cache_ttl_s"),
    Var("COLLSCOPE_AUTH_DENIED_TTL_S", _SECONDS, "seconds a refused review is kept",
        "auth.denied_ttl_s"),
    Var("COLLSCOPE_EXPENSIVE_BURST", _COUNT, "py-spy and Flight Recorder calls in a burst",
        "auth.expensive_burst"),
    Var("COLLSCOPE_EXPENSIVE_PER_MINUTE", _SECONDS, "... and per minute, per caller",
        "auth.expensive_per_minute"),
    Var("COLLSCOPE_HW_INTERVAL_S", _SECONDS, "seconds between hardware samples",
        "hardware.hw_interval_s"),
    Var("COLLSCOPE_SYS_ROOT", _TEXT, "where sysfs is mounted", "hardware.sys_root"),
    Var("COLLSCOPE_PYSPY", _TEXT, "the py-spy executable", "hardware.pyspy"),
)  # fmt: skip


def check(config: Settings) -> Settings:
    """``config`` if its TLS and authentication settings fit together, else ``SettingsError``."""
    tls = config.tls
    if bool(tls.cert_file) != bool(tls.key_file):
        raise errors.SettingsError(
            "COLLSCOPE_TLS_KEY_FILE", tls.key_file, "give both a certificate and its key, or none"
        )
    if config.auth.mode == "kubernetes" and not tls.cert_file:
        raise errors.SettingsError(
            "COLLSCOPE_TLS_CERT_FILE",
            "",
            "authentication needs TLS (bearer tokens in clear text); set COLLSCOPE_AUTH=none "
            "(--auth none) for a plain-HTTP agent on a trusted network",
        )
    return config


def _api_server(env: Mapping[str, str]) -> str:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host:
        return ""
    host = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return f"https://{host}:{port or 443}"
