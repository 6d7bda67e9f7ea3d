"""Function-level diagnosis of a live job: arm every rank's probe, pull, localise (EROICA §4).

EROICA profiles every worker for a short window once a degradation is seen (§4.1), summarises
each function as (β, μ, sigma) (§4.2) and finds the worker and function unlike the others by
differential distance (§4.3). Here: ``arm`` asks the agent of each node of the job to arm its
ranks' dormant probes (``POST /v1/profile``, one request id for the job); after the window
``pull`` reads their reports (``GET /v1/profile``) and ``pending`` says whether any rank is
still sampling; ``localise`` runs the offline pattern analysis (``analysis.patterns``, the same
code as ``collscope analyze`` on a bundle with ``functions.jsonl``) on what came back and adds,
per culprit, a sentence naming its function with β/μ/sigma against the median worker, its
GPU/NIC use over the window, and every rank that was not profiled with the reason its agent
gave (no probe, failed, unreachable): such a rank is reported, never guessed.

No kopf here: the handler that waits for the window without blocking (``kopf.TemporaryError``
with a delay) calls these functions.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence

from collscope.nodeagent import api
from collscope.nodeagent.bundle import models
from collscope.operator.analysis import diagnosis
from collscope.operator.analysis.patterns import engine, expectation, table
from collscope.operator.analysis.patterns import localise as localise_fn
from collscope.operator.clients import agents

WINDOW_S = 10.0  # EROICA §4.1 profiles 20 s; 10 s at 100 Hz gives 1,000 samples per rank
# Fewer ranks than this cannot be compared (a median of two is no majority).
MIN_WORKERS = 3
_ID = re.compile(r"[^A-Za-z0-9._-]")
_LOAD = ("util", "bytes", "throughput", "sm_clock")
# Every sampled function is "python", time spent in torch's C++ and on the GPU included, so the
# range EROICA expects of a Python function (β <= 0.01, D of §4.3) would flag every training
# step: here any β is expected and only the differences between workers (Δ) count.
SETTINGS = engine.PatternSettings(
    localise=localise_fn.LocaliseSettings(
        ranges={**expectation.DEFAULT_RANGES, "python": expectation.ExpectedRange(beta=(0.0, 1.0))}
    )
)


def request_id(job: str, now_ns: int) -> str:
    """One id per profiling of a job: its name and the time in ms (agents' id syntax)."""
    return f"{_ID.sub('-', job)[:40].strip('-._') or 'job'}-{now_ns // 1_000_000}"


async def arm(
    clients: Mapping[str, agents.AgentClient],
    ranks_by_node: Mapping[str, Sequence[int]],
    req_id: str,
    *,
    window_s: float = WINDOW_S,
    workloads: Sequence[str] | None = None,
) -> tuple[dict[str, api.ProfileArmed], list[agents.Unreachable]]:
    """Arm the probes of every rank, one request per node, concurrently."""
    calls = {
        node: clients[node].profile_arm(
            api.ProfileRequest(
                id=req_id,
                ranks=sorted(ranks),
                window_s=window_s,
                workloads=list(workloads) if workloads else None,
            )
        )
        for node, ranks in ranks_by_node.items()
        if node in clients
    }
    armed, failed = await agents.gather(calls)
    failed += [agents.Unreachable(n, "no agent known") for n in ranks_by_node if n not in clients]
    return armed, failed


async def pull(
    clients: Mapping[str, agents.AgentClient], nodes: Sequence[str], req_id: str
) -> tuple[dict[str, api.ProfileReport], list[agents.Unreachable]]:
    return await agents.gather(
        {n: clients[n].profile_report(req_id) for n in nodes if n in clients}
    )


def pending(reports: Mapping[str, api.ProfileReport]) -> bool:
    """Whether a rank is still to answer or sampling (its agent's deadline is ahead)."""
    return any(r.state in ("pending", "armed") for rep in reports.values() for r in rep.ranks)


def localise(
    reports: Mapping[str, api.ProfileReport],
    job: models.Job,
    failed: Sequence[agents.Unreachable] = (),
) -> diagnosis.Diagnosis:
    """The pattern analysis of the profiled ranks, with the sentences of the module docstring."""
    done = {r.rank: r for rep in reports.values() for r in rep.ranks if r.state == "done"}
    missing = [
        f"rank {r.rank} ({node}) not profiled: {r.state}" + (f" ({r.reason})" if r.reason else "")
        for node, rep in sorted(reports.items())
        for r in rep.ranks
        if r.state != "done"
    ] + [f"node {f.node}: its agent did not answer ({f.reason})" for f in failed]
    rows = [p for r in done.values() for p in r.patterns]
    if len(done) < MIN_WORKERS or not rows:
        return diagnosis.Diagnosis(
            anomaly=False,
            evidence=[f"profiling: {len(done)} rank(s) profiled, fewer than {MIN_WORKERS}: "
                      "no comparison", *missing],
        )  # fmt: skip
    found = engine.diagnose_patterns(table.PatternTable.from_patterns(rows), SETTINGS, job=job)
    extra = []
    shown: set[int] = set()  # ranks whose GPU/NIC use is said (once each)
    for c in found.culprits:
        if c.rank is None or c.function is None or c.rank not in done:
            continue
        extra.append(compare(c.rank, c.function, done))
        # Utilisation and traffic say how busy the rank's GPU and NIC were; error counters and
        # clock-reason bit masks (also sampled) say nothing about load.
        use = [u for u in done[c.rank].resources if any(w in u.metric for w in _LOAD)]
        if use and c.rank not in shown:
            shown.add(c.rank)
            text = (f"{u.device} {u.metric} mean {u.mean:.2f} (max {u.max:.2f})" for u in use[:6])
            extra.append(f"rank {c.rank} over the window: " + ", ".join(text))
    return found.model_copy(update={"evidence": [*extra, *found.evidence, *missing]})


def compare(rank: int, fn: str, done: Mapping[int, api.RankProfile]) -> str:
    """``rank``'s (β, μ, sigma) of ``fn`` against the median of the other profiled ranks (a rank
    without ``fn`` on its critical path counts as β = 0)."""
    own = next((p for p in done[rank].patterns if p.fn == fn), None)
    others = [next((p for p in r.patterns if p.fn == fn), None)
              for k, r in done.items() if k != rank]  # fmt: skip
    beta = statistics.median(p.beta if p else 0.0 for p in others)
    with_fn = [p for p in others if p is not None]
    mu = statistics.median(p.mu for p in with_fn) if with_fn else 0.0
    sigma = statistics.median(p.sigma for p in with_fn) if with_fn else 0.0
    b, m, s = (own.beta, own.mu, own.sigma) if own else (0.0, 0.0, 0.0)
    return (
        f"rank {rank}: {fn} β {b:.3f}, μ {m:.2f}, \u03c3 {s:.2f} against the median worker's "
        f"β {beta:.3f}, μ {mu:.2f}, \u03c3 {sigma:.2f} ({len(done)} ranks profiled)"
    )
