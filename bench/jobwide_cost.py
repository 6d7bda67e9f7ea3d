"""The job-wide hang check's cost per tick (issue 12; ``analysis/jobwide.py``).

Every tick the operator pulls each rank's ``/v1/summaries`` row and runs the check over all of
them. This measures, on an eval-dev bundle's replayed rows (``analysis/summaries.py``, the
agent's own ``summary.summarize``), replicated to ``--ranks`` ranks: the JSON bytes per rank, the
agent's ``summarize`` time per rank, the operator's parse of one 8-rank node's answer and the
check (``JobWide.update``) over every row. Not over HTTP (``bench/operator_scale.py`` is).

    .venv/bin/python bench/jobwide_cost.py [--bundle ../shared/eval-dev/case-009] [--ranks 1024]
"""

from __future__ import annotations

import argparse
import sys
import time

from collscope.nodeagent import api
from collscope.nodeagent.bundle import reader
from collscope.operator.analysis import jobwide, summaries

NS = 1_000_000_000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", default="../shared/eval-dev/case-009")
    p.add_argument("--ranks", type=int, default=1024, help="rows replicated to this many ranks")
    p.add_argument("--ticks", type=int, default=5, help="ticks measured (the bundle's last)")
    a = p.parse_args(argv)
    bundle = reader.load(a.bundle)
    span = bundle.time_span()
    if span is None:
        print(f"{a.bundle}: no records", file=sys.stderr)
        return 1
    rows_of = summaries.Summaries()
    ticks = [span[1] - (a.ticks - i) * NS for i in range(a.ticks)]
    t0 = time.perf_counter()
    per_tick = [rows_of(bundle, t) for t in ticks]
    summarize_s = (time.perf_counter() - t0) / sum(len(r) for r in per_tick)
    rows = per_tick[-1]
    world = len(rows)
    copies = max(1, a.ranks // world)
    big = [r.model_copy(update={"rank": r.rank + c * world}) for c in range(copies) for r in rows]
    node = api.SummariesResponse(node="n", now_ns=ticks[-1], summaries=big[:8])
    body = node.model_dump_json().encode()
    api.SummariesResponse.model_validate_json(body)  # pydantic's first call is slower
    t0 = time.perf_counter()
    for _ in range(100):
        api.SummariesResponse.model_validate_json(body)
    parse_s = (time.perf_counter() - t0) / 100
    limits = jobwide.Limits(
        floor_ns=int(1.2 * NS), k=4.0, interval_ns=NS // 10, max_age_intervals=2.0,
        period_ns=NS, periods=2.0, min_ops=8, barrier_max_bytes=0, known=lambda comm: None,
    )  # fmt: skip
    check = jobwide.JobWide()
    check.update(big, ticks[-2], limits)
    t0 = time.perf_counter()
    check.update(big, ticks[-1], limits)
    check_s = time.perf_counter() - t0
    per_rank = len(body) / len(node.summaries)
    print(f"bundle {a.bundle}: {world} ranks, rows replicated x{copies} = {len(big)} ranks")
    print(f"JSON per rank: {per_rank:.0f} bytes; per tick: {per_rank * len(big) / 1e6:.2f} MB")
    print(f"agent summarize: {summarize_s * 1e3:.3f} ms per rank")
    print(f"operator parse of one 8-rank answer: {parse_s * 1e3:.3f} ms "
          f"({parse_s * len(big) / 8 * 1e3:.1f} ms for all nodes)")  # fmt: skip
    print(f"check over {len(big)} rows: {check_s * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
