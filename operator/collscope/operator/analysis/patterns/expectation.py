"""Distance from expectation D (EROICA §4.3, Eq. 6-7): how far a pattern lies outside the
range R_f = [β_l, β_r] x [μ_l, μ_r] x [sigma_l, sigma_r] expected of its kind of function.

The paper's ranges, from its production experience:

- Python functions: β in [0, 0.01] (an LMT should not be bottlenecked by the CPU; 1 % is what
  customers call measurement noise);
- collective communication: β in [0, 0.3];
- GPU compute kernels: β in [0, 1] (a well-run job spends most of its time computing).

The paper gives none for memory operations (malloc, memcpy, pin_memory); ours is β in
[0, 0.05]: copies and allocations the GPU waits for are expected to be a few percent at most.
μ and sigma are unconstrained ([0, 1]) for every kind, as in the paper. All are shares of the
profiling window or utilisations: no step length or sampling interval is assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.operator.analysis.patterns import table

Range = tuple[float, float]
_ANY: Range = (0.0, 1.0)


@dataclass(frozen=True)
class ExpectedRange:
    """R_f of one kind of function (Eq. 6)."""

    beta: Range
    mu: Range = _ANY
    sigma: Range = _ANY

    def describe(self) -> str:
        parts = [f"β ≤ {self.beta[1]:g}" if self.beta[0] == 0 else f"β in {list(self.beta)}"]
        for name, r in (("μ", self.mu), ("\u03c3", self.sigma)):
            if r != _ANY:
                parts.append(f"{name} in [{r[0]:g}, {r[1]:g}]")
        return ", ".join(parts)


DEFAULT_RANGES: dict[str, ExpectedRange] = {
    "python": ExpectedRange(beta=(0.0, 0.01)),
    "comm": ExpectedRange(beta=(0.0, 0.3)),
    "kernel": ExpectedRange(beta=(0.0, 1.0)),
    "memory": ExpectedRange(beta=(0.0, 0.05)),
}


def distance(
    beta: table.F64, mu: table.F64, sigma: table.F64, r: ExpectedRange
) -> npt.NDArray[np.float64]:
    """D = min over p in R of the Manhattan distance to p (Eq. 7), per row.

    R is a box, so the minimum is the sum over dimensions of how far each coordinate lies
    outside its interval.
    """
    d = np.zeros_like(beta)
    for col, (lo, hi) in ((beta, r.beta), (mu, r.mu), (sigma, r.sigma)):
        d += np.maximum(lo - col, 0.0) + np.maximum(col - hi, 0.0)
    return d
