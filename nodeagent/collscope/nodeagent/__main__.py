"""``collscope-agent`` (also ``python -m collscope.nodeagent``): run the node agent, or export.

::

    collscope-agent [run] [--discovery directory --trace-root DIR] [--port 9464] ...
                    [--auth kubernetes|none] [--tls-cert-file F --tls-key-file F]
    collscope-agent export [--agent http://127.0.0.1:9464] [--since T] [--until T]
                           [--token-file F] [--cacert F] OUT.tar.gz

``run`` reads ``Settings.from_env(os.environ)`` (variables in ``settings.py``); flags override
them. Authentication (``kubernetes``, the default) needs a certificate; ``--auth none`` serves
anyone, for a demo on one machine. ``export`` asks a *running* agent over HTTP
(``GET /v1/export``) for a bundle-v1 of its window: only a running agent holds the window (rings
keep completions, not past live state), so that is the one way to get the evidence it sampled.
Times ``T``: ns since the epoch, ``now``, or relative, ``--since=-60s`` / ``--since=-5m`` (with
``=``: a bare ``-60s`` reads as a flag).
Exit status: 0 ok, 1 runtime error, 2 bad usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import pathlib
import re
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable, Sequence

import httpx

from collscope.nodeagent import agent, errors, hardware, logs, settings, version

log = logging.getLogger("collscope.nodeagent")
_REL = re.compile(r"^-(\d+(?:\.\d+)?)([smh])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}


# Builds the hardware sampler a ``run`` agent uses from its settings (``main(hardware=...)``):
# the node's by default, simulated GPUs and HCAs for the one-box (``onebox/hardware.py``).
HardwareFactory = Callable[[settings.Settings], hardware.Sampler]


def main(
    argv: Sequence[str] | None = None,
    *,
    hardware: HardwareFactory | None = None,
    proc_root: pathlib.Path = pathlib.Path("/proc"),
) -> int:
    """``collscope-agent``; ``hardware`` and ``proc_root`` replace the node's hardware and
    ``/proc`` for a ``run`` (the one-box's simulated nodes, ``onebox/nodeagent.py``)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "export":
            return _export(args)
        config = configure(args, dict(os.environ))
        logs.configure(config.log_level, config.log_format)
        return _run(args, config, hardware or agent.default_hardware, proc_root)
    except (errors.CollscopeError, httpx.HTTPError, OSError) as e:
        print(f"collscope-agent: {e}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="collscope-agent",
        description="Run the collscope node agent (sample this node's trace rings, serve its "
        "HTTP API), or export a running agent's window as a bundle.",
        epilog="Every run flag overrides its COLLSCOPE_* variable (settings.py); unset flags "
        "keep the variable's value, else the default shown.",
    )
    p.add_argument("--version", action="version", version=version.line("collscope-agent"))
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="sample the rings of this node and serve the HTTP API (the default)",
        description="Sample the trace rings of this node's training processes and serve the "
        "agent's HTTP API. Flags override the COLLSCOPE_* variables.",
    )
    _run_flags(run)
    _run_flags(p)  # `collscope-agent --port 1` == `collscope-agent run --port 1`
    ex = sub.add_parser(
        "export",
        help="save a running agent's window as a bundle-v1 .tar.gz",
        description="Ask a running agent (GET /v1/export) for a bundle-v1 of its window.",
    )
    ex.add_argument("--agent", default="http://127.0.0.1:9464", help="the agent's base URL")
    ex.add_argument("--since", default=None, help="ns, 'now' or '-60s' (default: all held)")
    ex.add_argument("--until", default=None, help="ns, 'now' or '-10s' (default: now)")
    ex.add_argument(
        "--timeout-s", type=float, default=60.0, help="seconds to wait for the bundle (60)"
    )
    ex.add_argument("--token-file", default=None, help="a bearer token to present (file)")
    ex.add_argument("--cacert", default=None, help="CA bundle verifying an https agent")
    ex.add_argument("out", type=pathlib.Path, help="the .tar.gz to write")
    return p


def _run_flags(p: argparse.ArgumentParser) -> None:
    d = settings.Settings()
    p.add_argument(
        "--discovery",
        choices=["kubelet", "directory"],
        default=argparse.SUPPRESS,
        help="find rings in the kubelet's pod volumes, or any *.ring under --trace-root "
        f"(COLLSCOPE_DISCOVERY; default: {d.discovery.mode})",
    )
    p.add_argument(
        "--kubelet-pods-dir",
        default=argparse.SUPPRESS,
        metavar="DIR",
        help="the kubelet's pod directory, kubelet --root-dir + /pods "
        f"(COLLSCOPE_KUBELET_PODS_DIR; default: {d.discovery.kubelet_pods_dir})",
    )
    p.add_argument(
        "--ring-volume",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help="the emptyDir volume holding a pod's rings "
        f"(COLLSCOPE_RING_VOLUME; default: {d.discovery.ring_volume})",
    )
    p.add_argument(
        "--trace-root",
        default=argparse.SUPPRESS,
        metavar="DIR",
        help="where --discovery directory looks for *.ring "
        f"(COLLSCOPE_TRACE_ROOT; default: {d.discovery.trace_root})",
    )
    p.add_argument(
        "--host",
        default=argparse.SUPPRESS,
        help=f"address to listen on (COLLSCOPE_LISTEN_HOST; default: {d.server.listen_host})",
    )
    p.add_argument(
        "--port",
        type=int,
        default=argparse.SUPPRESS,
        help=f"port to listen on (COLLSCOPE_LISTEN_PORT; default: {d.server.listen_port})",
    )
    p.add_argument(
        "--sample-interval-s",
        type=float,
        default=argparse.SUPPRESS,
        metavar="S",
        help="seconds between samples of every ring "
        f"(COLLSCOPE_SAMPLE_INTERVAL_S; default: {d.sampling.sample_interval_s:g})",
    )
    p.add_argument(
        "--window-s",
        type=float,
        default=argparse.SUPPRESS,
        metavar="S",
        help="seconds of records kept per rank "
        f"(COLLSCOPE_WINDOW_S; default: {d.window.window_s:g})",
    )
    p.add_argument(
        "--memory-cap-bytes",
        type=int,
        default=argparse.SUPPRESS,
        metavar="N",
        help="memory cap of the whole window "
        f"(COLLSCOPE_MEMORY_CAP_BYTES; default: {d.window.memory_cap_bytes})",
    )
    p.add_argument(
        "--node-name",
        default=argparse.SUPPRESS,
        help="this node's name (NODE_NAME; default: the host name)",
    )
    p.add_argument(
        "--no-hardware",
        action="store_true",
        default=argparse.SUPPRESS,
        help="sample no GPU or NIC counters (no NVML, no /sys reads)",
    )
    p.add_argument(
        "--auth",
        choices=["kubernetes", "none"],
        default=argparse.SUPPRESS,
        help="kubernetes: TokenReview + SubjectAccessReview for every call (needs TLS); none: "
        f"serve anyone, a demo on one machine (COLLSCOPE_AUTH; default: {d.auth.mode})",
    )
    p.add_argument(
        "--tls-cert-file",
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="serve https with this certificate (COLLSCOPE_TLS_CERT_FILE; default: plain http)",
    )
    p.add_argument(
        "--tls-key-file",
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="the certificate's private key (COLLSCOPE_TLS_KEY_FILE)",
    )
    p.add_argument(
        "--log-level",
        choices=logs.LEVELS,
        type=str.upper,
        default=argparse.SUPPRESS,
        help=f"least severe log lines kept (COLLSCOPE_LOG_LEVEL; default: {d.log_level})",
    )
    p.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=argparse.SUPPRESS,
        help=f"text, or one JSON object per line (COLLSCOPE_LOG_FORMAT; default: {d.log_format})",
    )


def configure(args: argparse.Namespace, env: dict[str, str]) -> settings.Settings:
    """Environment first, then the flags given (``SUPPRESS``: only those present)."""
    s = settings.Settings.from_env(env)
    f = vars(args)
    d = dataclasses.replace(
        s.discovery,
        **{
            k: f[k]
            for k in ("kubelet_pods_dir", "ring_volume", "trace_root")
            if k in f and f[k] is not None
        },
    )
    if "discovery" in f:
        d = dataclasses.replace(d, mode=f["discovery"])
    smp = s.sampling
    if "sample_interval_s" in f:
        smp = dataclasses.replace(smp, sample_interval_s=_positive("--sample-interval-s", f))
    win = s.window
    if "window_s" in f:
        win = dataclasses.replace(win, window_s=_positive("--window-s", f))
    if "memory_cap_bytes" in f:
        win = dataclasses.replace(win, memory_cap_bytes=int(_positive("--memory-cap-bytes", f)))
    srv = dataclasses.replace(
        s.server,
        **{n: f[k] for k, n in (("host", "listen_host"), ("port", "listen_port")) if k in f},
    )
    tls = dataclasses.replace(
        s.tls, **{k.removeprefix("tls_"): f[k] for k in ("tls_cert_file", "tls_key_file") if k in f}
    )
    auth = dataclasses.replace(s.auth, mode=f["auth"]) if "auth" in f else s.auth
    node = f.get("node_name", s.node_name)
    level = f.get("log_level", s.log_level)
    fmt = f.get("log_format", s.log_format)
    return settings.check(
        dataclasses.replace(
            s,
            node_name=node,
            log_level=level,
            log_format=fmt,
            discovery=d,
            sampling=smp,
            window=win,
            server=srv,
            tls=tls,
            auth=auth,
        )
    )


def _positive(flag: str, f: dict[str, object]) -> float:
    value = f[flag.lstrip("-").replace("-", "_")]
    assert isinstance(value, int | float)
    if value <= 0:
        raise errors.SettingsError(flag, str(value), "must be positive")
    return float(value)


def _run(
    args: argparse.Namespace,
    config: settings.Settings,
    make_hardware: HardwareFactory,
    proc_root: pathlib.Path,
) -> int:
    hw = None if getattr(args, "no_hardware", False) else make_hardware(config)
    a = agent.Agent(
        config,
        hardware_sampler=hw,
        stacks_dumper=agent.stacks_dumper(config.hardware.pyspy),
        fr_dumper=agent.fr_dumper(proc_root),
        proc_root=proc_root,
    )
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    a.start()
    host, port = a.server.address
    if config.auth.mode == "none":
        log.warning("authentication is off (--auth none): anyone who reaches the port may call it")
    where = (
        config.discovery.kubelet_pods_dir
        if config.discovery.mode == "kubelet"
        else config.discovery.trace_root
    )
    log.info(
        "serving on %s://%s:%d, %s discovery under %s",
        a.server.scheme,
        host,
        port,
        config.discovery.mode,
        where,
    )
    done.wait()
    a.stop()
    return 0


def parse_time(text: str | None, now_ns: int) -> int | None:
    """``T`` of the export flags -> ns since the epoch (None stays None)."""
    if text is None:
        return None
    if text == "now":
        return now_ns
    m = _REL.match(text)
    if m:
        return now_ns - int(float(m.group(1)) * _UNIT_S[m.group(2)] * 1e9)
    try:
        return int(text)
    except ValueError as e:
        raise errors.SettingsError("--since/--until", text, "ns, 'now' or like '-60s'") from e


def _export(args: argparse.Namespace) -> int:
    now = time.time_ns()
    params = {
        k: str(v)
        for k, v in (
            ("since", parse_time(args.since, now)),
            ("until", parse_time(args.until, now)),
        )
        if v is not None
    }
    url = args.agent.rstrip("/") + "/v1/export"
    headers = {}
    if args.token_file:
        headers["Authorization"] = "Bearer " + pathlib.Path(args.token_file).read_text().strip()
    verify: ssl.SSLContext | bool = True
    if args.cacert:
        verify = ssl.create_default_context(cafile=args.cacert)
    r = httpx.get(url, params=params, headers=headers, timeout=args.timeout_s, verify=verify)
    if r.status_code != 200:
        print(f"collscope-agent: {url}: HTTP {r.status_code}: {r.text}", file=sys.stderr)
        return 1
    out: pathlib.Path = args.out
    tmp = out.with_name(f".{out.name}.partial")
    tmp.write_bytes(r.content)
    tmp.replace(out)
    print(f"wrote {out} ({len(r.content)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
