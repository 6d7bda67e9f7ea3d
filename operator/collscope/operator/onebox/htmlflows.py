"""The HTML report's flows (``htmlreport``): where each flow of the culprit's operation stopped.

The culprit's flows in its operation in flight (else the last one sampled): per (channel,
direction, peer) where the chunks stopped in the data path (CCL-D §5's send ready/sent/done and
recv posted/arrived/consumed), then chunks done over time from the agents' 10 Hz state samples
(Mycroft §4.2's real-time state log) when there are enough samples to draw a line, else the
samples as a table, then every counter of the last sample.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import tables
from collscope.operator.onebox import htmlprogress, htmltimeline

NS: Final = 1_000_000_000
# Fewer samples of one operation than this draw no line (one point per flow is not a line);
# the samples are shown as a table instead. Three make the shape of a stall or a slow ramp.
MIN_PLOT_SAMPLES: Final = 3
# The three stages of a chunk, light to dark: produced/posted, on the wire/arrived, delivered/
# consumed. A flow's bar is filled to each stage's count, so the step shows where it stopped.
STAGES: Final = (
    ("ready / posted", "#c6dafc"),
    ("sent / arrived", "#7baaf7"),
    ("done / consumed", "#1a5fb4"),
)
PALETTE: Final = ("#1a73e8", "#d9363e", "#f0a030", "#3aa55d", "#9334e6", "#00897b")
Rows = npt.NDArray[np.intp]  # row indices into bundle.states


def render(bundle: tables.Bundle, rank: int, prog: htmlprogress.Progress) -> str:
    """Where each flow of the culprit's operation stopped, then its samples over time."""
    rows = np.flatnonzero(bundle.states["rank"] == rank)
    if prog.comm is not None:
        rows = rows[bundle.states["comm"][rows] == prog.comm]
    if len(rows) == 0:  # none on the page's communicator: the rank's latest sample elsewhere
        rows = np.flatnonzero(bundle.states["rank"] == rank)
        if len(rows) == 0:
            return "<p>no state samples of this rank in the window (no operation in flight)</p>"
        prog = htmlprogress.progress(bundle, rank, int(bundle.states["comm"][rows[-1]]))
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
    svg += htmltimeline.axis(left, plot_w, height, t_end_s, before=False)
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
