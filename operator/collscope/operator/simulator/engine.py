"""Orchestration: run the job phase by phase, inject the fault, stream records into a bundle.

Every rank has a clock (float64 seconds since job start in the reference clock; ``inf`` once
it is stuck forever). A ``Compute`` step advances its ranks' clocks by a jittered span; a
``Phase`` takes its members' clocks as entry times, is timed chunk by chunk
(``collectives``), emitted at once (``emit``; the per-chunk arrays are then dropped, so memory
stays bounded by one phase) and sets each member's clock to its end. The run stops when every
clock has passed ``duration_s`` or is stuck. Benign events of the workload (``benign``:
checkpoints, evaluation passes, one late rank) run between iterations. Randomness comes from
independent seeded streams (compute jitter here, culprit choice, stalls and clock offsets
elsewhere) so a healthy and a faulty run of one seed share their jitter up to onset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from collscope.nodeagent.bundle import tables
from collscope.operator import errors
from collscope.operator.simulator import (
    benign,
    collectives,
    config,
    emit,
    faults,
    program,
    topology,
)
from collscope.operator.simulator import truth as truth_mod


@dataclass(frozen=True)
class SimResult:
    """A simulated bundle (job, comm, op and state records) and what was injected."""

    bundle: tables.Bundle
    truth: truth_mod.Truth


def simulate(
    cfg: config.SimConfig, *, progress: Callable[[float], None] | None = None
) -> SimResult:
    """Simulate ``cfg`` (validated first) and return its bundle and ground truth.

    ``progress`` is told the fraction of simulated time every rank has passed (0 to 1), after
    every step of the program (``collscope simulate`` draws a bar with it).
    """
    cfg.validate()
    topo = topology.build(cfg)
    inj = faults.plan(cfg, topo)
    builder = tables.BundleBuilder(emit.job_model(cfg, topo), source="<simulator>")
    clock_rng = np.random.default_rng([cfg.seed, 3])
    node_off = clock_rng.uniform(-cfg.clock_skew_ms, cfg.clock_skew_ms, topo.nodes) * 1e6
    clk = emit.Clock(
        start_ns=cfg.start_ns,
        offset_ns=np.rint(node_off[topo.node_of]).astype(np.int64),
        interval_ns=round(cfg.state_interval_ms * 1e6),
        duration_ns=round(cfg.duration_s * 1e9),
        channels=cfg.channels,
        comm_ids=tuple(c.cid for c in topo.comms),
        phase_ns=(
            np.random.default_rng([cfg.seed, 4])
            .integers(0, round(cfg.state_interval_ms * 1e6), cfg.ranks)
            .astype(np.int64)
            if cfg.sample_phase
            else None
        ),
    )
    emit.comms(builder, topo, clk)
    _run(cfg, topo, inj, builder, clk, progress=progress or _quiet)
    emit.hardware(builder, cfg, topo, inj.fx, clk)
    return SimResult(bundle=builder.build(), truth=inj.truth())


def _quiet(_: float) -> None:
    pass


def _run(
    cfg: config.SimConfig,
    topo: topology.Topology,
    inj: faults.Injector,
    builder: tables.BundleBuilder,
    clk: emit.Clock,
    *,
    progress: Callable[[float], None],
) -> None:
    jitter_rng = np.random.default_rng([cfg.seed, 1])
    clock = np.zeros(cfg.ranks)
    seqs = np.zeros(len(topo.comms), dtype=np.int64)
    fx = inj.fx

    def run(todo: Iterable[program.Step]) -> bool:
        """Run ``todo`` (consumed lazily); True once every clock has passed the run's end."""
        for step in todo:
            if isinstance(step, program.Compute):
                noise = jitter_rng.standard_normal(len(step.ranks))
                t0 = clock[step.ranks]
                span = step.base_s * np.maximum(1.0 + cfg.workload.compute_jitter * noise, 0.5)
                mult = np.where(t0 >= fx.onset, fx.compute_mult[step.ranks], 1.0)
                clock[step.ranks] = t0 + span * mult
            elif isinstance(step, program.Delay):
                clock[step.ranks] += step.seconds
            else:
                _phase(cfg, topo, inj, builder=builder, clk=clk, phase=step, clock=clock, seqs=seqs)
            slowest = float(clock.min())
            if slowest >= cfg.duration_s:
                return True
            progress(slowest / cfg.duration_s)
        return False

    steps = list(program.iteration(cfg, topo))
    pending = sorted(enumerate(cfg.benign), key=lambda e: e[1].at_s)
    while True:
        before = clock.copy()
        while pending and float(clock.min()) >= pending[0][1].at_s:
            i, ev = pending.pop(0)
            if run(benign.steps(i, ev, cfg, topo, clock)):
                return
        if run(steps):
            return
        if not np.any(clock > before):  # e.g. zero layers and no DP/PP: nothing ever happens
            raise errors.SimulationError("an iteration of this workload takes no time")


def _phase(
    cfg: config.SimConfig,
    topo: topology.Topology,
    inj: faults.Injector,
    *,
    builder: tables.BundleBuilder,
    clk: emit.Clock,
    phase: program.Phase,
    clock: collectives.FloatArray,
    seqs: collectives.IntArray,
) -> None:
    groups = phase.groups
    n_groups, n = groups.shape
    entries = clock[groups]
    group_seq = seqs[phase.comms]
    seqs[phase.comms] += 1
    ops = list(phase.member_ops()) * n_groups
    nbytes = np.full(n_groups * n, phase.nbytes, dtype=np.int64)
    stuck = np.zeros(n_groups, dtype=bool)
    inj.before(phase, entries, stuck=stuck, seqs=group_seq, ops=ops, nbytes=nbytes)
    res = collectives.time_phase(phase, entries, stuck, topo=topo, cfg=cfg, fx=inj.fx)
    if inj.after(phase, entries, res.end, res.inter, group_seq):
        res = collectives.time_phase(phase, entries, stuck, topo=topo, cfg=cfg, fx=inj.fx)
    if inj.bytes_factor_member >= 0:  # set by ``before`` in this very phase
        res.flows.total[res.flows.owner == inj.bytes_factor_member] *= 2
        inj.bytes_factor_member = -1
    peer = (
        np.ascontiguousarray(groups[:, ::-1]).ravel()
        if phase.kind == "p2p"
        else np.full(n_groups * n, -1, dtype=np.int64)
    )
    info = emit.OpInfo(
        ops=ops,
        nbytes=nbytes,
        seq=np.repeat(group_seq, n),
        comm=np.repeat(phase.comms, n),
        peer=peer,
    )
    emit.phase(builder, phase, res, info, clk)
    clock[np.ascontiguousarray(groups).ravel()] = res.end
