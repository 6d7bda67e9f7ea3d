"""Black-box (network flow) analysis against simulated truth: LLMPrism's claims, measured.

    .venv/bin/python bench/flows_accuracy.py            # the full run recorded in the report
    .venv/bin/python bench/flows_accuracy.py --quick    # a smoke run, a minute or two

Three parts, each printed as a markdown table:

1. *Recognition, DP/PP and timelines* (LLMPrism §V-A..C): one fabric (2,880 GPUs, the paper's
   cluster; --quick: 512) simulated for 11 minutes (--quick: 4) by
   ``collscope.operator.simulator.flows``; windows of 1, 3, 5 and 10 minutes are cut from it
   and analysed from scratch. Jobs: recognised GPU sets equal to a true job's GPUs. Pairs: share
   of observed GPU pairs labelled as in truth, with and without the transitive refinement, with
   our one-off-size noise guard and with the paper's plain distinct-size count
   (``min_size_repeats=1``). Timeline: per GPU, reconstructed step durations (between
   consecutive DP-phase ends) against the true iteration durations (ends after the optimizer,
   what a training log prints), relative error; recall = durations recovered / true durations
   with both ends inside the window.
2. *Diagnosis* (§V-D): a 512-GPU fabric for 2 minutes, fault at 60 s (--quick: fewer seeds).
   Top-1: the first culprit is the injected switch; the members of the injected DP group; the
   GPUs of the injected job. Category as truth.json expects. Latency = detected_at - onset.
   NIC named first and named tie as in part 3.
3. *A slow NIC per ring size* (issue 17): a 256-GPU fabric (32 servers, 4 leaves, 4 spines)
   holding a job of DP 2, 3, 4 or 8 x PP 1 or 2 (servers shuffled by the seed) and jobs of 4
   servers on the rest; one NIC of the job at 1/2.5 bandwidth from 60 s of 120, under both ring
   pacings of the simulator (``Fabric.ring_pacing``: "ring", every link of a ring as slow as
   its slowest, what NCCL's flow-controlled ring does; "link", each hop its own time). Per
   setting: group exact = the first culprit's group has the injected ring's members; NIC
   first = the first culprit is the slow NIC's endpoint, component ``nic``, scored above
   every other; tie = it is among several culprits of the first's score (the verdict says it
   cannot choose). One healthy fabric per setting and seed: false alarms.
4. *Speed*: one minute of flows of a 2,880- and a 16,384-GPU fabric, analysed in this process
   (one core: numpy's sorts and ufuncs here are single-threaded), by phase, and whether that
   healthy minute raised an alarm (it must not); plus parsing that
   minute from ``flows.jsonl.gz`` for 2,880 GPUs (reader.iter_net_flows + FlowTable.from_flows).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from collscope.nodeagent.bundle import models, reader, tables, writer
from collscope.operator.analysis import diagnosis
from collscope.operator.analysis.flows import (
    attribution,
    engine,
    findings,
    jobs,
    parallelism,
    table,
    timeline,
    topology,
)
from collscope.operator.simulator.flows import config
from collscope.operator.simulator.flows import engine as simulator
from collscope.operator.simulator.flows import truth as truth_mod

NS = 1_000_000_000
# (window minutes, how many windows of that length), full and quick
WINDOWS = ((1, 5), (3, 3), (5, 2), (10, 1))
QUICK_WINDOWS = ((1, 3), (3, 1))
SCENARIOS: tuple[tuple[str, config.FaultKind | None, str | None], ...] = (
    ("healthy", None, None),
    ("congested spine", "congested-switch", None),
    ("congested leaf", "congested-switch", "leaf-01"),
    ("slow DP group", "slow-group", None),
    ("slow job", "slow-job", None),
)


@dataclass(frozen=True)
class WindowResult:
    minutes: int
    flows: int
    jobs_ok: int
    jobs: int
    pairs: int
    acc: float
    acc_raw: float
    acc_plain: float
    acc_plain_raw: float
    err_mean: float
    err_p99: float
    recall: float
    seconds: float


def flow_table(res: simulator.FlowSimResult) -> table.FlowTable:
    """The simulated flows as analysis reads them (no JSON round trip)."""
    return table.FlowTable.from_columns(
        endpoints=res.endpoints,
        switches=res.switches,
        src=res.src,
        dst=res.dst,
        ts=res.ts,
        nbytes=res.nbytes,
        duration=res.duration,
        sw_ptr=res.sw_ptr,
        sw_idx=res.sw_idx,
    )


def pair_accuracy(
    ft: table.FlowTable, par: parallelism.Parallelism, tr: truth_mod.FlowTruth
) -> tuple[int, float, float]:
    """(pairs, accuracy after refinement, accuracy before) against truth's pair types."""
    types = tr.pair_types()
    names = ft.endpoints
    truth_dp = np.array(
        [
            types.get((min(names[a], names[b]), max(names[a], names[b]))) == "dp"
            for a, b in zip(par.a.tolist(), par.b.tolist(), strict=True)
        ],
        dtype=bool,
    )
    return len(truth_dp), float(np.mean(par.dp == truth_dp)), float(np.mean(par.dp_raw == truth_dp))


def timeline_error(
    ft: table.FlowTable, tl: timeline.Timelines, tr: truth_mod.FlowTruth, lo: int, hi: int
) -> tuple[list[float], int, int]:
    """Relative step-duration errors, durations recovered, true durations inside the window.

    Each reconstructed step end is matched to the nearest true end; a reconstructed duration
    counts when its two ends match consecutive true ends.
    """
    gpu, end = tl.seg_gpu[tl.seg_complete], tl.seg_end[tl.seg_complete]
    firsts = np.flatnonzero(np.r_[True, gpu[1:] != gpu[:-1]])
    ends_of = dict(zip(gpu[firsts].tolist(), np.split(end, firsts[1:]), strict=True))
    errs: list[float] = []
    found = total = 0
    for g, name in enumerate(ft.endpoints):
        true = np.array(tr.step_ends.get(name, []), dtype=np.int64)
        true = true[(true >= lo) & (true < hi)]
        total += max(0, len(true) - 1)
        ends = ends_of.get(g)
        if ends is None or len(ends) < 2 or len(true) < 2:
            continue
        j = np.abs(true[None, :] - ends[:, None]).argmin(axis=1)
        ok = np.diff(j) == 1
        d = np.diff(true)[j[:-1][ok]]
        errs += (np.abs(np.diff(ends)[ok] - d) / d).tolist()
        found += int(ok.sum())
    return errs, found, total


def run_window(
    res: simulator.FlowSimResult, ft: table.FlowTable, minutes: int, start_ns: int
) -> WindowResult:
    hi = start_ns + minutes * 60 * NS
    w = ft.window(start_ns, hi)
    t0 = time.perf_counter()
    report = engine.analyze(w, job=res.job)
    seconds = time.perf_counter() - t0
    tr = res.truth
    true_jobs = {frozenset(j.endpoints) for j in tr.jobs}
    found = [frozenset(w.endpoints[e] for e in j.endpoints) for j in report.recognition.jobs]
    n, acc, acc_raw = pair_accuracy(w, report.parallelism, tr)
    plain = replace(engine.FlowSettings().parallelism, min_size_repeats=1)
    par_plain = parallelism.identify(w, report.recognition, plain)
    _, acc_plain, acc_plain_raw = pair_accuracy(w, par_plain, tr)
    errs, got, total = timeline_error(w, report.timelines, tr, start_ns, hi)
    e = np.array(errs) if errs else np.zeros(1)
    return WindowResult(
        minutes=minutes,
        flows=len(w),
        jobs_ok=sum(f in true_jobs for f in found),
        jobs=len(true_jobs),
        pairs=n,
        acc=acc,
        acc_raw=acc_raw,
        acc_plain=acc_plain,
        acc_plain_raw=acc_plain_raw,
        err_mean=float(e.mean()),
        err_p99=float(np.quantile(e, 0.99)),
        recall=got / total if total else 0.0,
        seconds=seconds,
    )


def part_windows(gpus: int, windows: tuple[tuple[int, int], ...], seed: int) -> str:
    duration = 60.0 * max(m for m, _ in windows) + 60.0
    t0 = time.perf_counter()
    res = simulator.simulate(config.preset(gpus, seed=seed, duration_s=duration))
    ft = flow_table(res)
    sim_s = time.perf_counter() - t0
    rows = []
    for minutes, count in windows:
        # windows spread over the run, the first 30 s in (jobs start at 0-2 s)
        span = duration - 30.0 - minutes * 60.0
        for i in range(count):
            offset = 30.0 + (span * i / (count - 1) if count > 1 else 0.0)
            rows.append(run_window(res, ft, minutes, int(ft.ts[0]) + int(offset * NS)))
    out = [
        f"fabric: {gpus} GPUs, {len(res.truth.jobs)} jobs, {len(res):,} flows in "
        f"{duration / 60:.0f} min (simulated in {sim_s:.0f} s)\n",
        "| window | windows | flows/window | jobs exact | DP/PP acc. | w/o refinement | "
        "paper count | paper count w/o ref. | step error mean | p99 | steps recovered | "
        "analysis s/window |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for minutes, _ in windows:
        sel = [r for r in rows if r.minutes == minutes]

        def pct(v: float) -> str:
            return f"{100 * v:.2f}%"

        out.append(
            f"| {minutes} min | {len(sel)} | {statistics.mean(r.flows for r in sel):,.0f} | "
            f"{sum(r.jobs_ok for r in sel)}/{sum(r.jobs for r in sel)} | "
            f"{pct(min(r.acc for r in sel))} | {pct(min(r.acc_raw for r in sel))} | "
            f"{pct(min(r.acc_plain for r in sel))} | {pct(min(r.acc_plain_raw for r in sel))} | "
            f"{100 * statistics.mean(r.err_mean for r in sel):.3f}% | "
            f"{100 * max(r.err_p99 for r in sel):.3f}% | "
            f"{pct(statistics.mean(r.recall for r in sel))} | "
            f"{statistics.mean(r.seconds for r in sel):.1f} |"
        )
    out.append(
        "\n(accuracies are the worst window of each length; errors the mean of means and the "
        "worst p99)"
    )
    return "\n".join(out)


@dataclass(frozen=True)
class Case:
    name: str
    kind: config.FaultKind | None
    target: str | None
    seed: int


@dataclass(frozen=True)
class CaseResult:
    case: Case
    anomaly: bool
    top1: bool
    nic: bool | None
    nic_tie: bool | None
    category_ok: bool
    latency_s: float | None
    seconds: float


def run_case(case: Case) -> CaseResult:
    faults = () if case.kind is None else (config.FlowFault(case.kind, case.target, 60.0),)
    res = simulator.simulate(config.preset(512, seed=case.seed, duration_s=120.0, faults=faults))
    ft = flow_table(res)
    t0 = time.perf_counter()
    report = engine.analyze(ft, job=res.job)
    diag = engine.to_diagnosis(report)
    seconds = time.perf_counter() - t0
    if not res.truth.faults:
        return CaseResult(
            case, diag.anomaly, not diag.anomaly, None, None, not diag.anomaly, None, seconds
        )
    f = res.truth.faults[0]
    top = diag.culprits[0] if diag.culprits else None
    top1, nic, nic_tie = False, None, None
    if top is not None and f.kind == "congested-switch":
        top1 = top.switch == f.culprit
    elif top is not None and f.kind == "slow-group":
        members = {c.endpoint for c in diag.culprits if c.group == top.group}
        top1 = top.group is not None and members == set(f.members)
        nic, nic_tie = _nic_named(diag.culprits, f.nic)
    elif top is not None and top.job is not None:
        job = report.recognition.job(top.job)
        top1 = job is not None and {ft.endpoints[e] for e in job.endpoints} == set(f.members)
    latency = None if diag.detected_at is None else (diag.detected_at - f.onset) / NS
    return CaseResult(
        case,
        diag.anomaly,
        top1,
        nic,
        nic_tie,
        diag.category == f.expected_category,
        latency,
        seconds,
    )


def _nic_named(culprits: list[diagnosis.Culprit], nic: str | None) -> tuple[bool, bool]:
    """(the NIC is the first culprit, alone at its score; it is among several tied first)."""
    top = culprits[0]
    tied = [c for c in culprits if c.group == top.group and c.score == top.score]
    named = top.endpoint == nic and top.component == "nic"
    in_tie = len(tied) > 1 and any(c.endpoint == nic and c.component == "nic" for c in tied)
    return named and len(tied) == 1, in_tie


def part_diagnosis(seeds: int, workers: int) -> str:
    cases = [Case(n, k, t, s) for n, k, t in SCENARIOS for s in range(seeds)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(run_case, cases))
    out = [
        "| scenario | cases | detected | top-1 culprit | category | NIC named first | "
        "latency median s | analysis median s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, kind, _ in SCENARIOS:
        sel = [r for r in results if r.case.name == name]
        n = len(sel)
        lat = [r.latency_s for r in sel if r.latency_s is not None]
        nic = [r.nic for r in sel if r.nic is not None]
        ties = sum(bool(r.nic_tie) for r in sel)
        alarms = sum(r.anomaly for r in sel)
        cells = [
            name,
            str(n),
            f"{alarms} false alarms" if kind is None else f"{alarms}/{n}",
            "-" if kind is None else f"{sum(r.top1 for r in sel)}/{n}",
            f"{sum(r.category_ok for r in sel)}/{n}",
            f"{sum(nic)}/{len(nic)} ({ties} in a named tie)" if nic else "-",
            f"{statistics.median(lat):.1f}" if lat else "-",
            f"{statistics.median(r.seconds for r in sel):.2f}",
        ]
        out.append("| " + " | ".join(cells) + " |")
    misses = [r for r in results if r.case.kind is not None and not (r.top1 and r.category_ok)]
    for r in misses:
        out.append(f"\nmiss: {r.case} anomaly={r.anomaly} top1={r.top1} cat={r.category_ok}")
    return "\n".join(out)


NIC_RINGS = (2, 3, 4, 8)
NIC_PP = (1, 2)
PACINGS: tuple[config.RingPacing, ...] = ("ring", "link")


@dataclass(frozen=True)
class NicCase:
    dp: int
    pp: int
    pacing: config.RingPacing
    seed: int
    faulty: bool


@dataclass(frozen=True)
class NicResult:
    case: NicCase
    anomaly: bool
    group_ok: bool
    nic_first: bool
    nic_tie: bool


def nic_config(case: NicCase) -> config.FlowSimConfig:
    """The fabric of part 3: the job under test ("nic-test") and jobs of 4 servers."""
    rng = np.random.default_rng([case.seed, case.dp, case.pp, 29])
    fabric = config.Fabric(servers=32, servers_per_leaf=8, spines=4, ring_pacing=case.pacing)
    free = [int(v) for v in rng.permutation(fabric.servers)]
    shapes = [(case.pp, case.dp)]
    while sum(p * d for p, d in shapes) + 4 <= fabric.servers:
        shapes.append((1, 4) if len(shapes) % 2 else (2, 2))
    specs = []
    for k, (pp, dp) in enumerate(shapes):
        fwd = float(rng.uniform(100.0, 200.0))
        specs.append(
            config.JobSpec(
                name="nic-test" if k == 0 else f"train-{k:02d}",
                servers=tuple(free[: pp * dp]),
                pp=pp,
                dp=dp,
                fwd_ms=round(fwd, 1),
                bwd_ms=round(2 * fwd, 1),
                grad_bytes=int(rng.uniform(1.0, 3.0) * (1 << 30)),
                buckets=_buckets(rng),
                start_s=float(rng.uniform(0.0, 2.0)),
            )
        )
        free = free[pp * dp :]
    target = f"nic-test/pp{rng.integers(case.pp)}/tp{rng.integers(fabric.gpus_per_server)}"
    faults = (config.FlowFault("slow-group", target, 60.0),) if case.faulty else ()
    return config.FlowSimConfig(
        fabric=fabric, jobs=tuple(specs), duration_s=120.0, faults=faults, seed=case.seed
    )


def _buckets(rng: np.random.Generator) -> tuple[float, ...]:
    """4-6 distinct bucket shares (DDP buckets differ in size; rounding may tie: draw again)."""
    while True:
        shares = tuple(
            round(float(x), 4) for x in rng.dirichlet(np.full(int(rng.integers(4, 7)), 4.0))
        )
        if len(set(shares)) == len(shares):
            return shares


def run_nic_case(case: NicCase) -> NicResult:
    res = simulator.simulate(nic_config(case))
    diag = engine.to_diagnosis(engine.analyze(flow_table(res), job=res.job))
    if not res.truth.faults:
        return NicResult(case, diag.anomaly, False, False, False)
    f = res.truth.faults[0]
    top = diag.culprits[0] if diag.culprits else None
    if top is None:
        return NicResult(case, diag.anomaly, False, False, False)
    group_ok = top.group is not None and {
        c.endpoint for c in diag.culprits if c.group == top.group
    } == set(f.members)
    return NicResult(case, diag.anomaly, group_ok, *_nic_named(diag.culprits, f.nic))


def part_nic(seeds: int, workers: int) -> str:
    cases = [
        NicCase(dp, pp, pacing, seed, faulty)
        for pacing in PACINGS
        for pp in NIC_PP
        for dp in NIC_RINGS
        for seed in range(seeds)
        for faulty in (True, False)
    ]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(run_nic_case, cases))
    out = [
        "| ring pacing | PP | DP ring | faulty cases | detected | group exact | NIC first | "
        "NIC in a named tie | healthy: false alarms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pacing in PACINGS:
        for pp in NIC_PP:
            for dp in NIC_RINGS:
                sel = [
                    r for r in results if (r.case.pacing, r.case.pp, r.case.dp) == (pacing, pp, dp)
                ]
                bad = [r for r in sel if r.case.faulty]
                ok = [r for r in sel if not r.case.faulty]
                n = len(bad)
                out.append(
                    f"| {pacing} | {pp} | {dp} | {n} | {sum(r.anomaly for r in bad)}/{n} | "
                    f"{sum(r.group_ok for r in bad)}/{n} | {sum(r.nic_first for r in bad)}/{n} | "
                    f"{sum(r.nic_tie for r in bad)}/{n} | "
                    f"{sum(r.anomaly for r in ok)}/{len(ok)} |"
                )
    return "\n".join(out)


def part_speed(sizes: tuple[int, ...]) -> str:
    out = [
        "| GPUs | jobs | flows in the minute | recognition s | DP/PP s | timelines s | "
        "diagnosis s | total s | flows/s | alarm (healthy) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    parse = ""
    for gpus in sizes:
        res = simulator.simulate(config.preset(gpus, seed=1, duration_s=62.0))
        ft = flow_table(res)
        w = ft.window(ft.ts[0] + NS, ft.ts[0] + 61 * NS)
        topo = topology.Topology.from_job(res.job)
        s = engine.FlowSettings()
        t = [time.perf_counter()]
        rec = jobs.recognize(w, topo, s.jobs)
        t.append(time.perf_counter())
        par = parallelism.identify(w, rec, s.parallelism)
        t.append(time.perf_counter())
        tl = timeline.reconstruct(w, par, rec.job_of, len(rec.jobs), s.timeline)
        t.append(time.perf_counter())
        found = [
            *findings.switch_level(w, par, s.findings, tl),
            *findings.cross_group(w, par, tl, rec, s.findings),
            *findings.cross_step(w, tl, rec, s.findings),
        ]
        report = engine.FlowReport(
            w, topo, rec, par, tl, tuple(attribution.attribute(found, w, par, rec, s.findings))
        )
        alarm = engine.to_diagnosis(report, s).anomaly
        t.append(time.perf_counter())
        total = t[-1] - t[0]
        out.append(
            f"| {gpus:,} | {len(rec.jobs)} | {len(w):,} | {t[1] - t[0]:.2f} | {t[2] - t[1]:.2f} | "
            f"{t[3] - t[2]:.2f} | {t[4] - t[3]:.2f} | {total:.2f} | {len(w) / total:,.0f} | "
            f"{'yes' if alarm else 'no'} |"
        )
        if gpus == 2880:
            parse = _parse_time(res.job, w)
    return "\n".join(out) + ("\n\n" + parse if parse else "")


def _parse_time(job: models.Job, w: table.FlowTable) -> str:
    """Write the minute as a flows-only bundle, then time reading it back into columns."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        empty = tables.BundleBuilder(job).build()
        path = writer.write(empty, os.path.join(tmp, "b"), net_flows=w.iter_flows())
        t1 = time.perf_counter()
        ft = table.FlowTable.from_flows(reader.iter_net_flows(path))
        t2 = time.perf_counter()
        size = os.path.getsize(os.path.join(path, "flows.jsonl.gz"))
    return (
        f"2,880 GPUs, that minute as flows.jsonl.gz ({size / 2**20:.0f} MiB, {len(ft):,} "
        f"lines): written in {t1 - t0:.1f} s, read and validated into columns in "
        f"{t2 - t1:.1f} s ({len(ft) / (t2 - t1):,.0f} flows/s)."
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller fabric, fewer windows and seeds")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--only", choices=("nic",), help="run one part only")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    print("# collscope flow analysis (LLMPrism) against simulated truth")
    print(f"# command: {' '.join([sys.executable.split('/')[-1], *sys.argv])}")
    print(
        f"# machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, numpy {np.__version__}\n"
    )
    if args.only == "nic":
        print(part_nic(1 if args.quick else 3, args.jobs))
        return 0
    print("## 1. Job recognition, DP/PP identification, timeline reconstruction\n")
    if args.quick:
        print(part_windows(512, QUICK_WINDOWS, seed=3))
    else:
        print(part_windows(2880, WINDOWS, seed=3))
    print("\n## 2. Diagnosis of injected faults (512 GPUs, 2 min, onset 60 s)\n")
    print(part_diagnosis(2 if args.quick else 6, args.jobs))
    print("\n## 3. A slow NIC per ring size (256 GPUs, 2 min, onset 60 s)\n")
    print(part_nic(1 if args.quick else 3, args.jobs))
    print("\n## 4. Time to process one minute of flows (one core)\n")
    print(part_speed((2880, 16384)))
    print(f"\n# total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
