"""Which ranks get py-spy'd on a Diagnosis, and which thread of each answer is kept."""

from __future__ import annotations

from collscope.operator.domain import stackgrid


def test_choose_puts_culprits_and_sampled_first_and_caps() -> None:
    assert stackgrid.choose([7], [0, 7, 3], range(10), max_ranks=4) == [7, 0, 3, 1]
    assert stackgrid.choose([99], [], [0, 1]) == [0, 1]  # unknown ranks are skipped
    assert len(stackgrid.choose([], [], range(100))) == stackgrid.MAX_RANKS


def test_rank_frames_prefers_the_main_thread() -> None:
    report = {
        "groups": [
            {"frames": ["poll (t.py:1)"], "pids": [5], "thread_names": ["pin_memory"]},
            {"frames": ["wait (nccl.py:3)", "main (train.py:9)"], "pids": [5],
             "thread_names": ["MainThread"]},
        ],
        "errors": [],
    }  # fmt: skip
    assert stackgrid.rank_frames(report) == ["wait (nccl.py:3)", "main (train.py:9)"]
    first = {"groups": [{"frames": ["a (x.py:1)"], "pids": [5]}]}
    assert stackgrid.rank_frames(first) == ["a (x.py:1)"]
    assert stackgrid.rank_frames({"groups": [], "errors": [{"pid": 5, "reason": "ptrace"}]}) is None
