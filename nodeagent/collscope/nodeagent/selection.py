"""Which (workload, rank) keys a request is about: the agent's answer to two jobs on one node.

The window holds each ring's records under (its workload, its rank) (``window.py``; the
workload is the ring's pod uid, ``discovery.workload_of``). A request names ranks, and may name
workloads (``api`` module docstring). ``select`` turns the two into keys:

- workloads named: only their rings count; a rank none of them holds is the request's error;
- none named (older operators, people with curl): any ring counts, and a rank held by one
  workload is answered as before; held by several, the rings being retired do not count while
  exactly one workload's ring of it is live (a pod replaced on the same node); still several,
  the request is refused (``errors.QueryError`` on ``workloads``, naming them) when it named
  that rank or when its answer is keyed by rank alone (``unique``: a window, an export, a dump).
  A summary of every rank is not: each summary says whose it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from collscope.nodeagent import errors, sampler, window


def rings_by_key(rings: Iterable[sampler.Tracked]) -> dict[window.Key, list[sampler.Tracked]]:
    """Every ring with a known rank, by its window key."""
    out: dict[window.Key, list[sampler.Tracked]] = {}
    for t in rings:
        if t.identity is not None and t.identity.rank is not None:
            out.setdefault((t.workload, t.identity.rank), []).append(t)
    return out


def select(
    known: Mapping[window.Key, Sequence[sampler.Tracked]],
    ranks: Sequence[int] | None,
    workloads: Sequence[str] | None,
    *,
    unique: bool,
    node: str,
) -> list[window.Key]:
    """The keys of ``ranks`` (None: all) of ``workloads`` (None: any), by rank then workload
    (module docstring); ``known``: ``rings_by_key`` of the node's rings."""
    by_rank: dict[int, list[window.Key]] = {}
    for key in sorted(known):
        if workloads is None or key[0] in workloads:
            by_rank.setdefault(key[1], []).append(key)
    where = f"node {node}" if workloads is None else f"workloads {_csv(workloads)}"
    for r in ranks or ():
        if r not in by_rank:
            raise errors.QueryError("ranks", f"rank {r} has no ring on {where}")
    out: list[window.Key] = []
    for r in sorted(by_rank) if ranks is None else sorted(set(ranks)):
        keys = by_rank[r]
        if len(keys) > 1 and workloads is None:
            live = [k for k in keys if any(t.health != "retired" for t in known[k])]
            keys = live if len(live) == 1 else keys
        if len(keys) > 1 and (unique or (ranks is not None and workloads is None)):
            raise errors.QueryError(
                "workloads",
                f"rank {r} is held by {len(keys)} workloads on node {node} "
                f"({_csv(w for w, _ in keys)}): name one with workloads= "
                "(RankInfo.workload, the pod uid) so that their data does not mix",
            )
        out += keys
    return out


def by_workload(keys: Iterable[window.Key]) -> dict[str, list[window.Key]]:
    out: dict[str, list[window.Key]] = {}
    for key in keys:
        out.setdefault(key[0], []).append(key)
    return out


def _csv(values: Iterable[str]) -> str:
    return ", ".join(sorted(set(values)))
