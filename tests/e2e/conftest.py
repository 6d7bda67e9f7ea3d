"""The whole data path on this machine (``collscope.operator.onebox``) under the real operator.

``onebox``: the plugin (built once per session with ``make -C native`` into a temporary
directory, or ``$COLLSCOPE_PLUGIN``), 8 rank processes on 2 simulated nodes, one real node
agent per node on ``127.0.0.2`` / ``127.0.0.3``. ``e2e``: the same plus every handler of
collscope-operator (kopf) against the kmock Kubernetes emulator, with Nodes, the Job, its Pods
(``hostIP`` = the node's loopback address, ``uid`` = the pod directory the agent reads) and
the TrainingJob pre-created; the operator finds the agents through its URL template
``http://{node_ip}:<port>``, as on a cluster.

The Harness is the operator tests' (``tests/unit/operator/conftest.py``), loaded by path:
conftest modules cannot be imported by name under ``--import-mode=importlib``.

``onebox`` shares the ranks' state through a memory-mapped file; a test parametrised
indirectly with ``"tcp"`` gets the TCP fabric a workload on a cluster uses instead.
``cluster``: with ``--cluster KUBECONFIG`` the options of ``clusterkit.py`` (the real-cluster
run, ``test_cluster.py``); without it, every test using it skips.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pytest

from collscope.operator.domain import jobs, policy, settings
from collscope.operator.onebox import box, nccl

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOB = "onebox"  # the workload (a batch/v1 Job) and its pods' prefix
TJ = f"job-{JOB}"  # the TrainingJob the operator makes for it (handlers: "<kind>-<name>")
LAYOUT = box.Layout(nodes=2, ranks_per_node=4, job=JOB)
# The operator as deployed (1 s tick: a shorter live tick fires a slowdown's 3-tick streak
# before the Diagnosis window holds the 3 s that the engine's replay, at its own 1 s tick,
# needs to see it again: it then reports "no anomaly"), with no retry of a dead agent (the
# agent-restart test wants it reported on the tick it happens) and short evidence timeouts.
FAST = settings.Settings(
    trigger=settings.TriggerLoopSettings(interval_s=1.0, window_s=5.0, rediscover_s=1.0),
    agents=settings.AgentSettings(timeout_s=1.0, retries=0),
    stacks_timeout_s=1.0,
    flight_recorder_timeout_s=1.0,
    # The hardware re-check 2 s after the corroboration instead of 30 s: the same path within
    # the scenarios' time (the one-box faults' hardware side lasts until the run ends).
    remediation=policy.RemediationPolicy(confirm_delay_s=2.0),
)


def _operator_conftest() -> Any:
    path = ROOT / "tests" / "unit" / "operator" / "conftest.py"
    spec = importlib.util.spec_from_file_location("collscope_operator_conftest_e2e", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Harness = _operator_conftest().Harness


def load_clusterkit() -> Any:
    """``tests/e2e/clusterkit.py``, loaded by path (no test module imports by name here)."""
    path = ROOT / "tests" / "e2e" / "clusterkit.py"
    if "collscope_e2e_clusterkit" in sys.modules:
        return sys.modules["collscope_e2e_clusterkit"]
    spec = importlib.util.spec_from_file_location("collscope_e2e_clusterkit", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def clusterkit() -> Any:
    return load_clusterkit()


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, clusterkit: Any) -> Any:
    """``clusterkit.Options`` of ``--cluster``; skips (saying how to run it) without it."""
    opts = clusterkit.Options.from_pytest(request.config.getoption, os.environ)
    if opts is None:
        pytest.skip(
            "needs a real cluster: pytest tests/e2e --cluster KUBECONFIG (with the images "
            "built and loaded; README 'End-to-end on kind')"
        )
    missing = [tool for tool in ("helm", "kubectl") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"--cluster given, but {', '.join(missing)} not on PATH", pytrace=False)
    if not pathlib.Path(opts.kubeconfig).is_file():
        pytest.fail(f"--cluster {opts.kubeconfig}: no such kubeconfig file", pytrace=False)
    return opts


@pytest.fixture(scope="session")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """``$COLLSCOPE_PLUGIN``, else ``make -C native`` into a temporary BUILD directory."""
    if os.environ.get("COLLSCOPE_PLUGIN"):
        return box.find_plugin()
    make = shutil.which("make")
    if make is None or (shutil.which("gcc") or shutil.which("cc")) is None:
        pytest.skip("make and a C compiler are needed to build the plugin (make -C native)")
    build = tmp_path_factory.mktemp("native-build")
    res = subprocess.run(
        [make, "-C", str(ROOT / "native"), f"BUILD={build}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, f"make -C native failed:\n{res.stdout}\n{res.stderr}"
    return build / nccl.LIB_NAME


@pytest.fixture
def onebox(
    plugin: pathlib.Path, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> Iterator[box.OneBox]:
    """Not started: a test starts it with its fault (``start(injection)``), then ``arm``s it.
    ``request.param`` (indirect parametrisation): the ranks' state, "mmap" unless told."""
    state: Literal["mmap", "tcp"] = getattr(request, "param", "mmap")
    b = box.OneBox(LAYOUT, tmp_path / "box", plugin, seed=7, state=state)
    try:
        yield b
    finally:
        b.close()


@dataclass
class E2E:
    harness: Any
    box: box.OneBox

    def cluster(self) -> None:
        """Nodes, the Job, its opted-in Pods and the TrainingJob, as a cluster would hold."""
        h, k, ns = self.harness, self.harness.k, self.harness.NS
        job_ref = {"apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": "uid-job",
                   "controller": True}  # fmt: skip
        k.objects["batch/v1/jobs", ns, JOB] = {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": JOB, "namespace": ns, "uid": "uid-job", "resourceVersion": "1"},
        }  # fmt: skip
        for node in LAYOUT.node_names():
            h.node(node)
        for r in range(LAYOUT.world):
            node = LAYOUT.node_of(r)
            k.objects["v1/pods", ns, LAYOUT.pod_of(r)] = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": LAYOUT.pod_of(r), "namespace": ns, "uid": self.box.uids[r],
                             "resourceVersion": "1", "ownerReferences": [job_ref],
                             "annotations": {"collscope.dev/diagnose": "true"}},
                "spec": {"nodeName": node, "containers": [{"name": "train", "image": "i"}]},
                "status": {"hostIP": LAYOUT.address_of(node), "phase": "Running"},
            }  # fmt: skip
        k.objects[h.TJ, ns, TJ] = {
            "apiVersion": "collscope.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": TJ, "namespace": ns, "uid": "uid-tj", "resourceVersion": "1"},
            "spec": {"owner": {"apiVersion": "batch/v1", "kind": "Job", "name": JOB,
                               "uid": "uid-job"}},
        }  # fmt: skip

    @contextlib.asynccontextmanager
    async def operator(self) -> AsyncIterator[Any]:
        directory = jobs.template_directory(f"http://{{node_ip}}:{self.box.port}")
        async with self.harness.run(FAST, directory) as memo:
            yield memo

    def diagnoses(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.harness.all(self.harness.DIAG)
        return found

    def finished(self) -> dict[str, Any] | None:
        """The first Diagnosis whose remediation step ran (``status.actions`` written)."""
        for d in self.diagnoses():
            if "actions" in (d.get("status") or {}):
                return d
        return None

    def node(self, name: str) -> dict[str, Any]:
        got = self.harness.obj("v1/nodes", name, None)
        assert got is not None
        return dict(got)

    def tj_status(self) -> dict[str, Any]:
        tj = self.harness.obj(self.harness.TJ, TJ) or {}
        return dict(tj.get("status") or {})


@pytest.fixture
def e2e(kmock: Any, onebox: box.OneBox) -> E2E:
    h = Harness(kmock)
    h.setup()
    return E2E(h, onebox)
