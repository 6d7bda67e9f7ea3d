"""Benign pauses of a fault-free job (issue 12): what training jobs do on purpose.

Each ``config.Benign`` event becomes program steps that the engine runs at the first iteration
boundary at which every rank has passed the event's ``at_s``:

- checkpoint (Megatron's legacy ``save_checkpoint``): the data-parallel rank 0 of every
  model-parallel group writes its shard, ``length_s`` x U(0.9, 1) each (file systems differ per
  writer), while every other rank has already entered ``torch.distributed.barrier()``; on
  NCCL that barrier is an AllReduce of one float32 element (4 bytes) on the default process
  group. Ranks leave training at their own iteration ends and resume together when the
  barrier completes. CCL-D §4.2.1 names such barriers as what a hang rule must ignore.
- eval: forward-only iterations (TP AllReduces and PP sends continue, at the forward pace;
  no backward and no DP gradient reduction) until every rank has passed ``length_s`` after
  the slowest one started evaluating; training then resumes.
- wide-round: one seeded rank starts its iteration ``length_s`` late, once (a data-loader
  hiccup): one round of every group it is in is wide, the rounds after are not.

Nothing here changes what the truth says: a run with these events is fault-free. Choices
come from their own seeded stream (``[seed, 17, event index]``), so a run stays deterministic
per seed and the compute jitter of a run without events is untouched up to the first event.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from collscope.operator import errors
from collscope.operator.simulator import config, program, topology

# ProcessGroupNCCL::barrier() all-reduces a one-element float32 tensor.
BARRIER_BYTES = 4


def steps(
    index: int,
    ev: config.Benign,
    cfg: config.SimConfig,
    topo: topology.Topology,
    clock: npt.NDArray[np.float64],
) -> Iterator[program.Step]:
    """The steps of event ``index`` (its position in ``cfg.benign``). ``clock`` is the
    engine's live clock array: the eval pass reads it between steps to know when to stop."""
    rng = np.random.default_rng([cfg.seed, 17, index])
    if ev.kind == "checkpoint":
        if topo.world_comm < 0:
            raise errors.SimulationError("a checkpoint needs the world communicator")
        writers = np.flatnonzero(topo.dp_i == 0).astype(np.int64)
        yield program.Delay(writers, ev.length_s * rng.uniform(0.9, 1.0, len(writers)))
        yield program.Phase(
            "ring",
            "AllReduce",
            np.arange(cfg.ranks, dtype=np.int64)[None, :],
            np.array([topo.world_comm], dtype=np.int64),
            BARRIER_BYTES,
            "Ring",
            False,
        )
    elif ev.kind == "eval":
        until = float(clock.min()) + ev.length_s
        while (was := float(clock.min())) < until:
            yield from program.iteration(cfg, topo, train=False)
            if not float(clock.min()) > was:
                raise errors.SimulationError(
                    "an evaluation iteration of this workload takes no time"
                )
    else:
        late = np.array([int(rng.integers(cfg.ranks))], dtype=np.int64)
        yield program.Delay(late, np.array([ev.length_s]))
