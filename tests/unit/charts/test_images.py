"""The Dockerfiles agree with the code and the chart: the plugin lands where the webhook's init
container copies it from, the commands are the project's console scripts, the ports are the
settings' defaults, and the build context keeps what the COPY lines need. (No image is built
here: the machines have no Docker daemon.)"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from collscope.nodeagent import settings as agent_settings
from collscope.operator.domain import injection, settings

ROOT = Path(__file__).resolve().parents[3]


def dockerfile(component: str) -> str:
    return (ROOT / component / "Dockerfile").read_text()


def stages(text: str) -> list[str]:
    """The text of each build stage (split at FROM)."""
    return re.split(r"^FROM ", text, flags=re.M)[1:]


def copies(text: str) -> list[str]:
    """Sources of the COPY lines that read the build context (not --from=)."""
    out: list[str] = []
    for m in re.finditer(r"^COPY (?!.*--from)(.+?)\s+\S+\s*$", text, flags=re.M):
        out += m.group(1).split()
    return out


def test_agent_image_holds_the_plugin_where_the_webhook_copies_from() -> None:
    text = dockerfile("nodeagent")
    dest = re.search(r"^COPY --from=plugin .*?(\S+)\s*\\?\s*\n\s*(\S+)\s*$", text, re.M)
    assert dest, "no COPY of the plugin from its build stage"
    assert dest.group(2) == injection.InjectionSettings().image_plugin_path
    assert dest.group(1).endswith("/" + injection.PLUGIN_FILE)
    makefile = (ROOT / "native" / "Makefile").read_text()
    assert f"LIB_NAME := {injection.PLUGIN_FILE}" in makefile
    assert "make -C native" in text


def test_init_container_command_exists_in_the_agent_image() -> None:
    # The injected init container runs `cp` from this image: the final base must have a shell
    # userland (python slim does; distroless or scratch would not).
    final = stages(dockerfile("nodeagent"))[-1]
    assert final.startswith("${PYTHON_IMAGE}")
    assert re.search(r"^ARG PYTHON_IMAGE=python:[\d.]+-slim", dockerfile("nodeagent"), re.M)
    assert injection.init_container(injection.InjectionSettings())["command"][0] == "cp"


SCRIPTS = [("operator", "collscope-operator"), ("nodeagent", "collscope-agent")]


@pytest.mark.parametrize(("component", "script"), SCRIPTS)
def test_commands_are_console_scripts(component: str, script: str) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    cmd = re.findall(r'^CMD \["([^"]+)"', dockerfile(component), re.M)
    assert cmd == [script] and script in scripts
    assert len(stages(dockerfile(component))) >= 2, "multi-stage: build and runtime apart"


def test_exposed_ports_are_the_defaults() -> None:
    op = settings.Settings()
    exposed = re.findall(r"^EXPOSE (.+)$", dockerfile("operator"), re.M)
    assert exposed == [f"{op.metrics_port} {op.health_port} 9443"]
    agent = agent_settings.ServerSettings()
    assert re.findall(r"^EXPOSE (.+)$", dockerfile("nodeagent"), re.M) == [str(agent.listen_port)]


def test_operator_image_runs_as_the_charts_user() -> None:
    chart = (ROOT / "charts/collscope/templates/operator-deployment.yaml").read_text()
    uid = re.search(r"runAsUser: (\d+)", chart)
    assert uid and f"USER {uid.group(1)}:" in dockerfile("operator")


def test_build_context_keeps_what_copy_needs() -> None:
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]  # fmt: skip
    for must_go in (".venv", "native/build", ".git"):
        assert must_go in patterns
    for component in ("operator", "nodeagent"):
        for src in copies(dockerfile(component)):
            if src.startswith("--"):
                continue
            path = src.rstrip("/")
            assert (ROOT / path).exists(), src
            assert not any(fnmatch.fnmatch(path, p) or path.startswith(p + "/")
                           for p in patterns), f"{src} is excluded by .dockerignore"  # fmt: skip


def test_versions_agree() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts/collscope/Chart.yaml").read_text())
    assert chart["appVersion"] == version
    assert injection.InjectionSettings().image.endswith(f"/collscope-agent:{version}")
