"""podcontract: the one list of names the webhook writes into a pod and the agent, the plugin
and the probe read back; each reader is checked against it here."""

from __future__ import annotations

import pathlib

import jsonpatch

from collscope.nodeagent import podcontract, settings
from collscope.operator.domain import injection

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_the_agent_looks_where_the_webhook_puts_the_rings() -> None:
    d = settings.Settings.from_env({}).discovery
    assert (d.ring_volume, d.trace_root) == (podcontract.TRACE_VOLUME, podcontract.TRACE_DIR)
    assert settings.Settings.from_env({"NODE_NAME": "gpu-7"}).node_name == "gpu-7"


def test_the_plugin_reads_the_variables_the_webhook_sets() -> None:
    source = "".join(p.read_text() for p in (ROOT / "native" / "src").glob("*.c"))
    names = [
        podcontract.TRACE_DIR_ENV,
        podcontract.RING_BYTES_ENV,
        podcontract.NEXT_PLUGIN_ENV,
        *(name for name, _ in podcontract.DOWNWARD_API),
    ]
    for name in names:
        assert f'getenv("{name}")' in source, name


def test_the_probe_reads_the_variables_the_webhook_sets() -> None:
    # Wherever the probe's package lives, its site directory is the one with collscope_probe.
    site = next(ROOT.glob("nodeagent/**/site/collscope_probe.py")).parent
    source = "".join(p.read_text() for p in site.glob("*.py"))
    for name in (podcontract.PROBE_ENV, podcontract.TRACE_DIR_ENV):
        assert f'"{name}"' in source, name
    assert f'"{podcontract.PROBE_DORMANT}"' in source


def test_an_injected_pod_carries_the_contract() -> None:
    pod = {
        "metadata": {"name": "p", "annotations": {"collscope.dev/diagnose": "true"}},
        "spec": {"containers": [{"name": "trainer", "image": "t"}]},
    }
    out = jsonpatch.apply_patch(pod, injection.patch(pod, injection.InjectionSettings()))
    (volume,) = [v for v in out["spec"]["volumes"] if v["name"] == podcontract.TRACE_VOLUME]
    assert volume["emptyDir"]["medium"] == "Memory"
    (trainer,) = out["spec"]["containers"]
    env = {e["name"]: e for e in trainer["env"]}
    assert env[podcontract.TRACE_DIR_ENV]["value"] == podcontract.TRACE_DIR
    for name, path in podcontract.DOWNWARD_API:
        assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == path
    assert env[podcontract.FR_PIPE_ENV]["value"].startswith(podcontract.TRACE_DIR + "/")
    mounts = {m["name"]: m["mountPath"] for m in trainer["volumeMounts"]}
    assert mounts[podcontract.TRACE_VOLUME] == podcontract.TRACE_DIR
