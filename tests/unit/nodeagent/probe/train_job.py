"""A tiny data-parallel training job (gloo, CPU) with one injected fault per rank, run by
test_training_job.py under the probe (PYTHONPATH=probe/site, COLLSCOPE_PROBE=1):

- rank 1: slow data loading (``slow_load`` sleeps in ``Dataset.__getitem__``);
- rank 2: garbage-collection pauses (``gc_pause``: cyclic garbage and a collection every
  iteration);
- rank 3: a deliberately slow rank (``slow_compute``: extra matrix products);
- rank 0: healthy.

Faults start at iteration FAULT_ONSET; the job runs TRAIN_ITERS iterations.
"""

from __future__ import annotations

import gc
import importlib
import os
import time
from typing import Any

# Untyped on purpose: the file type-checks the same with and without torch installed.
torch: Any = importlib.import_module("torch")
dist: Any = importlib.import_module("torch.distributed")

RANK = int(os.environ["RANK"])
ITERS = int(os.environ.get("TRAIN_ITERS", "130"))
ONSET = int(os.environ.get("FAULT_ONSET", "60"))
BATCH = 8
_state = {"step": 0}


def slow_load() -> None:
    time.sleep(0.0006)


def gc_pause() -> None:
    junk: list[list[object]] = [[[] for _ in range(4)] for _ in range(2000)]
    for a in junk:
        a.append(a)  # cycles: only the collector frees them
    del junk
    gc.collect(1)  # the young generations: a full collection under torch takes ~0.3 s


def slow_compute(x: Any) -> Any:
    m = torch.randn(128, 128)
    for _ in range(12):
        m = torch.tanh(m @ m)
    return x + 0 * m.sum()


class Data:  # map-style: DataLoader needs only __len__ and __getitem__
    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        if RANK == 1 and _state["step"] >= ONSET:
            slow_load()
        return torch.randn(16), torch.randn(1)


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Data(), batch_size=BATCH)
    for step, (batch, y) in enumerate(loader):
        _state["step"] = step
        x = batch
        if RANK == 2 and step >= ONSET:
            gc_pause()
        if RANK == 3 and step >= ONSET:
            x = slow_compute(batch)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step + 1 >= ITERS:
            break
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
