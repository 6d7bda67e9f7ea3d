"""Human renderings of a Diagnosis: the summary `collscope analyze` prints and the table
`collscope demo` prints, which is what `kubectl get diagnoses -o wide` shows for the Diagnosis
the operator would write (``printer``: the CRD's printer columns evaluated on the object).

Pure string building; the CLI decides where it goes.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from collscope.operator.analysis import diagnosis
from collscope.operator.domain import printer, status

_NS_PER_S = 1_000_000_000


def summary(d: diagnosis.Diagnosis, *, source: str, start_ns: int | None = None) -> str:
    """A few lines an SRE reads first: verdict, culprit, cause, then the evidence."""
    if not d.anomaly:
        lines = [f"{source}: no anomaly found"]
        lines += [f"  {e}" for e in d.evidence]
        return "\n".join(lines)
    when = _when(d.detected_at, start_ns)
    head = f"{source}: {d.trigger or 'anomaly'} detected{when}: {d.category}"
    lines = [
        head,
        f"  confidence {d.confidence:.2f}"
        + (", node-precise only" if d.precision == "node" else ""),
    ]
    info = _category_info(d.category)
    if info is not None:
        lines.append(f"  meaning: {info.meaning}")
        lines.append(f"  action:  {info.action}")
    if d.culprits:
        lines.append("  culprits (most likely first):")
        for c in d.culprits[:8]:
            lines.append(f"    {culprit_label(c)}  component={c.component}  score={c.score:.2f}")
        if len(d.culprits) > 8:
            lines.append(f"    ... and {len(d.culprits) - 8} more")
    if d.evidence:
        lines.append("  evidence:")
        lines += [f"    - {e}" for e in d.evidence]
    return "\n".join(lines)


def culprit_label(c: diagnosis.Culprit) -> str:
    """'rank 12 (gpu-node-01, GPU 4, mlx5_4)' with whatever placement is known; flow analysis
    culprits read 'switch spine-03', 'job job-2', or 'rank 12 (...) in DP group job-2/dp-5'."""
    if c.switch is not None:
        return f"switch {c.switch}"
    if c.rank is None and c.endpoint is None and c.job is not None:
        return f"job {c.job}"
    where = [p for p in (c.node, None if c.gpu is None else f"GPU {c.gpu}", c.nic) if p]
    head = f"rank {c.rank}" if c.rank is not None else f"endpoint {c.endpoint or '?'}"
    label = head + (f" ({', '.join(where)})" if where else "")
    return label + (f" in DP group {c.group}" if c.group is not None else "")


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """Left-aligned columns separated by three spaces, as kubectl prints them."""
    cells = [list(header), *[list(r) for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join(
        "   ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def diagnosis_object(
    d: diagnosis.Diagnosis,
    *,
    name: str,
    job: str,
    created: datetime.datetime,
    namespace: str = "default",
) -> dict[str, Any]:
    """The Diagnosis the operator writes for ``d`` once analysed (phase ``Diagnosed``, no
    remediation step yet: no ``action``), as the API server stores it."""
    return {
        "apiVersion": "collscope.dev/v1alpha1",
        "kind": "Diagnosis",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": status.timestamp(created),
        },
        "spec": {"trainingJob": {"name": job}, "trigger": d.trigger or "manual"},
        "status": status.diagnosis_status(
            d, phase="Diagnosed", generation=1, conditions=None, now=created
        ),
    }


def diagnoses_wide(
    d: diagnosis.Diagnosis | None,
    *,
    name: str,
    job: str,
    age_s: float,
    now: datetime.datetime | None = None,
) -> str:
    """What `kubectl get diagnoses -o wide` prints for the one Diagnosis ``d`` (created
    ``age_s`` ago), or kubectl's answer when there is none (no trigger: no Diagnosis)."""
    now = now or datetime.datetime.now(datetime.UTC)
    objects = []
    if d is not None:
        created = now - datetime.timedelta(seconds=age_s)
        objects.append(diagnosis_object(d, name=name, job=job, created=created))
    return printer.table(objects, printer.diagnosis_columns(), wide=True, now=now)


def _when(detected_at: int | None, start_ns: int | None) -> str:
    if detected_at is None:
        return ""
    if start_ns is None:
        return f" at {detected_at} ns"
    return f" at t={(detected_at - start_ns) / _NS_PER_S:.2f}s"


def _category_info(name: str | None) -> diagnosis.CategoryInfo | None:
    if name is None:
        return None
    try:
        return diagnosis.Category.from_name(name).value
    except ValueError:
        return None
