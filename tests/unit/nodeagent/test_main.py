"""``python -m collscope.nodeagent``: a real agent process, its HTTP API, and SIGTERM."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import httpx

from collscope.nodeagent import api


def test_agent_process_serves_and_stops_on_sigterm(tmp_path: pathlib.Path) -> None:
    env = dict(os.environ, NODE_NAME="node-a", COLLSCOPE_LISTEN_HOST="127.0.0.1")
    cmd = [sys.executable, "-m", "collscope.nodeagent", "run", "--discovery", "directory",
           "--trace-root", str(tmp_path), "--port", "0", "--auth", "none"]  # fmt: skip
    log = tmp_path / "agent.log"  # a file, not a pipe: a chatty agent never blocks on it
    with log.open("w") as err, subprocess.Popen(cmd, env=env, stderr=err) as p:
        try:
            deadline = time.monotonic() + 20
            m = None
            while m is None:
                assert p.poll() is None and time.monotonic() < deadline, log.read_text()
                m = re.search(r"serving on (http://[\d.]+:\d+)", log.read_text())
                time.sleep(0.05)
            with httpx.Client(base_url=m.group(1), timeout=5) as c:
                body = api.RanksResponse.model_validate_json(c.get("/v1/ranks").content)
                assert body.node == "node-a" and body.ranks == []
                hw = api.HardwareResponse.model_validate_json(c.get("/v1/hardware").content)
                assert hw.node == "node-a" and hw.sources  # the real sources, each listed
                assert c.get("/livez").status_code == 200
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=10) == 0
        finally:
            if p.poll() is None:
                p.kill()


def test_bad_environment_exits_naming_the_variable(tmp_path: pathlib.Path) -> None:
    env = dict(os.environ, COLLSCOPE_WINDOW_S="soon")
    r = subprocess.run(
        [sys.executable, "-m", "collscope.nodeagent", "--trace-root", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 1 and "COLLSCOPE_WINDOW_S='soon'" in r.stderr
