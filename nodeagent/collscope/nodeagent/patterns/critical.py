"""Critical execution duration (EROICA §4.2, Algorithm 1).

Given the utilisation samples U_1..U_n of a function's resource during one execution, find
the sub-interval [l_c, r_c] that holds at least 80 % of the total utilisation with the fewest
consecutive zero samples inside it: binary search on g, the longest run of zeros allowed;
for a given g the samples split into segments at every run of more than g zeros, and a segment
holding >= 80 % of the sum is the answer (no wider interval can include a longer zero run). A
worker that enters a collective early and waits leaves zero-utilisation gaps (Fig. 10) that
this trims away before μ and sigma are taken.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
SHARE = 0.8


def _segment(u: F64, g: int, need: float) -> tuple[int, int] | None:
    """The first segment without a run of more than g zeros holding >= need, or None."""
    n = u.size
    start = 0
    total = 0.0
    zeros = 0
    for i in range(n):
        if u[i] == 0.0:
            zeros += 1
            if zeros > g:  # the run is too long: the segment ended before it began
                if total >= need:
                    return _trim(u, start, i - zeros)
                start, total = i + 1, 0.0
                continue
        else:
            if zeros > g:
                start = i
            zeros = 0
        total += float(u[i])
    if total >= need:
        return _trim(u, start, n - 1)
    return None


def _trim(u: F64, lo: int, hi: int) -> tuple[int, int]:
    """Drop leading and trailing zeros of [lo, hi]."""
    while lo < hi and u[lo] == 0.0:
        lo += 1
    while hi > lo and u[hi] == 0.0:
        hi -= 1
    return lo, hi


def critical_interval(u: F64, share: float = SHARE) -> tuple[int, int]:
    """Algorithm 1: (l_c, r_c), inclusive sample indices; the whole span when all are 0."""
    n = u.size
    if n == 0:
        return (0, -1)
    s = float(u.sum())
    if s <= 0.0:
        return (0, n - 1)
    need = share * s
    lo_g, hi_g = 0, n
    best = (0, n - 1)
    while lo_g <= hi_g:
        g = (lo_g + hi_g) // 2
        seg = _segment(u, g, need)
        if seg is not None:
            best = seg
            hi_g = g - 1
        else:
            lo_g = g + 1
    return best


def utilisation(u: F64, share: float = SHARE) -> tuple[int, float, float]:
    """(|L(e)| in samples, mean, std) of U over the critical execution duration."""
    lo, hi = critical_interval(u, share)
    if hi < lo:
        return 0, 0.0, 0.0
    part = u[lo : hi + 1]
    return int(part.size), float(part.mean()), float(part.std())
