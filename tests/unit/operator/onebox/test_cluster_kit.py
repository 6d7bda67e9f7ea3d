"""What ``tests/e2e/test_cluster.py`` would do to a cluster, checked with no cluster.

The workload manifests (``examples/workload/workload.yaml`` filled in) are valid Kubernetes
objects (kubernetes-validate, strict), opt their pods in, stay valid once the webhook injected
them, and hand the launcher an environment it accepts; the kind values validate against the
chart's schema and render the objects the test waits for; the workload Dockerfile runs the
launcher; the helpers judging a Diagnosis and a node do what the test relies on.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import pathlib
import re
import string
import sys
from collections.abc import Iterator
from typing import Any

import jsonpatch
import jsonschema
import kubernetes_validate
import pytest
import yaml

from collscope.operator.domain import injection, owners
from collscope.operator.onebox import fabric, faults, workload

ROOT = pathlib.Path(__file__).resolve().parents[4]
K8S_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]


def _load_kit() -> Any:
    path = ROOT / "tests" / "e2e" / "clusterkit.py"
    if "collscope_clusterkit_unit" in sys.modules:
        return sys.modules["collscope_clusterkit_unit"]
    spec = importlib.util.spec_from_file_location("collscope_clusterkit_unit", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


kit = _load_kit()
WL = kit.Workload(name="cswl", namespace="collscope-e2e-abc123", image="r/collscope-workload:1")


def _objects() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = WL.manifests()
    assert [d["kind"] for d in docs] == ["Service", "Job"]
    return docs[0], docs[1]


def _pod(job: dict[str, Any], index: int) -> dict[str, Any]:
    """The pod the Job controller makes for ``index``, before the webhook."""
    t = job["spec"]["template"]
    meta = dict(t["metadata"]) | {
        "name": f"{job['metadata']['name']}-{index}-x7k2p",
        "namespace": job["metadata"]["namespace"],
        "annotations": t["metadata"]["annotations"] | {kit.INDEX_ANNOTATION: str(index)},
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": dict(t["spec"])}


def _injected(job: dict[str, Any], index: int) -> dict[str, Any]:
    pod = _pod(job, index)
    ops = injection.patch(pod, injection.InjectionSettings())
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, ops)
    return patched


# -- the workload manifests ------------------------------------------------------------------
def test_template_fields_are_exactly_the_workloads() -> None:
    text = kit.WORKLOAD_TEMPLATE.read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    used = {m.group(1) for m in re.finditer(r"\$\{(\w+)\}", body)}
    assert used == set(WL.fields())
    with pytest.raises(KeyError):
        kit.Workload("a", "b", "c").manifests("x: ${UNKNOWN}")
    assert "${" not in json.dumps(WL.manifests())


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_and_injected_pods_are_valid(version: str) -> None:
    svc, job = _objects()
    for obj in (svc, job, _injected(job, 0), _injected(job, 1)):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']} on {version}: {e.message}")


def test_validator_rejects_a_broken_job() -> None:
    _, job = _objects()
    job["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = 8  # not a string
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSIONS[0], strict=True)


def test_pods_are_opted_in_and_injected_by_the_webhook() -> None:
    _, job = _objects()
    assert owners.is_opted_in(job["spec"]["template"]["metadata"])
    pod = _injected(job, 1)
    assert kit.injected(pod) and not kit.injected(_pod(job, 1))


def test_service_reaches_pod_0_as_the_coordinator() -> None:
    svc, job = _objects()
    spec, tspec = svc["spec"], job["spec"]["template"]["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"].items() <= labels.items()
    assert tspec["subdomain"] == svc["metadata"]["name"]
    assert [p["port"] for p in spec["ports"]] == [fabric.PORT]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == WL.pods
    anti = tspec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["labelSelector"]["matchLabels"].items() <= labels.items()  # one pod a node


def _launcher_env(pod: dict[str, Any], index: int) -> dict[str, str]:
    """The environment the launcher sees: the manifest's, the webhook's, the Job's index."""
    fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": WL.namespace,
              "spec.nodeName": "kind-worker2"}  # fmt: skip
    env = {"JOB_COMPLETION_INDEX": str(index)}
    for e in pod["spec"]["containers"][0]["env"]:
        env[e["name"]] = (
            e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        )
    return env


def test_the_launcher_accepts_what_the_pod_gets() -> None:
    _, job = _objects()
    for index in range(WL.pods):
        s = workload.Settings.from_env(_launcher_env(_injected(job, index), index))
        assert (s.index, s.world, s.ranks_per_pod, s.pods) == (index, WL.world, 4, WL.pods)
        assert s.coordinator == (f"{WL.name}-0.{WL.name}", fabric.PORT)
        assert (s.fault, s.fault_ranks, s.onset_s) == (WL.fault, WL.fault_ranks, WL.onset_s)
        assert s.plugin == injection.InjectionSettings().plugin_path
        assert s.trace_dir == injection.InjectionSettings().trace_dir
        assert s.node == "kind-worker2" and s.namespace == WL.namespace
    assert WL.pod_index_of(WL.fault_ranks[0]) == 1  # the culprit is not the coordinator's pod
    assert faults.expected_category(WL.fault) == "hang.network"


def test_the_image_runs_the_launcher_as_the_manifests_user() -> None:
    text = (kit.WORKLOAD_DIR / "Dockerfile").read_text()
    assert re.findall(r"^CMD (.+)$", text, re.M) == [
        '["python", "-m", "collscope.operator.onebox.workload"]'
    ]
    _, job = _objects()
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["python", "-m", "collscope.operator.onebox.workload"]
    uid = job["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert f"USER {uid}:{uid}" in text
    assert re.findall(r"^EXPOSE (\d+)$", text, re.M) == [str(fabric.PORT)]
    for m in re.finditer(r"^COPY (?!--from)(.+?)\s+\S+\s*$", text, re.M):
        for src in m.group(1).split():
            assert (ROOT / src).exists(), f"COPY {src}: not in the build context"
    assert "--chmod" not in text and "libnccl" not in text.split("Build from")[1]  # no plugin


# -- the chart on kind -----------------------------------------------------------------------
def _kind_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(kit.KIND_VALUES.read_text())
    return values


def test_kind_values_validate_against_the_chart_schema() -> None:
    schema = json.loads((kit.CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((kit.CHART / "values.yaml").read_text())

    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for k, v in over.items():
            sub = out.get(k)
            out[k] = merge(sub, v) if isinstance(v, dict) and isinstance(sub, dict) else v
        return out

    jsonschema.validate(merge(defaults, _kind_values()), schema)


def _render() -> list[dict[str, Any]]:
    chart_mod = pytest.importorskip("helm_python.chart", reason="helm-python-sdk missing")
    chart = chart_mod.Chart.load(str(kit.CHART))
    values = _kind_values() | {"image": {"registry": "r", "tag": "t"}}
    out = chart.render(values, name=kit.RELEASE, namespace=kit.RELEASE)
    return [d for path, text in sorted(out.items()) if path.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d]  # fmt: skip


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"{len(hits)} {kind} {name}"
    return hits[0]


def test_chart_on_kind_renders_what_the_test_waits_for() -> None:
    docs = _render()
    _one(docs, "Deployment", kit.OPERATOR)
    ds = _one(docs, "DaemonSet", kit.AGENT)["spec"]["template"]["spec"]
    assert "runtimeClassName" not in ds  # no NVIDIA runtime on kind
    kind_cfg = yaml.safe_load((kit.WORKLOAD_DIR / "kind.yaml").read_text())
    workers = [n for n in kind_cfg["nodes"] if n["role"] == "worker"]
    assert len(workers) == WL.pods  # one pod per worker (anti-affinity)
    for n in workers:  # the agent runs where the workload runs
        assert ds["nodeSelector"].items() <= n["labels"].items()
    images = {c["image"] for d in docs if d["kind"] in ("Deployment", "DaemonSet")
              for c in d["spec"]["template"]["spec"]["containers"]}  # fmt: skip
    assert images == {"r/collscope-operator:t", "r/collscope-agent:t"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)


def test_policy_on_kind_is_the_shipped_one() -> None:
    pol = kit.chart_policy()
    assert "remediation" not in _kind_values() and "breaker" not in _kind_values()
    assert pol.enabled and not pol.dry_run and "hang.network" in pol.categories


# -- options and commands ----------------------------------------------------------------------
def _getter(opts: dict[str, str | None]) -> Any:
    return opts.get


def test_options_only_with_cluster() -> None:
    assert kit.Options.from_pytest(_getter({}), {}) is None
    o = kit.Options.from_pytest(_getter({"--cluster": "~/.kube/config"}), {})
    assert o.kubeconfig == str(pathlib.Path("~/.kube/config").expanduser())
    assert (o.registry, o.tag) == ("ghcr.io/collscope", kit.chart_version())
    assert o.workload_image == f"ghcr.io/collscope/collscope-workload:{kit.chart_version()}"
    env = {"COLLSCOPE_E2E_IMAGE_REGISTRY": "localhost:5001", "COLLSCOPE_E2E_IMAGE_TAG": "dev"}
    o = kit.Options.from_pytest(_getter({"--cluster": "k"}), env)
    assert o.workload_image == "localhost:5001/collscope-workload:dev"
    o = kit.Options.from_pytest(
        _getter({"--cluster": "k", "--image-tag": "x", "--workload-image": "w:1"}), env
    )
    assert (o.registry, o.tag, o.workload_image) == ("localhost:5001", "x", "w:1")


def test_helm_command_lines() -> None:
    o = kit.Options("/k", "reg", "tag", "w")
    argv = o.helm_install()
    assert argv[:5] == ["helm", "upgrade", "--install", kit.RELEASE, str(kit.CHART)]
    pairs = dict(itertools.pairwise(argv))
    assert pairs["--kubeconfig"] == "/k" and pairs["--namespace"] == kit.RELEASE
    assert pairs["-f"] == str(kit.KIND_VALUES) and "--wait" in argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--set"] == [
        "image.registry=reg", "image.tag=tag"
    ]  # fmt: skip
    assert o.helm_uninstall()[:3] == ["helm", "uninstall", kit.RELEASE]
    unc = o.uncordon("kind-worker2")
    assert unc[1:5] == ["-m", "collscope.operator.cli", "uncordon", "kind-worker2"]


class _Res:
    def __init__(self, rc: int, out: str = "", err: str = "") -> None:
        self.returncode, self.stdout, self.stderr = rc, out, err


def test_kubectl_wrapper() -> None:
    calls: list[tuple[list[str], str | None]] = []

    def run(argv: list[str], *, input: str | None, **kw: Any) -> _Res:
        calls.append((argv, input))
        if argv[3] == "fail":
            return _Res(1, err="error: the server doesn't have a resource type")
        return _Res(0, out='{"items": []}')

    k = kit.Kubectl("/k", run=run)
    assert k.json("get", "diagnoses") == {"items": []}
    assert calls[-1][0] == ["kubectl", "--kubeconfig", "/k", "get", "diagnoses", "-o", "json"]
    k.apply([{"kind": "Service"}])
    assert json.loads(calls[-1][1] or "")["items"] == [{"kind": "Service"}]
    with pytest.raises(RuntimeError, match="fail: error: the server doesn't have"):
        k("fail")


# -- judging the outcome -----------------------------------------------------------------------
def _diag(tj: str, status: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"trainingJob": {"name": tj}, "trigger": {}}, "status": status}


def test_finished_waits_for_the_remediation_step_of_this_job() -> None:
    done = _diag(WL.training_job, {"phase": "Remediated", "actions": []})
    items = {"items": [
        _diag(WL.training_job, {"phase": "Analyzing"}),
        _diag("job-other", {"phase": "Remediated", "actions": []}),
        done,
    ]}  # fmt: skip
    assert kit.finished(items, WL.training_job) == done
    assert kit.finished({"items": items["items"][:2]}, WL.training_job) is None
    assert WL.training_job == "job-cswl"


@pytest.mark.parametrize(
    ("category", "confidence", "cordon"),
    [("hang.network", 0.75, True), ("hang.network", 0.5, False), ("hang.gpu", 0.9, True),
     ("hang.not_entered", 0.9, False)],
)  # fmt: skip
def test_cordon_expected_follows_the_policy(category: str, confidence: float, cordon: bool) -> None:
    st = {"category": category, "result": {"confidence": confidence}}
    assert kit.cordon_expected(st, kit.chart_policy()) is cordon
    dry = kit.chart_policy(ROOT / "examples" / "values-dry-run.yaml")
    assert kit.cordon_expected(st, dry) is False


def test_node_of_a_completion_index() -> None:
    _, job = _objects()
    pods: Iterator[dict[str, Any]] = (
        _pod(job, i) | {"spec": {"nodeName": f"kind-worker{i + 1}"}} for i in range(2)
    )
    listing = {"items": list(pods)}
    assert kit.node_of_index(listing, 1) == "kind-worker2"
    with pytest.raises(LookupError):
        kit.node_of_index(listing, 2)


def test_template_is_what_envsubst_fills_by_hand() -> None:
    """The header's by-hand command fills the same fields as the test."""
    header = kit.WORKLOAD_TEMPLATE.read_text().split("apiVersion")[0]
    assigned = set(re.findall(r"\b([A-Z_]+)=", header))
    assert assigned == set(WL.fields())
    assert string.Template("${NAME}").substitute(WL.fields()) == "cswl"
