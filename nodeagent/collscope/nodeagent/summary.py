"""Trigger summaries: what the operator's real-time trigger needs of a rank, computed on the node.

The trigger (operator ``analysis/trigger.py``, Mycroft §4.3 Algorithm 1) asks per sampled rank
over the last Δ: did it complete anything (hang rule: "in flight, no progress, no completion"),
its throughput (bytes completed per second: Algorithm 1 line 6, "throughput drops by half"), the
mean interval between completions per communicator (line 7, "Coll Op interval doubles"), and
the operation in flight with how long nothing of it moved. Pulling these few numbers instead of
Δ seconds of raw records keeps the operator's 10 Hz-ish polling cheap on a large job.

In flight: the ``state`` rows of the rank's latest sample (``sampled_ns``; rows older than that
belong to ops that have since completed). Idle time: the smallest ``idle_ns`` of the op's flows,
or the time since its start when it has no flows yet (an op enqueued whose GPU work never
began); ``stalled_ns`` adds the sample's age.
"""

from __future__ import annotations

import numpy as np

from collscope.nodeagent import api
from collscope.nodeagent.bundle import tables

_NS = 1_000_000_000


def summarize(
    bundle: tables.Bundle,
    rank: int,
    *,
    now_ns: int,
    window_s: float,
    sampled_ns: int | None,
    health: api.Health,
    last_completion_ns: int | None = None,
) -> api.TriggerSummary:
    """The summary of ``rank`` over ``(now - window_s, now]`` from a window ``bundle``;
    ``last_completion_ns`` (``Window.last_completion``) when known beyond the bundle."""
    lo = now_ns - int(window_s * _NS)
    all_ops = bundle.ops[bundle.ops["rank"] == rank]
    last = int(all_ops["end"].max()) if len(all_ops) else None
    if last_completion_ns is not None:
        last = max(last or 0, last_completion_ns)
    ops = all_ops[(all_ops["ts"] > lo) & (all_ops["ts"] <= now_ns)]
    comms: list[api.CommActivity] = []
    intervals: list[float] = []
    for c in np.unique(ops["comm"]).tolist():
        mine = ops[ops["comm"] == c]
        ends = np.sort(mine["end"])
        iv = float(ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) >= 2 else None
        if iv is not None:
            intervals.append(iv)
        comms.append(
            api.CommActivity(
                comm=bundle.comm_id(c),
                ops=len(mine),
                bytes=int(mine["bytes"].sum()),
                mean_interval_ns=iv,
            )
        )
    nbytes = int(ops["bytes"].sum())
    return api.TriggerSummary(
        rank=rank,
        window_s=window_s,
        from_ns=lo,
        to_ns=now_ns,
        health=health,
        completed_ops=len(ops),
        completed_bytes=nbytes,
        throughput_bytes_per_s=nbytes / window_s,
        mean_op_interval_ns=float(np.mean(intervals)) if intervals else None,
        last_completion_ns=last,
        comms=comms,
        in_flight=_in_flight(bundle, rank, now_ns, sampled_ns),
    )


def _in_flight(
    bundle: tables.Bundle, rank: int, now_ns: int, sampled_ns: int | None
) -> list[api.InFlightOp]:
    rows = np.flatnonzero(bundle.states["rank"] == rank)
    if len(rows) == 0:
        return []
    ts = bundle.states["ts"][rows]
    latest = int(ts.max())
    if sampled_ns is not None and latest < sampled_ns:
        return []  # the latest sample saw nothing in flight
    out = []
    for i in rows[ts == latest].tolist():
        s = bundle.states[i]
        lo, hi = int(s["flow_lo"]), int(s["flow_hi"])
        if hi > lo:
            idle = int(bundle.flows["idle_ns"][lo:hi].min())
        else:
            idle = max(0, latest - int(s["start"]))
        out.append(
            api.InFlightOp(
                comm=bundle.comm_id(int(s["comm"])),
                seq=int(s["seq"]),
                op=bundle.string(int(s["op"])),
                bytes=int(s["bytes"]),
                start_ns=int(s["start"]),
                sampled_ns=latest,
                idle_ns=idle,
                stalled_ns=idle + max(0, now_ns - latest),
                flows=hi - lo,
            )
        )
    return sorted(out, key=lambda o: -o.stalled_ns)
