"""Killed and frozen ranks in the one box: ``hang.process``, the exact rank, no cordon, N of N.

    .venv/bin/python bench/process_faults.py               # 5 runs of each demo fault, ~2 min
    .venv/bin/python bench/process_faults.py --runs 1      # once each
    .venv/bin/python bench/process_faults.py --e2e         # + the e2e tests, 5 times each, ~3 min

Demo runs (issue 12, item 3): ``collscope demo --fault process-killed|process-frozen --seed S``
as the command runs it (``onebox.demo.run``: 8 rank processes driving the real plugin, real node
agents, the operator's trigger loop and the Diagnosis handler's analysis), ``S`` = the run
number, so the culprit rank changes from run to run; the rank kills (SIGKILL) or stops
(SIGSTOP) itself once a chunk of its AllReduce moved. A run is right when the category is
``hang.process``, the culprits are exactly the injected rank, and the shipped remediation policy
(``policy.decide``, what the remediator applies before its breaker) does not cordon.

``--e2e``: the same faults from outside (the test SIGKILLs and reaps, or SIGSTOPs, rank 5) under
the real operator (kopf against kmock, remediation included):
``tests/e2e/test_onebox.py::test_killed_training_process_last_state_is_read`` and
``::test_frozen_training_process_is_a_process_hang``, which assert the category, the exact rank
and that no node is unschedulable; run ``--runs`` times each. CI runs each scenario once (the
e2e tests). Exit code 0 when every run is right.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from collscope.operator.domain import policy
from collscope.operator.onebox import box, demo

ROOT = pathlib.Path(__file__).resolve().parents[1]
FAULTS = ("process-killed", "process-frozen")
E2E_TESTS = {
    "SIGKILL (e2e)": "tests/e2e/test_onebox.py::test_killed_training_process_last_state_is_read",
    "SIGSTOP (e2e)": "tests/e2e/test_onebox.py::test_frozen_training_process_is_a_process_hang",
}


@dataclass(frozen=True)
class Run:
    fault: str
    seed: int
    injected: tuple[int, ...]
    category: str | None
    culprits: tuple[int, ...]
    confidence: float
    cordon: bool
    detect_s: float | None
    elapsed_s: float

    @property
    def right(self) -> bool:
        return (
            self.category == "hang.process" and self.culprits == self.injected and not self.cordon
        )


def demo_run(fault: str, seed: int, plugin: pathlib.Path) -> Run:
    with tempfile.TemporaryDirectory(prefix="collscope-bench-") as tmp:
        res = demo.run(
            fault, seed=seed, out=pathlib.Path(tmp) / "bundle", plugin=plugin, say=lambda _: None
        )
    d, t = res.outcome.result, res.truth
    detect = None
    if d is not None and d.detected_at is not None and t.onset is not None:
        detect = (d.detected_at - t.onset) / 1e9
    return Run(
        fault=fault,
        seed=seed,
        injected=tuple(t.culprit_ranks),
        category=None if d is None else d.category,
        culprits=() if d is None else tuple(c.rank for c in d.culprits if c.rank is not None),
        confidence=0.0 if d is None else d.confidence,
        cordon=d is not None and policy.decide(policy.RemediationPolicy(), d).act,
        detect_s=detect,
        elapsed_s=res.elapsed_s,
    )


def e2e_run(test: str, plugin: pathlib.Path) -> tuple[bool, float, str]:
    started = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "COLLSCOPE_PLUGIN": str(plugin)},
    )  # fmt: skip
    tail = (res.stdout.strip().splitlines() or [""])[-1]
    return res.returncode == 0, time.perf_counter() - started, tail


def machine() -> str:
    model = ""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs {model}".strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--runs", type=int, default=5, help="runs of each scenario (default 5)")
    p.add_argument("--e2e", action="store_true", help="also run the e2e tests --runs times each")
    p.add_argument("--plugin", default=None, help="the built plugin (default: native/build)")
    args = p.parse_args(argv)
    plugin = box.find_plugin(args.plugin)
    print(f"machine: {machine()}; {time.strftime('%Y-%m-%d')}")
    print(f"{'fault':<16}{'seed':>5}  {'injected':<9}{'category':<15}{'culprits':<10}"
          f"{'conf':>5}  {'cordon':<7}{'detect':>7}  {'run':>6}  verdict")  # fmt: skip
    ok = 0
    runs: list[Run] = []
    for fault in FAULTS:
        for seed in range(1, args.runs + 1):
            r = demo_run(fault, seed, plugin)
            runs.append(r)
            ok += r.right
            detect = "-" if r.detect_s is None else f"{r.detect_s:.2f}s"
            print(
                f"{fault:<16}{seed:>5}  {','.join(map(str, r.injected)):<9}"
                f"{r.category or 'none':<15}{','.join(map(str, r.culprits)) or '-':<10}"
                f"{r.confidence:>5.2f}  {'yes' if r.cordon else 'no':<7}{detect:>7}  "
                f"{r.elapsed_s:>5.1f}s  {'right' if r.right else 'WRONG'}",
                flush=True,
            )
    total = len(runs)
    for fault in FAULTS:
        mine = [r for r in runs if r.fault == fault]
        print(f"{fault}: {sum(r.right for r in mine)} of {len(mine)} right")
    if args.e2e:
        for name, test in E2E_TESTS.items():
            passed = 0
            for i in range(args.runs):
                good, took, tail = e2e_run(test, plugin)
                passed += good
                print(f"{name} run {i + 1}: {'passed' if good else 'FAILED'} ({took:.0f} s) {tail}")
            print(f"{name}: {passed} of {args.runs} passed", flush=True)
            ok += passed
            total += args.runs
    return 0 if ok == total else 1


if __name__ == "__main__":
    sys.exit(main())
