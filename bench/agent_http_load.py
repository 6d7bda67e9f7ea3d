"""The node agent's HTTP server under load (issue 15 item 4): slowloris, 200 concurrent
clients, and the operator's pulls beside them. Not a CI test: it takes about a minute and its
numbers depend on the machine.

A real agent process (``collscope-agent run``) with no rings (the server is measured, not the
window) serves HTTPS. It runs with ``--auth none``: an operator's request with authorization on
costs one cache lookup more (reviews are cached 60 s), and there is no API server here. The load
runs in this process on asyncio, in three groups:

- slowloris: ``--slowloris`` connections that send a request line and then one header line
  every 2 s, never the end; 100 per source address (127.0.0.2, .3, ...), under the per-peer cap;
  the server drops each at its idle timeout, and the bench opens it again, for the whole run;
- ``--clients`` concurrent clients, each on its own connection, asking ``/v1/window`` and
  ``/v1/summaries`` back to back for the whole run;
- the operator: one kept-alive client asking ``/v1/summaries`` every second, as the trigger
  loop does (agent timeout 1 s). Its latencies are the result.

    .venv/bin/python bench/agent_http_load.py [--seconds 30] [--clients 200] [--slowloris 300]

Prints the operator's pulls (answered, within 1 s, p50/p99/max), the concurrent clients'
requests answered and failed, and the slowloris connections that were dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import pathlib
import platform
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

import httpx


def certificate(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        sys.exit("agent_http_load: the openssl command is needed for a test certificate")
    crt, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", "/CN=agent",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return crt, key


@dataclasses.dataclass
class Load:
    host: str
    port: int
    ctx: ssl.SSLContext
    stop: asyncio.Event
    dropped: int = 0
    counts: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"


async def slowloris(load: Load, source: str) -> None:
    while not load.stop.is_set():
        try:
            _, w = await asyncio.open_connection(
                load.host, load.port, ssl=load.ctx, local_addr=(source, 0),
                server_hostname="127.0.0.1",
            )  # fmt: skip
        except OSError:
            await asyncio.sleep(0.5)
            continue
        try:
            w.write(b"GET /v1/ranks HTTP/1.1\r\nHost: agent\r\n")
            i = 0
            while not load.stop.is_set():
                await asyncio.sleep(2.0)
                w.write(f"X-Slow-{i}: y\r\n".encode())
                await w.drain()
                i += 1
        except (OSError, ConnectionError):
            load.dropped += 1
        finally:
            w.close()


async def client(load: Load, source: str) -> None:
    """One client on its own connection from ``source`` (clients spread over addresses like
    pods on a node: the per-peer cap is for one pod, not for a whole node)."""
    transport = httpx.AsyncHTTPTransport(verify=load.ctx, local_address=source)
    headers = {"Authorization": "Bearer bench"}
    async with httpx.AsyncClient(
        base_url=load.url, timeout=30, transport=transport, headers=headers
    ) as c:
        i = 0
        while not load.stop.is_set():
            path = "/v1/window" if i % 2 else "/v1/summaries"
            i += 1
            try:
                r = await c.get(path)
                key = "ok" if r.status_code == 200 else f"http {r.status_code}"
            except httpx.HTTPError as e:
                key = type(e).__name__
            load.counts[key] = load.counts.get(key, 0) + 1


async def operator(url: str, ctx: ssl.SSLContext, stop: asyncio.Event, lat: list[float]) -> int:
    failed = 0
    headers = {"Authorization": "Bearer operator"}
    async with httpx.AsyncClient(base_url=url, verify=ctx, timeout=1.0, headers=headers) as c:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                r = await c.get("/v1/summaries", params={"window_s": "5"})
                if r.status_code == 200:
                    lat.append(time.monotonic() - t0)
                else:
                    failed += 1
            except httpx.HTTPError:
                failed += 1
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    return failed


async def run(host: str, port: int, ctx: ssl.SSLContext, args: argparse.Namespace) -> None:
    load = Load(host, port, ctx, asyncio.Event())
    lat: list[float] = []
    tasks = [
        asyncio.create_task(slowloris(load, f"127.0.0.{2 + i // 100}"))
        for i in range(args.slowloris)
    ]
    tasks += [
        asyncio.create_task(client(load, f"127.0.1.{1 + i // 100}")) for i in range(args.clients)
    ]
    await asyncio.sleep(2.0)  # everyone connected
    op = asyncio.create_task(operator(load.url, ctx, load.stop, lat))
    await asyncio.sleep(args.seconds)
    load.stop.set()
    failed = await op
    await asyncio.wait(tasks, timeout=40)
    pulls = len(lat) + failed
    within = sum(1 for x in lat if x <= 1.0)
    print(f"operator pulls: {pulls}, answered {len(lat)}, within 1 s {within}, failed {failed}; "
          f"median {1e3 * statistics.median(lat):.1f} ms, max {1e3 * max(lat):.1f} ms")  # fmt: skip
    others = ", ".join(f"{k} {v}" for k, v in sorted(load.counts.items()))
    print(f"{args.clients} concurrent clients over {args.seconds:g} s: {others}")
    print(f"{args.slowloris} slowloris connections: {load.dropped} drops by the server")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--slowloris", type=int, default=300)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        crt, key = certificate(root)
        (root / "trace").mkdir()
        log = root / "agent.log"
        cmd = [sys.executable, "-m", "collscope.nodeagent", "run", "--discovery", "directory",
               "--trace-root", str(root / "trace"), "--host", "127.0.0.1", "--port", "0",
               "--no-hardware", "--auth", "none", "--tls-cert-file", str(crt),
               "--tls-key-file", str(key)]  # fmt: skip
        with log.open("w") as out, subprocess.Popen(cmd, stderr=out) as agent_proc:
            try:
                deadline = time.monotonic() + 30
                while not (m := re.search(r"serving on https://([\d.]+):(\d+)", log.read_text())):
                    if agent_proc.poll() is not None or time.monotonic() > deadline:
                        sys.exit(f"agent_http_load: the agent did not start:\n{log.read_text()}")
                    time.sleep(0.1)
                host, port = m.group(1), int(m.group(2))
                ctx = ssl.create_default_context(cafile=str(crt))
                print(f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, "
                      f"Python {platform.python_version()}; agent process at "
                      f"https://{host}:{port}")  # fmt: skip
                asyncio.run(run(host, port, ctx, args))
            finally:
                agent_proc.terminate()
                agent_proc.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
