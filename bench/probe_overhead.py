"""Probe overhead per training iteration (target while dormant: ≤ 0.1 %).

    .venv/bin/python bench/probe_overhead.py   # any Python with torch (CPU is fine)

First, the dormant probe the webhook injects (``probe/site/collscope_probe.py``, issue 18),
side by side in one run: the same small training loop with no probe, with the probe's thread
dormant (a ``stat`` of the arm file every 0.5 s) and with it armed (sampling the training
thread's stack at 100 Hz), armed with its torch source recording CPU operators (what a live
job gets is CUDA activity only; on this CPU wheel the operators are the stand-in), and no probe
again (the difference between the two runs without a probe is the noise of the machine), 300
iterations a round, the five interleaved in rotating order for 12 rounds so that drift of a
shared machine hits all alike; medians per iteration.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import contextlib
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

from collscope.probe.site import collscope_probe


def train(torch: Any, iters: int) -> float:
    """Seconds per iteration of a small training loop."""
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(512), torch.randn(512)) for _ in range(256)]

    class Data:
        def __len__(self) -> int:
            return 10**9

        def __getitem__(self, i: int) -> Any:
            return data[i % 256]

    loader = torch.utils.data.DataLoader(Data(), batch_size=64)
    it = iter(loader)
    t0 = time.perf_counter()
    for _ in range(iters):
        x, y = next(it)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / iters


class _CpuOpsProbe(collscope_probe.Probe):
    def torch_source(self) -> collscope_probe.TorchSource:
        return collscope_probe.TorchSource(sys.modules.get("torch"), cpu=True)


def _dormant_round(torch: Any, trace: str, mode: str, n: int) -> float:
    """Seconds per iteration with no probe, a dormant one, or one armed for the round."""
    if mode == "none":
        return train(torch, n)
    kind = _CpuOpsProbe if mode == "armed+ops" else collscope_probe.Probe
    p = kind(trace, 0, poll_s=collscope_probe.POLL_S if mode == "dormant" else 0.01)
    thread = threading.Thread(target=p.run, daemon=True)
    thread.start()
    try:
        if mode.startswith("armed"):
            req = {"id": f"bench-{time.time_ns()}", "window_s": 120, "hz": 100,
                   "deadline_ns": time.time_ns() + 200 * 10**9}  # fmt: skip
            path = os.path.join(trace, collscope_probe.ARM_FILE)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(json.dumps(req))
            os.replace(path + ".tmp", path)
            while not p.armed:
                time.sleep(0.001)
        return train(torch, n)
    finally:
        p.stop.set()
        thread.join()
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(trace, collscope_probe.ARM_FILE))


def dormant_probe(torch: Any, rounds: int = 12, n: int = 300) -> dict[str, float]:
    # the second "none": the noise floor
    modes = ("none", "none again", "dormant", "armed", "armed+ops")
    out: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as trace:
        train(torch, 100)  # warm-up
        for i in range(rounds):
            k = i % len(modes)
            for m in modes[k:] + modes[:k]:  # each mode first as often as the others
                out[m].append(_dormant_round(torch, trace, m.split()[0], n))
    med = {m: statistics.median(v) for m, v in out.items()}
    base = med["none"]
    print(
        f"dormant probe, iteration (median of {rounds} rounds of {n}): no probe "
        f"{base * 1e3:.3f} ms, again {med['none again'] * 1e3:.3f} ms "
        f"({100 * (med['none again'] - base) / base:+.2f} %: the noise), "
        f"dormant {med['dormant'] * 1e3:.3f} ms "
        f"({100 * (med['dormant'] - base) / base:+.2f} %), armed at 100 Hz "
        f"{med['armed'] * 1e3:.3f} ms ({100 * (med['armed'] - base) / base:+.2f} %), armed "
        f"with torch's CPU operators {med['armed+ops'] * 1e3:.3f} ms "
        f"({100 * (med['armed+ops'] - base) / base:+.2f} %)"
    )
    return med


def main() -> int:
    try:
        import torch
    except ImportError:
        print("probe_overhead: torch is not installed; nothing to measure (skipped)")
        return 0
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus (pinned to one), torch "
        f"{torch.__version__}, python {platform.python_version()}"
    )
    dormant_probe(torch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
