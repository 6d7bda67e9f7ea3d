"""The HTML report's timeline (``htmlreport``): the top culprit and its ring neighbours.

Each completed collective is a bar from start to end, the operation in flight at the end is
drawn to the last sample (hatched), in seconds before the last record. ``axis`` draws the
seconds axis that the flows' plot (``htmlflows``) shares.
"""

from __future__ import annotations

from typing import Final

from collscope.nodeagent.bundle import tables
from collscope.operator.onebox import htmlprogress

NS: Final = 1_000_000_000
TIMELINE_S: Final = 4.0  # the timeline's window: onset, stall and trigger fit in it
HATCH: Final = (
    "repeating-linear-gradient(45deg,#d9363e 0 3px,#fff 3px 6px)"  # the SVG pattern, in CSS
)


def _neighbours(bundle: tables.Bundle, rank: int) -> list[int]:
    world = max(bundle.job.world_size, 1)
    return sorted({(rank - 1) % world, rank, (rank + 1) % world})


def _ticks_s(window_s: float) -> list[float]:
    """Tick positions in seconds before the end, 0 included: 4 to 8 of them at a round step."""
    step = next((s for s in (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0) if window_s / s <= 8), 30.0)
    return [k * step for k in range(int(window_s / step + 1e-9) + 1)]


def axis(left: float, plot_w: float, y: float, window_s: float, *, before: bool) -> list[str]:
    """An x axis of ``window_s`` seconds: ``before`` labels "-3 s".."0 s" ending at the right."""
    out = [f"<line x1='{left}' y1='{y}' x2='{left + plot_w}' y2='{y}' stroke='#888'/>"]
    for t in _ticks_s(window_s):
        x = left + plot_w * ((window_s - t) if before else t) / max(window_s, 1e-9)
        label = f"{-t:g} s" if before and t > 0 else f"{t:g} s"
        out.append(f"<line x1='{x:.1f}' y1='{y}' x2='{x:.1f}' y2='{y + 4}' stroke='#888'/>")
        out.append(f"<text x='{x:.1f}' y='{y + 16}' text-anchor='middle'>{label}</text>")
    return out


def render(bundle: tables.Bundle, culprit: int) -> str:
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
        p = htmlprogress.progress(bundle, r, None)
        if p.state_row is not None:
            last = bundle.states[p.state_row]
            x0 = left + (max(int(last["start"]), start) - start) * scale
            x1 = left + (int(last["ts"]) - start) * scale
            svg.append(
                f"<rect x='{x0:.1f}' y='{y}' width='{max(x1 - x0, 1):.1f}' height='18' "
                f"fill='url(#h)' stroke='#d9363e'><title>seq {p.in_flight} in flight"
                f"</title></rect>"
            )
    svg += axis(left, plot_w, 10 + len(ranks) * row_h, window_s, before=True)
    svg.append("</svg>")
    legend = (
        "<div class='legend'><span class='swatch' style='background:#3aa55d'></span>"
        "operation completed (start to end; hover for its seq)"
        f"<span class='swatch' style='background:{HATCH}'></span>"
        "operation in flight at the rank's last sample, drawn to that sample"
        "&nbsp;&nbsp; * the culprit &nbsp;&nbsp; axis: seconds before the last record</div>"
    )
    return "".join(svg) + legend
