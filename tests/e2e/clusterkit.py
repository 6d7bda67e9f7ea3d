"""What ``tests/e2e/test_cluster.py`` does to a real cluster, apart from the test itself so that
``tests/unit/operator/onebox/test_cluster_kit.py`` checks it with no cluster: the options, the
helm and kubectl command lines, the workload manifests (``examples/workload/workload.yaml``
filled in), and how a Diagnosis and a node are judged.

Loaded by path (``conftest.load_clusterkit``): modules under ``tests/`` cannot be imported by
name under ``--import-mode=importlib``.

Options (``tests/conftest.py``), each also read from the environment:

| option | environment | default |
| --- | --- | --- |
| ``--cluster KUBECONFIG`` | | none: the cluster tests skip |
| ``--image-registry`` | ``COLLSCOPE_E2E_IMAGE_REGISTRY`` | ``ghcr.io/collscope`` |
| ``--image-tag`` | ``COLLSCOPE_E2E_IMAGE_TAG`` | the chart's appVersion |
| ``--workload-image`` | ``COLLSCOPE_E2E_WORKLOAD_IMAGE`` | ``REGISTRY/collscope-workload:TAG`` |
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import string
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from collscope.operator.domain import injection, policy

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "collscope"
WORKLOAD_DIR = ROOT / "examples" / "workload"
WORKLOAD_TEMPLATE = WORKLOAD_DIR / "workload.yaml"
KIND_VALUES = WORKLOAD_DIR / "values-kind.yaml"
RELEASE = "collscope-e2e"  # the Helm release, and the namespace it is installed in
# What the chart names them for that release (_helpers.tpl: the release name holds "collscope").
OPERATOR = f"{RELEASE}-operator"  # Deployment
AGENT = f"{RELEASE}-agent"  # DaemonSet
DEFAULT_REGISTRY = "ghcr.io/collscope"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def chart_version() -> str:
    meta: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return str(meta["appVersion"])


@dataclasses.dataclass(frozen=True)
class Options:
    kubeconfig: str
    registry: str
    tag: str
    workload_image: str

    @classmethod
    def from_pytest(cls, get: Callable[[str], Any], env: Mapping[str, str]) -> Options | None:
        """None without ``--cluster``; ``get`` is ``config.getoption``."""
        kubeconfig = get("--cluster")
        if kubeconfig is None:
            return None
        registry = get("--image-registry") or env.get(
            "COLLSCOPE_E2E_IMAGE_REGISTRY", DEFAULT_REGISTRY
        )
        tag = get("--image-tag") or env.get("COLLSCOPE_E2E_IMAGE_TAG", chart_version())
        workload = get("--workload-image") or env.get(
            "COLLSCOPE_E2E_WORKLOAD_IMAGE", f"{registry}/collscope-workload:{tag}"
        )
        return cls(str(pathlib.Path(kubeconfig).expanduser()), registry, tag, workload)

    def helm_install(self) -> list[str]:
        """Install (or upgrade) the chart and wait until its Deployment and DaemonSet are up."""
        return [
            "helm", "upgrade", "--install", RELEASE, str(CHART),
            "--kubeconfig", self.kubeconfig, "--namespace", RELEASE, "--create-namespace",
            "-f", str(KIND_VALUES),
            "--set", f"image.registry={self.registry}", "--set", f"image.tag={self.tag}",
            "--wait", "--timeout", "5m",
        ]  # fmt: skip

    def helm_uninstall(self) -> list[str]:
        return [
            "helm", "uninstall", RELEASE, "--kubeconfig", self.kubeconfig,
            "--namespace", RELEASE, "--wait", "--timeout", "2m",
        ]  # fmt: skip

    def uncordon(self, node: str) -> list[str]:
        """collscope's own undo: only the marks it added (``collscope uncordon``)."""
        return [
            sys.executable, "-m", "collscope.operator.cli", "uncordon", node,
            "--kubeconfig", self.kubeconfig, "--namespace", RELEASE,
        ]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Workload:
    """The fields of ``examples/workload/workload.yaml``."""

    name: str
    namespace: str
    image: str
    pods: int = 2
    ranks_per_pod: int = 4
    fault: str = "nic-down"
    fault_ranks: tuple[int, ...] = (5,)  # a rank of pod 1: never the coordinator's pod
    # Healthy training before the fault, counted from the last rank's join: the trigger's
    # baselines and the operator's discovery of the new TrainingJob (it watches pods) first.
    onset_s: float = 30.0
    # Every rank stops (the Job completes) this long after joining, should cleanup fail.
    duration_s: float = 900.0

    @property
    def world(self) -> int:
        return self.pods * self.ranks_per_pod

    @property
    def training_job(self) -> str:
        """The TrainingJob the operator makes for the Job (handlers: ``<kind>-<name>``)."""
        return f"job-{self.name}"

    def pod_index_of(self, r: int) -> int:
        return r // self.ranks_per_pod

    def fields(self) -> dict[str, str]:
        return {
            "NAME": self.name,
            "NAMESPACE": self.namespace,
            "IMAGE": self.image,
            "PODS": str(self.pods),
            "RANKS_PER_POD": str(self.ranks_per_pod),
            "WORLD_SIZE": str(self.world),
            "FAULT": self.fault,
            "FAULT_RANKS": ",".join(map(str, self.fault_ranks)),
            "ONSET_S": f"{self.onset_s:g}",
            "DURATION_S": f"{self.duration_s:g}",
        }

    def manifests(self, template: str | None = None) -> list[dict[str, Any]]:
        """The Service and the Job, filled in (``string.Template``: ``${NAME}`` fields, as
        ``envsubst`` fills them by hand); KeyError when the template wants an unknown field."""
        text = WORKLOAD_TEMPLATE.read_text() if template is None else template
        filled = string.Template(text).substitute(self.fields())
        return [d for d in yaml.safe_load_all(filled) if d]


class Kubectl:
    """``kubectl --kubeconfig K ...``; a failure raises with kubectl's own message."""

    def __init__(self, kubeconfig: str, run: Callable[..., Any] = subprocess.run) -> None:
        self.kubeconfig, self._run = kubeconfig, run

    def argv(self, *args: str) -> list[str]:
        return ["kubectl", "--kubeconfig", self.kubeconfig, *args]

    def __call__(self, *args: str, stdin: str | None = None, timeout_s: float = 120) -> str:
        res = self._run(
            self.argv(*args), input=stdin, capture_output=True, text=True, timeout=timeout_s,
            check=False,
        )  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(self.argv(*args))}: {res.stderr.strip()}")
        return str(res.stdout)

    def json(self, *args: str) -> dict[str, Any]:
        got: dict[str, Any] = json.loads(self(*args, "-o", "json"))
        return got

    def apply(self, objects: Sequence[Mapping[str, Any]]) -> str:
        doc = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        return self("apply", "-f", "-", stdin=json.dumps(doc))


def finished(diagnoses: Mapping[str, Any], training_job: str) -> dict[str, Any] | None:
    """The first Diagnosis of ``training_job`` whose remediation step ran (``status.actions``
    written), from ``kubectl get diagnoses.collscope.dev -o json``."""
    for d in diagnoses.get("items", []):
        if (d.get("spec") or {}).get("trainingJob", {}).get("name") != training_job:
            continue
        if "actions" in (d.get("status") or {}):
            return dict(d)
    return None


def chart_policy(values_file: pathlib.Path = KIND_VALUES) -> policy.RemediationPolicy:
    """The remediation policy the installed chart runs with: its values.yaml under the
    values file, as Helm coalesces them (maps merge, the rest replaces)."""

    def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for k, v in over.items():
            sub = out.get(k)
            out[k] = merge(sub, v) if isinstance(v, dict) and isinstance(sub, dict) else v
        return out

    values = merge(
        yaml.safe_load((CHART / "values.yaml").read_text()),
        yaml.safe_load(values_file.read_text()) or {},
    )
    return policy.RemediationPolicy.from_values(values["remediation"])


def cordon_expected(status: Mapping[str, Any], pol: policy.RemediationPolicy) -> bool:
    """Does the policy cordon the culprit of this Diagnosis? (hardware categories of the policy
    above its confidence threshold, not in dry run; the breaker lets one node go: see
    examples/workload/values-kind.yaml)"""
    category = status.get("category")
    confidence = float((status.get("result") or {}).get("confidence", 0.0))
    return bool(
        pol.enabled
        and not pol.dry_run
        and category in pol.categories
        and confidence >= pol.confidence_threshold
    )


def node_of_index(pods: Mapping[str, Any], index: int) -> str:
    """The node the Job's pod ``index`` runs on, from ``kubectl get pods -o json``."""
    for p in pods.get("items", []):
        if (p["metadata"].get("annotations") or {}).get(INDEX_ANNOTATION) == str(index):
            return str(p["spec"]["nodeName"])
    raise LookupError(f"no pod of completion index {index}")


def injected(pod: Mapping[str, Any]) -> bool:
    """Did the collscope webhook inject this pod (its init container and plugin env)?"""
    spec = pod.get("spec") or {}
    inits = {c.get("name") for c in spec.get("initContainers") or ()}
    env = {e.get("name") for c in spec.get("containers") or () for e in c.get("env") or ()}
    return injection.INIT_CONTAINER in inits and "NCCL_PROFILER_PLUGIN" in env
