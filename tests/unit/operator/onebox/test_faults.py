"""Fault choice of the one-box job: deterministic, on the simulator's targets and categories."""

from __future__ import annotations

import pytest

from collscope.operator.onebox import faults
from collscope.operator.simulator import truth

RANKS_BY_NODE = {"node-0": [0, 1, 2, 3], "node-1": [4, 5, 6, 7]}


@pytest.mark.parametrize("kind", faults.NAMES)
def test_choice_follows_the_simulators_target(kind: str) -> None:
    inj = faults.choose(kind, seed=11, ranks_by_node=RANKS_BY_NODE, onset_s=2.5)
    assert inj.kind == kind and inj.onset_s == 2.5
    assert set(inj.ranks) <= set(RANKS_BY_NODE[inj.node])
    if faults.info_of(kind).target == "node":
        assert list(inj.ranks) == RANKS_BY_NODE[inj.node]
    else:
        assert len(inj.ranks) == 1


def test_choice_is_repeatable_and_depends_on_the_seed() -> None:
    pick = [
        faults.choose("nic-down", seed=s, ranks_by_node=RANKS_BY_NODE, onset_s=0).ranks
        for s in range(20)
    ]
    again = [
        faults.choose("nic-down", seed=s, ranks_by_node=RANKS_BY_NODE, onset_s=0).ranks
        for s in range(20)
    ]
    assert pick == again
    assert len(set(pick)) > 1
    # tests/e2e relies on this: seed 7 puts single-rank faults on rank 5 of node-1
    seven = faults.choose("gpu-hang", seed=7, ranks_by_node=RANKS_BY_NODE, onset_s=0)
    assert seven.ranks == (5,) and seven.node == "node-1"


def test_families_and_categories_agree_with_the_simulator() -> None:
    assert set(faults.NAMES) == set(truth.FAULT_NAMES) - {"none"} | set(faults.PROCESS)
    assert set(faults.RELIABLE) <= set(faults.NAMES)
    for kind in faults.NAMES:
        assert faults.info_of(kind).hang == (kind in faults.HANGS)
        category = faults.expected_category(kind)
        assert category is not None
        assert category.startswith("hang." if kind in faults.HANGS else "slow.")


def test_unknown_fault_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown fault 'nic-melted'.*, process-frozen$"):
        faults.choose("nic-melted", seed=0, ranks_by_node=RANKS_BY_NODE, onset_s=0)


@pytest.mark.parametrize("kind", ["process-killed", "process-frozen"])
def test_process_faults_are_one_box_hangs_of_their_own_category(kind: str) -> None:
    """Not in the simulator's catalogue (no processes there), a hang of one rank, expected
    ``hang.process``: the category that is never a network fault nor a cordon."""
    assert kind not in truth.FAULT_NAMES and kind in faults.RELIABLE
    assert kind in faults.HANGS and faults.expected_category(kind) == "hang.process"
    inj = faults.choose(kind, seed=7, ranks_by_node=RANKS_BY_NODE, onset_s=0)
    assert inj.ranks == (5,) and inj.node == "node-1"
