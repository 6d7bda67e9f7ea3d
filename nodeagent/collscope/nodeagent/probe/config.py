"""The probe's settings, read once from the environment of the training process.

Variables (defaults in the field comments); a malformed value switches the probe off rather
than raising (the probe must never break the training)::

    COLLSCOPE_PROBE                 "1" turns the probe on; anything else (or unset) leaves it off.
                                    The webhook sets it, and sets "0" for pods annotated
                                    collscope.dev/probe: "off" (opt-out)
    COLLSCOPE_TRACE_DIR             shared directory with the node agent (the trace emptyDir)
    RANK                            global rank (torchrun sets it); 0 when unset
    COLLSCOPE_PROBE_WINDOW_S        20    profile at most this long (EROICA §4.1: 20 s)
    COLLSCOPE_PROBE_ITERATIONS      20    ... and at most this many iterations
    COLLSCOPE_PROBE_LEAD            10    iterations between a request and its start
    COLLSCOPE_PROBE_POLL_S          1.0   how often a rank looks for a request file
    COLLSCOPE_PROBE_SAMPLE_HZ       1000  CPU utilisation samples per second while profiling
    COLLSCOPE_PROBE_COOLDOWN_S      300   no new request within this long of the last one
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeSettings:
    enabled: bool = False
    trace_dir: str = ""  # empty: nowhere to write, so the probe stays off
    rank: int = 0
    window_s: float = 20.0
    iterations: int = 20
    lead: int = 10  # EROICA §4.1: "the start set a few steps ahead"
    poll_s: float = 1.0
    sample_hz: float = 1000.0
    cooldown_s: float = 300.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ProbeSettings:
        """Settings from ``env``; off (``enabled=False``) when anything is malformed."""
        try:
            s = cls(
                enabled=env.get("COLLSCOPE_PROBE", "") == "1",
                trace_dir=env.get("COLLSCOPE_TRACE_DIR", ""),
                rank=int(env.get("RANK", "0")),
                window_s=float(env.get("COLLSCOPE_PROBE_WINDOW_S", cls.window_s)),
                iterations=int(env.get("COLLSCOPE_PROBE_ITERATIONS", cls.iterations)),
                lead=int(env.get("COLLSCOPE_PROBE_LEAD", cls.lead)),
                poll_s=float(env.get("COLLSCOPE_PROBE_POLL_S", cls.poll_s)),
                sample_hz=float(env.get("COLLSCOPE_PROBE_SAMPLE_HZ", cls.sample_hz)),
                cooldown_s=float(env.get("COLLSCOPE_PROBE_COOLDOWN_S", cls.cooldown_s)),
            )
        except ValueError:
            return cls()
        if not s.trace_dir or s.iterations < 1 or s.sample_hz <= 0 or s.rank < 0:
            return dataclasses.replace(s, enabled=False)
        return s
