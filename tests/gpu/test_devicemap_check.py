"""The parsing and judging of ``devicemap_check.py``, on nvidia-smi's output as written down
from its documentation and public samples, so the GPU check is known to read it right before a
GPU machine runs it. No GPU needed."""

from __future__ import annotations

import pathlib
import runpy
import subprocess
import sys
import types

HERE = pathlib.Path(__file__).parent


# A script, not a module of a package: run_path gives its globals (main() does not run).
check = types.SimpleNamespace(**runpy.run_path(str(HERE / "devicemap_check.py"), run_name="check"))

# nvidia-smi topo -m, driver 535+ form: NICs as NIC<k> with a legend (tab-separated).
TOPO_NEW = (
    "\tGPU0\tGPU1\tNIC0\tNIC1\tNIC2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\tPIX\tNODE\tSYS\t0-47\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\tNODE\tNODE\t48-95\t1\t\tN/A\n"
    "NIC0\tPIX\tSYS\t X \tNODE\tSYS\t\t\t\t\n"
    "NIC1\tNODE\tNODE\tNODE\t X \tSYS\t\t\t\t\n"
    "NIC2\tSYS\tNODE\tSYS\tSYS\t X \t\t\t\t\n"
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
    "\n"
    "NIC Legend:\n"
    "\n"
    "  NIC0: mlx5_0\n"
    "  NIC1: mlx5_1\n"
    "  NIC2: mlx5_2\n"
)
# Older drivers: the HCA's name in the header, no NIC legend.
TOPO_OLD = (
    "\tGPU0\tmlx5_0\tmlx5_1\tCPU Affinity\n"
    "GPU0\t X \tPXB\tPXB\t0-23\n"
    "mlx5_0\tPXB\t X \tPIX\t\n"
    "mlx5_1\tPXB\tPIX\t X \t\n"
    "\n"
    "Legend:\n"
)


def test_query_gpu_and_compute_apps() -> None:
    gpus = check.parse_gpus("0, GPU-aaaa, 00000000:18:00.0\n1, GPU-bbbb, 00000000:2A:00.0\n")
    assert gpus == [check.SmiGpu(0, "GPU-aaaa", "0000:18:00.0"),
                    check.SmiGpu(1, "GPU-bbbb", "0000:2a:00.0")]  # fmt: skip
    apps = check.parse_apps("4242, GPU-bbbb, 00000000:2A:00.0, /usr/bin/python3.11\n")
    assert apps == [check.SmiApp(4242, "GPU-bbbb", "0000:2a:00.0", "/usr/bin/python3.11")]
    assert check.parse_apps("") == []
    assert check.parse_apps("No running processes found\n") == []


def test_topo_names_nics_through_the_legend() -> None:
    topo = check.parse_topo(TOPO_NEW)
    assert topo == {
        0: {"mlx5_0": "PIX", "mlx5_1": "NODE", "mlx5_2": "SYS"},
        1: {"mlx5_0": "SYS", "mlx5_1": "NODE", "mlx5_2": "NODE"},
    }


def test_topo_of_older_drivers_names_nics_in_the_header() -> None:
    assert check.parse_topo(TOPO_OLD) == {0: {"mlx5_0": "PXB", "mlx5_1": "PXB"}}


def test_topo_without_nics() -> None:
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-15\t0\n\nLegend:\n"
    assert check.parse_topo(text) == {0: {}}


POOL = {"mlx5_0", "mlx5_1", "mlx5_2"}


def test_a_nic_under_the_gpus_switch_must_be_the_maps_choice() -> None:
    row = {"mlx5_0": "PIX", "mlx5_1": "NODE", "mlx5_2": "SYS"}
    assert check.judge_nics(0, {"mlx5_0"}, POOL, row) == ([], [])
    problems, _ = check.judge_nics(0, {"mlx5_1"}, POOL, row)
    assert problems and "mlx5_0" in problems[0]
    problems, _ = check.judge_nics(0, {"mlx5_0", "mlx5_1"}, POOL, row)
    assert problems


def test_the_map_may_be_finer_than_pxb() -> None:
    row = {"mlx5_0": "PXB", "mlx5_1": "PXB", "mlx5_2": "SYS"}
    assert check.judge_nics(0, {"mlx5_1"}, POOL, row) == ([], [])
    assert check.judge_nics(0, set(), POOL, row)[0]


def test_node_and_sys_tie_in_the_map_and_are_a_note() -> None:
    row = {"mlx5_0": "SYS", "mlx5_1": "NODE", "mlx5_2": "NODE"}
    problems, notes = check.judge_nics(1, POOL, POOL, row)
    assert problems == [] and "NODE from SYS" in notes[0]
    problems, _ = check.judge_nics(1, {"mlx5_0"}, POOL, row)
    assert problems  # the NUMA-local ones must be among the tie


def test_a_nic_sysfs_lacks_is_a_problem_and_no_nic_a_note() -> None:
    problems, _ = check.judge_nics(0, {"mlx5_0"}, {"mlx5_0"}, {"mlx5_0": "PIX", "mlx5_9": "SYS"})
    assert problems and "mlx5_9" in problems[0]
    assert check.judge_nics(0, set(), set(), {}) == ([], ["gpu0: nvidia-smi topo -m names no NIC"])


def test_without_nvidia_smi_it_skips(tmp_path: pathlib.Path) -> None:
    done = subprocess.run(
        [sys.executable, str(HERE / "devicemap_check.py")],
        env={"PATH": str(tmp_path)},  # an empty PATH: no nvidia-smi, whatever the machine has
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no GPU: nvidia-smi not found"
