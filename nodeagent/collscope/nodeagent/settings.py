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
    COLLSCOPE_LISTEN_HOST          0.0.0.0
    COLLSCOPE_LISTEN_PORT          9464
    COLLSCOPE_HW_INTERVAL_S        1.0
    COLLSCOPE_SYS_ROOT             /sys
    COLLSCOPE_PYSPY                py-spy
    COLLSCOPE_LOG_LEVEL            INFO
    NODE_NAME                      (downward API spec.nodeName; else the host name)
"""

from __future__ import annotations

import dataclasses
import math
import socket
from collections.abc import Callable, Mapping
from typing import Literal, TypeVar, cast

from collscope.nodeagent import errors

DiscoveryMode = Literal["kubelet", "directory"]
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True, slots=True)
class DiscoverySettings:
    """Where rings are found."""

    # kubelet: <kubelet_pods_dir>/<pod uid>/volumes/kubernetes.io~empty-dir/<volume>/*.ring
    # (DESIGN.md §3.1); directory: any *.ring below trace_root (standalone nodes, tests).
    mode: DiscoveryMode = "kubelet"
    kubelet_pods_dir: str = "/var/lib/kubelet/pods"  # kubelet --root-dir + "pods"
    ring_volume: str = "collscope-trace"  # the emptyDir the chart injects into training pods
    trace_root: str = "/run/collscope"
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
    """The HTTP API."""

    listen_host: str = "0.0.0.0"  # a DaemonSet pod's IP; the operator pulls from it
    listen_port: int = 9464  # an unassigned port in Prometheus' exporter range


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
    discovery: DiscoverySettings = DiscoverySettings()
    sampling: SamplingSettings = SamplingSettings()
    window: WindowSettings = WindowSettings()
    server: ServerSettings = ServerSettings()
    hardware: HardwareSettings = HardwareSettings()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Settings from ``env`` (pass ``os.environ``); unset variables keep their default."""
        d, s, w, v, h = (
            DiscoverySettings(),
            SamplingSettings(),
            WindowSettings(),
            ServerSettings(),
            HardwareSettings(),
        )

        def get(name: str, parse: Callable[[str, str], _T], default: _T) -> _T:
            raw = env.get(name)
            return default if raw is None or raw == "" else parse(name, raw)

        return cls(
            node_name=env.get("NODE_NAME") or socket.gethostname(),
            log_level=get("COLLSCOPE_LOG_LEVEL", _level, "INFO"),
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
            ),
            hardware=HardwareSettings(
                hw_interval_s=get("COLLSCOPE_HW_INTERVAL_S", _seconds, h.hw_interval_s),
                sys_root=get("COLLSCOPE_SYS_ROOT", _text, h.sys_root),
                pyspy=get("COLLSCOPE_PYSPY", _text, h.pyspy),
            ),
        )


def _text(name: str, raw: str) -> str:
    return raw


def _level(name: str, raw: str) -> str:
    if raw.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise errors.SettingsError(name, raw, "must be DEBUG, INFO, WARNING or ERROR")
    return raw.upper()


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
