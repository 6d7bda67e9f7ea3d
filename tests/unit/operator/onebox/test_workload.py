"""The workload's pod launcher (``onebox.workload``): its environment, the rank specs it makes,
and two "pods" run here for real (the plugin, the fabric over 127.0.0.1, rank processes)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from collscope.operator import errors
from collscope.operator.onebox import box, fabric, nccl, workload

# What the manifest and the webhook give a pod of examples/workload/workload.yaml.
ENV = {
    "JOB_COMPLETION_INDEX": "1",
    "WORLD_SIZE": "8",
    "COLLSCOPE_WORKLOAD_RANKS_PER_POD": "4",
    "COLLSCOPE_WORKLOAD_COORDINATOR": "cswl-0.cswl:7070",
    "COLLSCOPE_WORKLOAD_FAULT": "nic-down",
    "COLLSCOPE_WORKLOAD_FAULT_RANKS": "5",
    "COLLSCOPE_WORKLOAD_ONSET_S": "30",
    "COLLSCOPE_WORKLOAD_DURATION_S": "900",
    "NCCL_PROFILER_PLUGIN": "/opt/collscope-plugin/libnccl-profiler-collscope.so",
    "COLLSCOPE_TRACE_DIR": "/run/collscope",
    "POD_NAME": "cswl-1-abcde",
    "POD_NAMESPACE": "ml",
    "NODE_NAME": "kind-worker2",
}


def test_settings_from_the_pods_environment() -> None:
    s = workload.Settings.from_env(ENV)
    assert (s.index, s.world, s.ranks_per_pod, s.pods) == (1, 8, 4, 2)
    assert list(s.ranks()) == [4, 5, 6, 7]
    assert s.coordinator == ("cswl-0.cswl", 7070)
    assert (s.fault, s.fault_ranks, s.onset_s, s.duration_s) == ("nic-down", (5,), 30.0, 900.0)
    assert (s.pod, s.namespace, s.node) == ("cswl-1-abcde", "ml", "kind-worker2")
    healthy = workload.Settings.from_env(ENV | {"COLLSCOPE_WORKLOAD_FAULT": "none"})
    assert healthy.fault is None and healthy.fault_ranks == ()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"WORLD_SIZE": ""}, "WORLD_SIZE: not set"),
        ({"WORLD_SIZE": "eight"}, "WORLD_SIZE='eight': not an integer"),
        ({"WORLD_SIZE": "6"}, "WORLD_SIZE='6': not a multiple of"),
        ({"JOB_COMPLETION_INDEX": "2"}, "JOB_COMPLETION_INDEX='2': the job has 2 pods"),
        ({"COLLSCOPE_WORKLOAD_COORDINATOR": "cswl-0:x"}, "COORDINATOR='cswl-0:x': "),
        ({"COLLSCOPE_WORKLOAD_FAULT": "nic-dwon"}, "COLLSCOPE_WORKLOAD_FAULT='nic-dwon': not"),
        ({"COLLSCOPE_WORKLOAD_FAULT_RANKS": ""}, "COLLSCOPE_WORKLOAD_FAULT_RANKS: not set"),
        ({"COLLSCOPE_WORKLOAD_FAULT_RANKS": "8"}, "ranks are 0..7"),
        ({"COLLSCOPE_WORKLOAD_ONSET_S": "-1"}, "COLLSCOPE_WORKLOAD_ONSET_S='-1': must be"),
        ({"NCCL_PROFILER_PLUGIN": ""}, "NCCL_PROFILER_PLUGIN: not set .*webhook running"),
        ({"COLLSCOPE_TRACE_DIR": ""}, "COLLSCOPE_TRACE_DIR: not set"),
    ],
)
def test_a_bad_variable_is_named(change: dict[str, str], message: str) -> None:
    with pytest.raises(errors.SettingsError, match=message):
        workload.Settings.from_env(ENV | change)


def test_the_docstring_table_lists_every_variable_read() -> None:
    assert workload.__doc__ is not None
    rows = [line for line in workload.__doc__.splitlines() if line.startswith("| ``")]
    listed = {name for row in rows for name in re.findall(r"``([A-Z_]+)``", row.split("|")[1])}
    assert listed == {v.env for v in workload.VARIABLES}


def test_plugin_path_as_nccl_reads_it() -> None:
    assert workload.plugin_path("/opt/p/libnccl-profiler-collscope.so").startswith("/opt/p/")
    assert workload.plugin_path("collscope") == nccl.LIB_NAME  # NCCL's short name
    assert workload.plugin_path("libfoo.so") == "libfoo.so"


def test_specs_give_every_rank_its_identity_and_the_fault() -> None:
    specs = workload.specs(workload.Settings.from_env(ENV))
    assert [(s.rank, s.local_rank) for s in specs] == [(4, 0), (5, 1), (6, 2), (7, 3)]
    assert {(s.world, s.nnodes, s.node, s.pod, s.trace_dir) for s in specs} == {
        (8, 2, "kind-worker2", "cswl-1-abcde", "/run/collscope")
    }
    inj = specs[0].injection
    assert inj is not None and (inj.kind, inj.ranks, inj.node) == ("nic-down", (5,), "kind-worker2")
    # Pod 0 holds no culprit: it cannot know the culprit's node.
    pod0 = workload.specs(workload.Settings.from_env(ENV | {"JOB_COMPLETION_INDEX": "0"}))
    assert pod0[0].injection is not None and pod0[0].injection.node == ""


def test_missing_environment_exits_2_naming_it() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "collscope.operator.onebox.workload"],
        capture_output=True, text=True, timeout=60, check=False,
        env={k: v for k, v in os.environ.items() if k != "WORLD_SIZE"},
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip() == "collscope workload: error: WORLD_SIZE: not set"


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_two_pods_train_through_the_fabric_and_stop(tmp_path: pathlib.Path) -> None:
    """Two launchers as two pods of the Indexed Job: pod 0 serves the fabric, both start their
    ranks, each rank writes its ring where the webhook's volume would be, the coordinator
    stops them all ``DURATION_S`` after they joined, and both pods exit 0."""
    try:
        plugin = box.find_plugin()
    except errors.PluginError as e:
        pytest.skip(str(e))
    port = box.free_port(["127.0.0.1"])
    pods = []
    for index in (0, 1):
        trace = tmp_path / f"pod-{index}"
        trace.mkdir()
        env = os.environ | {
            "JOB_COMPLETION_INDEX": str(index), "WORLD_SIZE": "4",
            "COLLSCOPE_WORKLOAD_RANKS_PER_POD": "2",
            "COLLSCOPE_WORKLOAD_COORDINATOR": f"127.0.0.1:{port}",
            "COLLSCOPE_WORKLOAD_FAULT": "", "COLLSCOPE_WORKLOAD_DURATION_S": "4",
            "NCCL_PROFILER_PLUGIN": str(plugin), "COLLSCOPE_TRACE_DIR": str(trace),
            "POD_NAME": f"cswl-{index}", "POD_NAMESPACE": "ml", "NODE_NAME": f"node-{index}",
        }  # fmt: skip
        log = (tmp_path / f"pod-{index}.log").open("wb")
        cmd = [sys.executable, "-m", "collscope.operator.onebox.workload"]
        pods.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        log.close()
    try:
        codes = [p.wait(60) for p in pods]
    finally:
        for p in pods:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    logs = "\n".join((tmp_path / f"pod-{i}.log").read_text() for i in (0, 1))
    assert codes == [0, 0], logs
    for index in (0, 1):  # one ring per rank process, in its pod's trace volume
        rings = [p for p in (tmp_path / f"pod-{index}").iterdir() if p.stat().st_size > 0]
        assert len(rings) == 2, (index, rings, logs)
    assert "Traceback" not in logs
    with pytest.raises(errors.FabricError):  # and the coordinator is gone with pod 0
        fabric.Client(("127.0.0.1", port), 4, 2, None, connect_timeout_s=0.2)
