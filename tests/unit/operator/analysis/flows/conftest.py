"""Cached flow simulations for the flow-analysis tests.

A 256-GPU fabric (32 servers under 4 leaves, 8 spines, ~11 jobs of 2-6 servers) for 100 s with
any fault at 50 s: about 60,000 flows, simulated in under a second and analysed in about a
third of one; ~15 steps before onset give the cross-step baseline. The seeds are fixed so
that each fault's target (picked by the seed) is the same run to run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from collscope.operator.analysis.flows import engine, table
from collscope.operator.simulator.flows import config
from collscope.operator.simulator.flows import engine as simulator

GPUS = 256
DURATION_S = 100.0
ONSET_S = 50.0

Sim = tuple[simulator.FlowSimResult, table.FlowTable]


def as_table(res: simulator.FlowSimResult) -> table.FlowTable:
    return table.FlowTable.from_columns(
        endpoints=res.endpoints,
        switches=res.switches,
        src=res.src,
        dst=res.dst,
        ts=res.ts,
        nbytes=res.nbytes,
        duration=res.duration,
        sw_ptr=res.sw_ptr,
        sw_idx=res.sw_idx,
    )


@functools.lru_cache(maxsize=16)
def _simulate(kind: config.FaultKind | None, target: str | None, seed: int) -> Sim:
    faults = () if kind is None else (config.FlowFault(kind, target, ONSET_S),)
    res = simulator.simulate(config.preset(GPUS, seed=seed, duration_s=DURATION_S, faults=faults))
    return res, as_table(res)


@functools.lru_cache(maxsize=16)
def _analyze(kind: config.FaultKind | None, target: str | None, seed: int) -> engine.FlowReport:
    res, ft = _simulate(kind, target, seed)
    return engine.analyze(ft, job=res.job)


@pytest.fixture
def flow_sim() -> Callable[..., Sim]:
    """``flow_sim(kind=None, target=None, seed=1)``: a cached simulation and its flows."""

    def run(kind: config.FaultKind | None = None, target: str | None = None, seed: int = 1) -> Sim:
        return _simulate(kind, target, seed)

    return run


@pytest.fixture
def flow_report() -> Callable[..., tuple[simulator.FlowSimResult, engine.FlowReport]]:
    """``flow_report(kind=None, target=None, seed=1)``: the simulation and its analysis."""

    def run(
        kind: config.FaultKind | None = None, target: str | None = None, seed: int = 1
    ) -> tuple[simulator.FlowSimResult, engine.FlowReport]:
        return _simulate(kind, target, seed)[0], _analyze(kind, target, seed)

    return run
