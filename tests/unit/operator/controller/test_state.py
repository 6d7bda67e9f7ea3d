"""controller/state.py: one shared state for every object, and what a deleted Diagnosis leaves."""

from __future__ import annotations

import copy
from typing import cast

from collscope.operator.clients import kube
from collscope.operator.controller.state import OperatorState, diagnosis_key
from collscope.operator.domain import resources, settings

PENDING = {
    "state": "Pending",
    "node": "n1",
    "reason": "Corroborated",
    "checkedAt": "2026-11-28T10:00:00Z",
}


def _state() -> OperatorState:
    return OperatorState.create(cast(kube.Cluster, None), settings.Settings(), lambda n, ip: None)


def test_kopf_s_per_object_copy_is_the_state_itself() -> None:
    state = _state()
    assert copy.copy(state) is state


def test_a_deleted_diagnosis_leaves_nothing_behind() -> None:
    state = _state()
    gone, kept = diagnosis_key("ml", "d1", "u1"), diagnosis_key("ml", "d2", "u2")
    for key in (gone, kept):
        state.diagnoses_seen.add(key)
        state.confirmations[key] = resources.Confirmation.model_validate(PENDING)
    state.forget_diagnosis(gone)
    assert (state.diagnoses_seen, set(state.confirmations)) == ({kept}, {kept})
    state.forget_diagnosis(gone)  # twice: nothing to drop, no error
    assert diagnosis_key("ml", "d1", "u3") != gone  # made again: another uid, another key
