"""Which member's NIC slows a DP group: the member every hop of whose is slow.

LLMPrism's cross-group diagnosis (§IV-D) stops at the DP group whose DP flows are slow. This
looks inside the group (collscope's extension, not in the paper). A member's NIC carries its
incoming ring hop, its outgoing ring hop and its PP flows to the neighbouring stages, if any.
A slow NIC makes every one of them slow; a healthy member next to it shares one slow hop with
it and has at least one that is not. So, from the group's first outlier step on:

- every hop is measured as the median time per byte of its flows, against the same kind of hop
  elsewhere in the job: ring hops against the ring hops of the job's other DP groups, PP hops
  (one per PP peer) against the job's PP pairs that touch no member of the group. Reference
  mean = median of those hops' medians, sigma = 1.4826 x their MAD, floored at
  ``group_rel_sigma`` of the mean as in cross-group; a hop is slow beyond mean + k sigma, the
  rule the group itself was found by (``FindingSettings.k``);
- the candidates are the members with every hop slow. One candidate: its NIC is the culprit.
  Several cannot be told apart from flows: in a ring of two both members carry the same two
  links; where a collector's records of a ring all last as long as its slowest link's (NCCL's
  ring is flow-controlled, so every link moves at that pace), every member's two ring hops are
  slow, and only PP flows can single one out. None: the slow hops do not meet at one NIC.

A reference needs ``min_peers`` hops, as cross-group needs peers; a hop kind without one is not
judged (and a member with no judged hop is no candidate).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.operator.analysis.flows import findings, parallelism, table

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
MAD_TO_SIGMA = 1.4826  # MAD of a normal sample x this = its standard deviation


@dataclass(frozen=True)
class Hop:
    """One hop a member's NIC carries: ``kind`` "in", "out" or "pp", and ``peer`` its other end."""

    kind: str
    peer: int  # endpoint index
    ratio: float  # median time per byte / the reference's mean
    limit: float  # (mean + k sigma) / mean: slow beyond this ratio

    @property
    def slow(self) -> bool:
        return self.ratio > self.limit


@dataclass(frozen=True)
class Member:
    endpoint: int  # endpoint index
    hops: tuple[Hop, ...]  # judged hops only

    @property
    def every_hop_slow(self) -> bool:
        return bool(self.hops) and all(h.slow for h in self.hops)


@dataclass(frozen=True)
class Localisation:
    """The group's members with their hops, and the candidates (every hop slow)."""

    members: tuple[Member, ...]
    candidates: tuple[int, ...]  # endpoint indices
    pp: bool  # some member has judged PP hops

    @property
    def nic(self) -> int | None:
        """The culprit NIC's endpoint index when exactly one member has every hop slow."""
        return self.candidates[0] if len(self.candidates) == 1 else None


def localise(
    flows: table.FlowTable,
    par: parallelism.Parallelism,
    group: int,
    since_ns: int,
    s: findings.FindingSettings,
) -> Localisation:
    """Hops of every member of DP group ``group`` from ``since_ns`` on, and the candidates."""
    job = int(par.group_job[group])
    members = par.group_members(group)
    rows = par.rows[par.job[par.flow_pair] == job]
    rows = rows[(flows.ts[rows] >= since_ns) & (flows.nbytes[rows] > 0)]
    is_dp = np.zeros(len(flows), dtype=bool)
    is_dp[par.rows] = par.dp[par.flow_pair]
    src, dst = flows.src[rows], flows.dst[rows]
    per_byte = flows.duration[rows] / flows.nbytes[rows]
    g_src, g_dst = par.group_of[src], par.group_of[dst]
    ring = is_dp[rows] & (g_src == g_dst) & (g_src >= 0)
    mine = np.isin(src, members) | np.isin(dst, members)
    # DP: directed links; PP: unordered pairs
    dp_ref = _reference(src[ring & ~mine], dst[ring & ~mine], per_byte[ring & ~mine], s)
    pp = ~is_dp[rows]
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    pp_ref = _reference(lo[pp & ~mine], hi[pp & ~mine], per_byte[pp & ~mine], s)
    out = []
    for m in members.tolist():
        hops: list[Hop] = []
        if dp_ref is not None:
            sel_in = ring & (dst == m) & (g_src == group)
            sel_out = ring & (src == m) & (g_dst == group)
            hops += _hops("in", src[sel_in], per_byte[sel_in], dp_ref)
            hops += _hops("out", dst[sel_out], per_byte[sel_out], dp_ref)
        if pp_ref is not None:
            sel = pp & ((src == m) | (dst == m))
            hops += _hops("pp", np.where(src[sel] == m, dst[sel], src[sel]), per_byte[sel], pp_ref)
        out.append(Member(m, tuple(hops)))
    return Localisation(
        members=tuple(out),
        candidates=tuple(m.endpoint for m in out if m.every_hop_slow),
        pp=any(h.kind == "pp" for m in out for h in m.hops),
    )


def _medians(a: IntArray, b: IntArray, value: FloatArray) -> tuple[IntArray, FloatArray]:
    """Median ``value`` per distinct (a, b) key: (keys as a * 2**32 + b, medians)."""
    key = a.astype(np.int64) * (1 << 32) + b.astype(np.int64)
    order = np.lexsort((value, key))
    key, value = key[order], value[order]
    firsts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else key
    counts = np.diff(np.r_[firsts, len(key)])
    # lower and upper middle element of each run, averaged
    med = 0.5 * (value[firsts + (counts - 1) // 2] + value[firsts + counts // 2])
    return key[firsts], med


def _reference(
    a: IntArray, b: IntArray, value: FloatArray, s: findings.FindingSettings
) -> tuple[float, float] | None:
    """(mean, limit ratio) over the hops' medians, or None with fewer than ``min_peers`` hops."""
    _, med = _medians(a, b, value)
    if len(med) < s.min_peers:
        return None
    mean = float(np.median(med))
    sigma = max(MAD_TO_SIGMA * float(np.median(np.abs(med - mean))), s.group_rel_sigma * mean)
    return mean, (mean + s.k * sigma) / mean


def _hops(kind: str, peer: IntArray, value: FloatArray, ref: tuple[float, float]) -> list[Hop]:
    keys, med = _medians(peer, np.zeros_like(peer), value)
    mean, limit = ref
    return [
        Hop(kind, int(k >> 32), float(v / mean), limit)
        for k, v in zip(keys.tolist(), med.tolist(), strict=True)
    ]
