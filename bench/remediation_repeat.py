"""Confirmation before a cordon, repeated: each one-box remediation scenario N times.

    .venv/bin/python bench/remediation_repeat.py              # 5 runs of each test, ~7 min
    .venv/bin/python bench/remediation_repeat.py --runs 1     # what CI runs, once each
    .venv/bin/python bench/remediation_repeat.py --only killed --runs 10

Each run is one pytest process running one test of ``tests/e2e/test_onebox_remediation.py``
(the real operator, kopf against kmock, over the one-box: 8 rank processes through the real
plugin, real node agents sampling simulated GPUs and HCAs, ``onebox.hardware``; FAST settings
with the 2 s re-check). Each test appends what it observed, before asserting, to the JSON-lines
file named by ``$COLLSCOPE_REMEDIATION_RECORD``; this script gives every run its own file and
judges the lines against ``EXPECT``, so a run that fails still counts for what it did.

The tests run the operator with the cluster's floor at confidence 0, so that the confirmation
(hardware corroboration, then the re-check) is what decides; the trace verdict's confidence is
reported beside, with how many runs reached the shipped threshold (0.7) and so would have gone
to the confirmation under the shipped policy (the others stop there: BelowThreshold, no mark).

Scenarios (the first test yields three rows, one box: cordon, deletion, release):

- ``nic-down + link-down sample``: rank 5's NIC stops delivering and its port reports DOWN:
  hang.network on rank 5, Confirmed True (after the re-check), node-1 cordoned;
- ``job deleted: marks kept``: then the TrainingJob and its Diagnosis are deleted: node-1 stays
  marked; ``uncordon releases``: ``collscope uncordon node-1`` removes every mark;
- ``nic-down, no hardware sample``: the same fault, the HCA sampled healthy: hang.network on
  rank 5 (first, or tied first: the traces alone may not tell its NIC from a neighbour's),
  Confirmed False ``NotCorroborated``, no node marked;
- ``nic-down, agents without hardware``: the same fault, the agents run with no hardware source
  (``OneBox(hardware=False)``): Confirmed False ``NoHardwareSamples``, no node marked;
- ``killed rank``: rank 5 SIGKILLed from outside: hang.process, Confirmed False
  ``ProcessDeath``, no node marked.

Per scenario: runs, correct verdicts (category, rank, Confirmed status and reason all exact),
cordons (runs that left any node marked), false cordons (a node marked where the scenario
expects none, or another node than the culprit's), time from the onset to the ``Confirmed``
condition (its lastTransitionTime; median and max), and the runs whose test passed. Exit code
0 when there is no false cordon and every verdict is right.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from collscope.operator.domain import policy

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILE = "tests/e2e/test_onebox_remediation.py"
TESTS = {
    "confirmed": "test_nic_down_with_its_link_sample_cordons_and_outlives_the_job",
    "uncorroborated": "test_nic_down_without_its_hardware_sample_is_not_confirmed[healthy]",
    "nohardware": "test_nic_down_without_its_hardware_sample_is_not_confirmed[absent]",
    "killed": "test_killed_rank_is_never_confirmed",
}
RECORD_ENV = "COLLSCOPE_REMEDIATION_RECORD"
SHIPPED_THRESHOLD = policy.RemediationPolicy().confidence_threshold
RUN_TIMEOUT_S = 180  # one pytest process: its test's own timeout (90 s) plus start-up


@dataclass(frozen=True)
class Expect:
    test: str
    category: str
    confirmed: str  # the Confirmed condition's status
    reason: str  # and its reason
    cordoned: tuple[str, ...]  # the nodes marked when the record is written
    flag: str | None = None  # a boolean the record carries that must be true
    tied: bool = False  # rank 5 may share the top score with another culprit


RANK, NODE = 5, "node-1"  # seed 7 (the test's SEED): the fault is on rank 5 of node-1
EXPECT = {
    "nic-down + link-down sample": Expect("confirmed", "hang.network", "True", "Confirmed",
                                          (NODE,)),
    "job deleted: marks kept": Expect("confirmed", "hang.network", "True", "Confirmed", (NODE,),
                                      flag="kept"),
    "uncordon releases": Expect("confirmed", "hang.network", "True", "Confirmed", (),
                                flag="released"),
    "nic-down, no hardware sample": Expect("uncorroborated", "hang.network", "False",
                                           "NotCorroborated", (), tied=True),
    "nic-down, agents without hardware": Expect("nohardware", "hang.network", "False",
                                                "NoHardwareSamples", (), tied=True),
    "killed rank": Expect("killed", "hang.process", "False", "ProcessDeath", ()),
}  # fmt: skip


@dataclass
class Row:
    runs: int = 0
    correct: int = 0
    cordons: int = 0
    false_cordons: int = 0
    passed: int = 0
    confident: int = 0  # trace verdicts at or above the shipped threshold
    confidences: list[float] | None = None
    to_confirmed: list[float] | None = None
    wrong: list[dict[str, Any]] | None = None


def run_test(test: str, record: pathlib.Path) -> tuple[bool, float]:
    """One pytest process running ``test``; (passed, seconds)."""
    env = {**os.environ, RECORD_ENV: str(record)}
    argv = [sys.executable, "-m", "pytest", f"{FILE}::{TESTS[test]}", "-q", "-p",
            "no:cacheprovider", "-x"]  # fmt: skip
    started = time.perf_counter()
    try:
        res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=RUN_TIMEOUT_S, check=False)  # fmt: skip
        ok = res.returncode == 0
        if not ok:
            tail = (res.stdout + res.stderr).strip().splitlines()[-3:]
            print(f"    {test}: test failed: {' | '.join(tail)[:400]}", flush=True)
    except subprocess.TimeoutExpired:
        ok = False
        print(f"    {test}: no result within {RUN_TIMEOUT_S} s", flush=True)
    return ok, time.perf_counter() - started


def judge(rows: dict[str, Row], test: str, passed: bool, lines: list[dict[str, Any]]) -> None:
    got = {line["scenario"]: line for line in lines}
    for scenario, exp in EXPECT.items():
        if exp.test != test:
            continue
        row = rows[scenario]
        row.runs += 1
        row.passed += passed
        line = got.get(scenario)
        if line is None:  # the run stopped before this step: not a right verdict
            row.wrong = [*(row.wrong or []), {"scenario": scenario, "missing": True}]
            continue
        marked = tuple(line["cordoned"])
        row.cordons += bool(marked)
        row.false_cordons += any(n not in exp.cordoned for n in marked)
        scores = [c[2] for c in line["culprits"]]
        top = [c[0] for c in line["culprits"] if scores and c[2] == max(scores)]
        rank = RANK if exp.tied and RANK in top else line["rank"]
        right = (
            (line["category"], rank, line["node"]) == (exp.category, RANK, NODE)
            and (line["confirmed"], line["reason"]) == (exp.confirmed, exp.reason)
            and marked == exp.cordoned
            and (exp.flag is None or line.get(exp.flag) is True)
        )
        row.correct += right
        if line.get("confidence") is not None and exp.flag is None:
            row.confidences = [*(row.confidences or []), float(line["confidence"])]
            row.confident += float(line["confidence"]) >= SHIPPED_THRESHOLD
        if not right:
            row.wrong = [*(row.wrong or []), line]
        if line.get("to_confirmed_s") is not None and exp.flag is None:
            row.to_confirmed = [*(row.to_confirmed or []), float(line["to_confirmed_s"])]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs of each test (default 5)")
    p.add_argument("--only", choices=sorted(TESTS), action="append", help="these tests only")
    args = p.parse_args(argv)
    tests = args.only or list(TESTS)
    rows = {s: Row() for s, e in EXPECT.items() if e.test in tests}
    seconds: dict[str, list[float]] = {t: [] for t in tests}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; data: collscope's one-box, simulated hardware",
          flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="remediation-repeat-") as tmp:
        for i in range(args.runs):
            for test in tests:
                record = pathlib.Path(tmp) / f"{test}-{i}.jsonl"
                passed, took = run_test(test, record)
                seconds[test].append(took)
                lines = []
                if record.exists():
                    lines = [json.loads(x) for x in record.read_text().splitlines() if x]
                judge(rows, test, passed, lines)
                print(f"  run {i + 1}/{args.runs} {test}: {'pass' if passed else 'FAIL'} "
                      f"({took:.0f} s)", flush=True)  # fmt: skip
    print()
    head = ("scenario", "runs", "correct", "cordons", "false cordons", "to Confirmed (med/max)",
            "confidence (min-max)", f">= {SHIPPED_THRESHOLD:g}", "tests passed")  # fmt: skip
    print(" | ".join(head))
    for scenario, r in rows.items():
        t = r.to_confirmed or []
        when = f"{statistics.median(t):.1f} / {max(t):.1f} s" if t else "-"
        c = r.confidences or []
        conf = f"{min(c):.2f}-{max(c):.2f} | {r.confident}/{len(c)}" if c else "- | -"
        print(f"{scenario} | {r.runs} | {r.correct}/{r.runs} | {r.cordons} | "
              f"{r.false_cordons} | {when} | {conf} | {r.passed}/{r.runs}")  # fmt: skip
    for test, spent in seconds.items():
        print(
            f"{test}: {statistics.median(spent):.1f} s per run (median of {len(spent)}, "
            "pytest start-up included)"
        )
    for scenario, r in rows.items():
        for line in r.wrong or ():
            print(f"wrong: {scenario}: {json.dumps(line)}")
    bad = any(r.false_cordons or r.correct < r.runs for r in rows.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
