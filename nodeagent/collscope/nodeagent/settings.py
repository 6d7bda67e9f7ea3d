"""The node agent's settings: frozen, typed, grouped by concern, read from the environment once.

``Settings.from_env(os.environ)`` is called from ``main()`` only (STYLE habits 8 and 9); command
line flags then override single fields with ``dataclasses.replace``. A bad value raises
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
import math
import socket
from collections.abc import Callable, Mapping
from typing import Literal, TypeVar, cast

from collscope.nodeagent import errors, logs, podcontract

DiscoveryMode = Literal["kubelet", "directory"]
AuthMode = Literal["kubernetes", "none"]
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_T = TypeVar("_T")


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
        """Settings from ``env`` (pass ``os.environ``); unset variables keep their default.

        Authentication without TLS is refused: bearer tokens must not cross the network in
        clear text (``COLLSCOPE_AUTH=none`` for a plain-HTTP demo on one machine).
        """
        d, s, w, v, h = (
            DiscoverySettings(),
            SamplingSettings(),
            WindowSettings(),
            ServerSettings(),
            HardwareSettings(),
        )
        t, a = TLSSettings(), AuthSettings()

        def get(name: str, parse: Callable[[str, str], _T], default: _T) -> _T:
            raw = env.get(name)
            return default if raw is None or raw == "" else parse(name, raw)

        return cls(
            node_name=env.get(podcontract.NODE_NAME_ENV) or socket.gethostname(),
            log_level=get("COLLSCOPE_LOG_LEVEL", _level, "INFO"),
            log_format=get("COLLSCOPE_LOG_FORMAT", _log_format, "text"),
            discovery=DiscoverySettings(
                mode=get("COLLSCOPE_DISCOVERY", _mode, d.mode),
                kubelet_pods_dir=get("COLLSCOPE_KUBELET_PODS_DIR", _text, d.kubelet_pods_dir),
                ring_volume=get("COLLSCOPE_RING_VOLUME", _text, d.ring_volume),
                trace_root=get("COLLSCOPE_TRACE_ROOT", _text, d.trace_root),
                rescan_interval_s=get("COLLSCOPE_RESCAN_INTERVAL_S", _seconds, d.rescan_interval_s),
            ),
            sampling=SamplingSettings(
                sample_interval_s=get("COLLSCOPE_SAMPLE_INTERVAL_S", _seconds, s.sample_interval_s),
                stale_after_s=get("COLLSCOPE_STALE_AFTER_S", _seconds, s.stale_after_s),
            ),
            window=WindowSettings(
                window_s=get("COLLSCOPE_WINDOW_S", _seconds, w.window_s),
                memory_cap_bytes=get("COLLSCOPE_MEMORY_CAP_BYTES", _size, w.memory_cap_bytes),
            ),
            server=ServerSettings(
                listen_host=get("COLLSCOPE_LISTEN_HOST", _text, v.listen_host),
                listen_port=get("COLLSCOPE_LISTEN_PORT", _port, v.listen_port),
                max_connections=get("COLLSCOPE_MAX_CONNECTIONS", _count, v.max_connections),
                max_connections_per_peer=get(
                    "COLLSCOPE_MAX_CONNECTIONS_PER_PEER", _count, v.max_connections_per_peer
                ),
            ),
            tls=TLSSettings(
                cert_file=get("COLLSCOPE_TLS_CERT_FILE", _text, t.cert_file),
                key_file=get("COLLSCOPE_TLS_KEY_FILE", _text, t.key_file),
            ),
            auth=AuthSettings(
                mode=get("COLLSCOPE_AUTH", _auth, a.mode),
                api_server=get("COLLSCOPE_API_SERVER", _text, _api_server(env)),
                token_file=get("COLLSCOPE_AUTH_TOKEN_FILE", _text, a.token_file),
                ca_file=get("COLLSCOPE_AUTH_CA_FILE", _text, a.ca_file),
                audiences=get("COLLSCOPE_AUTH_AUDIENCES", _csv, a.audiences),
                cache_ttl_s=get("COLLSCOPE_AUTH_CACHE_TTL_S", _seconds, a.cache_ttl_s),
                denied_ttl_s=get("COLLSCOPE_AUTH_DENIED_TTL_S", _seconds, a.denied_ttl_s),
                expensive_burst=get("COLLSCOPE_EXPENSIVE_BURST", _count, a.expensive_burst),
                expensive_per_minute=get(
                    "COLLSCOPE_EXPENSIVE_PER_MINUTE", _seconds, a.expensive_per_minute
                ),
            ),
            hardware=HardwareSettings(
                hw_interval_s=get("COLLSCOPE_HW_INTERVAL_S", _seconds, h.hw_interval_s),
                sys_root=get("COLLSCOPE_SYS_ROOT", _text, h.sys_root),
                pyspy=get("COLLSCOPE_PYSPY", _text, h.pyspy),
            ),
        )


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


def _text(name: str, raw: str) -> str:
    return raw


def _csv(name: str, raw: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in raw.split(",") if x.strip())


def _auth(name: str, raw: str) -> AuthMode:
    if raw not in ("kubernetes", "none"):
        raise errors.SettingsError(name, raw, "must be 'kubernetes' or 'none'")
    return cast(AuthMode, raw)


def _count(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError as e:
        raise errors.SettingsError(name, raw, "must be a whole number") from e
    if value < 1:
        raise errors.SettingsError(name, raw, "must be at least 1")
    return value


def _level(name: str, raw: str) -> str:
    if raw.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise errors.SettingsError(name, raw, "must be DEBUG, INFO, WARNING or ERROR")
    return raw.upper()


def _log_format(name: str, raw: str) -> logs.LogFormat:
    if raw not in logs.FORMATS:
        raise errors.SettingsError(name, raw, "must be 'text' or 'json'")
    return cast(logs.LogFormat, raw)


def _mode(name: str, raw: str) -> DiscoveryMode:
    if raw not in ("kubelet", "directory"):
        raise errors.SettingsError(name, raw, "must be 'kubelet' or 'directory'")
    return cast(DiscoveryMode, raw)


def _seconds(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError as e:
        raise errors.SettingsError(name, raw, "must be a number of seconds") from e
    if not math.isfinite(value) or value <= 0:
        raise errors.SettingsError(name, raw, "must be a positive, finite number of seconds")
    return value


def _size(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError as e:
        raise errors.SettingsError(name, raw, "must be a whole number of bytes") from e
    if value < 1 << 20:
        raise errors.SettingsError(name, raw, "must be at least 1048576 bytes (1 MiB)")
    return value


def _port(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError as e:
        raise errors.SettingsError(name, raw, "must be a TCP port number") from e
    if not 0 <= value <= 65535:
        raise errors.SettingsError(name, raw, "must be a TCP port in [0, 65535]")
    return value
