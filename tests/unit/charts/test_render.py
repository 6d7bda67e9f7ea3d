"""The rendered chart: ``helm lint`` clean, every object valid against the Kubernetes OpenAPI
schemas (kubernetes-validate, strict: unknown fields fail), and wired the way the code expects
(env read by the settings modules, the webhook path, the ring volume, the plugin image)."""

from __future__ import annotations

import copy
import datetime
import shutil
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml

from collscope.nodeagent import podcontract
from collscope.nodeagent import settings as agent_settings
from collscope.operator.controller import webhook
from collscope.operator.domain import injection, owners, policy, remediation, settings

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest the validator
# knows. A variant may need a newer one (the appArmorProfile field arrived in 1.30).
K8S_VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]
NEEDS = {"apparmor": "1.30.0"}
# Kinds whose schema is not Kubernetes': checked against their CRD here or by name only.
NOT_CORE = {"ClusterKopfPeering", "Issuer", "Certificate", "ServiceMonitor"}

VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "standby": {"operator": {"standby": {"enabled": True}}},
    "cert-manager": {"webhook": {"tls": "certManager"}, "agent": {"tls": "certManager"}},
    "agent-plain": {"agent": {"tls": "disabled", "auth": {"enabled": False}}},
    "agent-port": {"agent": {"port": 19464}},
    "nvml-host-driver": {"agent": {"nvml": {"mode": "hostDriver"}}},
    "no-webhook": {"webhook": {"enabled": False}, "agent": {"nvml": {"mode": "none"}}},
    "monitoring": {"metrics": {"serviceMonitor": {"enabled": True}}},
    "apparmor": {"agent": {"appArmorProfile": {"type": "Unconfined"}}},
    "digests": {
        "operator": {"image": {"digest": "sha256:" + "a" * 64}, "logFormat": "json"},
        "agent": {"image": {"digest": "sha256:" + "b" * 64}, "logLevel": "DEBUG"},
    },
}


def test_chart_structure(chart: Any) -> None:
    meta = yaml.safe_load((chart.dir / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2" and meta["name"] == "collscope"
    for name in ("values.yaml", "values.schema.json", "templates/_helpers.tpl"):
        assert (chart.dir / name).is_file(), name
    assert sorted(p.name for p in (chart.dir / "crds").glob("*.yaml"))


def test_helm_lint_is_clean(chart: Any) -> None:
    lint = pytest.importorskip("helm_python.chart", reason="helm-python-sdk missing").lint
    report = lint(str(chart.dir), strict=True, namespace=chart.namespace)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == []


@pytest.mark.skipif(shutil.which("helm") is None, reason="no `helm` binary on the PATH")
def test_helm_binary_lints_and_renders(chart: Any) -> None:
    commands = [
        ["helm", "lint", "--strict", str(chart.dir)],
        ["helm", "template", "collscope", str(chart.dir), "-n", chart.namespace],
    ]
    for cmd in commands:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
    # webhook.tls "auto" picks cert-manager when the cluster serves it (not testable offline
    # with the SDK, which cannot set capabilities).
    cmd = [*commands[1], "--api-versions", "cert-manager.io/v1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
    kinds = {d["kind"] for d in yaml.safe_load_all(out.stdout) if d}
    assert "Certificate" in kinds and "Secret" not in kinds


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_objects_are_valid(chart: Any, variant: str, version: str) -> None:
    docs = chart.render(VARIANTS[variant])
    assert docs
    newer = NEEDS.get(variant, version)
    version = max(version, newer, key=lambda v: tuple(int(x) for x in v.split(".")))
    for doc in docs:
        if doc["kind"] in NOT_CORE:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {e.message} at {e.path}")


def test_validator_rejects_what_the_api_server_would(chart: Any) -> None:
    """The check above can fail: an unknown field and a wrong type are caught."""
    deploy = chart.find(chart.render(), "Deployment")
    typo = copy.deepcopy(deploy)
    typo["spec"]["template"]["spec"]["hostPid"] = True
    wrong = copy.deepcopy(deploy)
    wrong["spec"]["replicas"] = "one"
    for bad in (typo, wrong):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)


def test_crds_are_valid(chart: Any) -> None:
    for path in sorted((chart.dir / "crds").glob("*.yaml")):
        kubernetes_validate.validate(yaml.safe_load(path.read_text()), K8S_VERSIONS[0], True)


def test_peering_object_matches_its_crd(chart: Any) -> None:
    docs = chart.render(VARIANTS["standby"])
    peering = chart.find(docs, "ClusterKopfPeering")
    crd = yaml.safe_load((chart.dir / "crds/kopf.dev_clusterkopfpeerings.yaml").read_text())
    assert peering["apiVersion"] == f"{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}"
    # Our own peering object, named to every replica: kopf's shared "default" would let
    # another kopf operator's replicas pause ours.
    assert peering["metadata"]["name"] != "default"
    for d in [d for d in docs if d["kind"] == "Deployment"]:
        env = chart.env(d["spec"]["template"]["spec"]["containers"][0])
        assert env["COLLSCOPE_PEERING"] == peering["metadata"]["name"]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    priorities = {chart.env(d["spec"]["template"]["spec"]["containers"][0])["COLLSCOPE_PRIORITY"]
                  for d in deployments}  # fmt: skip
    assert len(deployments) == 2 and len(priorities) == 2, "replicas need distinct priorities"


def test_cert_manager_objects(chart: Any) -> None:
    docs = chart.render(VARIANTS["cert-manager"])
    cert = chart.find(docs, "Certificate", "collscope-webhook")
    hook = chart.find(docs, "MutatingWebhookConfiguration")
    deploy = chart.find(docs, "Deployment")
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    assert cert["spec"]["secretName"] == volumes["webhook-tls"]["secret"]["secretName"]
    issuer = chart.find(docs, "Issuer", "collscope-webhook")
    assert cert["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    ns, name = hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    assert (ns, name) == (cert["metadata"]["namespace"], cert["metadata"]["name"])
    assert "caBundle" not in hook["webhooks"][0]["clientConfig"]
    assert not [d for d in docs if d["kind"] == "Secret"]


def test_operator_env_is_read_by_the_operator(chart: Any) -> None:
    docs = chart.render()
    container = chart.find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = chart.env(container)
    config = settings.Settings.from_env(env)
    values = chart.values()
    assert config.namespace == chart.namespace
    # operator.agentURL empty: https at the node's IP and agent.port, verified and with a token
    assert values["operator"]["agentURL"] == ""
    assert config.agents.url_template == f"https://{{node_ip}}:{values['agent']['port']}"
    assert config.agents.server_name == "collscope-agent.collscope-system.svc"
    # ... the token presented is a projected one for the agents' audience only
    assert config.agents.token_file == "/var/run/secrets/collscope.dev/agent-token/token"
    assert config.remediation == policy.RemediationPolicy.from_values(values["remediation"])
    assert config.breaker.max_fraction == values["breaker"]["maxFraction"]
    assert config.webhook_port == values["webhook"]["port"]
    assert config.injection.image == "ghcr.io/collscope/collscope-agent:0.1.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": config.metrics_port, "health": config.health_port,
                     "webhook": config.webhook_port}  # fmt: skip
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["webhook-tls"]
    assert config.webhook_cert_dir == mount
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert config.agents.ca_file == mounts["agent-ca"] + "/ca.crt"
    pod = chart.find(docs, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    # the agents' CA only, never their key
    only_ca = [{"key": "ca.crt", "path": "ca.crt"}]
    assert volumes["agent-ca"]["secret"] == {"secretName": "collscope-agent-tls", "items": only_ca}


def test_the_operator_presents_a_token_for_the_agents_audience_only(chart: Any) -> None:
    docs = chart.render()
    pod = chart.find(docs, "Deployment")["spec"]["template"]["spec"]
    op = settings.Settings.from_env(chart.env(pod["containers"][0]))
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    volume = {v["name"]: v for v in pod["volumes"]}["agent-token"]
    assert op.agents.token_file == mounts["agent-token"]["mountPath"] + "/token"
    [source] = volume["projected"]["sources"]
    sat = source["serviceAccountToken"]
    assert sat["path"] == "token" and sat["expirationSeconds"] == 3600
    ds = chart.find(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    agent = agent_settings.Settings.from_env(chart.env(ds))
    assert agent.auth.audiences == (sat["audience"],) == ("collscope-agent",)
    # Without an audience (or without auth): the operator's ordinary token, no projection.
    for values in ({"agent": {"auth": {"enabled": True, "audience": ""}}},
                   VARIANTS["agent-plain"]):  # fmt: skip
        docs = chart.render(values)
        pod = chart.find(docs, "Deployment")["spec"]["template"]["spec"]
        op = settings.Settings.from_env(chart.env(pod["containers"][0]))
        assert op.agents.token_file.endswith("/serviceaccount/token")
        assert "agent-token" not in {v["name"] for v in pod["volumes"]}
        ds = chart.find(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
        assert agent_settings.Settings.from_env(chart.env(ds)).auth.audiences == ()
    with pytest.raises(Exception, match="audience"):
        chart.render({"agent": {"auth": {"enabled": True, "audience": "a,b"}}})


def test_agent_env_is_read_by_the_agent(chart: Any) -> None:
    docs = chart.render()
    ds = chart.find(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    container = pod["containers"][0]
    config = agent_settings.Settings.from_env(chart.env(container))
    # The agent finds the rings in the volume the webhook injects, under the mounted kubelet dir.
    assert config.discovery.ring_volume == podcontract.TRACE_VOLUME
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    kubelet = mounts["kubelet-pods"]
    assert kubelet["mountPath"] == config.discovery.kubelet_pods_dir
    assert kubelet["readOnly"] and kubelet["mountPropagation"] == "HostToContainer"
    assert mounts["host-sys"]["readOnly"] and config.hardware.sys_root == "/host/sys"
    # The operator reaches the agent at the node IP and the default port, over TLS, with a token
    # the agent reviews; the agent binds the node's address only.
    assert pod["hostNetwork"] and pod["hostPID"]
    assert config.server.listen_port == 9464 == settings.DEFAULT_AGENT_PORT
    host = {e["name"]: e for e in container["env"]}["COLLSCOPE_LISTEN_HOST"]
    assert host["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert agent_settings.check(config).auth.mode == "kubernetes"
    assert config.tls.cert_file == mounts["agent-tls"]["mountPath"] + "/tls.crt"
    assert pod["automountServiceAccountToken"] is True
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] and "SYS_PTRACE" in sc["capabilities"]["add"]
    assert pod["runtimeClassName"] == "nvidia"
    assert container["resources"]["limits"] and container["resources"]["requests"]


def test_webhook_points_at_the_kopf_handler(chart: Any) -> None:
    docs = chart.render()
    hook = chart.find(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    svc = hook["clientConfig"]["service"]
    assert svc["path"] == f"/{webhook.HANDLER_ID}"
    assert hook["failurePolicy"] == "Ignore"
    service = chart.find(docs, "Service", svc["name"])
    port = {p["port"]: p["targetPort"] for p in service["spec"]["ports"]}[svc["port"]]
    assert port == "webhook"
    assert chart.namespace in hook["namespaceSelector"]["matchExpressions"][0]["values"]
    secret = chart.find(docs, "Secret", "collscope-webhook-tls")
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]


def test_webhook_is_called_for_opted_in_pods_only(chart: Any) -> None:
    """The API server calls the webhook only for pods carrying the opt-in annotation (a CEL
    matchCondition, GA from Kubernetes 1.28: the chart's floor), read as ``owners.is_opted_in``
    reads it: the value ``true`` in any case. No CEL evaluator is installed here, so the
    expression is checked for the parts that carry that meaning."""
    meta = yaml.safe_load((chart.dir / "Chart.yaml").read_text())
    assert meta["kubeVersion"] == ">=1.28.0-0" and K8S_VERSIONS[0] == "1.28.0"
    hook = chart.find(chart.render(), "MutatingWebhookConfiguration")["webhooks"][0]
    (cond,) = hook["matchConditions"]
    expr = " ".join(cond["expression"].split())
    key = owners.OPT_IN_ANNOTATION
    assert expr == (
        f"has(object.metadata.annotations) && '{key}' in object.metadata.annotations && "
        f"object.metadata.annotations['{key}'].lowerAscii() == 'true'"
    )
    assert owners.is_opted_in({"annotations": {key: "TRUE"}})
    assert not owners.is_opted_in({"annotations": {key: "yes"}})


def test_injected_pod_is_valid() -> None:
    """The webhook's patch applied to a typical pod yields a valid Pod (the Deployment of the
    chart is checked above; this checks what the operator writes into user pods)."""
    import jsonpatch

    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "t-0", "namespace": "ml",
                     "annotations": {"collscope.dev/diagnose": "true"}},
        "spec": {"containers": [{"name": "train", "image": "pytorch:2",
                                 "env": [{"name": "RANK", "value": "0"}]}]},
    }  # fmt: skip
    patched = jsonpatch.apply_patch(pod, injection.patch(pod, injection.InjectionSettings()))
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(patched, version, strict=True)


def test_remediated_node_is_valid() -> None:
    """A Node after the cordon patch the remediator sends, and after its undo."""
    import jsonpatch

    meta = {"name": "gpu-1", "labels": {"a": "b"}}
    node: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": {}}
    ops = remediation.plan(node, "ml/diag-1", "hang.gpu", datetime.datetime.now(datetime.UTC))
    marked = jsonpatch.apply_patch(copy.deepcopy(node), ops)
    kubernetes_validate.validate(marked, K8S_VERSIONS[0], strict=True)
    assert marked["spec"]["unschedulable"] is True
    undone = jsonpatch.apply_patch(marked, remediation.undo(marked))
    kubernetes_validate.validate(undone, K8S_VERSIONS[0], strict=True)


def test_the_agent_port_is_honoured_everywhere(chart: Any) -> None:
    docs = chart.render(VARIANTS["agent-port"])
    ds = chart.find(docs, "DaemonSet")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    assert agent_settings.Settings.from_env(chart.env(container)).server.listen_port == 19464
    assert [p["containerPort"] for p in container["ports"]] == [19464]
    svc = chart.find(docs, "Service", "collscope-agent")
    assert [p["port"] for p in svc["spec"]["ports"]] == [19464]
    op = chart.find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert settings.Settings.from_env(chart.env(op)).agents.url_template == (
        "https://{node_ip}:19464"
    )


def test_plain_agent_only_without_auth(chart: Any) -> None:
    docs = chart.render(VARIANTS["agent-plain"])
    op = chart.find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert settings.Settings.from_env(chart.env(op)).agents.url_template.startswith("http://")
    ds = chart.find(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert agent_settings.check(agent_settings.Settings.from_env(chart.env(ds))).auth.mode == "none"
    assert not [d for d in docs if d["kind"] == "Secret" and "agent" in d["metadata"]["name"]]
    with pytest.raises(Exception, match=r"agent\.auth\.enabled needs agent\.tls"):
        chart.render({"agent": {"tls": "disabled"}})


def test_agent_certificate_names_what_the_operator_checks(chart: Any) -> None:
    docs = chart.render(VARIANTS["cert-manager"])
    cert = chart.find(docs, "Certificate", "collscope-agent")
    op = chart.find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    name = settings.Settings.from_env(chart.env(op)).agents.server_name
    assert name in cert["spec"]["dnsNames"] and cert["spec"]["secretName"] == "collscope-agent-tls"
    # the leaf comes from a CA of its own: renewing it keeps ca.crt, which the operator trusts
    ca_issuer = chart.find(docs, "Issuer", cert["spec"]["issuerRef"]["name"])
    ca = chart.find(docs, "Certificate", ca_issuer["spec"]["ca"]["secretName"])
    assert ca["spec"]["isCA"] is True
    monitor = chart.render({"metrics": {"serviceMonitor": {"enabled": True}}})
    ep = chart.find(monitor, "ServiceMonitor", "collscope-agent")["spec"]["endpoints"][0]
    assert ep["scheme"] == "https" and ep["tlsConfig"]["serverName"] == name
    assert ep["tlsConfig"]["ca"]["secret"] == {"name": "collscope-agent-tls", "key": "ca.crt"}
    assert ep["bearerTokenFile"].endswith("/serviceaccount/token")


def test_images_by_digest_when_set(chart: Any) -> None:
    docs = chart.render(VARIANTS["digests"])
    operator = chart.find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    agent = chart.find(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert operator["image"] == "ghcr.io/collscope/collscope-operator@sha256:" + "a" * 64
    assert agent["image"] == "ghcr.io/collscope/collscope-agent@sha256:" + "b" * 64
    # the plugin's init container copies from the agent image, by the same digest
    config = settings.Settings.from_env(chart.env(operator))
    assert config.injection.image == agent["image"]
    assert config.log_format == "json"
    assert agent_settings.Settings.from_env(chart.env(agent)).log_level == "DEBUG"
    # by tag otherwise (the chart's appVersion)
    docs = chart.render()
    operator = chart.find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert operator["image"] == "ghcr.io/collscope/collscope-operator:0.1.0"
