"""The demo's HTML report as a browser lays it out: headless Chromium renders the page in a
1280x800 window and the culprit and the key evidence sentence must be on that first screen,
wrapped, not clipped.

A probe script is added to a copy of the page (the report itself has no script): after layout it
writes the geometry of the elements as JSON into the DOM, which ``--dump-dom`` prints.
"""

from __future__ import annotations

import functools
import html
import json
import pathlib
import re
import shutil
import subprocess
from typing import Any

import pytest

from collscope.operator.analysis import diagnosis
from collscope.operator.analysis import engine as analysis
from collscope.operator.domain import report
from collscope.operator.onebox import htmlreport
from collscope.operator.simulator import config, engine, truth

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)",
)
# A laptop's browser window: its first screen is what an SRE sees before scrolling.
WINDOW = (1280, 800)
PROBE = """<script>
(() => {
  const box = (e) => {
    const r = e.getBoundingClientRect();
    return {top: r.top, left: r.left, bottom: r.bottom, right: r.right,
            scrollWidth: e.scrollWidth, clientWidth: e.clientWidth, text: e.innerText};
  };
  const byId = (id) => { const e = document.getElementById(id); return e ? box(e) : null; };
  const out = {
    vw: window.innerWidth, vh: window.innerHeight,
    culprit: byId('culprit'), key: byId('key-evidence'), evidence: byId('evidence'),
    items: Array.from(document.querySelectorAll('#evidence li')).map(box),
  };
  const pre = document.createElement('pre');
  pre.id = 'geometry';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


@functools.cache
def _sim(fault: str) -> engine.SimResult:
    cfg = config.SimConfig(
        ranks=16, tp=4, pp=2, dp=2, duration_s=8.0, onset_s=4.0,
        fault=truth.Fault.from_name(fault), seed=5,
    )  # fmt: skip
    return engine.simulate(cfg)


def _layout(page: str, tmp_path: pathlib.Path) -> dict[str, Any]:
    assert CHROMIUM is not None
    path = tmp_path / "report.html"
    path.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    w, h = WINDOW
    done = subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--window-size={w},{h}", f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom", path.as_uri(),
        ],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    found = re.search(r"<pre id=\"geometry\">(.*?)</pre>", done.stdout, re.S)
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    geometry: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return geometry


def _page(result: diagnosis.Diagnosis, sim: engine.SimResult) -> str:
    return htmlreport.render(
        result,
        sim.bundle,
        title="collscope diagnosis demo-hang-7",
        wide=report.diagnoses_wide(result, name="demo-hang-7", job="demo", age_s=13),
        summary=report.summary(result, source="diagnosis"),
        injected="a fault on a rank, expected a category",
    )


def _assert_first_screen(geometry: dict[str, Any], result: diagnosis.Diagnosis) -> None:
    # the viewport the browser reports: the window less its own bars (657 px high in headless
    # Chromium 150's 1280x800 window, about what a desktop browser leaves), never more
    vw, vh = geometry["vw"], geometry["vh"]
    assert vw == WINDOW[0] and 600 <= vh <= WINDOW[1], (vw, vh)
    top = result.culprits[0]
    key = result.evidence[htmlreport.key_evidence(result) or 0]
    culprit, sentence = geometry["culprit"], geometry["key"]
    assert culprit and sentence, geometry
    assert report.culprit_label(top) in culprit["text"]
    assert " ".join(sentence["text"].split()) == key
    for name, box in (("culprit", culprit), ("key evidence", sentence)):
        assert box["top"] >= 0 and box["bottom"] <= vh, f"{name} is below the first screen: {box}"
        assert box["left"] >= 0 and box["right"] <= vw, f"{name} runs off the screen: {box}"
    # the evidence wraps: no item (nor the box) is wider than what it shows
    for box in [geometry["evidence"], *geometry["items"]]:
        assert box["scrollWidth"] <= box["clientWidth"], f"clipped: {box['text'][:80]}"
        assert box["right"] <= vw


def test_hang_culprit_and_key_evidence_on_the_first_screen(tmp_path: pathlib.Path) -> None:
    sim = _sim("nic-down")
    result = analysis.diagnose(sim.bundle)
    assert result.anomaly and result.culprits and result.culprits[0].rank is not None
    # the key sentence is the long one about the culprit, the one the old page cut at 1,100 px
    assert result.evidence[htmlreport.key_evidence(result) or 0].startswith(
        f"rank {result.culprits[0].rank} ("
    )
    _assert_first_screen(_layout(_page(result, sim), tmp_path), result)


def test_unbroken_evidence_wraps_too(tmp_path: pathlib.Path) -> None:
    sim = _sim("gpu-power-limit")
    result = analysis.diagnose(sim.bundle)
    assert result.anomaly and result.culprits
    # an evidence item with no space to break at (a list of communicator ids, say)
    long = ",".join(f"0x{i:016x}" for i in range(12))
    result = result.model_copy(update={"evidence": [*result.evidence, long]})
    geometry = _layout(_page(result, sim), tmp_path)
    _assert_first_screen(geometry, result)
    assert any(long in " ".join(b["text"].split()).replace(" ", "") for b in geometry["items"])
