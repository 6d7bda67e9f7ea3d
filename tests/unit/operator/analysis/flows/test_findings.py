"""Switch-level bins scale with the measured step (``findings.switch_bin_ns``)."""

from __future__ import annotations

import numpy as np

from collscope.operator.analysis.flows import findings, timeline

S = 1_000_000_000


def _timelines(*steps_s: list[float]) -> timeline.Timelines:
    empty = np.zeros(0, dtype=np.int64)
    jobs = tuple(
        timeline.JobSteps(
            ends=np.zeros(len(d), dtype=np.int64),
            durations=np.array(d, dtype=np.float64) * S,
            gpus=np.zeros(len(d), dtype=np.int64),
        )
        for d in steps_s
    )
    return timeline.Timelines(
        empty, empty, empty, np.zeros(0, dtype=bool), empty, empty, empty, jobs
    )


def test_the_switch_bin_holds_the_longest_step_and_at_least_10_s() -> None:
    s = findings.FindingSettings()
    # no timelines, no measured step, or steps up to 10 s: the 10 s floor (as before)
    assert findings.switch_bin_ns(None, s) == 10 * S
    assert findings.switch_bin_ns(_timelines([], [float("nan")]), s) == 10 * S
    assert findings.switch_bin_ns(_timelines([3.0, 3.2, 2.9], [9.0, 9.5, 9.0]), s) == 10 * S
    # a job of 30 s steps beside one of 3 s: one of its steps, so every bin holds its DP phase
    assert findings.switch_bin_ns(_timelines([3.0] * 4, [30.0, float("nan"), 30.0]), s) == 30 * S
