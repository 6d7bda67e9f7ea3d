"""Function behaviour patterns column-wise: one row per (worker, function) of ``functions.jsonl``.

Localisation works on numpy columns grouped by function, never on one pydantic model per line,
so a million workers fit in memory (one row is 41 bytes) and every step is vectorised.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import models
from collscope.operator import errors

KINDS: tuple[str, ...] = ("python", "kernel", "comm", "memory")
_KIND_ID = {k: i for i, k in enumerate(KINDS)}

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Bool = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class PatternTable:
    """Rows sorted by (function, rank); ``fns[fn_id[i]]`` names row i's function."""

    rank: I64
    fn_id: I64
    beta: F64
    mu: F64
    sigma: F64
    fns: tuple[str, ...]
    fn_kind: tuple[str, ...]  # kind of each function, by fn id
    window_ns: int  # the longest profiling window seen (0 when unknown)

    def __len__(self) -> int:
        return int(self.rank.size)

    @property
    def workers(self) -> int:
        return int(np.unique(self.rank).size) if len(self) else 0

    def spans(self) -> list[tuple[int, int, int]]:
        """(fn id, first row, end row) of each function present, in fn id order."""
        if not len(self):
            return []
        cuts = np.flatnonzero(np.diff(self.fn_id)) + 1
        starts = np.concatenate(([0], cuts))
        ends = np.concatenate((cuts, [len(self)]))
        return [(int(self.fn_id[s]), int(s), int(e)) for s, e in zip(starts, ends, strict=True)]

    @classmethod
    def from_arrays(
        cls,
        *,
        rank: Sequence[int] | I64,
        fn_id: Sequence[int] | I64,
        beta: Sequence[float] | F64,
        mu: Sequence[float] | F64,
        sigma: Sequence[float] | F64,
        fns: Sequence[str],
        fn_kind: Sequence[str],
        window_ns: int = 0,
    ) -> PatternTable:
        """Columns as given, checked (kinds known, values in [0, 1]) and sorted."""
        if len(fns) != len(fn_kind):
            raise errors.AnalysisError("fns and fn_kind must have the same length")
        for k in fn_kind:
            if k not in _KIND_ID:
                raise errors.AnalysisError(f"unknown function kind {k!r}; one of {KINDS}")
        r = np.asarray(rank, dtype=np.int64)
        f = np.asarray(fn_id, dtype=np.int64)
        cols = [np.asarray(c, dtype=np.float64) for c in (beta, mu, sigma)]
        if any(c.shape != r.shape for c in (f, *cols)):
            raise errors.AnalysisError("pattern columns must have the same length")
        if r.size and (f.min() < 0 or f.max() >= len(fns)):
            raise errors.AnalysisError("fn_id out of range of fns")
        for name, c in zip(("beta", "mu", "sigma"), cols, strict=True):
            if c.size and not (np.all(c >= 0.0) and np.all(c <= 1.0)):
                raise errors.AnalysisError(f"{name} must lie in [0, 1]")
        order = np.lexsort((r, f))
        return cls(
            rank=r[order],
            fn_id=f[order],
            beta=cols[0][order],
            mu=cols[1][order],
            sigma=cols[2][order],
            fns=tuple(fns),
            fn_kind=tuple(fn_kind),
            window_ns=window_ns,
        )

    @classmethod
    def from_patterns(cls, patterns: Iterable[models.FunctionPattern]) -> PatternTable:
        """From ``reader.iter_functions``; a function is its (fn, kind) pair."""
        ids: dict[tuple[str, str], int] = {}
        rank: list[int] = []
        fid: list[int] = []
        beta: list[float] = []
        mu: list[float] = []
        sigma: list[float] = []
        window = 0
        for p in patterns:
            key = (p.fn, p.kind)
            i = ids.setdefault(key, len(ids))
            rank.append(p.rank)
            fid.append(i)
            beta.append(p.beta)
            mu.append(p.mu)
            sigma.append(p.sigma)
            window = max(window, p.window_ns)
        keys = list(ids)
        return cls.from_arrays(
            rank=rank,
            fn_id=fid,
            beta=beta,
            mu=mu,
            sigma=sigma,
            fns=[k[0] for k in keys],
            fn_kind=[k[1] for k in keys],
            window_ns=window,
        )
