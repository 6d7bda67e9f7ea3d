"""Ring pacing: what a slow NIC does to the flow records of its DP ring's links."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from collscope.operator.simulator.flows import config, engine, pipeline

S = 1_000_000_000
# one DP ring of 4 servers (pp 1), each under its own leaf so every link crosses a spine
JOB = config.JobSpec(name="ring", servers=(0, 4, 8, 12), pp=1, dp=4)
ONSET_S = 10.0


@functools.lru_cache(maxsize=2)
def _sim(pacing: config.RingPacing) -> engine.FlowSimResult:
    fault = config.FlowFault("slow-group", "ring/pp0/tp0", ONSET_S)
    cfg = config.FlowSimConfig(
        fabric=config.Fabric(servers=16, servers_per_leaf=4, spines=4, ring_pacing=pacing),
        jobs=(JOB,),
        duration_s=30.0,
        faults=(fault,),
        seed=2,
    )
    return engine.simulate(cfg)


def _per_link(res: engine.FlowSimResult) -> dict[tuple[str, str], float]:
    """Median time per byte (ns/B) of each link of the slow ring, after onset."""
    f = res.truth.faults[0]
    ring = set(f.members)
    after = (res.kind == pipeline.DP) & (res.ts >= f.onset + 2 * S)
    out: dict[tuple[str, str], list[float]] = {}
    for i in np.flatnonzero(after).tolist():
        a, b = res.endpoints[res.src[i]], res.endpoints[res.dst[i]]
        if a in ring and b in ring:
            out.setdefault((a, b), []).append(res.duration[i] / res.nbytes[i])
    return {k: float(np.median(v)) for k, v in out.items()}


def test_ring_pacing_makes_every_link_as_slow_as_the_slowest() -> None:
    links = _per_link(_sim("ring"))
    assert len(links) == 4
    values = np.array(list(links.values()))
    assert values.max() / values.min() < 1.05


def test_link_pacing_slows_only_the_two_hops_of_the_slow_nic() -> None:
    res = _sim("link")
    nic = res.truth.faults[0].nic
    severity = res.truth.faults[0].severity
    links = _per_link(res)
    fast = min(links.values())
    for (a, b), v in links.items():
        if nic in (a, b):  # its incoming and its outgoing hop
            assert v / fast == pytest.approx(severity, rel=0.1)
        else:
            assert v / fast < 1.1
