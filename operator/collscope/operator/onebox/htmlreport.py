"""A self-contained HTML page of one Diagnosis: rank grid, culprit timeline, evidence.

No external assets (inline CSS and SVG), so the file can be mailed or attached to a ticket.

- Rank grid: one cell per rank, coloured by its state at the end of the window the Diagnosis
  was made from: the culprits (red), ranks with an operation in flight and no progress for
  longer than ``STALL_S`` (orange), ranks that completed an operation recently (green), ranks
  with no records (grey).
- Timeline of the top culprit and its ring neighbours: each completed collective a bar from
  start to end, the operation in flight at the end drawn to the last sample (hatched).
- The culprit's flows: per (channel, direction) of its last in-flight operation, chunks done
  (send) or consumed (recv) over time, from the agents' 10 Hz state samples (Mycroft §4.2's
  real-time state log), and a table of every counter at the last sample (CCL-D §5's
  send ready/sent/done and recv posted/arrived/consumed): where in the data path it stopped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Final

import numpy as np

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import diagnosis

NS: Final = 1_000_000_000
STALL_S: Final = 1.0  # an in-flight op idle this long reads as stalled in the grid
COLOURS: Final = {
    "culprit": "#d9363e",
    "stalled": "#f0a030",
    "running": "#3aa55d",
    "no data": "#9aa0a6",
}
CSS: Final = """
body{font-family:system-ui,sans-serif;margin:2em;color:#202124;max-width:1100px}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:1.6em}
pre{background:#f4f5f7;padding:.8em;overflow-x:auto;font-size:.85em}
.grid{display:flex;flex-wrap:wrap;gap:6px}
.cell{width:118px;padding:6px;border-radius:6px;color:#fff;font-size:.8em}
.cell b{font-size:1.15em} .legend span{display:inline-block;padding:2px 8px;margin-right:6px;
border-radius:4px;color:#fff;font-size:.8em} .node{margin:.4em 0 .2em;font-weight:600}
li{margin:.2em 0}
table.counters{border-collapse:collapse;font-size:.85em}
.counters td,.counters th{border:1px solid #dadce0;padding:3px 10px;text-align:right}
"""


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
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<pre>{html.escape(wide)}</pre>",
    ]
    if injected:
        parts.append(f"<p><b>Injected:</b> {html.escape(injected)}</p>")
    if bundle is not None and len(bundle.ranks) > 0:
        parts += ["<h2>Ranks</h2>", _grid(result, bundle)]
        top = result.culprits[0].rank if result.culprits else None
        if top is not None:
            parts += [f"<h2>Timeline of rank {top} and its neighbours</h2>", _timeline(bundle, top)]
            parts += [f"<h2>Flows of rank {top}'s last operation</h2>", _flows(bundle, top)]
            parts.append(_last_counters(bundle, top))
    parts += ["<h2>Diagnosis and evidence</h2>", f"<pre>{html.escape(summary)}</pre>"]
    parts.append("</body></html>\n")
    return "\n".join(parts)


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


def _grid(result: diagnosis.Diagnosis, bundle: tables.Bundle) -> str:
    states = rank_states(result, bundle)
    nodes: dict[str, list[int]] = {}
    node_of = {i.rank: i.node for i in bundle.job.ranks}
    for r in sorted(states):
        nodes.setdefault(node_of.get(r) or "?", []).append(r)
    legend = "".join(
        f"<span style='background:{c}'>{html.escape(k)}</span>" for k, c in COLOURS.items()
    )
    rows = [f"<div class='legend'>{legend}</div>"]
    for node, ranks in sorted(nodes.items()):
        rows.append(f"<div class='node'>{html.escape(node)}</div><div class='grid'>")
        for r in ranks:
            ops = bundle.ops[bundle.ops["rank"] == r]
            seq = int(ops["seq"].max()) if len(ops) else "-"
            s = states[r]
            rows.append(
                f"<div class='cell' style='background:{COLOURS[s]}'><b>rank {r}</b><br>"
                f"{html.escape(s)}<br>last done: seq {seq}</div>"
            )
        rows.append("</div>")
    return "\n".join(rows)


def _neighbours(bundle: tables.Bundle, rank: int) -> list[int]:
    world = max(bundle.job.world_size, 1)
    return sorted({(rank - 1) % world, rank, (rank + 1) % world})


def _timeline(bundle: tables.Bundle, culprit: int) -> str:
    span = bundle.time_span()
    if span is None:
        return "<p>no records</p>"
    end = span[1]
    start = max(span[0], end - 4 * NS)  # the last 4 s: onset, stall and trigger fit in it
    ranks = _neighbours(bundle, culprit)
    width, row_h, left = 900, 26, 80
    scale = (width - left - 10) / max(end - start, 1)
    svg = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' "
        f"height='{row_h * len(ranks) + 30}' font-size='11'>",
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
        st = bundle.states[bundle.states["rank"] == r]
        if len(st):
            last = st[np.argmax(st["ts"])]
            same_comm = ops[ops["comm"] == last["comm"]]
            if len(same_comm) == 0 or int(last["seq"]) > int(same_comm["seq"].max()):
                x0 = left + (max(int(last["start"]), start) - start) * scale
                x1 = left + (int(last["ts"]) - start) * scale
                svg.append(
                    f"<rect x='{x0:.1f}' y='{y}' width='{max(x1 - x0, 1):.1f}' height='18' "
                    f"fill='url(#h)' stroke='#d9363e'><title>seq {int(last['seq'])} in flight"
                    f"</title></rect>"
                )
    axis_y = 10 + len(ranks) * row_h + 12
    for k in range(5):
        x = left + k * (width - left - 10) / 4
        t = (start - end) / NS * (1 - k / 4)
        svg.append(f"<text x='{x:.0f}' y='{axis_y}'>{t:+.1f}s</text>")
    svg.append("</svg>")
    return "".join(svg)


def _flows(bundle: tables.Bundle, culprit: int) -> str:
    st = bundle.states[bundle.states["rank"] == culprit]
    if len(st) == 0:
        return "<p>no state samples of this rank in the window (no operation in flight)</p>"
    seq = int(st["seq"].max())
    st = st[st["seq"] == seq]
    t0, t1 = int(st["ts"].min()), int(st["ts"].max())
    series: dict[tuple[int, int, int], list[tuple[int, float]]] = {}
    for row_index in np.flatnonzero(bundle.states["rank"] == culprit):
        row = bundle.states[row_index]
        if int(row["seq"]) != seq:
            continue
        for f in bundle.state_flows(int(row_index)):
            total = max(int(f["total"]), 1)
            value = int(f["done"]) if int(f["dir"]) == tables.SEND else int(f["consumed"])
            key = (int(f["channel"]), int(f["dir"]), int(f["peer"]))
            series.setdefault(key, []).append((int(row["ts"]), value / total))
    width, height, left = 900, 180, 40
    scale = (width - left - 180) / max(t1 - t0, 1)
    palette = ("#1a73e8", "#d9363e", "#f0a030", "#3aa55d", "#9334e6", "#00897b")
    svg = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height + 30}' "
           f"font-size='11'>"]  # fmt: skip
    svg.append(f"<line x1='{left}' y1='{height}' x2='{width - 180}' y2='{height}' stroke='#888'/>")
    for i, (key, pts) in enumerate(sorted(series.items())):
        colour = palette[i % len(palette)]
        coords = " ".join(
            f"{left + (t - t0) * scale:.1f},{height - v * (height - 10):.1f}" for t, v in pts
        )
        svg.append(f"<polyline fill='none' stroke='{colour}' stroke-width='2' points='{coords}'/>")
        ch, d, peer = key
        label = f"ch {ch} {tables.DIRS[d]} {'to' if d == tables.SEND else 'from'} rank {peer}"
        svg.append(f"<text x='{width - 170}' y='{14 + 14 * i}' fill='{colour}'>{label}</text>")
    svg.append(f"<text x='0' y='14'>100%</text><text x='0' y='{height}'>0</text>")
    svg.append(
        f"<text x='{left}' y='{height + 20}'>seq {seq}: chunks done (send) / consumed (recv), "
        f"{(t1 - t0) / NS:.1f} s of samples</text></svg>"
    )
    return "".join(svg)


def _last_counters(bundle: tables.Bundle, culprit: int) -> str:
    """Every counter of the culprit's flows at its latest state sample, as a table."""
    rows = np.flatnonzero(bundle.states["rank"] == culprit)
    if len(rows) == 0:
        return ""
    last = int(rows[np.argmax(bundle.states["ts"][rows])])
    state = bundle.states[last]
    head = (
        "<table class='counters'><tr><th>channel</th><th>direction</th><th>peer</th>"
        "<th>total</th><th>ready / posted</th><th>sent / arrived</th><th>done / consumed</th>"
        "<th>idle</th></tr>"
    )
    body = []
    for f in bundle.state_flows(last):
        send = int(f["dir"]) == tables.SEND
        cells = (
            (int(f["ready"]), int(f["sent"]), int(f["done"]))
            if send
            else (int(f["posted"]), int(f["done"]), int(f["consumed"]))
        )
        idle = int(f["idle_ns"]) / NS if int(f["idle_ns"]) >= 0 else None
        body.append(
            f"<tr><td>{int(f['channel'])}</td><td>{tables.DIRS[int(f['dir'])]}</td>"
            f"<td>{'to' if send else 'from'} rank {int(f['peer'])}</td><td>{int(f['total'])}</td>"
            + "".join(f"<td>{v}</td>" for v in cells)
            + f"<td>{'-' if idle is None else f'{idle:.1f} s'}</td></tr>"
        )
    caption = (
        f"<p>At the last sample (seq {int(state['seq'])}, "
        f"{(int(state['ts']) - int(state['start'])) / NS:.1f} s after the operation started): "
        "a send chunk is ready when the GPU produced it, sent when it went on the network, done "
        "when the network delivered it; a receive is posted, arrived, then consumed by the GPU."
        "</p>"
    )
    return caption + head + "".join(body) + "</table>"


def ranks_list(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))
