"""bench/coverage.py: the bound table (stated = measured) and one detection case."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


def _load_coverage() -> Any:
    name = "collscope_bench_coverage"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "coverage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


cov = _load_coverage()


def test_bound_table_states_and_measures_the_same_bound() -> None:
    rows = cov.bound_table().splitlines()
    # ranks | TP x PP x DP | DP groups | anchors | rotating slots | stated | measured | time
    assert rows[2].startswith("| 64 | 8 x 2 x 4 | 16 | 4 | 6 | 6 | 6 |")
    assert rows[7].startswith("| 16,384 | 8 x 8 x 256 | 64 | 1 | 9 | 21 | 21 |")
    assert rows[8].startswith("| 16,384 | 8 x 16 x 128 | 128 | 0 | 10 | 39 | 39 |")


def test_a_slow_nic_in_a_rotating_group_is_found_within_the_bound() -> None:
    # Rank 54's DP group is visited at ticks 3-5, 9-11: onset at 5 s, found on tick 11 (12 s).
    found = cov.run(cov.Case(ranks=64, target=54, onset_s=5.0, duration_s=15.0))
    assert found.right and found.bound_s == 5.0
    assert found.latency_s is not None and round(found.latency_s) == 7
    assert found.extra_s is not None and 0 < found.extra_s <= found.bound_s
