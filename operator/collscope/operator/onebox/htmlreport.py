"""A self-contained HTML page of one Diagnosis: verdict, rank grid, culprit timeline, flows.

No external assets (inline CSS and SVG, no script), so the file can be mailed or attached to a
ticket. The page is read top down, and the first screen (1280x800) answers "who and why":

- Verdict: category and meaning, the top culprit with its sequence numbers, the evidence as a
  wrapped list with its key sentence (the one about the culprit) marked, the action.
- Rank grid: one cell per rank, coloured by its state at the end of the window the Diagnosis
  was made from: the culprits (red), ranks with no completed operation for longer than
  ``STALL_S`` (orange), ranks that completed an operation recently (green), ranks with no
  records (grey).
- Timeline of the top culprit and its ring neighbours, in seconds before the last sample: each
  completed collective a bar from start to end, the operation in flight at the end drawn to the
  last sample (hatched).
- The culprit's flows in its operation in flight (else the last one sampled): per (channel,
  direction, peer) where the chunks stopped in the data path (CCL-D §5's send ready/sent/done
  and recv posted/arrived/consumed), then chunks done over time from the agents' 10 Hz state
  samples (Mycroft §4.2's real-time state log) when there are enough samples to draw a line,
  else the samples as a table.

Sequence numbers count per communicator, so every seq on the page is read by one definition
(``progress``) on one communicator (``focus_comm``): the top culprit's, else the one it last
worked on. The module runs to about 600 lines (past STYLE's 400) because every part of the
page reads those two definitions; the flows' drawing (``_flows`` and below) is the part to move
out first if it grows.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import tables
from collscope.operator import report
from collscope.operator.analysis import diagnosis

NS: Final = 1_000_000_000
STALL_S: Final = 1.0  # no operation completed for this long reads as stalled in the grid
TIMELINE_S: Final = 4.0  # the timeline's window: onset, stall and trigger fit in it
# Fewer samples of one operation than this draw no line (one point per flow is not a line);
# the samples are shown as a table instead. Three make the shape of a stall or a slow ramp.
MIN_PLOT_SAMPLES: Final = 3
COLOURS: Final = {
    "culprit": "#d9363e",
    "stalled": "#f0a030",
    "running": "#3aa55d",
    "no data": "#9aa0a6",
}
# The three stages of a chunk, light to dark: produced/posted, on the wire/arrived, delivered/
# consumed. A flow's bar is filled to each stage's count, so the step shows where it stopped.
STAGES: Final = (
    ("ready / posted", "#c6dafc"),
    ("sent / arrived", "#7baaf7"),
    ("done / consumed", "#1a5fb4"),
)
PALETTE: Final = ("#1a73e8", "#d9363e", "#f0a030", "#3aa55d", "#9334e6", "#00897b")
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
Rows = npt.NDArray[np.intp]  # row indices into bundle.states
HATCH: Final = (
    "repeating-linear-gradient(45deg,#d9363e 0 3px,#fff 3px 6px)"  # the SVG pattern, in CSS
)


@dataclass(frozen=True)
class Progress:
    """Where a rank stands on one communicator at its last record.

    ``last_done``: the highest seq it completed there; ``in_flight``: the seq of its last state
    sample there when above ``last_done`` (an operation it started and had not finished), with
    that sample's row in ``bundle.states``. A sample below ``last_done`` is of an operation that
    completed since: short operations are caught by the 10 Hz samples only now and then.
    """

    comm: int | None
    last_done: int | None
    in_flight: int | None
    state_row: int | None


def focus_comm(result: diagnosis.Diagnosis, bundle: tables.Bundle) -> int | None:
    """The communicator the page counts sequence numbers on: the top culprit's."""
    top = result.culprits[0] if result.culprits else None
    if top is None or top.rank is None:
        return None
    if top.comm is not None:
        index = bundle.comm_index(top.comm)
        if index is not None:
            return index
    return _latest_comm(bundle, top.rank)


def progress(bundle: tables.Bundle, rank: int, comm: int | None) -> Progress:
    """``rank``'s progress on ``comm``, else (no records there) on its latest communicator."""
    ops = bundle.ops[bundle.ops["rank"] == rank]
    state_rows = np.flatnonzero(bundle.states["rank"] == rank)
    if comm is None or not (
        (ops["comm"] == comm).any() or (bundle.states["comm"][state_rows] == comm).any()
    ):
        comm = _latest_comm(bundle, rank)
    if comm is None:
        return Progress(None, None, None, None)
    done = ops["seq"][ops["comm"] == comm]
    last_done = int(done.max()) if len(done) else None
    rows = state_rows[bundle.states["comm"][state_rows] == comm]
    if len(rows):
        last = int(rows[np.argmax(bundle.states["ts"][rows])])
        seq = int(bundle.states["seq"][last])
        if last_done is None or seq > last_done:
            return Progress(comm, last_done, seq, last)
    return Progress(comm, last_done, None, None)


def _latest_comm(bundle: tables.Bundle, rank: int) -> int | None:
    best: tuple[int, int] | None = None
    for table, ts in ((bundle.ops, "end"), (bundle.states, "ts")):
        mine = table[table["rank"] == rank]
        if len(mine):
            row = mine[np.argmax(mine[ts])]
            if best is None or int(row[ts]) > best[0]:
                best = (int(row[ts]), int(row["comm"]))
    return None if best is None else best[1]


def _seq_text(p: Progress) -> str:
    done = "-" if p.last_done is None else f"seq {p.last_done}"
    return f"last done {done}" + ("" if p.in_flight is None else f", seq {p.in_flight} in flight")


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
    comm = focus_comm(result, bundle) if bundle is not None and has_ranks else None
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
            prog = progress(bundle, top, comm)
            parts += [f"<h2>Timeline of rank {top} and its neighbours</h2>", _timeline(bundle, top)]
            parts += [f"<h2>Flows of rank {top}</h2>", _flows(bundle, top, prog)]
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
            p = progress(bundle, c.rank, comm)
            if p.comm is not None:
                seqs = f"; on comm {html.escape(bundle.comm_id(p.comm))}: {_seq_text(p)}"
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
            p = progress(bundle, r, comm)
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


def _neighbours(bundle: tables.Bundle, rank: int) -> list[int]:
    world = max(bundle.job.world_size, 1)
    return sorted({(rank - 1) % world, rank, (rank + 1) % world})


def _ticks_s(window_s: float) -> list[float]:
    """Tick positions in seconds before the end, 0 included: 4 to 8 of them at a round step."""
    step = next((s for s in (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0) if window_s / s <= 8), 30.0)
    return [k * step for k in range(int(window_s / step + 1e-9) + 1)]


def _axis(left: float, plot_w: float, y: float, window_s: float, *, before: bool) -> list[str]:
    """An x axis of ``window_s`` seconds: ``before`` labels "-3 s".."0 s" ending at the right."""
    out = [f"<line x1='{left}' y1='{y}' x2='{left + plot_w}' y2='{y}' stroke='#888'/>"]
    for t in _ticks_s(window_s):
        x = left + plot_w * ((window_s - t) if before else t) / max(window_s, 1e-9)
        label = f"{-t:g} s" if before and t > 0 else f"{t:g} s"
        out.append(f"<line x1='{x:.1f}' y1='{y}' x2='{x:.1f}' y2='{y + 4}' stroke='#888'/>")
        out.append(f"<text x='{x:.1f}' y='{y + 16}' text-anchor='middle'>{label}</text>")
    return out


def _timeline(bundle: tables.Bundle, culprit: int) -> str:
    span = bundle.time_span()
    if span is None:
        return "<p>no records</p>"
    end = span[1]
    start = max(span[0], end - int(TIMELINE_S * NS))
    window_s = (end - start) / NS
    ranks = _neighbours(bundle, culprit)
    width, row_h, left = 900, 26, 80
    plot_w = width - left - 30
    scale = plot_w / max(end - start, 1)
    svg = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' "
        f"height='{row_h * len(ranks) + 34}' font-size='11'>",
        "<defs><pattern id='h' width='6' height='6' patternUnits='userSpaceOnUse' "
        "patternTransform='rotate(45)'><rect width='3' height='6' fill='#d9363e'/></pattern>"
        "</defs>",
    ]
    for i, r in enumerate(ranks):
        y = 10 + i * row_h
        svg.append(f"<text x='0' y='{y + 14}'>rank {r}{' *' if r == culprit else ''}</text>")
        ops = bundle.ops[(bundle.ops["rank"] == r) & (bundle.ops["end"] >= start)]
        for o in ops:
            x0 = left + (max(int(o["start"]), start) - start) * scale
            x1 = left + (int(o["end"]) - start) * scale
            svg.append(
                f"<rect x='{x0:.1f}' y='{y}' width='{max(x1 - x0, 1):.1f}' height='18' "
                f"fill='#3aa55d'><title>seq {int(o['seq'])}: "
                f"{(int(o['end']) - int(o['start'])) / 1e6:.1f} ms</title></rect>"
            )
        p = progress(bundle, r, None)
        if p.state_row is not None:
            last = bundle.states[p.state_row]
            x0 = left + (max(int(last["start"]), start) - start) * scale
            x1 = left + (int(last["ts"]) - start) * scale
            svg.append(
                f"<rect x='{x0:.1f}' y='{y}' width='{max(x1 - x0, 1):.1f}' height='18' "
                f"fill='url(#h)' stroke='#d9363e'><title>seq {p.in_flight} in flight"
                f"</title></rect>"
            )
    svg += _axis(left, plot_w, 10 + len(ranks) * row_h, window_s, before=True)
    svg.append("</svg>")
    legend = (
        "<div class='legend'><span class='swatch' style='background:#3aa55d'></span>"
        "operation completed (start to end; hover for its seq)"
        f"<span class='swatch' style='background:{HATCH}'></span>"
        "operation in flight at the rank's last sample, drawn to that sample"
        "&nbsp;&nbsp; * the culprit &nbsp;&nbsp; axis: seconds before the last record</div>"
    )
    return "".join(svg) + legend


def _flows(bundle: tables.Bundle, rank: int, prog: Progress) -> str:
    """Where each flow of the culprit's operation stopped, then its samples over time."""
    rows = np.flatnonzero(bundle.states["rank"] == rank)
    if prog.comm is not None:
        rows = rows[bundle.states["comm"][rows] == prog.comm]
    if len(rows) == 0:  # none on the page's communicator: the rank's latest sample elsewhere
        rows = np.flatnonzero(bundle.states["rank"] == rank)
        if len(rows) == 0:
            return "<p>no state samples of this rank in the window (no operation in flight)</p>"
        prog = progress(bundle, rank, int(bundle.states["comm"][rows[-1]]))
        rows = rows[bundle.states["comm"][rows] == prog.comm]
    last_row = prog.state_row
    if last_row is None:
        last_row = int(rows[np.argmax(bundle.states["ts"][rows])])
    state = bundle.states[last_row]
    seq = int(state["seq"])
    rows = rows[bundle.states["seq"][rows] == seq]
    rows = rows[np.argsort(bundle.states["ts"][rows], kind="stable")]
    op = bundle.string(int(state["op"]))
    age_s = (int(state["ts"]) - int(state["start"])) / NS
    comm = html.escape(bundle.comm_id(int(state["comm"])))
    if prog.in_flight is not None:
        caption = (
            f"{html.escape(op)} seq {seq} on comm {comm}, in flight {age_s:.1f} s at the "
            f"rank's last sample; {len(rows)} sample(s) of it."
        )
    else:
        caption = (
            f"No operation in flight at the rank's last sample. {html.escape(op)} seq {seq} on "
            f"comm {comm} is the last one sampled ({len(rows)} sample(s)); it completed, like "
            f"every operation up to seq {prog.last_done}: the agents sample at 10 Hz, so "
            "operations shorter than 0.1 s are caught only now and then."
        )
    flows = bundle.state_flows(last_row)
    keys = sorted(_key(f) for f in flows)
    parts = [f"<p>{caption}</p>", "<h3>Where each flow stopped (last sample)</h3>"]
    parts.append(_stops(flows))
    if len(rows) >= MIN_PLOT_SAMPLES and not _moved(bundle, rows, keys):
        first_s, last_s = (
            (int(bundle.states["ts"][r]) - int(state["start"])) / NS for r in (rows[0], rows[-1])
        )
        parts.append(
            f"<p>No flow moved in the {len(rows)} samples from {first_s:.2f} s to {last_s:.1f} s "
            "after the operation started: each had stopped where its bar above ends before the "
            "first sample (a line over time would be flat).</p>"
        )
    elif len(rows) >= MIN_PLOT_SAMPLES:
        parts += ["<h3>Chunks over time</h3>", _over_time(bundle, rows, keys, int(state["start"]))]
    else:
        parts += [
            f"<h3>The samples ({len(rows)}: too few to draw a line)</h3>",
            _samples_table(bundle, rows, keys, int(state["start"])),
        ]
    parts.append(_counters(flows, seq, age_s))
    return "\n".join(parts)


def _key(f: np.void) -> tuple[int, int, int]:
    return int(f["channel"]), int(f["dir"]), int(f["peer"])


def _label(key: tuple[int, int, int]) -> str:
    ch, d, peer = key
    return f"ch {ch} {tables.DIRS[d]} {'to' if d == tables.SEND else 'from'} rank {peer}"


def _stages(f: np.void) -> tuple[int, int, int]:
    """(ready, sent, done) of a send flow, (posted, arrived, consumed) of a receive."""
    if int(f["dir"]) == tables.SEND:
        return int(f["ready"]), int(f["sent"]), int(f["done"])
    return int(f["posted"]), int(f["done"]), int(f["consumed"])


def _stop_text(f: np.void) -> str:
    total = int(f["total"])
    a, b, c = _stages(f)
    send = int(f["dir"]) == tables.SEND
    names = ("ready", "sent", "done") if send else ("posted", "arrived", "consumed")
    if c >= total:
        text = f"all {total} {names[2]}"
    elif b > c:
        text = f"{c} of {total} {names[2]}; {b - c} {names[1]}, not {names[2]}"
    elif a > b:
        text = f"{b} of {total} {names[1]}; {a - b} {names[0]}, not {names[1]}"
    else:
        text = f"{c} of {total} {names[2]}; no further chunk {names[0]}"
    idle = int(f["idle_ns"])
    return text + (f"; idle {idle / NS:.1f} s" if idle >= 0 else "")


def _stops(flows: tables.Table) -> str:
    """One bar per flow, filled to each stage's count: the step where the fill ends is where
    the chunks stopped."""
    ordered = sorted(flows, key=_key)
    width, row_h, left, bar_w = 900, 24, 150, 300
    svg = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' "
        f"height='{row_h * len(ordered) + 8}' font-size='11'>"
    ]
    for i, f in enumerate(ordered):
        y = 4 + i * row_h
        total = max(int(f["total"]), 1)
        svg.append(f"<text x='0' y='{y + 13}'>{_label(_key(f))}</text>")
        svg.append(
            f"<rect x='{left}' y='{y}' width='{bar_w}' height='16' fill='#fff' stroke='#888'/>"
        )
        for (name, colour), count in zip(STAGES, _stages(f), strict=True):
            w = bar_w * min(max(count, 0), total) / total
            svg.append(
                f"<rect x='{left}' y='{y}' width='{w:.1f}' height='16' fill='{colour}'>"
                f"<title>{name}: {count} of {total}</title></rect>"
            )
        svg.append(f"<text x='{left + bar_w + 10}' y='{y + 13}'>{_stop_text(f)}</text>")
    svg.append("</svg>")
    legend = "".join(
        f"<span class='swatch' style='background:{c}'></span>{html.escape(n)}" for n, c in STAGES
    )
    return "".join(svg) + f"<div class='legend'>{legend} (chunks, of the flow's total)</div>"


def _moved(bundle: tables.Bundle, rows: Rows, keys: Sequence[tuple[int, int, int]]) -> bool:
    """Whether any flow's done/consumed count changed between the samples."""
    return any(len({v for _, v, _ in pts}) > 1 for pts in _fractions(bundle, rows, keys).values())


def _fractions(
    bundle: tables.Bundle, rows: Rows, keys: Sequence[tuple[int, int, int]]
) -> dict[tuple[int, int, int], list[tuple[int, int, int]]]:
    """flow -> [(ts, done or consumed, total)] over the sample rows."""
    out: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {k: [] for k in keys}
    for row in rows:
        ts = int(bundle.states["ts"][row])
        for f in bundle.state_flows(int(row)):
            k = _key(f)
            if k in out:
                out[k].append((ts, _stages(f)[2], max(int(f["total"]), 1)))
    return out


def _over_time(
    bundle: tables.Bundle, rows: Rows, keys: Sequence[tuple[int, int, int]], start: int
) -> str:
    """Chunks done (send) / consumed (recv) per flow against seconds since the operation
    started; a dot marks each flow's last change: where it stopped moving."""
    series = _fractions(bundle, rows, keys)
    t_end_s = max((int(bundle.states["ts"][rows[-1]]) - start) / NS, 1e-3)
    width, height, left, top = 900, 170, 50, 8
    plot_w = width - left - 30
    svg = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height + 30}' "
        "font-size='11'>"
    ]
    for frac in (0.0, 0.5, 1.0):
        y = height - frac * (height - top)
        svg.append(
            f"<line x1='{left}' y1='{y:.1f}' x2='{left + plot_w}' y2='{y:.1f}' stroke='#eee'/>"
            f"<text x='0' y='{y + 4:.1f}'>{frac:.0%}</text>"
        )
    legend = []
    for i, key in enumerate(keys):
        colour = PALETTE[i % len(PALETTE)]
        pts = [
            (left + plot_w * (ts - start) / NS / t_end_s, height - v / total * (height - top))
            for ts, v, total in series[key]
        ]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        svg.append(f"<polyline fill='none' stroke='{colour}' stroke-width='2' points='{coords}'/>")
        values = [v for _, v, _ in series[key]]
        moved = next((j for j in range(len(values) - 1, 0, -1) if values[j] != values[j - 1]), 0)
        x, y = pts[moved]
        svg.append(
            f"<circle cx='{x:.1f}' cy='{y:.1f}' r='4' fill='{colour}'><title>{_label(key)}: "
            f"last moved {(series[key][moved][0] - start) / NS:.2f} s after the start"
            "</title></circle>"
        )
        legend.append(
            f"<span class='swatch' style='background:{colour}'></span>{html.escape(_label(key))}"
        )
    svg += _axis(left, plot_w, height, t_end_s, before=False)
    svg.append("</svg>")
    return (
        "".join(svg)
        + f"<div class='legend'>{''.join(legend)}</div><div class='legend'>chunks done (send) "
        "or consumed (recv), % of the flow's total, against seconds since the operation "
        "started; the dot: the flow's last change</div>"
    )


def _samples_table(
    bundle: tables.Bundle, rows: Rows, keys: Sequence[tuple[int, int, int]], start: int
) -> str:
    series = _fractions(bundle, rows, keys)
    head = "".join(f"<th>{html.escape(_label(k))}</th>" for k in keys)
    body = []
    for j, row in enumerate(rows):
        t = (int(bundle.states["ts"][row]) - start) / NS
        cells = "".join(
            f"<td>{series[k][j][1]} / {series[k][j][2]}</td>"
            if j < len(series[k])
            else "<td>-</td>"
            for k in keys
        )
        body.append(f"<tr><td>{t:.3f} s</td>{cells}</tr>")
    return (
        f"<table class='counters'><tr><th>since start</th>{head}</tr>{''.join(body)}</table>"
        "<p class='legend'>chunks done (send) or consumed (recv) of the flow's total</p>"
    )


def _counters(flows: tables.Table, seq: int, age_s: float) -> str:
    """Every counter of the flows at that sample, as a table."""
    head = (
        "<table class='counters'><tr><th>channel</th><th>direction</th><th>peer</th>"
        "<th>total</th><th>ready / posted</th><th>sent / arrived</th><th>done / consumed</th>"
        "<th>idle</th></tr>"
    )
    body = []
    for f in sorted(flows, key=_key):
        send = int(f["dir"]) == tables.SEND
        idle = int(f["idle_ns"]) / NS if int(f["idle_ns"]) >= 0 else None
        body.append(
            f"<tr><td>{int(f['channel'])}</td><td>{tables.DIRS[int(f['dir'])]}</td>"
            f"<td>{'to' if send else 'from'} rank {int(f['peer'])}</td><td>{int(f['total'])}</td>"
            + "".join(f"<td>{v}</td>" for v in _stages(f))
            + f"<td>{'-' if idle is None else f'{idle:.1f} s'}</td></tr>"
        )
    caption = (
        f"<p>The counters at that sample (seq {seq}, {age_s:.1f} s after the operation started): "
        "a send chunk is ready when the GPU produced it, sent when it went on the network, done "
        "when the network delivered it; a receive is posted, arrived, then consumed by the GPU."
        "</p>"
    )
    return caption + head + "".join(body) + "</table>"


def ranks_list(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))
