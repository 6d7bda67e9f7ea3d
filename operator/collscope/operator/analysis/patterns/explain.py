"""Sentences and culprits for pattern findings, in the words of EROICA's output (Fig. 7):
which function, on which workers, and how it behaves differently, e.g.
``pin_memory (memory): β 0.23-0.33 on ranks 5, 811, 2047 vs ≤ 0.01 elsewhere``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from collscope.operator.analysis import diagnosis, placement
from collscope.operator.analysis.patterns import imbalance, localise, table

# Wording only: no constant here decides a verdict, and none is a time.
MAX_LISTED = 8  # ranks an evidence sentence lists before "and N more"
_DIMS = ("β", "μ", "\u03c3")

# kind -> (category, culprit component) of the Diagnosis table (docs/spec/bundle-v1.md)
CATEGORY: dict[str, tuple[diagnosis.Category, diagnosis.Component]] = {
    "kernel": (diagnosis.Category.SLOW_COMPUTE, "gpu"),
    "comm": (diagnosis.Category.SLOW_NETWORK, "nic"),
    "memory": (diagnosis.Category.SLOW_HOST, "host"),
    "python": (diagnosis.Category.SLOW_HOST, "software"),
}


def ranks_text(ranks: Sequence[int] | table.I64, limit: int = MAX_LISTED) -> str:
    r = [int(x) for x in ranks]
    head = ", ".join(map(str, r[:limit]))
    word = "rank" if len(r) == 1 else "ranks"
    return f"{word} {head}" + (f" (+{len(r) - limit} more)" if len(r) > limit else "")


def _values(x: table.F64) -> str:
    lo, hi = float(x.min()), float(x.max())
    return f"{lo:.2f}" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}-{hi:.2f}"


def _rest(x: table.F64) -> str:
    if x.size == 0:
        return "no other worker"
    lo, hi = (float(v) for v in np.percentile(x, [5, 95]))
    # a range spanning more than 5x, or all under 1.5 % (Eq. 11's 1 % plus rounding), reads
    # better as an upper bound; picked for wording
    if lo < 0.2 * hi or hi <= 0.015:
        return f"≤ {max(hi, 0.01):.2f}"
    return f"{lo:.2f}" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}-{hi:.2f}"


def _differing(flagged: Sequence[table.F64], rest: Sequence[table.F64]) -> list[int]:
    """Dimensions whose medians differ by more than 15 % of the larger (β always if it does)."""
    dims = []
    for i, (a, b) in enumerate(zip(flagged, rest, strict=True)):
        if a.size == 0 or b.size == 0:
            continue
        ma, mb = float(np.median(a)), float(np.median(b))
        if abs(ma - mb) > 0.15 * max(ma, mb, 1e-9):  # picked for wording: a visible difference
            dims.append(i)
    return dims or [0]


def sentence(f: localise.FunctionFinding) -> str:
    flagged = (f.beta, f.mu, f.sigma)
    if f.common:
        return (
            f"{f.fn} ({f.kind}): β {_values(f.beta)} on {f.ranks.size:,} of {f.workers:,} "
            f"workers, outside the range expected of a {f.kind} function "
            f"({f.expected.describe()}; D up to {f.d_max:.2f}): a problem of the whole job "
            "(slow storage, inefficient code or configuration), not of some workers"
        )
    present = f.rest[0] > 0  # workers without f on their critical path have no μ or sigma
    rest = (f.rest[0], f.rest[1][present], f.rest[2][present])
    dims = _differing(flagged, rest)
    how = ", ".join(f"{_DIMS[i]} {_values(flagged[i])}" for i in dims)
    named = dims != [0]
    others = ", ".join((f"{_DIMS[i]} " if named else "") + _rest(rest[i]) for i in dims)
    why = []
    if f.by_difference:
        why.append(f"Δ above {f.threshold:.2f} on {f.by_difference}")
    if f.by_expectation:
        why.append(f"outside {f.expected.describe()} on {f.by_expectation}")
    among = f" among {f.role}" if f.role else ""
    return (
        f"{f.fn} ({f.kind}): {how} on {ranks_text(f.ranks)} vs {others} elsewhere{among} "
        f"({f.ranks.size:,} of {f.workers:,} workers; {'; '.join(why)})"
    )


def sigma_only_sentence(f: localise.FunctionFinding) -> str:
    """Workers unlike the rest in sigma alone: evidence, not culprits (``discoveries``)."""
    among = f" among {f.role}" if f.role else ""
    return (
        f"{f.fn} ({f.kind}): only \u03c3 stands out on {ranks_text(f.sigma_only)}{among}, β and μ "
        "ordinary: their utilisation fluctuates more but they are not slower (evidence, not a "
        "culprit)"
    )


def roles_sentence(names: Sequence[str], source: str) -> str:
    """How the workers were grouped before being compared (``roles``)."""
    where = "job.json's pipeline stages" if source == "parallelism" else "their function sets"
    return f"workers compared within {len(names)} roles from {where}: {'; '.join(names[:4])}" + (
        f" (+{len(names) - 4} more)" if len(names) > 4 else ""
    )


def distinct_sentence(f: localise.FunctionFinding) -> str:
    keep = np.isin(f.ranks, f.distinct)
    a = (f.beta[keep], f.mu[keep], f.sigma[keep])
    b = (f.beta[~keep], f.mu[~keep], f.sigma[~keep])
    dims = [i for i in _differing(a, b) if i] or _differing(a, b)
    how = ", ".join(f"{_DIMS[i]} {_values(a[i])} vs {float(np.median(b[i])):.2f}" for i in dims)
    note = ""
    if f.kind == "comm" and float(np.median(a[1])) < float(np.median(b[1])):
        note = (
            ": the lowest utilisation, so its own link is slow and the others wait on it "
            "(EROICA §3, Fig. 5c)"
        )
    return (
        f"{f.fn}: among the {f.ranks.size} flagged workers, {ranks_text(f.distinct)} "
        f"stand{'s' if f.distinct.size == 1 else ''} apart: {how}{note}"
    )


def imbalance_sentence(im: imbalance.Imbalance, t: table.PatternTable) -> str:
    worst = max(im.kernels, key=lambda k: k.max_over_min)
    mu = max(k.mu_ratio for k in im.kernels)
    return (
        f"load imbalance: {len(im.kernels)} of {im.qualifying} GPU kernels run at the same μ "
        f"(p95/p5 ≤ {mu:.2f}) but their β spreads (p95/p5 ≥ "
        f"{min(k.beta_ratio for k in im.kernels):.2f}; in {t.fns[worst.fn_id]} the busiest "
        f"worker computes {100 * (worst.max_over_min - 1):.0f} % more than the most idle): "
        f"some workers get more work and the rest wait for them; busiest: "
        f"{ranks_text(im.busiest)} (summed β {im.busiest_beta[0]:.2f} vs median "
        f"{im.median_beta:.2f})"
    )


def gc_note(found: Sequence[localise.FunctionFinding]) -> str | None:
    """§6.1 Problem 3: several Python functions, each slow on a few different random workers."""
    py = [f for f in found if f.kind == "python" and not f.common]
    if len(py) < 2:
        return None
    sets = [set(map(int, f.ranks)) for f in py]
    union = set().union(*sets)
    # "little overlap": each worker in 1.5 of the functions' sets on average at most (picked;
    # the paper's three functions each hit a few random workers, §6.1 Problem 3)
    if sum(len(s) for s in sets) > 1.5 * len(union):
        return None
    return (
        f"{len(py)} Python functions are slow on {len(union)} different workers with little "
        "overlap: typical of asynchronous garbage collection (EROICA §6.1); run gc.collect() "
        "on every rank at the same iteration (e.g. every 200) with automatic GC disabled"
    )


def culprits(
    f: localise.FunctionFinding, where: placement.Placement, limit: int
) -> list[diagnosis.Culprit]:
    _, component = CATEGORY[f.kind]
    order = np.argsort(-(f.delta + f.beta), kind="stable")
    first = [int(r) for r in f.distinct]
    rest = [int(f.ranks[i]) for i in order if int(f.ranks[i]) not in set(first)]
    out = []
    delta = dict(zip(map(int, f.ranks), map(float, f.delta), strict=True))
    for r in [*first, *rest][:limit]:
        score = 0.95 if r in first else (0.8 if f.common else max(0.5, min(0.9, delta[r])))
        c = where.culprit(r, component=component, score=round(score, 3))
        out.append(c.model_copy(update={"function": f.fn}))
    return out
