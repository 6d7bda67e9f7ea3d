"""Algorithm 1 and the critical-path patterns of EROICA §4.2, on hand-made events."""

from __future__ import annotations

import numpy as np

from collscope.nodeagent.patterns import critical, summarise


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


def test_a_held_sample_stands_for_executions_without_one() -> None:
    ev = [summarise.Event("gemm", "kernel", 100, 110), summarise.Event("gemm", "kernel", 300, 310)]
    ts = np.array([50.0, 250.0])
    val = np.array([0.5, 1.0])
    held = summarise.Samples(ts, val, hold_ns=60)  # 100 - 50 <= 60; 300 - 250 <= 60
    (p,) = summarise.summarise(ev, main_tid=0, window=(0, 400), samples={"sm": held})
    assert p.mu == 0.75 and p.sigma == 0.0
    short = summarise.Samples(ts, val, hold_ns=49)  # too old for both: unknown, 0
    (p,) = summarise.summarise(ev, main_tid=0, window=(0, 400), samples={"sm": short})
    assert p.mu == 0.0
    (p,) = summarise.summarise(
        ev, main_tid=0, window=(0, 400), samples={"sm": summarise.Samples(ts, val)}
    )
    assert p.mu == 0.0  # no hold by default
