"""Circuit breaker on node cordons, across the whole cluster.

A diagnosis tool that cordons nodes can do more harm than the fault it found: a bug, a fabric-wide
event misread as a node fault, or a flapping job could empty a cluster. So every cordon passes
this breaker (after ``policy.decide``):

- at most ``max_cordons`` cordons within any ``window_s`` (default 2 per hour), counting cordons
  made, even if released since;
- never more nodes held (marked by collscope and not released) than ``max_fraction`` of the
  cluster's nodes (default 5 %), rounded down but at least ``min_cap_nodes`` (default 1, so a
  cluster of fewer than 20 nodes may still lose one node; 0 makes the fraction strict).

The held set is the nodes' own truth: the remediator rebuilds it from the nodes that carry
collscope's record (``remediation.is_held``) at start-up and before every cordon
(``sync_held``), so a node someone released by hand, with ``collscope uncordon`` or
``kubectl``, no longer counts, and a mark made before a restart still does.

A request beyond either cap *trips* the breaker: it opens, refuses every later cordon and stays
open until a human resets it (NVSentinel's breaker behaves the same way; its trip point is 50 %
of GPU nodes in 5 min). The cordon history is kept across a reset, so the caps still hold.

The state is plain data (``BreakerState.to_dict``/``from_dict``) so the operator can keep it in a
ConfigMap or Lease and a standby replica takes over with it. Time comes from an injected clock
(seconds, e.g. ``time.time``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from collscope.operator import errors
from collscope.operator.domain import ids

State = Literal["Closed", "Open"]


@dataclass(frozen=True)
class BreakerSettings:
    max_cordons: int = 2  # per window; issue 5's default
    window_s: float = 3600.0  # one hour
    max_fraction: float = 0.05  # of all nodes, held at once
    min_cap_nodes: int = 1  # the fraction cap never falls below this

    def __post_init__(self) -> None:
        if self.max_cordons < 0 or self.window_s <= 0 or self.min_cap_nodes < 0:
            raise errors.PolicyError(f"breaker settings out of range: {self}")
        if not 0.0 <= self.max_fraction <= 1.0:
            raise errors.PolicyError(f"breaker maxFraction must be in 0..1 ({self.max_fraction})")

    def node_cap(self, total_nodes: int) -> int:
        """Most nodes collscope may hold at once in a cluster of ``total_nodes``."""
        cap = max(self.min_cap_nodes, math.floor(self.max_fraction * total_nodes + 1e-9))
        return min(cap, total_nodes)


@dataclass
class BreakerState:
    """Everything the breaker remembers; serialisable."""

    cordons: list[tuple[ids.NodeName, float]] = field(default_factory=list)  # (node, at_s)
    held: set[ids.NodeName] = field(default_factory=set)
    tripped_at_s: float | None = None
    reason: str = ""
    reset_by: str = ""
    reset_at_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "cordons": [{"node": n, "atS": t} for n, t in self.cordons],
            "held": sorted(self.held),
            "trippedAtS": self.tripped_at_s,
            "reason": self.reason,
            "resetBy": self.reset_by,
            "resetAtS": self.reset_at_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BreakerState:
        try:
            return cls(
                cordons=[(ids.NodeName(str(c["node"])), float(c["atS"])) for c in data["cordons"]],
                held={ids.NodeName(str(n)) for n in data["held"]},
                tripped_at_s=_opt_float(data.get("trippedAtS")),
                reason=str(data.get("reason", "")),
                reset_by=str(data.get("resetBy", "")),
                reset_at_s=_opt_float(data.get("resetAtS")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise errors.PolicyError(f"unreadable breaker state: {e!r}") from e


def _opt_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str


class Breaker:
    """Decides and records cordons; see the module docstring for the rules."""

    def __init__(
        self,
        settings: BreakerSettings,
        clock: Callable[[], float],
        state: BreakerState | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.state = state if state is not None else BreakerState()

    @property
    def status(self) -> State:
        return "Open" if self.state.tripped_at_s is not None else "Closed"

    def summary(self, total_nodes: int) -> dict[str, Any]:
        """The visible state (for a ConfigMap, metrics and ``collscope`` CLI output)."""
        return {
            "state": self.status,
            "reason": self.state.reason,
            "trippedAtS": self.state.tripped_at_s,
            "recentCordons": len(self.recent()),
            "maxCordons": self.settings.max_cordons,
            "windowS": self.settings.window_s,
            "held": sorted(self.state.held),
            "nodeCap": self.settings.node_cap(total_nodes),
        }

    def recent(self) -> list[tuple[ids.NodeName, float]]:
        """Cordons made within the window ending now."""
        since = self.clock() - self.settings.window_s
        return [(n, t) for n, t in self.state.cordons if t > since]

    def check(self, node: ids.NodeName, total_nodes: int) -> Verdict:
        """Would a cordon of ``node`` pass now? Changes nothing (use for dry runs)."""
        s = self.state
        if s.tripped_at_s is not None:
            return Verdict(False, f"circuit breaker open: {s.reason}; a human must reset it")
        if node in s.held:
            return Verdict(True, f"{node} is already held by collscope")
        recent = len(self.recent())
        if recent >= self.settings.max_cordons:
            return Verdict(
                False,
                f"{recent} cordons within {self.settings.window_s:g} s "
                f"(cap {self.settings.max_cordons})",
            )
        cap = self.settings.node_cap(total_nodes)
        if len(s.held) + 1 > cap:
            return Verdict(False, f"{len(s.held)} of {total_nodes} nodes already held (cap {cap})")
        return Verdict(True, "within limits")

    def acquire(self, node: ids.NodeName, total_nodes: int) -> Verdict:
        """Ask to cordon ``node``: record it when allowed, trip the breaker when not."""
        verdict = self.check(node, total_nodes)
        now = self.clock()
        if verdict.allowed:
            if node not in self.state.held:
                self.state.cordons = [*self.recent(), (node, now)]
                self.state.held.add(node)
        elif self.state.tripped_at_s is None:
            self.state.tripped_at_s = now
            self.state.reason = f"refused a cordon of {node}: {verdict.reason}"
        return verdict

    def release(self, node: ids.NodeName) -> None:
        """``node``'s marks were removed (``collscope uncordon``, or a failed cordon)."""
        self.state.held.discard(node)

    def sync_held(self, held: set[ids.NodeName]) -> None:
        """The nodes that carry collscope's marks now (read from the nodes): the held count
        follows them, whatever was recorded before. The cordon history is left alone."""
        self.state.held = set(held)

    def reset(self, by: str) -> None:
        """A human closes the breaker; the cordon history stays, so the caps still apply."""
        self.state.tripped_at_s = None
        self.state.reason = ""
        self.state.reset_by = by
        self.state.reset_at_s = self.clock()
