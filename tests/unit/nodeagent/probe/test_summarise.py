"""Algorithm 1 and the critical-path patterns of EROICA §4.2, on hand-made events."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from collscope.nodeagent.probe import collect, coordinate, critical, runtime, summarise, trace


def test_algorithm1_trims_waiting_gaps() -> None:
    u = np.array([0, 0.9, 0, 0, 0, 0, 0.8, 0.9, 0.9, 0, 0.9, 0.8, 0, 0, 0, 0, 0, 0, 0.1])
    assert critical.critical_interval(u) == (6, 11)
    n, mean, std = critical.utilisation(u)
    assert n == 6 and abs(mean - 4.3 / 6) < 1e-9 and std > 0


def test_algorithm1_degenerate_inputs() -> None:
    assert critical.critical_interval(np.zeros(0)) == (0, -1)
    assert critical.critical_interval(np.zeros(4)) == (0, 3)
    assert critical.critical_interval(np.full(5, 0.5)) == (0, 4)


def test_critical_path_priorities_and_python_leaves() -> None:
    ev = [
        summarise.Event("train_step", "python", 0, 100, tid=1),
        summarise.Event("forward", "python", 10, 40, tid=1),
        summarise.Event("gemm", "kernel", 20, 60, tid=7),
        summarise.Event("allreduce", "comm", 50, 80, tid=8),
        summarise.Event("worker_thread", "python", 0, 100, tid=2),  # not the training thread
    ]
    pats = {p.fn: p for p in summarise.summarise(ev, main_tid=1, window=(0, 100))}
    assert pats["gemm"].beta == 0.4  # 20..60: the kernel outranks everything
    assert pats["allreduce"].beta == 0.2  # 60..80
    assert pats["train_step;forward"].beta == 0.1  # 10..20: the leaf, named by its stack
    assert pats["train_step"].beta == 0.3  # 0..10 and 80..100
    assert not any("worker_thread" in k for k in pats)


def test_mu_and_sigma_come_from_samples_on_the_critical_duration() -> None:
    ev = [summarise.Event("allreduce", "comm", 0, 100)]
    ts = np.arange(0, 100, 10, dtype=np.float64)
    val = np.array([0, 0, 0, 0, 0.5, 0.5, 0.5, 0.5, 0, 0], dtype=np.float64)  # waits, then sends
    pats = summarise.summarise(
        ev, main_tid=0, window=(0, 100), samples={"nic": summarise.Samples(ts, val)}
    )
    assert pats[0].mu == 0.5 and pats[0].sigma == 0.0


def test_chrome_trace_events_are_mapped_and_cleaned() -> None:
    doc = {
        "baseTimeNanoseconds": 1_000_000_000,
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "ts": 1.0, "dur": 2.0},
            {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "ts": 1.0, "dur": 2.0, "tid": 7},
            {"ph": "X", "cat": "cpu_op", "name": "aten::pin_memory", "ts": 0, "dur": 1},
            {
                "ph": "X",
                "cat": "python_function",
                "name": "<m add_ of P object at 0x7f00ab>",
                "ts": 5,
            },
            {
                "ph": "X",
                "cat": "python_function",
                "name": "torch/profiler/profiler.py(1): x",
                "ts": 5,
            },
            {"ph": "i", "cat": "kernel", "name": "instant"},
        ],
    }
    ev = trace.events(json.loads(json.dumps(doc)))
    assert [(e.name, e.kind) for e in ev] == [
        ("ncclDevKernel_AllReduce", "comm"),
        ("sm90_gemm", "kernel"),
        ("aten::pin_memory", "memory"),
        ("<m add_ of P object>", "python"),
    ]
    assert ev[0].start_ns == 1_000_001_000 and ev[0].end_ns == 1_000_003_000


def test_agent_hardware_samples_are_read_per_resource(tmp_path: Path) -> None:
    (tmp_path / "hw.3.jsonl").write_text(
        '{"ts": 20, "resource": "nic", "value": 0.5}\n'
        '{"ts": 10, "resource": "nic", "value": 1.5}\n'
        '{"ts": 10, "resource": "sm", "value": 0.9}\n'
    )
    got = runtime._agent_samples(str(tmp_path), 3)
    assert sorted(got) == ["nic", "sm"]
    assert got["nic"].ts_ns.tolist() == [10, 20]
    assert got["nic"].value.tolist() == [1.0, 0.5]  # sorted by time, clipped to [0, 1]
    assert runtime._agent_samples(str(tmp_path), 4) == {}


def test_collect_gathers_probe_files_and_skips_bad_lines(tmp_path: Path) -> None:
    a, b = tmp_path / "pod-a", tmp_path / "pod-b"
    a.mkdir()
    b.mkdir()
    line = (
        '{"rank": %d, "fn": "f", "kind": "python", "beta": 0.2, "mu": 0.5, "sigma": 0.1, '
        '"window_ns": 5}\n'
    )
    coordinate.write_patterns(str(a), 0, [line % 0])
    coordinate.write_patterns(str(b), 1, [line % 1, '{"rank": 1, "kind": "gpu"}\n'])
    got = collect.collect([str(a), str(b)])
    assert got.files == 2 and got.bad_lines == 1
    assert [p.rank for p in got.patterns] == [0, 1]
    assert got.lines().count("\n") == 2 and '"beta":0.2' in got.lines()
