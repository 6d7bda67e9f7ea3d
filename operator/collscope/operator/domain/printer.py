"""What ``kubectl get <custom resource> [-o wide]`` prints, computed from the CRD itself.

The API server turns each object into table cells with the CRD's ``additionalPrinterColumns``
(apiextensions ``tableconvertor``): a ``NAME`` column first, then each column's ``jsonPath``
evaluated on the object, a missing value an empty cell, ``date`` as an age. kubectl prints the
columns of priority 0, and with ``-o wide`` every column in CRD order, headers upper-cased,
through a ``tabwriter`` (minimum width 6, padding 3, the last column not padded); a string cell
ends at its first newline with ``...``; numbers print as Go's ``fmt.Sprint`` does (``0.93``,
``1``, ``1e-05``). A sample, for a Diagnosis::

    NAME          JOB    TRIGGER   CATEGORY   CULPRIT NODE   RANK   CONFIDENCE   ...
    demo-hang-7   demo   hang      hang.gpu   node-1         5      0.93         ...

``collscope demo`` prints its Diagnosis with this, the columns read from the Diagnosis CRD
shipped in the package (``crds/``, copied from the repository's by ``charts/sync_crds.py``), so
its table and kubectl's cannot diverge.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import importlib.resources
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

DIAGNOSES_CRD = "collscope.dev_diagnoses.yaml"
MIN_WIDTH = 6  # kubectl's tabwriter: minwidth 6, padding 3 (cli-runtime GetNewTabWriter)
PADDING = 3


@dataclass(frozen=True)
class Column:
    """One ``additionalPrinterColumns`` entry."""

    name: str
    type: str  # string, integer, number, boolean, date
    json_path: str  # a simple path, e.g. ``.status.culpritNode``
    priority: int = 0


def columns_of(crd: Mapping[str, Any]) -> tuple[Column, ...]:
    """The printer columns of the CRD's storage version, ``NAME`` first as the server adds it."""
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    extra = version.get("additionalPrinterColumns") or ()
    return (
        Column("Name", "string", ".metadata.name"),
        *(Column(c["name"], c["type"], c["jsonPath"], int(c.get("priority", 0))) for c in extra),
    )


@functools.cache
def diagnosis_columns() -> tuple[Column, ...]:
    """The Diagnosis CRD's printer columns, from the copy in this package."""
    text = importlib.resources.files("collscope.operator").joinpath("crds", DIAGNOSES_CRD)
    return columns_of(yaml.safe_load(text.read_text(encoding="utf-8")))


def lookup(obj: Mapping[str, Any], json_path: str) -> Any:
    """A simple JSONPath (``.a.b``) on a plain object; None where a key is missing."""
    value: Any = obj
    for key in json_path.lstrip(".").split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def go_float(x: float) -> str:
    """A float64 as Go's ``fmt.Sprint`` writes it: shortest digits, ``%e`` form when the
    exponent is < -4 or >= 6 (strconv's ``eprec = 6`` for the shortest ``%g``): ``0.93``,
    ``1``, ``1e-05``, ``1.234567e+06``."""
    if x == 0:
        return "0"
    sign, digits, exp = decimal.Decimal(repr(float(x))).normalize().as_tuple()
    assert isinstance(exp, int)
    text = "".join(map(str, digits))
    point = len(text) + exp  # digits before the decimal point
    e10 = point - 1
    head = "-" if sign else ""
    if e10 < -4 or e10 >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{head}{mantissa}e{'-' if e10 < 0 else '+'}{abs(e10):02d}"
    if point <= 0:
        return f"{head}0.{'0' * -point}{text}"
    if point >= len(text):
        return head + text + "0" * (point - len(text))
    return f"{head}{text[:point]}.{text[point:]}"


def human_duration(seconds: float) -> str:
    """An age as kubectl writes it (apimachinery ``duration.HumanDuration``)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, (hours // 24) % 365
        return f"{years}y" if days == 0 else f"{years}y{days}d"
    return f"{hours // 24 // 365}y"


def cell(column: Column, value: Any, now: datetime.datetime) -> str:
    """What kubectl shows for ``value`` in ``column`` (empty when the server's cell is null)."""
    if value is None:
        return ""
    if column.type == "string":
        text = value if isinstance(value, str) else str(value)
        for i, ch in enumerate(text):
            if ch in "\f\n\r":
                return text[:i] + "..."
        return text
    if column.type == "integer" and isinstance(value, int | float) and not isinstance(value, bool):
        return str(int(value))
    if column.type == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return go_float(float(value))
    if column.type == "boolean" and isinstance(value, bool):
        return "true" if value else "false"
    if column.type == "date" and isinstance(value, str):
        try:
            then = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return "<invalid>"
        return human_duration((now - then).total_seconds())
    return ""


def table(
    objects: Sequence[Mapping[str, Any]],
    columns: Sequence[Column],
    *,
    wide: bool,
    now: datetime.datetime,
    namespace: str = "default",
) -> str:
    """``kubectl get`` of ``objects`` (``-o wide`` when ``wide``), without the final newline."""
    if not objects:
        return f"No resources found in {namespace} namespace."
    shown = [c for c in columns if wide or c.priority == 0]
    rows = [[c.name.upper() for c in shown]]
    rows += [[cell(c, lookup(o, c.json_path), now) for c in shown] for o in objects]
    widths = [max(MIN_WIDTH, max(len(r[i]) for r in rows) + PADDING) for i in range(len(shown))]
    return "\n".join(
        "".join(v.ljust(w) for v, w in zip(r[:-1], widths, strict=False)) + r[-1] for r in rows
    )
