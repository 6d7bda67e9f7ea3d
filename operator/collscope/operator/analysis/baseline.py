"""What "normal" looks like, learned online from completed operations of the sampled ranks.

Three baselines, each from a paper:

- stall threshold per communicator (hang trigger): ``max(floor + usual stall, k * usual
  stall)``, the usual stall the p99 of the longest stall each of its completed operations
  showed (its duration where nothing shows progress; the floor derived in
  ``trigger.TriggerSettings``). CCL-D
  §4.2.1 sets the hang threshold "considering such long operations"
  (checkpoints, synchronisation); learning it per communicator keeps a legitimately long
  pipeline receive or checkpoint barrier from looking like a hang, and the floor keeps short
  jobs from hair-trigger alarms.
- ``Tbase`` per (comm, op, bytes) (CCL-D §4.2.1 eq. 1): mean of the per-round maximum duration
  over the first ``m`` rounds, ``m = min(m_max, rounds in the first span)``. CCL-D's span is
  two minutes; ours is a setting because simulated runs last seconds. ``m`` is at least
  ``base_min_rounds`` whatever the span: a round's maximum duration includes the arrival
  spread of its members, an extreme value that varies from round to round; averaged over one
  or two rounds of a job with multi-second iterations it can be several times too small, and
  θ ≈ 3 is then crossed by ordinary jitter. Until learned there is no slowdown ratio (no
  configured initial baseline by default).
- normal throughput and operation interval per sampled rank (Mycroft Algorithm 1 line 9):
  medians of the values seen on recent ticks where nothing looked wrong.
- the job's iteration period: the median gap between consecutive completions of one rank of
  the same (comm, op, bytes), pooled per (op, bytes) over communicators, the largest over
  those with ``min_gaps`` gaps seen (barriers
  excluded: a checkpoint barrier every N iterations is not the step). The operation done once
  per step (the DP gradient ReduceScatter) has the longest regular gap, which is the step;
  keying by op and size keeps a ReduceScatter/AllGather pair on one communicator, seconds
  and microseconds apart, from halving it. Windows that
  must hold whole iterations (Algorithm 1's Δ, a slowdown's baseline) are sized from it: a
  job with 10 s steps completes nothing for seconds at a time, and a 2 s window measures the
  phase of its step, not its speed.

Everything is fed only with records at or before the current tick (the trigger is causal).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

import numpy as np

NS = 1_000_000_000
Key = tuple[int, int, int]  # (comm index, op string index, bytes)


@dataclass
class _KeyBase:
    first_end: int
    round_max: dict[int, int] = field(default_factory=dict)  # seq -> max duration (ns)
    tbase_ns: float | None = None


class Baselines:
    """Mutable learner; one per trigger evaluator."""

    def __init__(
        self,
        *,
        history: int,
        base_rounds: int,
        base_span_ns: int,
        normal_history: int,
        base_min_rounds: int = 1,
        barrier_max_bytes: int = 4,
    ) -> None:
        self._barrier_max_bytes = barrier_max_bytes
        self._history = history
        self._base_rounds = base_rounds
        self._base_min_rounds = base_min_rounds
        self._base_span_ns = base_span_ns
        self._normal_history = normal_history
        self._durations: dict[int, deque[int]] = defaultdict(lambda: deque(maxlen=history))
        # Per communicator: for each completed operation, the longest stall (time without
        # progress, ``inflight``) as far as it is known: what its flow-carrying state samples
        # showed, else its duration (``learn_stall``).
        self._stalls: dict[int, deque[int]] = defaultdict(lambda: deque(maxlen=history))
        self._keys: dict[Key, _KeyBase] = {}
        self._throughput: dict[int, deque[float]] = defaultdict(
            lambda: deque(maxlen=normal_history)
        )
        self._interval: dict[tuple[int, int], deque[float]] = defaultdict(
            lambda: deque(maxlen=normal_history)
        )
        self._last_end: dict[tuple[int, int, int, int], int] = {}  # (rank, *Key) -> end
        # Gaps pooled per (op, bytes) over communicators: every DP group runs its gradient
        # ReduceScatter once per step, so ten sampled ranks in ten DP groups learn the step
        # from their first two steps instead of five each.
        self._gaps: dict[tuple[int, int], deque[int]] = defaultdict(lambda: deque(maxlen=history))

    # -- learning from completions ------------------------------------------------------------
    def learn_ops(self, done: np.ndarray) -> None:
        """Feed newly completed operations (each exactly once), in completion order.

        ``done`` holds op rows (``tables.OP_DTYPE`` fields comm, op, bytes, seq, start, end).
        """
        comm, op, nbytes = done["comm"], done["op"], done["bytes"]
        seq, start, end = done["seq"], done["start"], done["end"]
        dur = (end - start).tolist()
        for r, c, o, b, s, d, e in zip(
            done["rank"].tolist(),
            comm.tolist(),
            op.tolist(),
            nbytes.tolist(),
            seq.tolist(),
            dur,
            end.tolist(),
            strict=True,
        ):
            self._durations[c].append(d)
            if b > self._barrier_max_bytes:
                prev = self._last_end.get((r, c, o, b))
                if prev is not None and e > prev:
                    self._gaps[(o, b)].append(e - prev)
                self._last_end[(r, c, o, b)] = e
            key = (c, o, b)
            kb = self._keys.get(key)
            if kb is None:
                kb = self._keys[key] = _KeyBase(first_end=e)
            if kb.tbase_ns is not None:
                continue
            if (
                e - kb.first_end > self._base_span_ns
                and len(kb.round_max) >= self._base_min_rounds
                and s not in kb.round_max
            ):
                self._freeze(kb)
                continue
            kb.round_max[s] = max(kb.round_max.get(s, 0), d)
            if len(kb.round_max) > self._base_rounds:
                self._freeze(kb)

    def _freeze(self, kb: _KeyBase) -> None:
        # The newest round may still be missing members: keep the first m complete ones.
        seqs = sorted(kb.round_max)[: self._base_rounds]
        kb.tbase_ns = float(np.mean([kb.round_max[s] for s in seqs]))
        kb.round_max.clear()

    # -- queries --------------------------------------------------------------------------------
    def learn_stall(self, comm: int, stall_ns: int) -> None:
        """Feed one completed operation's longest stall, each op once: the longest its state
        samples showed where flows show progress, else its duration (an upper bound)."""
        self._stalls[comm].append(stall_ns)

    def stall_threshold_ns(
        self,
        comm: int,
        *,
        floor_ns: int,
        k: float,
        add_p99: bool = False,
    ) -> int:
        """``max(floor, k * p99)`` of the communicator's recent durations, or, with
        ``add_p99``, ``max(floor + usual stall, k * usual stall)``: the floor is a delay on top
        of the longest stall the communicator's operations usually show (see
        ``trigger.TriggerSettings.proxy_hiccup_s``), and CCL-D's allowance for "such long
        operations" (§4.2.1, ``k``) applies to what the rule measures, the stall: an operation
        that moves data for 0.6 s does not stall for 4 x 0.6 s.

        The usual stall is the p99, over the completed operations, of each one's longest stall
        as far as it is known (``learn_stall``): the longest its flow-carrying samples showed,
        else its duration, which bounds it. Every operation counts, with the tightest bound
        known of it, so the statistic covers as many operations as the durations do and needs
        no minimum of its own (Mycroft §4.3, "stuck for a long time": what is long is judged
        against what this communicator's operations showed). A bandwidth-bound operation that
        moves data all along (eval-dev's 0.3 s DP AllReduce: its stalls stay under 10 ms)
        lasts far longer than it ever stalls; a pipeline receive waits without progress for
        its sender, and that wait is its stall; an operation no sample caught (shorter than a
        sampling interval) or one without flows (intra-node) counts with its duration. Where
        no stall is known at all, the durations' p99."""
        d = self._durations.get(comm)
        if not d:
            return floor_ns
        p99 = float(np.percentile(np.fromiter(d, dtype=np.int64), 99))
        if not add_p99:
            return max(floor_ns, int(k * p99))
        st = self._stalls.get(comm)
        usual = float(np.percentile(np.fromiter(st, dtype=np.int64), 99)) if st else p99
        return max(floor_ns + int(usual), int(k * usual))

    def durations_seen(self, comm: int) -> int:
        """How many recent durations of the communicator are known (up to ``history``)."""
        d = self._durations.get(comm)
        return len(d) if d else 0

    def duration_quantile_ns(self, comm: int, q: float) -> int | None:
        """Quantile ``q`` (0..1) of the communicator's recent operation durations."""
        d = self._durations.get(comm)
        return int(np.quantile(np.fromiter(d, dtype=np.int64), q)) if d else None

    def median_duration_ns(self, comm: int) -> int | None:
        """Median recent duration of the communicator's operations (rare stalls do not move it)."""
        d = self._durations.get(comm)
        return int(np.median(np.fromiter(d, dtype=np.int64))) if d else None

    def period_ns(self, min_gaps: int = 5) -> int | None:
        """The iteration period learned so far (see module docstring); None until known."""
        meds = [float(np.median(np.fromiter(g, dtype=np.int64))) for g in self._gaps.values()]
        meds = [m for m, g in zip(meds, self._gaps.values(), strict=True) if len(g) >= min_gaps]
        return int(max(meds)) if meds else None

    def tbase_ns(self, key: Key) -> float | None:
        kb = self._keys.get(key)
        return None if kb is None else kb.tbase_ns

    def normal_throughput(self, rank: int, min_samples: int) -> float | None:
        v = self._throughput.get(rank)
        return float(np.median(v)) if v is not None and len(v) >= min_samples else None

    def normal_interval(self, rank: int, comm: int, min_samples: int) -> float | None:
        v = self._interval.get((rank, comm))
        return float(np.median(v)) if v is not None and len(v) >= min_samples else None

    # -- learning from healthy ticks (Mycroft Algorithm 1 line 9) -----------------------------
    def learn_tick(
        self, throughput: dict[int, float], intervals: dict[tuple[int, int], float]
    ) -> None:
        for r, v in throughput.items():
            self._throughput[r].append(v)
        for rc, v in intervals.items():
            self._interval[rc].append(v)
