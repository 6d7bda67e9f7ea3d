"""Python stacks of a Diagnosis's ranks, as the rank grid its status shows (Mycroft §5: stacks
are collected on trigger and read grouped; docs/design.md, "Data path" 6).

Stacks are asked per rank (``POST /v1/stacks {"ranks": [r]}`` to the rank's agent), so each
answer belongs to one rank whatever pid namespace the agent resolved it in; ``rank_frames``
picks that process's main thread (py-spy names it, or its tid is the pid), else its first
group, innermost frame first. ``status.stack_groups`` then merges ranks with identical stacks.
``choose`` bounds the cost: the culprits first, then the sampled ranks, then the others in rank
order, at most ``max_ranks``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

MAX_RANKS: Final = 32  # py-spy pauses each process briefly; a grid of 32 shows the pattern


def choose(
    culprits: Iterable[int],
    sampled: Iterable[int],
    ranks: Iterable[int],
    max_ranks: int = MAX_RANKS,
) -> list[int]:
    out: list[int] = []
    known = set(ranks)
    for r in [*culprits, *sampled, *sorted(known)]:
        if r in known and r not in out:
            out.append(r)
    return out[:max_ranks]


def rank_frames(report: Mapping[str, Any]) -> list[str] | None:
    """The main thread's frames in one rank's ``StacksReport`` (JSON), None when empty."""
    groups = [g for g in report.get("groups") or [] if isinstance(g, Mapping)]
    if not groups:
        return None
    main = next((g for g in groups if "MainThread" in (g.get("thread_names") or [])), groups[0])
    return [str(f) for f in main.get("frames") or []]
