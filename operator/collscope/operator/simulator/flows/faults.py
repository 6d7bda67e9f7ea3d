"""Injected faults: their targets (the seed picks one when not given), effects and truth.

| fault | effect from onset (severity s, default) | target when not given |
| --- | --- | --- |
| congested-switch | its flows move s x slower (3) | a spine on training paths |
| slow-group | a member NIC at 1/s bandwidth (2.5): the ring, its PP | a group with dp >= 3 |
| slow-job | every GPU's forward/backward compute x s (1.3) | any job |

Network effects are ``fabric.Slowdowns``; compute effects ``pipeline.ComputeSlowdown`` per job.
"""

from __future__ import annotations

import numpy as np

from collscope.operator import errors
from collscope.operator.simulator.flows import config, fabric, pipeline, truth


def plan(
    cfg: config.FlowSimConfig, fab: fabric.FabricModel
) -> tuple[fabric.Slowdowns, dict[str, pipeline.ComputeSlowdown], list[truth.FaultTruth]]:
    """Resolve every fault's target and turn it into slowdowns and truth."""
    rng = np.random.default_rng([cfg.seed, 2])
    n_sw, gps = len(fab.switch_names), cfg.fabric.gpus_per_server
    slow = fabric.Slowdowns(
        switch_mult=np.ones(n_sw),
        switch_onset=np.full(n_sw, np.inf),
        nic_mult=np.ones(cfg.fabric.gpus),
        nic_onset=np.full(cfg.fabric.gpus, np.inf),
    )
    compute: dict[str, pipeline.ComputeSlowdown] = {}
    out: list[truth.FaultTruth] = []
    by_name = {j.name: j for j in cfg.jobs}
    for f in cfg.faults:

        def record(
            culprit: str,
            job: str | None = None,
            members: list[str] | None = None,
            nic: str | None = None,
            f: config.FlowFault = f,
        ) -> truth.FaultTruth:
            return truth.FaultTruth(
                kind=f.kind,
                culprit=culprit,
                onset=cfg.start_ns + round(f.onset_s * 1e9),
                severity=f.factor,
                job=job,
                members=members or [],
                nic=nic,
                expected_category=truth.EXPECTED_CATEGORY[f.kind],
            )

        if f.kind == "congested-switch":
            names = fab.switch_names
            name = f.target or names[_busy_switch(cfg, fab, rng)]
            if name not in names:
                raise errors.SimulationError(f"no switch {name!r} (have {names[0]}..)")
            i = names.index(name)
            slow.switch_mult[i], slow.switch_onset[i] = f.factor, f.onset_s
            out.append(record(name))
        elif f.kind == "slow-job":
            job = by_name.get(f.target) if f.target else cfg.jobs[rng.integers(len(cfg.jobs))]
            if job is None:
                raise errors.SimulationError(f"no job {f.target!r}")
            compute[job.name] = pipeline.ComputeSlowdown(f.factor, f.onset_s)
            eps = [fabric.endpoint(int(g), gps) for g in pipeline.gpu_grid(job, gps).ravel()]
            out.append(record(job.name, job=job.name, members=eps))
        else:
            spec, stage, t = _group_target(cfg, f.target, rng)
            grid = pipeline.gpu_grid(spec, gps)[stage, :, t]
            member = int(grid[rng.integers(len(grid))])
            slow.nic_mult[member], slow.nic_onset[member] = f.factor, f.onset_s
            out.append(
                record(
                    f"{spec.name}/pp{stage}/tp{t}",
                    job=spec.name,
                    members=[fabric.endpoint(int(g), gps) for g in grid],
                    nic=fabric.endpoint(member, gps),
                )
            )
    return slow, compute, out


def _busy_switch(
    cfg: config.FlowSimConfig, fab: fabric.FabricModel, rng: np.random.Generator
) -> int:
    """A switch that carries training traffic, a spine when any does (seed's choice).

    A congested switch that no ring or pipeline crosses slows nothing: not a fault to find.
    """
    load = np.zeros(len(fab.switch_names), dtype=np.int64)
    for job in cfg.jobs:
        grid = pipeline.gpu_grid(job, cfg.fabric.gpus_per_server)
        links = [(grid[:-1], grid[1:])] if job.pp > 1 else []  # PP: stage s -> s + 1
        if job.dp > 1:
            links.append((grid, np.roll(grid, -1, axis=1)))  # DP ring d -> d + 1
        for src, dst in links:
            for sw in fab.path(src.ravel(), dst.ravel()):
                load += np.bincount(sw[sw >= 0], minlength=len(load))
    spines = np.arange(cfg.fabric.leaves, len(load))
    pool = spines[load[spines] > 0]
    if not len(pool):
        pool = np.flatnonzero(load > 0)
    return int(pool[rng.integers(len(pool))]) if len(pool) else fab.spine_index(0)


def _group_target(
    cfg: config.FlowSimConfig, target: str | None, rng: np.random.Generator
) -> tuple[config.JobSpec, int, int]:
    """(job, stage, TP rank) of a DP group named ``JOB/ppS/tpT``, or one the seed picks."""
    if target is None:
        choices = [j for j in cfg.jobs if j.dp >= 3] or [j for j in cfg.jobs if j.dp >= 2]
        if not choices:
            raise errors.SimulationError("slow-group needs a job with dp >= 2")
        pick = choices[rng.integers(len(choices))]
        return pick, int(rng.integers(pick.pp)), int(rng.integers(cfg.fabric.gpus_per_server))
    try:
        name, pp_part, tp_part = target.split("/")
        stage, t = int(pp_part.removeprefix("pp")), int(tp_part.removeprefix("tp"))
    except ValueError as e:
        raise errors.SimulationError(
            f"slow-group target must be JOB/ppS/tpT (got {target!r})"
        ) from e
    job = next((j for j in cfg.jobs if j.name == name), None)
    if job is None or not 0 <= stage < job.pp or not 0 <= t < cfg.fabric.gpus_per_server:
        raise errors.SimulationError(f"no DP group {target!r}")
    if job.dp < 2:
        raise errors.SimulationError(f"job {name} has no DP groups (dp = 1)")
    return job, stage, t
