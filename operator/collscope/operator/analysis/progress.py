"""Is a rank still moving? The difference between a hang and a long wait on a busy rank.

CCL-D §4.2.2 (H1) calls a rank that has not entered an operation the culprit of a hang when
there is "no increment in its operation counter": it is stuck before the collective. A rank
that has not entered *but keeps completing operations elsewhere, or moving chunks*, is not
stuck: it is late because the work it is doing takes longer (a slowed DP ring holds up the next
pipeline stage's sends; with iterations of several seconds a pipeline bubble alone lasts
seconds). The ranks waiting on it are then victims of a slowdown, and the trigger's stall
threshold (a fixed floor above proxy hiccups) only says that the wait was long, not that the job
stopped (Mycroft Algorithm 1 checks a failure first; it is the analysis that must tell them
apart).

``moving(bundle, ranks, since, t)``: the ranks that made progress during the second half of the
wait (since, t]: an operation completed, or a flow's counts changed (a state record's
``ts - idle_ns``). The second half, because a rank that got stuck just after the waiter entered
may still have finished its previous operation in the first moments of the wait; a stuck rank
cannot move in the latter half of a wait that already crossed the stall threshold.
"""

from __future__ import annotations

import numpy as np

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import inflight


def moving(bundle: tables.Bundle, ranks: list[int], *, since_ns: int, t_ns: int) -> set[int]:
    """Those of ``ranks`` that made progress in the second half of (since, t] (see above)."""
    if not ranks or t_ns <= since_ns:
        return set()
    mid = since_ns + (t_ns - since_ns) // 2
    want = np.asarray(sorted(set(ranks)), dtype=np.int64)
    ops = bundle.ops
    done = ops[(ops["end"] > mid) & (ops["end"] <= t_ns) & (ops["ts"] <= t_ns)]
    out = {int(r) for r in np.intersect1d(done["rank"].astype(np.int64), want).tolist()}
    st = bundle.states
    m = np.flatnonzero(
        (st["ts"] > mid)
        & (st["ts"] <= t_ns)
        & (st["flow_hi"] > st["flow_lo"])
        & np.isin(st["rank"].astype(np.int64), want)
    )
    if len(m):
        idle = inflight.segment_min(
            bundle.flows["idle_ns"].astype(np.int64),
            st["flow_lo"][m].astype(np.int64),
            st["flow_hi"][m].astype(np.int64),
        )
        last_move = st["ts"][m].astype(np.int64) - idle
        out |= {int(r) for r in st["rank"][m][last_move > mid].tolist()}
    return out


def within_usual_gaps(
    bundle: tables.Bundle, ranks: list[int], *, t_ns: int, k: float, min_gaps: int = 5
) -> set[int]:
    """Those of ``ranks`` whose silence at ``t`` is not longer than ``k`` times their usual
    longest time outside operations (p99 of the gaps between an op's end and the rank's next
    op start, from completions before t).

    A rank outside every operation is either computing or stuck before its next collective;
    one instant cannot tell them apart (Mycroft Table 3's "not entered"), but a duration can:
    a step's compute phase of 5 s leaves its rank silent 5 s every step, so silence counts as
    stuck only past ``k`` times what the rank's own compute phases take (``k`` is the trigger's
    ``hang_k``, the same margin the stall threshold keeps over normal durations). Ranks with
    fewer than ``min_gaps`` gaps seen are never excused.
    """
    out: set[int] = set()
    ops = bundle.ops
    for r in sorted(set(ranks)):
        mine = ops[(ops["rank"] == r) & (ops["ts"] <= t_ns)]
        if len(mine) <= min_gaps:
            continue
        mine = mine[np.argsort(mine["start"], kind="stable")]
        end_so_far = np.maximum.accumulate(mine["end"].astype(np.int64))
        gaps = mine["start"][1:].astype(np.int64) - end_so_far[:-1]
        gaps = gaps[gaps > 0]
        if len(gaps) < min_gaps:
            continue
        usual = float(np.percentile(gaps, 99))
        seen = [int(end_so_far[-1])]
        st = bundle.states
        mst = st["ts"][(st["rank"] == r) & (st["ts"] <= t_ns)]
        if len(mst):
            seen.append(int(mst.max()))
        if t_ns - max(seen) <= k * usual:
            out.add(r)
    return out
