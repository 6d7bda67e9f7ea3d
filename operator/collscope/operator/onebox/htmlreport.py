"""A self-contained HTML page of one Diagnosis: verdict, rank grid, culprit timeline, flows.

No external assets (inline CSS and SVG, no script), so the file can be mailed or attached to a
ticket. The page is read top down, and the first screen (1280x800) answers "who and why":

- Verdict: category and meaning, the top culprit with its sequence numbers, the evidence as a
  wrapped list with its key sentence (the one about the culprit) marked, the action.
- Rank grid: one cell per rank, coloured by its state at the end of the window the Diagnosis
  was made from: the culprits (red), ranks with no completed operation for longer than
  ``STALL_S`` (orange), ranks that completed an operation recently (green), ranks with no
  records (grey).
- Timeline of the top culprit and its ring neighbours, in seconds before the last sample
  (``htmltimeline``).
- The culprit's flows in its operation in flight, else the last one sampled: where each flow's
  chunks stopped, then over time or as a table (``htmlflows``).

Every sequence number on the page is read by one definition on one communicator
(``htmlprogress``), so the parts cannot disagree.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Final

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import diagnosis
from collscope.operator.domain import report
from collscope.operator.onebox import htmlflows, htmlprogress, htmltimeline

NS: Final = 1_000_000_000
STALL_S: Final = 1.0  # no operation completed for this long reads as stalled in the grid
COLOURS: Final = {
    "culprit": "#d9363e",
    "stalled": "#f0a030",
    "running": "#3aa55d",
    "no data": "#9aa0a6",
}
CSS: Final = """
body{font-family:system-ui,sans-serif;margin:1.2em 2em;color:#202124;max-width:1100px}
h1{font-size:1.4em;margin:.2em 0 .5em} h2{font-size:1.1em;margin-top:1.6em}
h3{font-size:.95em;margin:1em 0 .4em}
pre{background:#f4f5f7;padding:.8em;overflow-x:auto;font-size:.85em}
pre.text{white-space:pre-wrap;overflow-wrap:anywhere}
.verdict{border-left:4px solid #d9363e;padding:.3em 1em;background:#fbf3f3}
.verdict p{margin:.35em 0} .verdict ul{margin:.3em 0;padding-left:1.3em}
.evidence li{overflow-wrap:anywhere} .evidence li.key{font-weight:600}
.grid{display:flex;flex-wrap:wrap;gap:6px}
.cell{width:136px;padding:6px;border-radius:6px;color:#fff;font-size:.8em}
.cell b{font-size:1.15em} .legend span{display:inline-block;padding:2px 8px;margin-right:6px;
border-radius:4px;color:#fff;font-size:.8em} .node{margin:.4em 0 .2em;font-weight:600}
.legend{font-size:.85em;margin:.3em 0} .swatch{display:inline-block;width:22px;height:12px;
margin:0 4px 0 12px;vertical-align:middle;border:1px solid #888}
li{margin:.2em 0}
table.counters{border-collapse:collapse;font-size:.85em}
.counters td,.counters th{border:1px solid #dadce0;padding:3px 10px;text-align:right}
"""


def _category_info(name: str | None) -> diagnosis.CategoryInfo | None:
    try:
        return diagnosis.Category.from_name(name).value if name else None
    except ValueError:  # an extension category (flow or profiling analysis) has no table row
        return None


def key_evidence(result: diagnosis.Diagnosis) -> int | None:
    """Index of the evidence sentence about the top culprit itself ("rank 5 (node-1, ...): ..."),
    else the first one naming it, else the first that is not the trigger's."""
    ev = result.evidence
    if not ev:
        return None
    rank = result.culprits[0].rank if result.culprits else None
    if rank is not None:
        for pattern in (rf"^rank {rank} \(", rf"\brank {rank}\b"):
            for i, e in enumerate(ev):
                if not e.startswith("trigger") and re.search(pattern, e):
                    return i
    return next((i for i, e in enumerate(ev) if not e.startswith("trigger")), 0)


def render(
    result: diagnosis.Diagnosis,
    bundle: tables.Bundle | None,
    *,
    title: str,
    wide: str,
    summary: str,
    injected: str = "",
) -> str:
    """The page; ``wide`` and ``summary`` are ``report.diagnoses_wide`` / ``report.summary``."""
    has_ranks = bundle is not None and len(bundle.ranks) > 0
    comm = htmlprogress.focus_comm(result, bundle) if bundle is not None and has_ranks else None
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        _verdict(result, bundle if has_ranks else None, comm, injected),
        f"<pre>{html.escape(wide)}</pre>",
    ]
    if bundle is not None and has_ranks:
        parts += ["<h2>Ranks</h2>", _grid(result, bundle, comm)]
        top = result.culprits[0].rank if result.culprits else None
        if top is not None:
            prog = htmlprogress.progress(bundle, top, comm)
            timeline = htmltimeline.render(bundle, top)
            parts += [f"<h2>Timeline of rank {top} and its neighbours</h2>", timeline]
            parts += [f"<h2>Flows of rank {top}</h2>", htmlflows.render(bundle, top, prog)]
    parts += ["<h2>Diagnosis as text</h2>", f"<pre class='text'>{html.escape(summary)}</pre>"]
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _verdict(
    result: diagnosis.Diagnosis, bundle: tables.Bundle | None, comm: int | None, injected: str
) -> str:
    """The first screen: category, culprit, evidence (wrapped, key sentence marked), action."""
    info = _category_info(result.category)
    head = (
        f"<b>{html.escape(result.category or result.trigger or 'anomaly')}</b>, "
        f"confidence {result.confidence:.2f}" + (f": {html.escape(info.meaning)}" if info else "")
        if result.anomaly
        else "<b>no anomaly found</b>"
    )
    out = ["<section class='verdict' id='verdict'>", f"<p>{head}</p>"]
    if result.culprits:
        c = result.culprits[0]
        seqs = ""
        if bundle is not None and c.rank is not None:
            p = htmlprogress.progress(bundle, c.rank, comm)
            if p.comm is not None:
                where = html.escape(bundle.comm_id(p.comm))
                seqs = f"; on comm {where}: {htmlprogress.seq_text(p)}"
        out.append(
            f"<p id='culprit'><b>Culprit:</b> {html.escape(report.culprit_label(c))}, "
            f"component {html.escape(c.component)}, score {c.score:.2f}{seqs}</p>"
        )
    if injected:
        out.append(f"<p><b>Injected:</b> {html.escape(injected)}</p>")
    if result.evidence:
        key = key_evidence(result)
        items = "".join(
            f"<li class='key' id='key-evidence'>{html.escape(e)}</li>"
            if i == key
            else f"<li>{html.escape(e)}</li>"
            for i, e in enumerate(result.evidence)
        )
        out.append(f"<ul class='evidence' id='evidence'>{items}</ul>")
    if info is not None and result.anomaly:
        out.append(f"<p><b>Action:</b> {html.escape(info.action)}</p>")
    out.append("</section>")
    return "\n".join(out)


def rank_states(result: diagnosis.Diagnosis, bundle: tables.Bundle) -> dict[int, str]:
    """rank -> one of ``COLOURS`` at the end of the window."""
    span = bundle.time_span()
    end = span[1] if span else 0
    culprits = {c.rank for c in result.culprits if c.rank is not None and c.score >= 0.99}
    world = bundle.job.world_size
    out: dict[int, str] = {}
    for r in range(world):
        ops = bundle.ops[bundle.ops["rank"] == r]
        st = bundle.states[bundle.states["rank"] == r]
        last_done = int(ops["end"].max()) if len(ops) else None
        if r in culprits:
            out[r] = "culprit"
        elif last_done is None and len(st) == 0:
            out[r] = "no data"
        elif last_done is None or end - last_done > STALL_S * NS:
            out[r] = "stalled"
        else:
            out[r] = "running"
    return out


def _grid(result: diagnosis.Diagnosis, bundle: tables.Bundle, comm: int | None) -> str:
    states = rank_states(result, bundle)
    nodes: dict[str, list[int]] = {}
    node_of = {i.rank: i.node for i in bundle.job.ranks}
    for r in sorted(states):
        nodes.setdefault(node_of.get(r) or "?", []).append(r)
    legend = "".join(
        f"<span style='background:{c}'>{html.escape(k)}</span>" for k, c in COLOURS.items()
    )
    where = (
        f"on comm {html.escape(bundle.comm_id(comm))} (the culprit's), else on the rank's "
        "latest communicator (marked *)"
        if comm is not None
        else "on each rank's latest communicator"
    )
    rows = [
        f"<div class='legend'>{legend}</div>",
        f"<p class='legend'>Sequence numbers count per communicator: {where}.</p>",
    ]
    for node, ranks in sorted(nodes.items()):
        rows.append(f"<div class='node'>{html.escape(node)}</div><div class='grid'>")
        for r in ranks:
            p = htmlprogress.progress(bundle, r, comm)
            other = " *" if comm is not None and p.comm is not None and p.comm != comm else ""
            done = "-" if p.last_done is None else p.last_done
            flight = "" if p.in_flight is None else f"<br>in flight: seq {p.in_flight}"
            s = states[r]
            rows.append(
                f"<div class='cell' style='background:{COLOURS[s]}'><b>rank {r}</b><br>"
                f"{html.escape(s)}<br>last done: seq {done}{other}{flight}</div>"
            )
        rows.append("</div>")
    return "\n".join(rows)


def ranks_list(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))
