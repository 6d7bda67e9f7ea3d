"""bench/remediation_repeat.py: how a run's record is judged (no box is started here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


def _load() -> Any:
    name = "collscope_bench_remediation_repeat"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "remediation_repeat.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


rr = _load()


def line(scenario: str, **over: Any) -> dict[str, Any]:
    base = {
        "scenario": scenario, "category": "hang.network", "rank": 5, "node": "node-1",
        "culprits": [[5, "nic", 1.0], [4, "nic", 0.5]], "confirmed": "False",
        "reason": "NotCorroborated", "to_confirmed_s": 2.0, "cordoned": [],
    }  # fmt: skip
    return {**base, **over}


def test_a_cordon_where_none_is_expected_is_false_and_wrong() -> None:
    rows = {s: rr.Row() for s in rr.EXPECT}
    rr.judge(rows, "uncorroborated", False, [line("nic-down, no hardware sample",
                                                  cordoned=["node-1"])])  # fmt: skip
    r = rows["nic-down, no hardware sample"]
    assert (r.runs, r.correct, r.cordons, r.false_cordons, r.passed) == (1, 0, 1, 1, 0)


def test_the_culprits_node_cordoned_when_expected_is_no_false_cordon() -> None:
    rows = {s: rr.Row() for s in rr.EXPECT}
    got = line("nic-down + link-down sample", confirmed="True", reason="Confirmed",
               cordoned=["node-1"])  # fmt: skip
    rr.judge(rows, "confirmed", True, [got])
    r = rows["nic-down + link-down sample"]
    assert (r.correct, r.cordons, r.false_cordons, r.to_confirmed) == (1, 1, 0, [2.0])
    # the same test's later steps wrote nothing: not counted as right
    assert rows["job deleted: marks kept"].correct == 0
    assert rows["job deleted: marks kept"].runs == 1
    # another node than the culprit's is a false cordon
    rr.judge(rows, "confirmed", False, [{**got, "cordoned": ["node-0", "node-1"]}])
    assert (r.runs, r.correct, r.false_cordons) == (2, 1, 1)


def test_rank_5_tied_first_is_right_only_where_a_tie_is_allowed() -> None:
    rows = {s: rr.Row() for s in rr.EXPECT}
    tied = [[4, "nic", 1.0], [5, "nic", 1.0]]
    rr.judge(rows, "uncorroborated", True, [line("nic-down, no hardware sample", rank=4,
                                                 culprits=tied)])  # fmt: skip
    assert rows["nic-down, no hardware sample"].correct == 1
    rr.judge(rows, "killed", True, [line("killed rank", category="hang.process", rank=4,
                                         culprits=tied, reason="ProcessDeath")])  # fmt: skip
    assert rows["killed rank"].correct == 0
