"""Injection by sitecustomize: off by default, opt-out honoured, harmless without torch,
chains the image's own sitecustomize, and the probe never raises into the training code."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from collscope.nodeagent.probe import config, runtime

ROOT = Path(__file__).resolve().parents[4]
SITE = ROOT / "nodeagent" / "collscope" / "nodeagent" / "probe" / "site"
CHECK = (
    "import sys; from collscope.nodeagent.probe import install; "
    "print('armed' if 'settings' in install._state else 'off', "
    "any(type(f).__name__ == '_TorchFinder' for f in sys.meta_path))"
)


def _python(code: str, env: dict[str, str], extra_path: str = "") -> str:
    full = dict(os.environ)
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), extra_path) if p)
    res = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", res.stderr
    return res.stdout


def test_off_unless_collscope_probe_is_1(tmp_path: Path) -> None:
    assert _python(CHECK, {"COLLSCOPE_TRACE_DIR": str(tmp_path)}).split() == ["off", "False"]
    env = {"COLLSCOPE_PROBE": "0", "COLLSCOPE_TRACE_DIR": str(tmp_path)}  # opt-out
    assert _python(CHECK, env).split() == ["off", "False"]


def test_armed_waits_for_torch_and_import_errors_stay_normal(tmp_path: Path) -> None:
    env = {"COLLSCOPE_PROBE": "1", "COLLSCOPE_TRACE_DIR": str(tmp_path)}
    assert _python(CHECK, env).split() == ["armed", "True"]
    code = (
        "import importlib.util, sys\n"
        "try:\n    import collscope_no_such_module\nexcept ModuleNotFoundError:\n"
        "    print('normal')\n"
    )
    assert _python(code, env).strip() == "normal"


def test_chains_the_next_sitecustomize(tmp_path: Path) -> None:
    other = tmp_path / "image"
    other.mkdir()
    (other / "sitecustomize.py").write_text("print('image sitecustomize ran')\n")
    env = {"COLLSCOPE_PROBE": "1", "COLLSCOPE_TRACE_DIR": str(tmp_path)}
    assert "image sitecustomize ran" in _python("pass", env, extra_path=str(other))


def test_malformed_settings_switch_the_probe_off() -> None:
    on = {"COLLSCOPE_PROBE": "1", "COLLSCOPE_TRACE_DIR": "/tmp"}
    assert config.ProbeSettings.from_env(on).enabled
    assert not config.ProbeSettings.from_env({**on, "RANK": "x"}).enabled
    assert not config.ProbeSettings.from_env({**on, "COLLSCOPE_PROBE_ITERATIONS": "0"}).enabled
    assert not config.ProbeSettings.from_env({"COLLSCOPE_PROBE": "1"}).enabled  # nowhere to write


def test_probe_failures_never_reach_the_training_code(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    s = config.ProbeSettings(enabled=True, trace_dir=str(not_a_dir), cooldown_s=0)
    p = runtime.Probe(s, torch=None)  # no torch at all: profiling cannot start either
    for i in range(80):
        p.on_event("next")
        if i > 60:
            time.sleep(0.002)  # slower iterations: degradation, a request to an unusable dir
        p.on_event("step")
    assert p.detector.iterations >= 50  # it got as far as judging degradation
    assert not p.enabled  # it switched itself off instead of raising
