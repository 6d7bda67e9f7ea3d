"""The whole data path on a real cluster (``--cluster KUBECONFIG``; skipped without it).

Installs the chart with Helm (``examples/workload/values-kind.yaml``, the images of
``--image-registry``/``--image-tag``), waits for the operator and the agents, runs the workload
image (``examples/workload/``: an Indexed Job of 2 pods x 4 rank processes driving the injected
plugin, a ring AllReduce between all 8) with a NIC that stops delivering on rank 5 (pod 1),
polls ``kubectl get diagnoses.collscope.dev -o json`` until the operator has diagnosed and
remediated it, and checks the verdict (``hang.network`` on rank 5 and its node) and the node:
cordoned exactly when the shipped policy says so. It always cleans up: the workload's namespace
(its Diagnoses release their nodes), ``collscope uncordon`` of the culprit node, the release,
its namespace, and ``kubectl uncordon`` of any node this run left cordoned that was not before.

How to run it on kind: README "End-to-end on kind". Not run from this project's CI (no cluster
there); the pieces it is made of are checked there with no cluster:
``tests/unit/operator/onebox/test_cluster_kit.py`` (manifests, values, commands) and
``tests/e2e/test_onebox_fabric.py`` (the workload's network state under the real operator).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from collscope.operator.onebox import faults

pytestmark = pytest.mark.slow

# From the pods being Ready to the Diagnosis remediated: the workload's own onset (30 s after
# the last rank joined), the operator's discovery of the new Job's pods, the 1.5 s stall
# threshold, the evidence (py-spy, Flight Recorder: up to their timeouts) and the API server's
# round trips; generous for a kind cluster on a laptop.
DIAGNOSED_S = 180.0
POLL_S = 3.0
READY_TIMEOUT = "300s"  # image pulls from a kind node's cache, the init container's copy


def _run(argv: list[str], timeout_s: float = 600) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert res.returncode == 0, f"{' '.join(argv)} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def _until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(1.0)


def _evidence(kubectl: Any, kit: Any, ns: str) -> str:
    """What to read when it fails: pods, Diagnoses, TrainingJobs, operator and workload logs."""
    out = []
    for args in (
        ("get", "pods,trainingjobs,diagnoses", "-n", ns, "-o", "wide"),
        ("get", "pods", "-n", kit.RELEASE, "-o", "wide"),
        ("logs", f"deployment/{kit.OPERATOR}", "-n", kit.RELEASE, "--tail=60"),
        ("logs", "-n", ns, "-l", "collscope.dev/workload", "--tail=20", "--prefix"),
    ):
        try:
            out.append(kubectl(*args))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            out.append(str(e))
    return "\n".join(out)


def _unschedulable(kubectl: Any) -> dict[str, bool]:
    nodes = kubectl.json("get", "nodes")["items"]
    return {n["metadata"]["name"]: bool(n["spec"].get("unschedulable")) for n in nodes}


@pytest.mark.timeout(1500)
def test_injected_nic_down_is_diagnosed_and_acted_on(cluster: Any, clusterkit: Any) -> None:
    kit = clusterkit
    kubectl = kit.Kubectl(cluster.kubeconfig)
    ns = f"collscope-e2e-{uuid.uuid4().hex[:6]}"
    wl = kit.Workload(name="cswl", namespace=ns, image=cluster.workload_image)
    before = _unschedulable(kubectl)
    culprit_node: str | None = None
    try:
        _run(cluster.helm_install())
        for what in (f"deployment/{kit.OPERATOR}", f"daemonset/{kit.AGENT}"):
            kubectl("rollout", "status", what, "-n", kit.RELEASE, "--timeout=300s", timeout_s=330)
        kubectl("create", "namespace", ns)
        kubectl.apply(wl.manifests())
        selector = f"collscope.dev/workload={wl.name}"

        # `kubectl wait -l` fails at once while the Job controller has not made the pods yet.
        def made() -> bool:
            listed = kubectl.json("get", "pods", "-n", ns, "-l", selector)["items"]
            return len(listed) >= int(wl.pods)

        _until(made, 60, "the Job made no pods")
        kubectl("wait", "--for=condition=Ready", "pod", "-l", selector, "-n", ns,
                f"--timeout={READY_TIMEOUT}", timeout_s=330)  # fmt: skip
        pods = kubectl.json("get", "pods", "-n", ns, "-l", selector)
        assert len(pods["items"]) == wl.pods
        for p in pods["items"]:
            assert kit.injected(p), f"{p['metadata']['name']}: the webhook did not inject it"
        culprit_node = kit.node_of_index(pods, wl.pod_index_of(wl.fault_ranks[0]))

        deadline = time.monotonic() + wl.onset_s + DIAGNOSED_S
        done = None
        while done is None:
            listed = kubectl.json("get", "diagnoses.collscope.dev", "-n", ns)
            done = kit.finished(listed, wl.training_job)
            if done is None:
                assert time.monotonic() < deadline, "no Diagnosis in time\n" + _evidence(
                    kubectl, kit, ns
                )
                time.sleep(POLL_S)
        st = done["status"]
        assert st.get("category") == faults.expected_category(wl.fault), st
        assert st["culpritRank"] in wl.fault_ranks and st["culpritNode"] == culprit_node, st
        expected = kit.cordon_expected(st, kit.chart_policy())
        now = _unschedulable(kubectl)
        assert now[culprit_node] is (expected or before[culprit_node]), st.get("actions")
        assert st["phase"] == ("Remediated" if expected else "Diagnosed"), st["phase"]
        others = {n: v for n, v in now.items() if n != culprit_node}
        assert others == {n: before[n] for n in others}, "a node other than the culprit's moved"
    finally:
        _cleanup(cluster, kit, kubectl, ns, culprit=culprit_node, before=before)


def _cleanup(
    cluster: Any, kit: Any, kubectl: Any, ns: str, *, culprit: str | None, before: dict[str, bool]
) -> None:
    """Best effort, every step whatever the previous one did; the first error is raised last."""
    errors: list[str] = []

    def step(argv: list[str], timeout_s: float = 300) -> None:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        if res.returncode != 0 and "not found" not in res.stderr:
            errors.append(f"{' '.join(argv)}: {res.stderr.strip()}")

    # Deleting the namespace deletes its Diagnoses: the operator releases what it marked.
    step(kubectl.argv("delete", "namespace", ns, "--wait=true", "--timeout=180s"), 200)
    if culprit is not None:
        step(cluster.uncordon(culprit), 120)  # collscope's own undo, if anything is left
    step(cluster.helm_uninstall(), 200)
    step(kubectl.argv("delete", "namespace", kit.RELEASE, "--wait=true", "--timeout=180s"), 200)
    try:
        after = _unschedulable(kubectl)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        errors.append(str(e))
        after = {}
    for node, cordoned in after.items():
        if cordoned and not before.get(node, False):  # never a node someone else cordoned
            step(kubectl.argv("uncordon", node), 60)
    assert not errors, "cleanup: " + "; ".join(errors)
