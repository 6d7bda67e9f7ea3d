"""Every rank's ``GET /v1/summaries`` row at a tick, built from a bundle: the job-wide rows a
replay feeds ``engine.diagnose(..., summaries=...)`` so that it judges hangs on what the live
operator pulls each tick (``controller/trigger_loop.py``, ``analysis/jobwide.py``).

The one implementation of that replayed pull: ``collscope analyze``, the operator's own
replay of a Diagnosis window (``controller/diagnosis_handlers.analyse``) and ``bench/``
(accuracy, time invariance, job-wide cost) all use ``Summaries``. Each row is made by the
agent's own ``collscope.nodeagent.summary.summarize`` (the row format's one definition), over
the records the rank's node would hold at the tick, as ``Service.summaries`` does.
"""

from __future__ import annotations

from collscope.nodeagent import api, summary
from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import inflight, placement, view

NS = 1_000_000_000
# The completion window the operator asks the agents for (trigger_loop.JOBWIDE_WINDOW_S is this):
# one tick's worth, since the check reads only each rank's operation in flight and latest
# completion.
WINDOW_S = 1.0
# The agent's slack for the latest state sample (Service.summaries): two of its sampling
# periods, the period measured in the bundle (``inflight.infer_interval_ns``) or given; the
# agent's default, 100 ms, only where the bundle's states do not tell. Records of
# (t - WINDOW_S - SLACK_INTERVALS x interval, t] are summarised.
SLACK_INTERVALS = 2.0
DEFAULT_INTERVAL_S = 0.1


class Summaries:
    """``engine.diagnose``'s ``summaries``: every rank's ``/v1/summaries`` row at tick ``t``, as
    its node's agent answers (``Service.summaries``): ``summary.summarize`` over the node's
    records of the last ``WINDOW_S`` plus two sampling periods, the rank's latest completion held
    (``Window.last_completion``). The bundle gives no sampling times, so ``sampled_ns`` is
    None (the latest state rows stand for the latest sample: a stale one is told by its age).
    Ticks must come in increasing order (the latest completions are accumulated); one instance
    per replay. ``interval_ns``: the agents' sampling period; None: measured in the bundle at
    the first tick."""

    def __init__(self, interval_ns: int | None = None) -> None:
        self.interval_ns = interval_ns
        self._prev_ns: int | None = None
        self._last: dict[int, int] = {}
        self._nodes: dict[str, list[int]] | None = None

    def __call__(self, bundle: tables.Bundle, t_ns: int) -> list[api.TriggerSummary]:
        if self._prev_ns is not None and t_ns < self._prev_ns:
            raise ValueError(f"tick {t_ns} before the previous one, {self._prev_ns}")
        if self.interval_ns is None:
            default = int(DEFAULT_INTERVAL_S * NS)
            self.interval_ns = inflight.infer_interval_ns(bundle, default)
        if self._nodes is None:
            where = placement.Placement.of(bundle.job)
            self._nodes = {}
            for r in sorted({int(i.rank) for i in bundle.job.ranks}):
                self._nodes.setdefault(where.node(r) or "-", []).append(r)
        ops = bundle.ops
        new = ops[(ops["ts"] <= t_ns) & (ops["ts"] > (self._prev_ns or -1))]
        self._prev_ns = t_ns
        for r, e in zip(new["rank"].tolist(), new["end"].tolist(), strict=True):
            self._last[r] = max(self._last.get(r, e), e)
        lo = t_ns - int(WINDOW_S * NS) - int(SLACK_INTERVALS * self.interval_ns)
        cut = view.select(bundle, since_ns=lo, until_ns=t_ns)
        out = []
        for ranks in self._nodes.values():
            mine = view.select(cut, ranks=ranks)
            for r in ranks:
                got = summary.summarize(
                    mine,
                    r,
                    now_ns=t_ns,
                    window_s=WINDOW_S,
                    sampled_ns=None,
                    health="live",
                    last_completion_ns=self._last.get(r),
                )
                out.append(got)
        return out
