"""Which Diagnoses of a TrainingJob go, so they do not pile up forever.

The rule (enforced by the trigger loop each time it creates a Diagnosis, ``trigger_loop``):
a TrainingJob keeps its newest ``keep`` Diagnoses (``operator.diagnosisRetention`` in the chart,
20 by default), by creation time. An older one is deleted when it is finished (phase
``Failed`` or ``Remediated``, or ``Diagnosed`` with a remediation outcome other than
``pending``: never one whose analysis or re-check is still running), unless a node still
marked by collscope names it (annotation ``collscope.dev/diagnosis``, ``remediation.record_of``):
a faulty node stays marked after the job, and that Diagnosis is the record of why. At most one
Diagnosis per marked node is kept that way, so a job keeps at most ``keep`` plus the nodes it
got marked.

Pure: ``beyond`` chooses among listed objects (``resources.Diagnosis``, parsed by the caller);
``named_by_marks`` reads Nodes the caller got.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from collscope.operator.domain import remediation, resources

DEFAULT_KEEP = 20


def job_of(obj: resources.Diagnosis) -> str:
    """The TrainingJob a Diagnosis is about (``spec.trainingJob.name``)."""
    return obj.spec.training_job.name


def finished(obj: resources.Diagnosis) -> bool:
    """Nothing runs on it any more: analysis and remediation are done."""
    st = obj.status
    if st.phase in ("Failed", "Remediated"):
        return True
    return st.phase == "Diagnosed" and st.action not in (None, "pending")


def beyond(
    objs: Iterable[resources.Diagnosis], *, job: str, keep: int
) -> list[resources.Diagnosis]:
    """The finished Diagnoses of ``job`` older than its newest ``keep``, oldest first."""
    mine = [o for o in objs if job_of(o) == job]
    mine.sort(key=_created)
    old = mine[: max(len(mine) - keep, 0)]
    return [o for o in old if finished(o)]


def _created(obj: resources.Diagnosis) -> tuple[str, str]:
    meta = obj.metadata
    return str(meta.get("creationTimestamp", "")), str(meta["name"])  # RFC 3339 sorts as text


def named_by_marks(nodes: Sequence[Mapping[str, Any] | None]) -> set[str]:
    """``namespace/name`` of each Diagnosis a node still marked by collscope names."""
    out = set()
    for node in nodes:
        try:
            record = None if node is None else remediation.record_of(node)
        except (ValueError, KeyError, TypeError):  # an edited record: the node is not ours
            record = None
        if record is not None:
            out.add(record.diagnosis)
    return out


def culprit_node(obj: resources.Diagnosis) -> str | None:
    return obj.status.culprit_node or None
