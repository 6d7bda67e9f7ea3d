"""The demo's HTML report: self-contained, well-formed, coloured by what the window shows."""

from __future__ import annotations

import dataclasses
import functools
import re
import xml.etree.ElementTree as ET

import numpy as np

from collscope.operator.analysis import diagnosis
from collscope.operator.analysis import engine as analysis
from collscope.operator.onebox import htmlprogress, htmlreport
from collscope.operator.simulator import config, engine, truth


@functools.cache
def _nic_down() -> engine.SimResult:
    cfg = config.SimConfig(
        ranks=16, tp=4, pp=2, dp=2, duration_s=8.0, onset_s=4.0,
        fault=truth.Fault.from_name("nic-down"), seed=5,
    )  # fmt: skip
    return engine.simulate(cfg)


def _page(result: diagnosis.Diagnosis, sim: engine.SimResult, title: str = "t") -> str:
    return htmlreport.render(
        result, sim.bundle, title=title, wide="NAME  JOB", summary="diagnosis: ...", injected="x"
    )


def test_page_is_self_contained_and_its_svgs_are_well_formed() -> None:
    sim = _nic_down()
    result = analysis.diagnose(sim.bundle)
    assert result.anomaly and result.culprits
    page = _page(result, sim)
    assert page.startswith("<!doctype html>")
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "<script" not in page and "src=" not in page
    svgs = page.split("<svg")[1:]
    assert len(svgs) == 2  # the culprit's timeline and where its flows stopped
    for svg in svgs:
        ET.fromstring("<svg" + svg.split("</svg>")[0] + "</svg>")
    top = result.culprits[0].rank
    assert f"Timeline of rank {top} and its neighbours" in page
    # the hung operation is drawn in flight, and its counters show where the data path stopped
    assert "fill='url(#h)'" in page
    assert "<table class='counters'>" in page and "done / consumed" in page


def test_grid_colours_culprits_and_stalled_ranks() -> None:
    sim = _nic_down()
    result = analysis.diagnose(sim.bundle)
    states = htmlreport.rank_states(result, sim.bundle)
    assert set(states) == set(range(16))
    sure = {c.rank for c in result.culprits if c.rank is not None and c.score >= 0.99}
    assert sure and all(states[r] == "culprit" for r in sure)
    # a NIC down hangs the whole job: no rank still completes operations at the end
    assert "running" not in states.values()
    assert set(states.values()) <= set(htmlreport.COLOURS)


def test_healthy_window_is_all_running_and_text_is_escaped() -> None:
    sim = engine.simulate(
        config.SimConfig(ranks=16, tp=4, pp=2, dp=2, duration_s=4.0, onset_s=2.0, seed=1)
    )
    healthy = diagnosis.Diagnosis(anomaly=False, evidence=["checked"])
    assert set(htmlreport.rank_states(healthy, sim.bundle).values()) == {"running"}
    page = _page(healthy, sim, title="<job & co>")
    assert "<title>&lt;job &amp; co&gt;</title>" in page
    assert "Timeline" not in page  # no culprit, no timeline


def test_page_without_a_window() -> None:
    page = htmlreport.render(
        diagnosis.Diagnosis(anomaly=False), None, title="t", wide="w", summary="s"
    )
    assert "Ranks" not in page and "<pre class='text'>s</pre>" in page


def test_sequence_numbers_are_the_culprits_communicators_everywhere() -> None:
    """Seqs count per communicator: the grid, the culprit line and the flows read them on the
    culprit's (its P2P comm here), not as a maximum over every comm the rank is in."""
    sim = _nic_down()
    result = analysis.diagnose(sim.bundle)
    top = result.culprits[0]
    assert top.rank is not None and top.comm is not None
    comm = sim.bundle.comm_index(top.comm)
    ops = sim.bundle.ops[sim.bundle.ops["rank"] == top.rank]
    done = int(ops["seq"][ops["comm"] == comm].max())
    assert int(ops["seq"].max()) > done  # another comm of the rank counts higher: the trap
    p = htmlprogress.progress(sim.bundle, top.rank, comm)
    assert (p.comm, p.last_done, p.in_flight) == (comm, done, done + 1)
    page = _page(result, sim)
    culprit = re.search(r"<p id='culprit'>(.*?)</p>", page)
    assert culprit and f"last done seq {done}, seq {done + 1} in flight" in culprit.group(1)
    cell = re.search(rf"<b>rank {top.rank}</b><br>culprit<br>(.*?)</div>", page)
    assert cell and cell.group(1) == f"last done: seq {done}<br>in flight: seq {done + 1}"
    assert f"seq {done + 1} on comm {top.comm}, in flight" in page


def test_hung_flows_show_where_they_stopped_and_no_flat_line() -> None:
    sim = _nic_down()
    page = _page(analysis.diagnose(sim.bundle), sim)
    assert "Where each flow stopped" in page
    assert re.search(r"\d+ of \d+ done; \d+ sent, not done; idle \d", page)
    assert "No flow moved in the" in page and "<polyline" not in page


def test_timeline_has_a_legend_and_an_axis_in_seconds() -> None:
    sim = _nic_down()
    page = _page(analysis.diagnose(sim.bundle), sim)
    labels = re.findall(r"text-anchor='middle'>([^<]*)</text>", page)
    # the last 4 s in half seconds, from the last record ("0 s") back
    assert labels[:9] == ["0 s"] + [f"-{k / 2:g} s" for k in range(1, 9)]
    assert "-0" not in labels
    assert "operation in flight at the rank's last sample" in page


def test_too_few_samples_make_a_table_not_a_plot() -> None:
    """A power-capped GPU's operations are shorter than the 0.1 s between samples: one sample
    of the last one sampled, which a plot would draw as nothing."""
    cfg = config.SimConfig(
        ranks=16, tp=4, pp=2, dp=2, duration_s=8.0, onset_s=4.0,
        fault=truth.Fault.from_name("gpu-power-limit"), seed=5,
    )  # fmt: skip
    sim = engine.simulate(cfg)
    result = analysis.diagnose(sim.bundle)
    assert result.category == "slow.compute"
    page = _page(result, sim)
    assert "too few to draw a line" in page and "<polyline" not in page
    assert "No operation in flight at the rank's last sample" in page


def test_moving_flows_are_plotted_against_seconds_since_the_start() -> None:
    """The hung operation's samples rewritten so the flows move over the first samples: a line
    per flow, a dot where it stopped, an axis in seconds from the operation's start."""
    sim = _nic_down()
    result = analysis.diagnose(sim.bundle)
    b = sim.bundle
    top = result.culprits[0].rank
    assert top is not None
    p = htmlprogress.progress(b, top, b.comm_index(result.culprits[0].comm or ""))
    assert p.state_row is not None
    rows = np.flatnonzero(
        (b.states["rank"] == top) & (b.states["seq"] == p.in_flight) & (b.states["comm"] == p.comm)
    )
    flows = b.flows.copy()
    for k, row in enumerate(rows):
        lo, hi = int(b.states["flow_lo"][row]), int(b.states["flow_hi"][row])
        for column in ("done", "consumed"):
            flows[column][lo:hi] = np.minimum(k, flows["total"][lo:hi] // 2)
    page = _page(result, dataclasses.replace(sim, bundle=dataclasses.replace(b, flows=flows)))
    assert "Chunks over time" in page
    assert page.count("<polyline") == len(b.state_flows(p.state_row)) == page.count("<circle")
    assert "0 s</text>" in page and "No flow moved" not in page
