"""Benign pauses of a fault-free workload (``simulator.benign``): what each one does to the
records, that the run stays fault-free, and that it stays deterministic per seed."""

from __future__ import annotations

import numpy as np
import pytest

from collscope.nodeagent.bundle import tables
from collscope.operator import errors
from collscope.operator.simulator import benign, config, engine

S = 1_000_000_000


def _run(*events: config.Benign, seed: int = 0) -> engine.SimResult:
    return engine.simulate(
        config.SimConfig(
            ranks=16,
            tp=4,
            pp=2,
            dp=2,
            duration_s=8.0,
            onset_s=4.0,
            seed=seed,
            clock_skew_ms=0.0,
            benign=events,
        )
    )


def _comms(b: tables.Bundle, prefix: str) -> list[int]:
    """Indices of the communicators whose name starts with ``prefix``."""
    pairs = zip(b.comms["comm"].tolist(), b.comms["name"].tolist(), strict=True)
    return sorted({c for c, n in pairs if b.string(n).startswith(prefix)})


T0 = config.DEFAULT_START_NS  # clock skew 0: host times are the reference clock


def test_checkpoint_writers_save_while_the_rest_wait_in_a_barrier() -> None:
    res = _run(config.Benign("checkpoint", at_s=3.0, length_s=2.0))
    b = res.bundle
    assert res.truth.fault == "none" and res.truth.culprit_ranks == []
    (world,) = _comms(b, "world")
    bar = b.ops[b.ops["comm"] == world]
    assert len(bar) == 16 and set(bar["bytes"].tolist()) == {benign.BARRIER_BYTES}
    assert b.string(int(bar["op"][0])) == "AllReduce"
    dur = (bar["end"] - bar["start"]) / S
    writers = (bar["rank"] // 4) % 2 == 0  # rank = tp_i + 4 * (dp_i + 2 * pp_i)
    # DP rank 0 of each model-parallel group writes (1.8-2 s) and barely waits; others wait.
    assert dur[writers].max() < 0.3 and dur[~writers].min() > 1.5
    # nothing but the barrier runs during the pause
    t0, t1 = int(bar["start"].min()), int(bar["end"].max())
    other = b.ops[b.ops["comm"] != world]
    assert not ((other["end"] > t0 + 300_000_000) & (other["start"] < t1 - 1_000_000)).any()


def test_eval_runs_forward_only_without_dp() -> None:
    base = _run().bundle
    res = _run(config.Benign("eval", at_s=3.0, length_s=2.0))
    b = res.bundle
    assert res.truth.fault == "none"
    dp = np.isin(b.ops["comm"], _comms(b, "dp"))
    ends = np.sort(b.ops["end"][dp]) - T0
    gap = np.diff(ends).max() / S
    assert 1.8 < gap < 2.6  # no DP reduction during the 2 s pass
    tp = np.isin(b.ops["comm"], _comms(b, "tp"))
    during = tp & (b.ops["end"] - T0 > 3.5 * S) & (b.ops["end"] - T0 < 4.5 * S)
    assert during.sum() > 0  # TP keeps running during it
    assert len(base.comm_ids) == len(b.comm_ids)  # no world communicator without a checkpoint


def test_wide_round_delays_one_rank_once() -> None:
    a = _run()
    b = _run(config.Benign("wide-round", at_s=3.0, length_s=0.5))
    assert b.truth.fault == "none"
    gaps = [np.diff(np.sort(x.bundle.ops["end"])) / S for x in (a, b)]
    # every rank waits for the late one once (~0.5 s with nothing completing), then no more
    assert gaps[0].max() < 0.2 and 0.4 < gaps[1].max() < 0.7
    assert (gaps[1] > 0.2).sum() == 1


def test_benign_runs_are_deterministic_per_seed() -> None:
    ev = (
        config.Benign("wide-round", at_s=2.0, length_s=0.3),
        config.Benign("eval", at_s=3.0, length_s=1.0),
        config.Benign("checkpoint", at_s=5.0, length_s=1.0),
    )
    x, y, z = _run(*ev, seed=5), _run(*ev, seed=5), _run(*ev, seed=6)
    assert np.array_equal(x.bundle.ops, y.bundle.ops)
    assert np.array_equal(x.bundle.states, y.bundle.states)
    assert not np.array_equal(x.bundle.ops["end"], z.bundle.ops["end"])


def test_a_benign_event_must_lie_inside_the_run() -> None:
    with pytest.raises(errors.SimulationError, match="benign eval"):
        _run(config.Benign("eval", at_s=9.0, length_s=1.0))
