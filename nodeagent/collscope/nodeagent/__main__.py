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

from collscope.nodeagent import agent, envsettings, errors, hardware, logs, settings, version

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
    defaults = settings.Settings()
    for var in settings.VARIABLES:
        if var.flag:
            envsettings.add_flag(p, var, defaults)
        if var.flag == "--node-name":
            p.add_argument(
                "--no-hardware",
                action="store_true",
                default=argparse.SUPPRESS,
                help="sample no GPU or NIC counters (no NVML, no /sys reads)",
            )


def configure(args: argparse.Namespace, env: dict[str, str]) -> settings.Settings:
    """Environment first, then the flags given (``SUPPRESS``: only those present), each checked
    as its variable is."""
    config = settings.Settings.from_env(env)
    return settings.check(envsettings.overrides(config, settings.VARIABLES, args))


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
