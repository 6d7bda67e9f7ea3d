"""Several jobs on one fabric, as the flow collector sees them, with their ground truth.

``simulate(cfg)`` resolves the faults (``faults``: targets the seed picks when not given), runs
every job (``pipeline``) on the shared fabric (``fabric``), then plays the collector
(``collector``): storage traffic from GPU NICs to non-GPU endpoints, lost records, records split
in two, timestamp noise, and the cut at ``duration_s``. The result holds the flows as columns
(for in-memory analysis), the ``job.json`` of the fabric (every GPU slot with its server and
endpoint id: the physical topology of LLMPrism Algorithm 1) and ``truth.json``; ``write`` makes
a flows-only bundle. Both take an optional ``progress``, told the fraction done (0 to 1): the
jobs simulated, then the flows written (``collscope simulate --kind flows`` draws it as a bar).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import models, tables, writer
from collscope.operator.simulator.flows import collector, config, fabric, pipeline, truth
from collscope.operator.simulator.flows import faults as fault_plan

IntArray = npt.NDArray[np.int64]
Report = Callable[[float], None]
# Flows written between two progress reports: a report costs a clock read, a flow ~15 us.
REPORT_EVERY_FLOWS = 16_384


def _quiet(_: float) -> None:
    pass


@dataclass(frozen=True)
class FlowSimResult:
    """Flows sorted by start (ns), names interned; ``kind`` (PP/DP/other) is truth only."""

    endpoints: tuple[str, ...]
    switches: tuple[str, ...]
    src: IntArray
    dst: IntArray
    ts: IntArray
    nbytes: IntArray
    duration: IntArray
    sw_ptr: IntArray
    sw_idx: IntArray
    kind: IntArray
    job: models.Job
    truth: truth.FlowTruth

    def __len__(self) -> int:
        return len(self.ts)

    def columns(self) -> dict[str, object]:
        """Keyword arguments of ``analysis.flows.table.FlowTable.from_columns``."""
        return {
            "endpoints": self.endpoints,
            "switches": self.switches,
            "src": self.src,
            "dst": self.dst,
            "ts": self.ts,
            "nbytes": self.nbytes,
            "duration": self.duration,
            "sw_ptr": self.sw_ptr,
            "sw_idx": self.sw_idx,
        }

    def net_flows(self) -> Iterator[models.NetFlow]:
        """Every flow as its ``flows.jsonl`` model, in start order."""
        columns = (self.ts, self.src, self.dst, self.nbytes, self.duration)
        return tables.net_flow_models(
            self.endpoints, self.switches, columns, self.sw_ptr, self.sw_idx
        )

    def write(
        self, out: str | os.PathLike[str], *, compress: bool = True, progress: Report | None = None
    ) -> pathlib.Path:
        """A flows-only bundle: job.json, empty records, flows.jsonl, truth.json; ``progress``
        is told the fraction of the flows written (most of the time goes there)."""
        empty = tables.BundleBuilder(self.job, source="<flow simulator>").build()
        text = self.truth.model_dump_json(by_alias=True) + "\n"
        return writer.write(
            empty,
            out,
            compress=compress,
            extra_files={"truth.json": text},
            net_flows=_counted(self.net_flows(), len(self), progress or _quiet),
        )


def _counted(
    flows: Iterator[models.NetFlow], total: int, report: Report
) -> Iterator[models.NetFlow]:
    """``flows`` as they go to the writer, reporting the fraction written."""
    for i, f in enumerate(flows, 1):
        yield f
        if i % REPORT_EVERY_FLOWS == 0:
            report(i / total)
    report(1.0)


def simulate(cfg: config.FlowSimConfig, *, progress: Report | None = None) -> FlowSimResult:
    """Simulate ``cfg`` (validated first); ``progress`` is told the fraction of the jobs run."""
    report = progress or _quiet
    cfg.validate()
    fab = fabric.FabricModel(cfg.fabric)
    gps = cfg.fabric.gpus_per_server
    slow, compute, faults = fault_plan.plan(cfg, fab)
    parts: list[pipeline.JobFlows] = []
    for k, job in enumerate(cfg.jobs):
        rng = np.random.default_rng([cfg.seed, 5, k])
        parts.append(
            pipeline.simulate(
                job,
                fab,
                slow,
                compute.get(job.name, pipeline.ComputeSlowdown()),
                duration_s=cfg.duration_s,
                rng=rng,
            )
        )
        report((k + 1) / len(cfg.jobs))
    flows = collector.collect(cfg, fab, parts)
    n_gpu = cfg.fabric.gpus
    gpu_names = [fabric.endpoint(g, gps) for g in range(n_gpu)]
    ranks = [
        models.RankInfo(rank=g, node=fabric.server_name(g // gps), gpu=g % gps, nic=gpu_names[g])
        for g in range(n_gpu)
    ]
    job_model = models.Job(
        job=f"fabric of {n_gpu} GPUs, {len(cfg.jobs)} jobs (flows only)",
        world_size=n_gpu,
        ranks=ranks,
    )
    tr = _truth(cfg, parts, gpu_names, faults)
    return FlowSimResult(
        endpoints=(*gpu_names, *flows.extra_endpoints),
        switches=fab.switch_names,
        src=flows.src,
        dst=flows.dst,
        ts=flows.ts,
        nbytes=flows.nbytes,
        duration=flows.duration,
        sw_ptr=flows.sw_ptr,
        sw_idx=flows.sw_idx,
        kind=flows.kind,
        job=job_model,
        truth=tr,
    )


def _truth(
    cfg: config.FlowSimConfig,
    parts: list[pipeline.JobFlows],
    names: list[str],
    faults: list[truth.FaultTruth],
) -> truth.FlowTruth:
    gps = cfg.fabric.gpus_per_server
    jobs: list[truth.JobTruth] = []
    groups: list[truth.GroupTruth] = []
    pairs: set[tuple[str, str, Literal["dp", "pp"]]] = set()
    step_ends: dict[str, list[int]] = {}
    cut = cfg.duration_s
    for job, part in zip(cfg.jobs, parts, strict=True):
        grid = pipeline.gpu_grid(job, gps)
        jobs.append(
            truth.JobTruth(
                name=job.name,
                servers=[fabric.server_name(v) for v in job.servers],
                endpoints=[names[g] for g in grid.ravel()],
                tp=gps,
                pp=job.pp,
                dp=job.dp,
                micro_batches=job.micro_batches,
            )
        )
        for s in range(job.pp):
            for t in range(gps):
                ring = [names[g] for g in grid[s, :, t]]
                if job.dp >= 2:
                    groups.append(
                        truth.GroupTruth(
                            label=f"{job.name}/pp{s}/tp{t}", job=job.name, members=ring
                        )
                    )
                    for d in range(job.dp):
                        a, b = sorted((ring[d], ring[(d + 1) % job.dp]))
                        pairs.add((a, b, "dp"))
                if s + 1 < job.pp:
                    for d in range(job.dp):
                        a, b = sorted((names[grid[s, d, t]], names[grid[s + 1, d, t]]))
                        pairs.add((a, b, "pp"))
        ends = (
            np.stack(part.step_ends, axis=-1) if part.step_ends else np.zeros((job.pp, job.dp, 0))
        )
        for s in range(job.pp):
            for d in range(job.dp):
                row = ends[s, d]
                ns = [cfg.start_ns + round(v * 1e9) for v in row[row < cut].tolist()]
                for t in range(gps):
                    step_ends[names[grid[s, d, t]]] = ns
    return truth.FlowTruth(
        seed=cfg.seed,
        jobs=jobs,
        dp_groups=groups,
        pairs=sorted(pairs),
        step_ends=step_ends,
        faults=faults,
    )
