"""Root cause of a slowdown: Mycroft Algorithm 2 (AnalyzeStragglerRootCause, §5.2, §5.4, Table 3)
with CCL-D §4.2.2 (slow location, eq. 4).

Input: the window (since, t] of every rank and the history before it (the baseline period).
``signals`` turns them into per-rank evidence; this module decides:

1. proxy stalls (bursty: flows idle ``host_stall_s`` with data ready and the receiver ready,
   then catching up) => ``slow.host``, the stalling rank (Mycroft #7). The stall's length
   runs to its catching up (``signals.catch_up``: the operation's completion less its usual
   transfer time), not to the sample that caught it: with long steps the proxy stalls the
   one short operation of a step it hits, and a sample catches it at a random phase of the
   sampling interval;
2. *compute* evidence = unexplained late starts (Mycroft "constant late starts", at least
   ``min_late_rounds``); *network* evidence = the rank's communicators' transfer time (CCL-D
   Tmin) rose, refined by flows more backlogged than their siblings (Mycroft Table 3/4);
3. both on the same culprit => ``slow.mixed``; only one => ``slow.compute`` / ``slow.network``;
   when they name different ranks, CCL-D's P = (Tmax - Tmin)/(Tmax - Tbase) on the compute
   candidate's widest round decides with alpha/beta (P > beta compute, P < alpha network, else
   mixed). P alone does not decide: a 2x compute slowdown dwarfs a 6x NIC slowdown in Tmax, so
   P says "compute" for a genuinely mixed fault;
4. when the best evidence covers most ranks of one node alike (``node_share``), the fault is
   the node's: the culprits are its ranks (Mycroft #5 background load, #6 background traffic).

Why one module: the steps weigh each other's evidence (a proxy stall explains late starts, P
decides between a compute and a network candidate, node share overrides both), so they share
the per-rank findings built here; the evidence itself is built in ``signals`` and ``rounds``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import diagnosis, failure, hwsamples, placement, rounds, signals

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Cat = diagnosis.Category
NS = 1_000_000_000


@dataclass(frozen=True)
class StragglerSettings:
    """Thresholds of the slowdown root cause, and where each value comes from (issue 12).

    From a paper: ``alpha``/``beta`` (CCL-D §4.2.2 eq. 4); ``min_late_rounds`` is Mycroft's
    "constant late starts" (§5.2) read as "more than one"; ``node_share`` follows Mycroft #5/#6
    (a background load or traffic hits every rank of its node). From the protocol:
    ``late_factor`` compares a late start with the op's own baseline arrival spread and
    ``net_slowdown`` a transfer time with its own baseline (scale-free ratios; 3x and 1.5x are
    rounded choices, not derived). Measured: ``host_stall_s`` (0.3 s) lies between the idle
    time of healthy flows (at most 0.20 s in eval-dev's fault-free cases) and Mycroft #7's
    1 s proxy sleep; it bounds a stall's length measured to its catching up
    (``signals.catch_up``), so it holds at any sampling interval (it assumed ~100 ms while
    it bounded the sampled idle: at 200 ms a 0.37 s stall was seen 0.21 s long).
    Not derived, picked on collscope's own simulator and kept because eval-dev agrees (20/20
    with ``bench/accuracy.py --bundles ../shared/eval-dev``): the absolute floors
    ``late_min_s`` (2 ms) and ``net_min_excess_s`` (1 ms), which only matter for operations
    whose arrival spread is below them; ``explained_share``, ``min_late_share``,
    ``slow_path_chunks``, ``slow_path_weight``, ``host_min_samples`` and ``node_score``. Each
    is a candidate for derivation from the data (sampling interval, measured jitter).
    ``host_min_samples`` counts flow rows (channels x state samples), so one sample of a
    stalled operation with two channels meets it; more samples at finer sampling only add
    to a count already met.
    """

    late_min_s: float = 0.002  # Mycroft's late-start threshold is 1 s in production; ops here ms
    late_factor: float = 3.0  # ... and at least this x the op's baseline arrival spread
    explained_share: float = 0.5  # own extra compute must cover this share of the lateness
    min_late_rounds: int = 2  # "constant": at least this many unexplained late starts ...
    min_late_share: float = 0.3  # ... in communicators where it was late this often
    net_slowdown: float = 1.5  # transfer time (Tmin) at least this x its baseline
    net_min_excess_s: float = 0.001  # ... and longer by at least this much
    slow_path_chunks: float = 4.0  # a flow this backlogged beyond its siblings is on a slow path
    slow_path_weight: float = 0.25  # weight of slow-path flows next to transfer slowdown
    host_stall_s: float = 0.3  # all flows idle this long with data ready: a proxy stall
    host_min_samples: int = 2  # proxy-stall flow samples needed for slow.host
    alpha: float = 0.4  # CCL-D: P < alpha => communication
    beta: float = 0.6  # CCL-D: P > beta => computation
    node_share: float = 0.75  # this share of a node's ranks implicated => node fault
    node_score: float = 0.5  # "implicated" = score at least this x the best score


def analyze(
    bundle: tables.Bundle,
    *,
    since_ns: int,
    t_ns: int,
    base_from_ns: int,
    where: placement.Placement,
    interval_ns: int = 100_000_000,
    settings: StragglerSettings = StragglerSettings(),
) -> failure.Finding | None:
    """Root cause of a slowdown in (since, t] against the baseline (base_from, since]."""
    ev = _Evidence()
    found = _analyze(
        bundle,
        since_ns=since_ns,
        t_ns=t_ns,
        base_from_ns=base_from_ns,
        where=where,
        interval_ns=interval_ns,
        settings=settings,
        ev=ev,
    )
    if found is None:
        return None
    return dataclasses.replace(found, alternatives=_alternatives(found, ev, where, settings))


@dataclass
class _Evidence:
    """The per-rank signals ``_analyze`` weighed, kept for the alternatives it ranked lower."""

    ranks: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    late: F64 = field(default_factory=lambda: np.zeros(0))
    net: F64 = field(default_factory=lambda: np.zeros(0))
    host: F64 = field(default_factory=lambda: np.zeros(0))
    p: float | None = None


def _alternatives(
    found: failure.Finding, ev: _Evidence, where: placement.Placement, s: StragglerSettings
) -> list[diagnosis.Alternative]:
    """The other categories whose evidence was weighed, and the runner-up rank of the verdict.

    Scores are on the verdict's scale: 0.5 means that category's own rule held but the
    decision (CCL-D's P, the order of the rules) preferred the verdict; below 0.5, the share
    of its rule's threshold that its evidence reached. The runner-up rank scores its score
    relative to the verdict's culprit (1.0: a tie).
    """
    out: list[diagnosis.Alternative] = []
    if len(ev.ranks) == 0:
        return out
    cat = found.category
    p = "" if ev.p is None else f" (CCL-D P = {ev.p:.2f} on the widest round)"
    # (category, its evidence per rank, the rule's threshold, what the evidence is, what
    # ranked it lower when its rule held)
    candidates = [
        (Cat.SLOW_HOST, ev.host, float(s.host_min_samples), "proxy-stall samples",
         "the proxy-stall rule is checked first and did not hold"),
        (Cat.SLOW_COMPUTE, ev.late, float(s.min_late_rounds), "unexplained late starts",
         f"the transfer slowdown weighed more{p}"),
        (Cat.SLOW_NETWORK, ev.net, 1e-9, "a transfer slowdown of its communicators",
         f"the late starts weighed more{p}"),
    ]  # fmt: skip
    mixed_parts = {Cat.SLOW_COMPUTE, Cat.SLOW_NETWORK}
    for c, vec, need, what, lost in candidates:
        if c is cat or (cat is Cat.SLOW_MIXED and c in mixed_parts) or float(vec.max()) <= 0:
            continue
        i = int(np.argmax(vec))
        held = float(vec[i]) >= need
        lower = lost if held else f"below the rule's threshold of {need:g}"
        out.append(
            diagnosis.Alternative(
                category=c.value.name,
                rank=int(ev.ranks[i]),
                node=where.node(int(ev.ranks[i])),
                score=0.5 if held else round(0.5 * float(vec[i]) / need, 3),
                why=f"{where.label(int(ev.ranks[i]))}: {vec[i]:g} {what}, {lower}",
            )
        )
    out += failure.runner_up(found)
    out.sort(key=lambda a: -a.score)
    return out


def _analyze(
    bundle: tables.Bundle,
    *,
    since_ns: int,
    t_ns: int,
    base_from_ns: int,
    where: placement.Placement,
    interval_ns: int,
    settings: StragglerSettings,
    ev: _Evidence,
) -> failure.Finding | None:
    """Steps 1-4 of the module docstring; the per-rank evidence weighed goes to ``ev``."""
    s = settings
    ops = bundle.ops
    before = ops[(ops["end"] > base_from_ns) & (ops["end"] <= since_ns)]
    win = rounds.build(ops[(ops["end"] > since_ns) & (ops["end"] <= t_ns)], history=before)
    base = rounds.build(before)
    ranks = bundle.ranks.astype(np.int64)
    if len(win) == 0 or len(ranks) == 0:
        return None
    p2p = {i for i in (bundle.string_index("Send"), bundle.string_index("Recv")) if i is not None}
    late = signals.late_starts(
        win,
        base,
        ranks,
        p2p_ops=p2p,
        late_min_ns=s.late_min_s * NS,
        late_factor=s.late_factor,
        explained_share=s.explained_share,
        min_share=s.min_late_share,
    )
    net, notes = signals.transfer(
        win,
        base,
        ranks,
        slowdown=s.net_slowdown,
        min_excess_ns=s.net_min_excess_s * NS,
        recent_ns=since_ns + (t_ns - since_ns) // 2,  # the second half: what the trigger saw
    )
    st = bundle.states
    rows = np.flatnonzero(
        (st["ts"] > since_ns) & (st["ts"] <= t_ns) & (st["flow_hi"] > st["flow_lo"])
    )
    usual = signals.by_key(base, base.r_tmin)  # each operation's usual transfer time
    fl = signals.flows(
        bundle,
        rows,
        ranks,
        interval_ns=interval_ns,
        host_stall_ns=s.host_stall_s * NS,
        min_chunks=s.slow_path_chunks,
        catch_up_ns=signals.catch_up(bundle, rows, usual),
        usual_ns=usual,
    )
    ev.ranks, ev.late, ev.net, ev.host = ranks, late, net, fl.host
    if fl.host.max() >= s.host_min_samples:
        return _host_finding(fl.host, ranks, where=where, s=s)
    if net.max() > 0:
        net, notes = _with_path_evidence(
            bundle, net, notes, slow_path=fl.slow_path, ranks=ranks, where=where, s=s
        )
    ev.net = net
    return _decide(win, base, ranks=ranks, late=late, net=net, notes=notes, where=where, s=s, ev=ev)


def _host_finding(
    host: F64, ranks: I64, *, where: placement.Placement, s: StragglerSettings
) -> failure.Finding:
    """Step 1: ``slow.host``, the rank with the most proxy-stall flow samples."""
    i = int(np.argmax(host))
    return _finding(
        Cat.SLOW_HOST,
        host,
        ranks,
        where=where,
        s=s,
        why=[
            f"{where.label(int(ranks[i]))}: {int(host[i])} flow samples idle for "
            f">= {s.host_stall_s:g} s waiting on its proxy (chunks ready and the receiver "
            f"ready, or chunks delivered to it and not yet noticed), in operations that then "
            f"completed: bursty proxy (host) stalls, not a steady network slowdown"
        ],
        p=None,
    )


def _with_path_evidence(
    bundle: tables.Bundle,
    net: F64,
    notes: list[str],
    *,
    slow_path: F64,
    ranks: I64,
    where: placement.Placement,
    s: StragglerSettings,
) -> tuple[F64, list[str]]:
    """Step 2's network evidence refined by slow-path flows and the NICs' own samples."""
    net = net + s.slow_path_weight * _norm(slow_path) * float(net.max())
    # Two endpoints of one slow path score alike, or apart only by Table 4's one-hop
    # reading (a slow ingress at the receiver looks like a local cause at the sender). A
    # NIC whose link trained below its peers' speed, or that carries others' traffic, is
    # direct evidence on the device: it outweighs that reading (one slow-path unit) and
    # nothing more, so it never overrides a difference in transfer slowdown.
    implicated = [int(r) for r in ranks[net > 0]]
    slow_links = hwsamples.nic_slow(bundle, implicated)
    busy = hwsamples.nic_busy(bundle, implicated)
    hint = np.array([float(int(r) in slow_links or int(r) in busy) for r in ranks])
    net = net + hint * s.slow_path_weight * float(net.max())
    notes = [
        *notes,
        *hwsamples.nic_slow_text(slow_links, where),
        *hwsamples.nic_busy_text(busy, where)[:2],
    ]
    return net, notes


def _decide(
    win: rounds.Rounds,
    base: rounds.Rounds,
    *,
    ranks: I64,
    late: F64,
    net: F64,
    notes: list[str],
    where: placement.Placement,
    s: StragglerSettings,
    ev: _Evidence,
) -> failure.Finding | None:
    """Step 3: compute, network or mixed from the two kinds of evidence and CCL-D's P."""
    has_comp = late.max() >= s.min_late_rounds
    has_net = net.max() > 0
    if not has_comp and not has_net:
        return None
    p = _ccl_p(win, base, int(ranks[int(np.argmax(late if has_comp else net))]))
    ev.p = p
    if has_comp and has_net:
        top_c, top_n = int(np.argmax(late)), int(np.argmax(net))
        # Ties matter: on a two-rank path both endpoints score the same network evidence, and
        # the compute culprit being one of them is the same culprit.
        shared = top_c == top_n or net[top_c] >= net[top_n] * (1.0 - 1e-9)
        if shared or _same_node(ranks, late, net, where, s):
            return _finding(
                Cat.SLOW_MIXED,
                _norm(late) + _norm(net),
                ranks,
                where=where,
                s=s,
                why=[_late_text(where, ranks, late), _net_text(where, ranks, net, notes)],
                p=p,
            )
        if p is not None and p < s.alpha:
            has_comp = False
        elif p is not None and p > s.beta:
            has_net = False
        else:
            return _finding(
                Cat.SLOW_MIXED,
                _norm(late) + _norm(net),
                ranks,
                where=where,
                s=s,
                why=[_late_text(where, ranks, late), _net_text(where, ranks, net, notes)],
                p=p,
            )
    if has_net and not has_comp:
        return _finding(
            Cat.SLOW_NETWORK,
            net,
            ranks,
            where=where,
            s=s,
            why=[_net_text(where, ranks, net, notes)],
            p=p,
        )
    return _finding(
        Cat.SLOW_COMPUTE, late, ranks, where=where, s=s, why=[_late_text(where, ranks, late)], p=p
    )


def _late_text(where: placement.Placement, ranks: I64, late: F64) -> str:
    i = int(np.argmax(late))
    return (
        f"{where.label(int(ranks[i]))} entered {int(late[i])} collective rounds last by "
        f"more than the threshold, each time after computing longer than its peers (not "
        f"after waiting in another group): compute, PCIe or power slows it"
    )


def _net_text(where: placement.Placement, ranks: I64, net: F64, notes: list[str]) -> str:
    i = int(np.argmax(net))
    notes = list(dict.fromkeys(notes))  # one line per communicator key, not per op of it
    return (
        f"{where.label(int(ranks[i]))} is the member shared by the communicators whose "
        f"transfer slowed ({'; '.join(notes[:3])}): its NIC path moves chunks slowly "
        f"while the GPUs keep up"
    )


def _norm(x: F64) -> F64:
    m = float(x.max()) if len(x) else 0.0
    return x / m if m > 0 else x


def _ccl_p(win: rounds.Rounds, base: rounds.Rounds, rank: int) -> float | None:
    """CCL-D eq. 2 and 4 on the widest-spread round of ``rank`` (Tbase: mean baseline Tmax)."""
    tbase = signals.by_key(base, base.r_tmax)
    best: tuple[float, float] | None = None
    mine = np.unique(win.rid[win.rank == rank])
    for i in mine.tolist():
        if win.r_n[i] < 2:
            continue
        tb = tbase.get((int(win.r_comm[i]), int(win.r_op[i]), int(win.r_bytes[i])))
        tmax, tmin = float(win.r_tmax[i]), float(win.r_tmin[i])
        if tb is None or tmax <= tb:
            continue
        spread = tmax - tmin
        if best is None or spread > best[0]:
            best = (spread, min(max(spread / (tmax - tb), 0.0), 1.0))
    return None if best is None else best[1]


def _node_fault(
    ranks: I64, score: F64, where: placement.Placement, s: StragglerSettings
) -> str | None:
    """The best rank's node, when most of that node's ranks are implicated alike."""
    top = float(score.max()) if len(score) else 0.0
    if top <= 0:
        return None
    node = where.node(int(ranks[int(np.argmax(score))]))
    if node is None:
        return None
    on = np.asarray([r for r in where.ranks_on(node)], dtype=np.int64)
    on = on[np.isin(on, ranks)]
    if len(on) < 2:
        return None
    hit = score[np.searchsorted(ranks, on)] >= s.node_score * top
    return node if float(hit.mean()) >= s.node_share else None


def _same_node(
    ranks: I64, late: F64, net: F64, where: placement.Placement, s: StragglerSettings
) -> bool:
    a = _node_fault(ranks, late, where, s)
    return a is not None and a == _node_fault(ranks, net, where, s)


def _finding(
    cat: Cat,
    score: F64,
    ranks: I64,
    *,
    where: placement.Placement,
    s: StragglerSettings,
    why: list[str],
    p: float | None,
) -> failure.Finding:
    order = np.lexsort((ranks, -score))
    best = float(score[order[0]]) or 1.0
    node = _node_fault(ranks, score, where, s)
    comps: dict[Cat, diagnosis.Component] = {Cat.SLOW_HOST: "host", Cat.SLOW_NETWORK: "nic"}
    comp = comps.get(cat, "gpu")
    if node is not None:
        chosen = [int(ranks[i]) for i in order if where.node(int(ranks[i])) == node]
        second = max(
            (float(score[i]) for i in order if where.node(int(ranks[i])) != node), default=0.0
        )
    else:
        chosen = [int(ranks[i]) for i in order[:4] if score[i] > 0]
        second = float(score[order[1]]) if len(order) > 1 else 0.0
    culprits = [
        where.culprit(r, component=comp, score=float(score[int(np.searchsorted(ranks, r))]) / best)
        for r in chosen
    ]
    ev = list(why)
    if node is not None:
        ev.append(
            f"every rank of node {node} is implicated alike ({len(chosen)} ranks): a "
            f"node-level fault"
        )
    if p is not None:
        ev.append(
            f"CCL-D P = (Tmax - Tmin)/(Tmax - Tbase) = {p:.2f} on the culprit's widest "
            f"round (near 1: it arrives late; near 0: the transfer itself is slow)"
        )
    return failure.Finding(
        category=cat,
        culprits=culprits,
        evidence=ev,
        margin=max(0.0, (best - second) / best),
        coverage=1.0,
    )
