"""Shared, cached simulations: each distinct config is simulated once per test session."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

from collscope.operator.simulator import config, engine

# Short runs keep the suite fast: 6 s holds ~18 iterations of the default job, enough for a
# baseline before onset (3 s) and a clear picture after it.
SHORT: dict[str, Any] = {"duration_s": 6.0, "onset_s": 3.0}


@functools.lru_cache(maxsize=64)
def _simulate(cfg: config.SimConfig) -> engine.SimResult:
    return engine.simulate(cfg)


@pytest.fixture
def sim() -> Callable[..., engine.SimResult]:
    """``sim(**fields)``: simulate ``SimConfig(**SHORT | fields)`` (cached)."""

    def run(**fields: Any) -> engine.SimResult:
        return _simulate(config.SimConfig(**(SHORT | fields)))

    return run
