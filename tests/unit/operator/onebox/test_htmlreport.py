"""The demo's HTML report: self-contained, well-formed, coloured by what the window shows."""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ET

from collscope.operator.analysis import diagnosis
from collscope.operator.analysis import engine as analysis
from collscope.operator.onebox import htmlreport
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
    assert len(svgs) == 2  # the culprit's timeline and its flows
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
    assert "Ranks" not in page and "<pre>s</pre>" in page
