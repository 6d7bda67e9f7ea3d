"""Pattern bundles: ``cases.generate`` written as job.json, an empty records.jsonl.gz,
functions.jsonl (docs/spec/bundle-v1.md) and truth.json.

``write`` takes an optional ``progress``, told the fraction done (0 to 1). The steps' shares
(``SHARES``) are their times at 200,000 workers (14.3 s with cProfile on a 2-core machine):
the patterns 7 %, the functions.jsonl text 53 %, job.json 14 %, writing the files 26 %.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict

from collscope.nodeagent.bundle import models, tables, writer
from collscope.operator.simulator.patterns import cases

WINDOW_NS = 20_000_000_000  # EROICA §4.1: a 20 s profiling window
# Fraction done after each step of ``write`` (see the module docstring).
SHARES = {"patterns": 0.07, "lines": 0.60, "job": 0.74}
# Lines between two progress reports: a report costs a clock read, a line ~1 us.
REPORT_EVERY_LINES = 65_536
Report = Callable[[float], None]


def _quiet(_: float) -> None:
    pass


class PatternTruth(BaseModel):
    """truth.json of a pattern bundle (readers of the bundle ignore it)."""

    model_config = ConfigDict(frozen=True)

    case: str
    workers: int
    seed: int
    expected_category: str | None
    culprit_ranks: list[int]
    culprit_fns: list[str]
    detail: str


def job(workers: int) -> models.Job:
    g = cases.GPUS_PER_NODE
    return models.Job(
        job=f"patterns-{workers}",
        world_size=workers,
        ranks=[
            models.RankInfo(rank=r, node=f"gpu-node-{r // g:04d}", gpu=r % g)
            for r in range(workers)
        ],
    )


def lines(p: cases.Patterns, *, progress: Report = _quiet) -> str:
    """functions.jsonl text: one line per (worker, function) the worker runs, worker-major;
    ``progress`` is told the fraction of the lines made."""
    out = []
    names = [(n.replace("\\", "\\\\").replace('"', '\\"'), k) for n, k in p.fns]
    rank, fn, *cols = p.rows()
    b, m, s = (np.round(x, 5).tolist() for x in cols)
    for r, i, br, mr, sr in zip(rank.tolist(), fn.tolist(), b, m, s, strict=True):
        n, k = names[i]
        out.append(
            f'{{"rank":{r},"fn":"{n}","kind":"{k}","beta":{br},"mu":{mr},'
            f'"sigma":{sr},"window_ns":{WINDOW_NS}}}\n'
        )
        if len(out) % REPORT_EVERY_LINES == 0:
            progress(len(out) / len(rank))
    return "".join(out)


def write(
    case: str,
    workers: int,
    seed: int,
    out: str | os.PathLike[str],
    *,
    progress: Report | None = None,
) -> tuple[pathlib.Path, PatternTruth]:
    report = progress or _quiet
    p = cases.generate(case, workers, seed)
    report(SHARES["patterns"])
    lo, hi = SHARES["patterns"], SHARES["lines"]
    text = lines(p, progress=lambda f: report(lo + f * (hi - lo)))
    report(hi)
    truth = PatternTruth(
        case=case,
        workers=workers,
        seed=seed,
        expected_category=p.expected_category,
        culprit_ranks=list(p.culprit_ranks),
        culprit_fns=list(p.culprit_fns),
        detail=p.detail,
    )
    empty = tables.BundleBuilder(job(workers), source="<pattern simulator>").build()
    report(SHARES["job"])
    path = writer.write(
        empty,
        out,
        extra_files={
            "functions.jsonl": text,
            "truth.json": truth.model_dump_json(indent=2) + "\n",
        },
    )
    report(1.0)
    return path, truth
