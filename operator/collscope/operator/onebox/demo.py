"""``collscope demo``: the whole data path on this machine, a fault, its Diagnosis.

1. ``box.OneBox``: 8 rank processes (2 simulated nodes x 4) drive the real plugin through its
   NCCL profiler API, each writing its real ring into its pod's volume in a kubelet-like tree;
   one real node agent per node samples them and serves ``/v1`` on ``127.0.0.<n>``.
2. After ``healthy_s`` of training the fault is switched on in the chosen rank(s)
   (``faults.choose``: from ``seed``).
3. ``watch.watch`` runs the operator's trigger loop against the agents every second and, on a
   trigger, the Diagnosis handler's analysis.
4. The result is printed as ``kubectl get diagnoses -o wide`` would print the Diagnosis the
   operator writes (``report.diagnoses_wide``: the CRD's printer columns; with no trigger there
   is no Diagnosis and kubectl's "No resources found"), with the evidence (``report``); the
   window is written as a bundle-v1 (with ``truth.json``) to ``out`` and a self-contained HTML
   report (``htmlreport``) beside it.

Exit code 0 when the top culprit and category match the injected fault (or, for ``none``, when
nothing triggered), 1 otherwise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from collscope.nodeagent.bundle import writer
from collscope.operator.analysis import diagnosis
from collscope.operator.controller import trigger_loop
from collscope.operator.controller.state import OperatorState
from collscope.operator.domain import report, settings
from collscope.operator.onebox import box, faults, htmlreport, watch
from collscope.operator.simulator import truth

EXIT_OK = 0
EXIT_MISMATCH = 1
# Healthy training before the onset: the trigger's baselines need a few healthy 1 s ticks
# (TriggerSettings.normal_min_ticks = 3) and CCL-D's Tbase rounds (base_span_s = 3 s).
HEALTHY_S = 5.0
# Longest wait for a trigger after the onset; slowdowns need repeat_ticks (3) slow ticks.
DETECT_S = 25.0


@dataclass(frozen=True)
class DemoResult:
    code: int
    outcome: watch.Outcome
    truth: truth.Truth
    bundle_path: pathlib.Path | None
    html_path: pathlib.Path
    elapsed_s: float


def verdict(diag: diagnosis.Diagnosis | None, t: truth.Truth) -> bool:
    """Top-1 culprit and category agree with the truth (or: no anomaly for a healthy run)."""
    if t.expected_category is None:
        return diag is None or not diag.anomaly
    return (
        diag is not None
        and diag.anomaly
        and diag.category == t.expected_category
        and bool(diag.culprits)
        and diag.culprits[0].rank in t.culprit_ranks
    )


def run(
    fault: str,
    *,
    seed: int,
    out: pathlib.Path | None,
    plugin: pathlib.Path,
    layout: box.Layout | None = None,
    healthy_s: float = HEALTHY_S,
    detect_s: float = DETECT_S,
    say: Callable[[str], None] = print,
) -> DemoResult:
    t_start = time.perf_counter()
    layout = layout or box.Layout(job="demo")
    out = out or pathlib.Path(tempfile.mkdtemp(prefix="collscope-demo-")) / "bundle"
    writer.check_target(out)  # before the run, not after it
    what = "no fault (a healthy run)" if fault == "none" else f"injecting '{fault}'"
    say(
        f"collscope demo (seed {seed}): job '{layout.job}', {layout.world} ranks on "
        f"{layout.nodes} simulated nodes, real plugin ({plugin}), real node agents; "
        f"{what} after {healthy_s:g} s of training ..."
    )
    outcome, inj, onset = _observe(
        fault, layout, seed=seed, plugin=plugin, healthy_s=healthy_s, detect_s=detect_s, say=say,
        t_start=t_start,
    )  # fmt: skip
    t = _truth(fault, inj, seed)
    elapsed = time.perf_counter() - t_start
    diag = outcome.result
    name = f"{layout.job}-{outcome.hit.kind if outcome.hit else 'none'}-{seed}"
    shown = diag or diagnosis.Diagnosis(anomaly=False, evidence=_no_trigger(outcome))
    # Age as kubectl counts it: since the Diagnosis was created, at the trigger.
    age_s = elapsed
    if diag is not None and diag.detected_at is not None:
        age_s = time.time() - diag.detected_at / 1e9
    wide = report.diagnoses_wide(diag, name=name, job=layout.job, age_s=age_s)
    summary = report.summary(shown, source="diagnosis", start_ns=int(onset * 1e9))
    path = None
    if outcome.bundle is not None:
        extra = {"truth.json": t.model_dump_json(by_alias=True, indent=2) + "\n"}
        out.parent.mkdir(parents=True, exist_ok=True)
        path = writer.write(outcome.bundle, out, extra_files=extra)
    html_path = (path or out).parent / f"{(path or out).name}-report.html"
    injected = (
        "nothing (a healthy run)"
        if inj is None
        else f"{fault} on rank(s) {htmlreport.ranks_list(inj.ranks)} ({inj.node}), "
        f"expected {t.expected_category}"
    )
    html_path.write_text(
        htmlreport.render(
            shown,
            outcome.bundle,
            title=f"collscope diagnosis {name}",
            wide=wide,
            summary=summary,
            injected=injected,
        ),
        encoding="utf-8",
    )
    ok = verdict(diag, t)
    say("")
    say(wide)
    say("")
    say(summary)
    say("")
    say(f"injected: {injected}")
    _say_verdict(say, ok, diag, t, inj is None)
    if outcome.analysed_in_s:
        say(f"analysed in {outcome.analysed_in_s:.1f} s; whole demo {elapsed:.1f} s")
    if path is not None:
        say(f"bundle:   {path}   (collscope analyze {path})")
    say(f"report:   {html_path}")
    return DemoResult(EXIT_OK if ok else EXIT_MISMATCH, outcome, t, path, html_path, elapsed)


def _observe(
    fault: str,
    layout: box.Layout,
    *,
    seed: int,
    plugin: pathlib.Path,
    healthy_s: float,
    detect_s: float,
    say: Callable[[str], None],
    t_start: float,
) -> tuple[watch.Outcome, faults.Injection | None, float]:
    """Steps 1-3 (module docstring): what the operator's watch saw, the fault injected (None:
    none) and its onset (unix seconds); ``t_start``: when the demo started (perf_counter)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="collscope-onebox-"))
    try:
        with box.OneBox(layout, root, plugin, seed=seed) as b:
            inj = None
            if fault != "none":
                inj = faults.choose(
                    fault, seed=seed, ranks_by_node=layout.ranks_by_node(), onset_s=0.0
                )
            b.start(inj)
            onset = time.time() + healthy_s
            b.arm(onset)
            if inj is not None:
                inj = dataclasses.replace(inj, onset_s=onset)
            urls = {n: b.agent_url(n) for n in layout.node_names()}
            say(
                "  ranks up in "
                f"{time.perf_counter() - t_start:.1f} s; agents: "
                + ", ".join(f"{n} {u}" for n, u in urls.items())
            )
            state = watch.operator_state(layout, urls, b.uids, settings.Settings())
            outcome = asyncio.run(_watch(state, layout, healthy_s + detect_s, say))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return outcome, inj, onset


def _say_verdict(
    say: Callable[[str], None],
    ok: bool,
    diag: diagnosis.Diagnosis | None,
    t: truth.Truth,
    healthy: bool,
) -> None:
    latency = ""
    if diag is not None and diag.detected_at is not None and t.onset is not None:
        latency = f", detected {(diag.detected_at - t.onset) / 1e9:.2f} s after onset"
    judged = "no Diagnosis on a healthy run" if healthy else f"top culprit and category{latency}"
    say(f"verdict:  {'CORRECT' if ok else 'MISMATCH'} ({judged})")


async def _watch(
    state: OperatorState, layout: box.Layout, duration_s: float, say: Callable[[str], None]
) -> watch.Outcome:
    """The watch, then (no trigger) the window for the report, in one event loop: the agents'
    clients are the state's, bound to it, and closed at the end."""
    try:
        outcome = await watch.watch(state, layout, duration_s=duration_s, on_tick=_ticker(say))
        if outcome.bundle is None and state.jobs:
            outcome.bundle = await watch.window(state, layout, state.settings.diagnosis_window_s)
    finally:
        await trigger_loop.close_clients(state)
    return outcome


def _ticker(say: Callable[[str], None]) -> Callable[[int, str], None]:
    def tick(n: int, what: str) -> None:
        if what != "no trigger" or n % 5 == 0:
            say(f"  trigger tick {n}: {what}")

    return tick


def _no_trigger(outcome: watch.Outcome) -> list[str]:
    return [
        f"{outcome.ticks} trigger ticks on sampled ranks {list(outcome.sampled)}: no operation "
        f"stalled past its threshold and no slowdown held; no Diagnosis was created"
    ]


def _truth(fault: str, inj: faults.Injection | None, seed: int) -> truth.Truth:
    if inj is None:
        return truth.Truth(fault="none", seed=seed)
    return truth.Truth(
        fault=fault,
        onset=int(inj.onset_s * 1e9),
        culprit_ranks=list(inj.ranks),
        culprit_node=inj.node,
        expected_category=faults.expected_category(fault),
        seed=seed,
        detail=faults.info_of(fault).summary,
    )
