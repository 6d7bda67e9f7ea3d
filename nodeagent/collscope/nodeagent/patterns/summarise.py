"""Behaviour patterns (β, μ, sigma) of the functions on the critical path (EROICA §4.2, Eq. 1-5).

Critical path (Fig. 9): GPU compute kernels > memory operations > collective communication >
Python (and CPU operator) functions. At any instant the critical path is the highest-priority
kind executing; several events of that kind share the instant equally; for Python only the
innermost event (no executing child) of the training thread counts, and its function is its
whole call stack (enclosing events of the same thread, outermost first, ``;``-joined).

- β_f: time f spends on the critical path / window length (Eq. 2);
- μ_f, sigma_f: for every execution e of f, the utilisation samples of f's resource during e are
  cut to the critical execution duration L(e) (``critical``, Algorithm 1), and the mean and
  standard deviation over L(e) are averaged weighted by |L(e)| (Eq. 4-5). Resources by kind:
  ``kernel`` -> ``sm`` (SM clock / max), ``comm`` -> ``nic`` (GPU-NIC throughput / line
  rate), ``memory`` and ``python`` -> ``cpu`` (CPU utilisation of the training process). A
  kind with no samples gets μ = sigma = 0 (unknown, the same on every worker). A resource read
  far more slowly than its executions last (the agent's GPU and NIC counters, about once a
  second, against kernels of milliseconds) is held: an execution with no sample inside takes
  the last sample before it, if at most ``Samples.hold_ns`` old, as an |L(e)| of one sample
  with sigma 0.

Pure: events and samples in, patterns out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from collscope.nodeagent.patterns import critical

PRIORITY = {"kernel": 3, "memory": 2, "comm": 1, "python": 0}
RESOURCE = {"kernel": "sm", "comm": "nic", "memory": "cpu", "python": "cpu"}
MAX_STACK = 12  # frames kept in a Python function's identity (innermost ones)


@dataclass(frozen=True)
class Event:
    name: str
    kind: str  # python | kernel | comm | memory
    start_ns: int
    end_ns: int
    tid: int = 0  # thread (Python) or stream (GPU)


@dataclass(frozen=True)
class Samples:
    """One resource's utilisation time series: ``ts_ns`` ascending, ``value`` in [0, 1].

    ``hold_ns``: how long a sample still stands for an execution that holds no sample of its
    own (a reading that holds until the next one); 0: never."""

    ts_ns: critical.F64
    value: critical.F64
    hold_ns: int = 0


@dataclass(frozen=True)
class Pattern:
    fn: str
    kind: str
    beta: float
    mu: float
    sigma: float


def _stacks(events: Sequence[Event], main_tid: int) -> dict[int, str]:
    """Index of each Python event of the training thread -> its call stack identity."""
    py = sorted(
        (i for i, e in enumerate(events) if e.kind == "python" and e.tid == main_tid),
        key=lambda i: (events[i].start_ns, -events[i].end_ns),
    )
    out: dict[int, str] = {}
    open_: list[int] = []
    for i in py:
        e = events[i]
        while open_ and events[open_[-1]].end_ns <= e.start_ns:
            open_.pop()
        names = [events[j].name for j in open_] + [e.name]
        out[i] = ";".join(names[-MAX_STACK:])
        open_.append(i)
    return out


def critical_time(
    events: Sequence[Event], main_tid: int, window: tuple[int, int]
) -> dict[int, float]:
    """Event index -> ns it spends on the critical path inside ``window`` (sweep line)."""
    lo_w, hi_w = window
    keep = [
        i
        for i, e in enumerate(events)
        if e.end_ns > lo_w and e.start_ns < hi_w and (e.kind != "python" or e.tid == main_tid)
    ]
    points: list[tuple[int, int, int]] = []  # (time, +1 start / -1 end, event)
    for i in keep:
        e = events[i]
        points.append((max(e.start_ns, lo_w), 1, i))
        points.append((min(e.end_ns, hi_w), -1, i))
    points.sort(key=lambda p: (p[0], p[1]))
    active: dict[str, set[int]] = {k: set() for k in PRIORITY}
    out: dict[int, float] = defaultdict(float)
    prev = None
    for t, what, i in points:
        if prev is not None and t > prev:
            _credit(events, active, t - prev, out)
        prev = t
        kind = events[i].kind
        if what > 0:
            active[kind].add(i)
        else:
            active[kind].discard(i)
    return dict(out)


def _credit(
    events: Sequence[Event], active: Mapping[str, set[int]], dt: int, out: dict[int, float]
) -> None:
    for kind in sorted(PRIORITY, key=lambda k: -PRIORITY[k]):
        now = active[kind]
        if not now:
            continue
        if kind == "python":  # the innermost: latest start, then earliest end
            leaf = max(now, key=lambda i: (events[i].start_ns, -events[i].end_ns))
            out[leaf] += dt
        else:
            for i in now:
                out[i] += dt / len(now)
        return


def summarise(
    events: Sequence[Event],
    *,
    main_tid: int,
    window: tuple[int, int],
    samples: Mapping[str, Samples] | None = None,
) -> list[Pattern]:
    """Patterns of every function with critical time in ``window`` (module docstring)."""
    length = max(1, window[1] - window[0])
    crit = critical_time(events, main_tid, window)
    stacks = _stacks(events, main_tid)
    beta: dict[tuple[str, str], float] = defaultdict(float)
    util: dict[tuple[str, str], list[tuple[int, float, float]]] = defaultdict(list)
    samples = samples or {}
    for i, ns in crit.items():
        e = events[i]
        key = (stacks.get(i, e.name), e.kind)
        beta[key] += ns / length
        s = samples.get(RESOURCE[e.kind])
        if s is not None and s.ts_ns.size:
            a, b = np.searchsorted(s.ts_ns, [e.start_ns, e.end_ns])
            if b > a:
                util[key].append(critical.utilisation(s.value[a:b]))
            elif a > 0 and e.start_ns - s.ts_ns[a - 1] <= s.hold_ns:
                util[key].append((1, float(s.value[a - 1]), 0.0))
    out = []
    for key, b in beta.items():
        parts = util.get(key, [])
        w = sum(p[0] for p in parts)
        mu = sum(p[0] * p[1] for p in parts) / w if w else 0.0
        sd = sum(p[0] * p[2] for p in parts) / w if w else 0.0
        out.append(Pattern(key[0], key[1], _unit(b), _unit(mu), _unit(sd)))
    out.sort(key=lambda p: -p.beta)
    return out


def _unit(x: float) -> float:
    return round(min(1.0, max(0.0, x)), 6)
