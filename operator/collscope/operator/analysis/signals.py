"""Per-rank signals of a slowdown, each from a paper rule; ``straggler`` weighs them.

- ``late_starts`` (Mycroft Algorithm 2 lines 16-18 "constant late starts", §5.4 cross-group):
  in each collective round of the window, the member that entered last (the shortest
  duration: the others waited for it) by more than ``max(late_min, late_factor x the op's
  baseline arrival spread)`` (Tmax - Tmin, CCL-D §4.2.1) counts, unless its
  lateness is *explained*: its own time outside operations since the previous round of that
  communicator (``rounds.Rounds.own``) is not longer than the other members' by at least
  ``explained_share`` of the lateness. A victim of another group arrives late with an ordinary
  ``own`` (it waited inside that group's operation); the root cause arrives late because it
  computed longer. Point-to-point rounds are skipped (a pipeline receiver always enters long
  before its sender: the schedule, not a straggler).
- ``transfer`` (CCL-D §4.2.2: Tmin approaching Tmax means communication dominates): per
  (comm, op, bytes), the median shortest duration of a round (the last arriver waits for
  nobody, so its duration is the transfer itself) against its baseline. Members of every
  communicator whose transfer slowed get ``log2(ratio)``; a slow NIC is the one member shared
  by its DP and PP communicators.
- ``flows`` (Mycroft Table 3 flow-level "each flow should take similar execution time", Table 4
  "not delivered", #6 "GPU_ready = RDMA_transmitted but RDMA_done smaller"): in one sampled
  state of an operation, a send flow holding many more chunks sent-but-unacknowledged than its
  siblings is on a slow path; both endpoints count. And proxy stalls (#7): a local
  "not transmitted" flow (receiver had buffers) idle for ``host_stall`` or longer, charged to
  the receiver instead when it has not yet noticed chunks the sender delivered. A stall is
  measured to its catching up (``catch_up``), not only to the sample that caught it: a state
  sample sees a stall some phase of the sampling interval after it began, so ``idle_ns``
  alone makes a 0.4 s stall look 0.2 s long at 200 ms sampling, and one op's stall per step
  (long steps) then never counts.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import chunks, rounds

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Key = tuple[int, int, int]


def key_of(r: rounds.Rounds) -> I64:
    """(comm, op, bytes) of every round, ``[rounds, 3]``."""
    return np.stack([r.r_comm, r.r_op, r.r_bytes], axis=1)


def by_key(
    r: rounds.Rounds, values: I64, keep: npt.NDArray[np.bool_] | None = None
) -> dict[Key, float]:
    """Median of a per-round value for each (comm, op, bytes), over the rounds ``keep`` says."""
    out: dict[Key, float] = {}
    k = key_of(r)
    if keep is not None:
        k, values = k[keep], values[keep]
    if len(k) == 0:
        return out
    _, first, inv = np.unique(k, axis=0, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    for g, f in enumerate(first.tolist()):
        out[(int(k[f, 0]), int(k[f, 1]), int(k[f, 2]))] = float(np.median(values[inv == g]))
    return out


def _add(out: F64, ranks: I64, who: I64, weight: float | F64) -> None:
    pos = np.searchsorted(ranks, who)
    ok = (pos < len(ranks)) & (ranks[np.clip(pos, 0, len(ranks) - 1)] == who)
    np.add.at(out, pos[ok], weight if np.isscalar(weight) else np.asarray(weight)[ok])


def late_starts(
    win: rounds.Rounds,
    base: rounds.Rounds,
    ranks: I64,
    *,
    p2p_ops: set[int],
    late_min_ns: float,
    late_factor: float,
    explained_share: float,
    min_share: float = 0.0,
) -> F64:
    """Unexplained late starts per rank (see module docstring).

    "Constant" late starts (Mycroft Algorithm 2): only communicators where the rank was late in
    at least ``min_share`` of the rounds it took part in count; a few late entries among many
    rounds are jitter.
    """
    # Arrival spread from durations, not start times (CCL-D §4.2.1: the first to arrive waits
    # for the last, so Tmax - Tmin is the spread): each duration is read on its own rank's
    # clock, so a node clock offset left by ``clocks`` (32 ms seen at 50 ms steps) neither
    # widens the baseline spread nor makes a punctual member of that node look late.
    spread = by_key(base, base.r_tmax - base.r_tmin)
    out = np.zeros(len(ranks))
    multi = np.flatnonzero((win.r_n >= 2) & ~np.isin(win.r_op, sorted(p2p_ops)))
    # Shares are counted per (comm, op, bytes): a ReduceScatter and the AllGather that follows
    # it at once on the same communicator are different rounds of one step, and only the first
    # can start late.
    took: Counter[tuple[int, Key]] = Counter()
    late: Counter[tuple[int, Key]] = Counter()
    for i in multi.tolist():
        k = (int(win.r_comm[i]), int(win.r_op[i]), int(win.r_bytes[i]))
        lo, n = int(win.r_lo[i]), int(win.r_n[i])
        for r in win.rank[lo : lo + n].tolist():
            took[(r, k)] += 1
        dur = win.end[lo : lo + n] - win.start[lo : lo + n]
        own = win.own[lo : lo + n]
        j = int(np.argmin(dur))  # the last to arrive waits for nobody: the shortest duration
        others = np.delete(np.arange(n), j)
        lateness = float(np.median(dur[others]) - dur[j])  # how long the others waited for it
        if lateness <= max(late_min_ns, late_factor * spread.get(k, late_min_ns)):
            continue
        known = own[others] >= 0
        if own[j] < 0 or not known.any():
            continue
        if float(own[j] - np.median(own[others][known])) < explained_share * lateness:
            continue  # it spent the time waiting inside other operations: explained
        late[(int(win.rank[lo + j]), k)] += 1
    for (r, c), n_late in late.items():
        if n_late >= min_share * took[(r, c)]:
            _add(out, ranks, np.asarray([r], dtype=np.int64), float(n_late))
    return out


def transfer(
    win: rounds.Rounds,
    base: rounds.Rounds,
    ranks: I64,
    *,
    slowdown: float,
    min_excess_ns: float,
    recent_ns: int | None = None,
) -> tuple[F64, list[str]]:
    """log2 transfer slowdown summed over each rank's slowed communicators, and notes.

    ``recent_ns``: the window's transfer time is the median over its rounds that ended after
    it (keys without such a round: over all). The window's start only bounds the onset from
    below (a rank that rotated into the sample stretches it back to its last visit, seconds
    before the fault): the trigger saw the slowdown at the window's end, and a median over a
    window half before the onset is the healthy transfer time (nic-slow at 50 ms steps: a
    6 s window, the NIC slowed 3 s into it)."""
    out = np.zeros(len(ranks))
    notes: list[str] = []
    # Only rounds every member completed: a round cut by the window's edge lacks its last
    # arriver, and the shortest duration left is a wait, not the transfer.
    in_base, in_win = _members(base), _members(win)
    size = {k: max(in_base.get(k, 0), in_win.get(k, 0)) for k in {**in_base, **in_win}}
    tb = by_key(base, base.r_tmin, _complete(base, size))
    tw = by_key(win, win.r_tmin, _complete(win, size))
    if recent_ns is not None:
        tw |= by_key(win, win.r_tmin, _complete(win, size) & (win.r_end_max > recent_ns))
    for k, now in sorted(tw.items()):
        before = tb.get(k)
        if before is None or before <= 0:
            continue
        ratio = now / before
        if ratio < slowdown or now - before < min_excess_ns:
            continue
        # Every member of the communicator: a slowed round ends late, so at the instant judged
        # some members have not completed it yet; they are on the same slow ring all the same.
        mem = np.unique(np.concatenate([win.rank[win.comm == k[0]], base.rank[base.comm == k[0]]]))
        _add(out, ranks, mem, float(np.log2(ratio)))
        notes.append(
            f"comm #{k[0]}: transfer time (Tmin) {now / 1e6:.1f} ms vs "
            f"{before / 1e6:.1f} ms before ({ratio:.1f}x)"
        )
    return out, notes


def _members(r: rounds.Rounds) -> dict[Key, int]:
    """Most members seen in one round of each (comm, op, bytes)."""
    out: dict[Key, int] = {}
    for key, n in zip(map(tuple, key_of(r).tolist()), r.r_n.tolist(), strict=True):
        k = (int(key[0]), int(key[1]), int(key[2]))
        out[k] = max(out.get(k, 0), int(n))
    return out


def _complete(r: rounds.Rounds, size: dict[Key, int]) -> npt.NDArray[np.bool_]:
    keys = key_of(r).tolist()
    n = r.r_n.tolist()
    return np.asarray(
        [m >= size.get((k[0], k[1], k[2]), 0) for k, m in zip(keys, n, strict=True)], dtype=bool
    )


def catch_up(bundle: tables.Bundle, rows: npt.NDArray[np.intp], usual_ns: dict[Key, float]) -> I64:
    """Per state row of ``rows``: how long its operation's stall lasted after the sample.

    Straggler step 1's "then catching up" (Mycroft #7): once a stalled proxy resumes, the
    chunks it held go out at once and the operation completes within its usual transfer time
    ``u`` (``usual_ns`` by (comm, op, bytes): CCL-D Tmin of the baseline rounds). So when a
    sample at ``ts`` is the operation's *last* (no later sample of it tells more) and the
    operation completed at ``end``, the stall ran on until at least ``end - u``: it lasted
    ``idle + (end - ts - u)``, whatever the sampling interval and phase. 0 where the operation
    was sampled again (that sample's idle speaks), has not completed (it may be a hang) or has
    no known ``u``. The flows' rule (``flows``) only applies it to a flow frozen at the sample
    for longer than ``u``: a flow that moves slowly (a slow NIC) is not stalled, and its
    remaining transfer takes longer than ``u``, which would pass for a stall.
    """
    out = np.zeros(len(rows), dtype=np.int64)
    if len(rows) == 0 or not usual_ns:
        return out
    st_all = bundle.states
    key_all = np.stack([st_all["rank"], st_all["comm"], st_all["seq"]], axis=1).astype(np.int64)
    uniq, inv = np.unique(key_all, axis=0, return_inverse=True)
    last = np.full(len(uniq), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last, inv.reshape(-1), st_all["ts"].astype(np.int64))
    ops = bundle.ops
    end_of = {
        (int(r), int(c), int(q)): int(e)
        for r, c, q, e in zip(
            ops["rank"].tolist(), ops["comm"].tolist(), ops["seq"].tolist(),
            ops["end"].tolist(), strict=True,
        )
    }  # fmt: skip
    st = st_all[rows]
    inv_rows = inv.reshape(-1)[rows]
    for i in range(len(rows)):
        ts = int(st["ts"][i])
        if ts < int(last[inv_rows[i]]):
            continue
        end = end_of.get((int(st["rank"][i]), int(st["comm"][i]), int(st["seq"][i])))
        u = usual_ns.get((int(st["comm"][i]), int(st["op"][i]), int(st["bytes"][i])))
        if end is None or u is None or end < ts:
            continue
        out[i] = max(0, int(end - ts - u))
    return out


@dataclass(frozen=True)
class FlowSignals:
    slow_path: F64  # per rank: send flows far more backlogged than their siblings (endpoints)
    host: F64  # per rank: proxy-stall flow samples (local "not transmitted", long idle)
    samples: F64  # per rank: state records with flows looked at


def flows(
    bundle: tables.Bundle,
    rows: npt.NDArray[np.intp],
    ranks: I64,
    *,
    interval_ns: int,
    host_stall_ns: float,
    min_chunks: float,
    catch_up_ns: I64 | None = None,
    usual_ns: dict[Key, float] | None = None,
) -> FlowSignals:
    """Flow-level signals over the state records ``rows`` (see module docstring).
    ``catch_up_ns`` (per row, ``catch_up``) and ``usual_ns`` (the usual transfer time by
    (comm, op, bytes)) lengthen a frozen flow's stall to its catching up; None: the
    sample's idle only."""
    z = np.zeros(len(ranks))
    if len(rows) == 0:
        return FlowSignals(z, z.copy(), z.copy())
    ft = chunks.of_states(bundle, rows)
    v = chunks.verdicts(ft)
    snd = np.flatnonzero(ft.send)
    backlog = (ft.sent - ft.done)[snd].astype(np.float64)
    slow = np.zeros(len(ranks))
    if len(snd):
        # Siblings: flows of the same operation sampled in the same state interval.
        grp = np.stack([ft.comm[snd], ft.seq[snd], ft.ts[snd] // max(interval_ns, 1)], axis=1)
        _, inv = np.unique(grp, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        order = np.lexsort((backlog, inv))
        bounds = np.flatnonzero(np.r_[True, inv[order][1:] != inv[order][:-1], True])
        q25 = np.empty(int(inv.max()) + 1)
        size = np.empty(int(inv.max()) + 1)
        for a, b in itertools.pairwise(bounds):
            g = int(inv[order[a]])
            q25[g] = backlog[order[a + (b - a) // 4]]
            size[g] = b - a
        # Hot: at least min_chunks (StragglerSettings.slow_path_chunks) and twice the lower
        # quartile of its siblings' backlog plus two chunks (NCCL keeps up to NCCL_STEPS = 8
        # chunks in flight per flow; two is the jitter of one poll of the proxy), among at
        # least three siblings (a quartile of two is one of them). Ratios and counts of
        # chunks, so they hold at any step length and sampling interval; 2x and +2 picked
        # on the own simulator, kept because eval-dev agrees.
        hot = (size[inv] >= 3) & (backlog >= np.maximum(min_chunks, 2.0 * q25[inv] + 2.0))
        # Both endpoints of a slow hop are suspects, but Mycroft Table 4 reads "not
        # transmitted (ready > sent) while the receiver has buffers posted" as a *local*
        # cause: the chunks queue in the sender's send queue, its NIC does not take them. The
        # receiver of such a hop keeps half the weight (the same picture can come from a slow
        # ingress; only the two NICs' counters settle it).
        local = (v.not_transmitted & v.net_blocked)[snd][hot]
        _add(slow, ranks, ft.sender[snd][hot], 1.0)
        _add(slow, ranks, ft.receiver[snd][hot], np.where(local, 0.5, 1.0))
    host = np.zeros(len(ranks))
    stall = _stall_ns(bundle, rows, ft, catch_up_ns, usual_ns or {})
    stalled = ft.send & v.not_transmitted & v.net_blocked & (stall >= host_stall_ns)
    # A receiver that has not noticed every chunk the sender delivered (its "arrived" behind
    # the sender's "done") is the one whose proxy is stuck: its frozen buffer count only looks
    # free. Otherwise the sending proxy holds a ready chunk with a buffer waiting: local cause.
    m = ft.mate
    has = m >= 0
    rx_behind = np.zeros(len(ft), dtype=bool)
    rx_behind[has] = ft.done[m[has]] < ft.done[has]
    _add(host, ranks, ft.owner[stalled & ~rx_behind], 1.0)
    _add(host, ranks, ft.receiver[stalled & rx_behind], 1.0)
    # The receiving proxy stalled: its GPU consumed every chunk that arrived (posted = done =
    # consumed) yet no new receive buffer was posted, so the sender holds ready chunks.
    drained = np.zeros(len(ft), dtype=bool)
    drained[has] = (ft.posted[m[has]] == ft.consumed[m[has]]) & (
        ft.posted[m[has]] < ft.total[m[has]]
    )
    rx_stalled = ft.send & v.receiver_not_ready & drained & (stall >= host_stall_ns)
    _add(host, ranks, ft.receiver[rx_stalled], 1.0)
    samples = np.zeros(len(ranks))
    _add(samples, ranks, bundle.states["rank"][rows].astype(np.int64), 1.0)
    return FlowSignals(slow, host, samples)


def _stall_ns(
    bundle: tables.Bundle,
    rows: npt.NDArray[np.intp],
    ft: chunks.FlowTable,
    catch_up_ns: I64 | None,
    usual_ns: dict[Key, float],
) -> I64:
    """Per flow row: how long it stood still, the sample's idle plus, for a flow frozen longer
    than its operation's usual transfer time, the stall's run to the catching up."""
    if catch_up_ns is None:
        return ft.idle
    st = bundle.states[rows]
    reps = (st["flow_hi"] - st["flow_lo"]).astype(np.int64)
    extra = np.repeat(catch_up_ns, reps)
    keys = zip(st["comm"].tolist(), st["op"].tolist(), st["bytes"].tolist(), strict=True)
    u = np.repeat(np.asarray([usual_ns.get(k, np.inf) for k in keys], dtype=np.float64), reps)
    frozen = ft.idle > u
    return np.where(frozen, ft.idle + extra, ft.idle)
