"""The webhook's probe part: PYTHONPATH prepended when the container sets it, set only when the
pod says the image has none (``collscope.dev/probe: "on"``), opt-out, valueFrom left alone, and
a second pass changes nothing; the init container copies the probe beside the plugin."""

from __future__ import annotations

from typing import Any

import jsonpatch

from collscope.operator.domain import injection

SETTINGS = injection.InjectionSettings(image="registry.local/collscope:test")
PROBE = "/opt/collscope-plugin/probe"


def pod(annotations: dict[str, str], env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "trainer", "image": "pytorch"}
    if env is not None:
        c["env"] = env
    return {"metadata": {"name": "p", "annotations": {"collscope.dev/diagnose": "true",
                                                      **annotations}},
            "spec": {"containers": [c]}}  # fmt: skip


def inject(obj: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = jsonpatch.apply_patch(obj, injection.patch(obj, SETTINGS))
    assert injection.patch(out, SETTINGS) == []  # idempotent
    return out


def env_of(p: dict[str, Any]) -> dict[str, Any]:
    c = p["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def test_the_probe_directory_is_where_the_init_container_copies_it() -> None:
    assert SETTINGS.probe_dir == PROBE
    cmd = injection.init_container(SETTINGS)["command"]
    assert cmd[:2] == ["cp", "-R"] and SETTINGS.image_probe_dir in cmd
    assert cmd[-1] == "/opt/collscope-plugin/"


def test_an_existing_pythonpath_is_prepended() -> None:
    env = env_of(inject(pod({}, [{"name": "PYTHONPATH", "value": "/app:/lib"}])))
    assert env["PYTHONPATH"] == f"{PROBE}:/app:/lib"
    assert env["COLLSCOPE_PROBE"] == "dormant"


def test_without_a_pythonpath_only_when_the_pod_says_on() -> None:
    env = env_of(inject(pod({})))  # the image may set one the webhook cannot see: leave it
    assert "PYTHONPATH" not in env and "COLLSCOPE_PROBE" not in env
    env = env_of(inject(pod({"collscope.dev/probe": "on"})))
    assert env["PYTHONPATH"] == PROBE and env["COLLSCOPE_PROBE"] == "dormant"


def test_opt_out_and_value_from() -> None:
    env = env_of(inject(pod({"collscope.dev/probe": "off"}, [{"name": "PYTHONPATH",
                                                               "value": "/app"}])))  # fmt: skip
    assert env["PYTHONPATH"] == "/app" and "COLLSCOPE_PROBE" not in env
    ref = {"configMapKeyRef": {"name": "cm", "key": "pp"}}
    env = env_of(inject(pod({"collscope.dev/probe": "on"}, [{"name": "PYTHONPATH",
                                                              "valueFrom": ref}])))  # fmt: skip
    assert env["PYTHONPATH"] == ref and "COLLSCOPE_PROBE" not in env
