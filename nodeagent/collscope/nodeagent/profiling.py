"""Profiling on demand: arm the ranks' dormant probes, read back β, μ, sigma per function.

The agent's half of EROICA's on-demand profiling (§4.1, "profiling on degradation" with every
worker profiled) on Kubernetes. ``POST /v1/profile`` (``api.ProfileRequest``) writes the arm
file the probe watches (``collscope.probe``: ``site/collscope_probe.py``) into the trace
directory of each asked-for rank on this node::

    <trace_dir>/probe.arm  {"id": "diag-x", "window_s": 10, "deadline_ns": ..., "hz": 100,
                            "ranks": [0, 1]}

``deadline_ns`` is now + ``window_s`` + ``grace_s``: a probe that has not started by then never
starts, and one that started stops by then. ``GET /v1/profile?id=`` reads each rank's
``probe.<pid>.json`` (``pid``: the ring header's, the process's own pid in its namespace) and
answers a ``RankProfile`` per rank: ``pending`` / ``armed`` / ``failed`` as the probe wrote
them, ``no probe`` when no file of this id appeared before the deadline (nothing is guessed),
``done`` with the patterns and the utilisation of the rank's GPU and NIC over the same window
(the agent's hardware sampler, ``service.hw_owners`` by the device map).

From samples to patterns (EROICA §4.2): a run of consecutive samples with the same stack is one
execution of that function, from the sample before the run to its last sample (each sample's
CPU utilisation covers the interval since the previous one, so it is placed at its middle);
``patterns.summarise`` then gives β (share of the window on the critical path: the innermost
function of the training thread) and μ, sigma of the training thread's CPU utilisation over
each execution's critical duration (Algorithm 1). Where the probe also ran torch's profiler
(a process with torch and CUDA: ``torch.ops``), its kernels, NCCL kernels and memory copies are
events of kinds ``kernel``, ``comm`` and ``memory``, which outrank Python on the critical path.
Their μ, sigma come from the agent's own hardware records of the rank's GPU and NIC over the
window (``hw_samples``), joined by device through the device map (``service.hw_owners``; never
by the records' rank): ``kernel`` from ``sm`` = ``sm_clock_mhz`` / ``sm_clock_max_mhz`` of the
rank's GPU, ``comm`` from ``nic`` = ``nic_tx_bytes_per_second`` x 8 / ``nic_link_speed_gbps``
of its NIC(s) (summed over the ports the device map gives it), both clipped to [0, 1].
``memory`` keeps the training thread's CPU utilisation. The hardware is read about once a
second, far more slowly than kernels last, so a reading holds for up to ``HOLD_NS``
(``summarise.Samples.hold_ns``) and the records are fetched from ``HOLD_NS`` before the window.
A rank whose GPU or NIC the device map does not know, or whose source gave no such record (no
NVML on a CPU machine, a link without a speed), keeps μ = sigma = 0 for that kind, and when it
has patterns of that kind its ``reason`` says which record was missing and why (the device
map's ``unresolved``, the source's status); nothing is guessed. A torch source that failed is
said in the rank's ``reason`` too.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from collscope.nodeagent import api, errors, service
from collscope.nodeagent.bundle import models
from collscope.nodeagent.patterns import summarise
from collscope.probe.site import collscope_probe

ARM_FILE = collscope_probe.ARM_FILE
MAIN_TID = 1  # the probe samples one thread: every execution is on it
_OP_KINDS = ("kernel", "comm", "memory")  # what the probe's torch source records
_NS = 1_000_000_000
SM_CLOCK, SM_CLOCK_MAX = "sm_clock_mhz", "sm_clock_max_mhz"  # hardware/gpu.py's metrics
NIC_TX, NIC_SPEED = "nic_tx_bytes_per_second", "nic_link_speed_gbps"  # hardware/nic.py, rdma.py
# How long a GPU or NIC reading stands for the executions after it: two of the hardware
# sampler's default 1 s intervals (one sample may be late or missed).
HOLD_NS = 2 * _NS
_NEEDS = {"kernel": "sm", "comm": "nic"}  # kinds whose μ, sigma come from the hardware records
_SOURCES = {"sm": ("nvml",), "nic": ("rdma", "netlink")}


@dataclass(frozen=True)
class Target:
    """A rank on this node: where its probe looks and which pid it writes under."""

    rank: int
    trace_dir: str
    pid: int


def targets(
    svc: service.Service, ranks: Sequence[int] | None, workloads: Sequence[str] | None = None
) -> list[Target]:
    """The live rings' ranks (those of ``ranks`` in the pods ``workloads``; None: all) with
    their trace directories. Two jobs on a node may both have a rank 0: the operator names its
    pods (``api.py``, workloads)."""
    out: dict[tuple[str, int], Target] = {}
    for t in svc.sampler.rings():
        i = t.identity
        if i is None or i.rank is None or t.health == "retired":
            continue
        if ranks is not None and i.rank not in ranks:
            continue
        if workloads is not None and t.pod_uid not in workloads:
            continue
        out[(str(t.pod_uid), i.rank)] = Target(i.rank, os.path.dirname(t.path), i.pid)
    return [out[k] for k in sorted(out, key=lambda k: (k[1], k[0]))]


def arm(svc: service.Service, req: api.ProfileRequest) -> api.ProfileArmed:
    """Write the arm file into each target's trace directory (once per directory)."""
    found = targets(svc, req.ranks, req.workloads)
    if len({t.rank for t in found}) < len(found):
        raise errors.QueryError("workloads", "ranks of several workloads: name the job's pods")
    missing = sorted(set(req.ranks or ()) - {t.rank for t in found})
    if missing:
        raise errors.QueryError("ranks", f"no live ring of rank(s) {missing} on node {svc.node}")
    if not found:
        raise errors.QueryError("ranks", f"no rank with a live ring on node {svc.node}")
    deadline = svc.clock_ns() + int((req.window_s + req.grace_s) * _NS)
    doc = {
        "id": req.id,
        "window_s": req.window_s,
        "deadline_ns": deadline,
        "hz": req.hz,
        "ranks": [t.rank for t in found],
    }
    for d in sorted({t.trace_dir for t in found}):
        _write(os.path.join(d, ARM_FILE), doc)
    return api.ProfileArmed(
        id=req.id, node=svc.node, deadline_ns=deadline, ranks=[t.rank for t in found]
    )


def report(svc: service.Service, req_id: str) -> api.ProfileReport:
    """Each armed rank's probe for request ``req_id`` (see the module docstring)."""
    now = svc.clock_ns()
    out: list[api.RankProfile] = []
    deadline: int | None = None
    job: models.Job | None = None
    for t in targets(svc, None):
        armed = _read(os.path.join(t.trace_dir, ARM_FILE))
        if armed is None or armed.get("id") != req_id or t.rank not in armed.get("ranks", ()):
            continue
        deadline = int(armed["deadline_ns"])
        doc = _read(os.path.join(t.trace_dir, f"probe.{t.pid}.json"))
        if doc is None or doc.get("id") != req_id:
            state: api.ProfileState = "pending" if now < deadline else "no probe"
            why = "" if state == "pending" else "no probe answered before the deadline"
            out.append(api.RankProfile(rank=t.rank, state=state, reason=why))
            continue
        if doc.get("state") != "done":
            st = "failed" if doc.get("state") == "failed" else "armed"
            out.append(
                api.RankProfile(
                    rank=t.rank, state=st, pid=t.pid, reason=str(doc.get("reason", ""))[:500]
                )
            )
            continue
        if job is None:
            job = svc.job()
        out.append(_done(svc, t, doc, job))
    return api.ProfileReport(id=req_id, node=svc.node, deadline_ns=deadline, ranks=out)


def _done(svc: service.Service, t: Target, doc: dict[str, Any], job: models.Job) -> api.RankProfile:
    try:
        start, end = int(doc["start_ns"]), int(doc["end_ns"])
        n = len(doc["samples"])
    except (KeyError, TypeError, ValueError) as e:
        return _unreadable(t, e)
    use: list[api.ResourceUse] = []
    hw: dict[str, summarise.Samples] = {}
    info = next((i for i in job.ranks if i.rank == t.rank), None)
    if svc.hardware is None:
        missing = {k: "no hardware sampler on this agent" for k in _SOURCES}
    else:
        records = svc.hardware.window(max(0, start - HOLD_NS), end)
        mine = service.hw_owners(job, {r.device for r in records}, [t.rank])
        use = resource_use(r for r in records if r.device in mine and r.ts >= start)
        gpu = None if info is None or info.gpu is None else f"gpu{info.gpu}"
        down = {s.name: s.reason for s in svc.hardware.statuses() if not s.available}
        hw, missing = hw_samples(
            [r for r in records if r.device in mine],
            gpu=gpu,
            nics=sorted(d for d in mine if d != gpu),
            nic_known=info is not None and info.nic is not None,
            unresolved=(info.unresolved or "") if info is not None else "not in the device map",
            down=down,
        )
    try:
        pats = patterns(doc, t.rank, hw)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        return _unreadable(t, e)
    why = []
    src = doc.get("torch")
    if isinstance(src, dict) and src.get("state") == "failed":
        why.append(f"torch profiler failed: {src.get('reason', '')}")
    for kind in sorted({p.kind for p in pats} & set(_NEEDS)):
        if _NEEDS[kind] in missing:
            why.append(f"{kind} mu, sigma = 0: {missing[_NEEDS[kind]]}")
    return api.RankProfile(
        rank=t.rank,
        state="done",
        reason="; ".join(why)[:500],
        pid=t.pid,
        start_ns=start,
        end_ns=end,
        samples=n,
        patterns=pats,
        resources=use,
    )


def _unreadable(t: Target, e: Exception) -> api.RankProfile:
    return api.RankProfile(
        rank=t.rank,
        state="failed",
        pid=t.pid,
        reason=f"unreadable probe output: {type(e).__name__}: {e}",
    )


def hw_samples(
    records: Sequence[models.HwRecord],
    *,
    gpu: str | None,
    nics: Sequence[str],
    nic_known: bool = True,
    unresolved: str = "",
    down: Mapping[str, str] | None = None,
) -> tuple[dict[str, summarise.Samples], dict[str, str]]:
    """The ``sm`` and ``nic`` utilisation of one rank from hardware records (module docstring):
    ``gpu`` its GPU's device (None: unknown), ``nics`` the devices of its NIC; only records of
    those devices are read, whatever their ``rank``. Returns the samples found and, per
    resource without samples, why (``unresolved``: the device map's word on an unknown device;
    ``down``: source name -> reason of the sources that are unavailable)."""
    down = down or {}
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in sorted(records, key=lambda r: r.ts):
        series.setdefault((r.device, r.metric), []).append((r.ts, r.value))
    out: dict[str, summarise.Samples] = {}
    missing: dict[str, str] = {}

    def why(res: str, text: str) -> None:
        srcs = [f"{n}: {down[n]}" for n in _SOURCES[res] if n in down]
        missing[res] = f"{text} ({'; '.join(srcs)})" if srcs else text

    if gpu is None:
        why("sm", f"the rank's GPU is unknown{f' ({unresolved})' if unresolved else ''}")
    else:
        got = _ratio([(series.get((gpu, SM_CLOCK), []), series.get((gpu, SM_CLOCK_MAX), []))], 1.0)
        if got is not None:
            out["sm"] = got
        elif not series.get((gpu, SM_CLOCK)):
            why("sm", f"no {SM_CLOCK} record of {gpu} in the window")
        else:
            why("sm", f"no {SM_CLOCK_MAX} record of {gpu} in the window")
    if not nic_known or not nics:
        text = "the rank's NIC is unknown" if not nic_known else "no record of the rank's NIC"
        why("nic", f"{text}{f' ({unresolved})' if unresolved and not nic_known else ''}")
    else:
        pairs = [(series.get((d, NIC_TX), []), series.get((d, NIC_SPEED), [])) for d in nics]
        got = _ratio(pairs, 1e9 / 8)  # bytes/s against Gb/s
        if got is not None:
            out["nic"] = got
        elif not any(series.get((d, NIC_TX)) for d in nics):
            why("nic", f"no {NIC_TX} record of {', '.join(nics)} in the window")
        else:
            why("nic", f"no {NIC_SPEED} record of {', '.join(nics)} in the window")
    return out, missing


def _ratio(
    pairs: Sequence[tuple[Sequence[tuple[int, float]], Sequence[tuple[int, float]]]], scale: float
) -> summarise.Samples | None:
    """Per time of the numerators: their sum / (the sum of their denominators x scale), each
    device's denominator its latest positive one at or before that time (else its first),
    clipped to [0, 1]; a device without a positive denominator is left out; None when none
    is left."""
    rows: dict[int, list[float]] = {}
    for num, den_all in pairs:
        den = [d for d in den_all if d[1] > 0]
        if not num or not den:
            continue
        keys = [ts for ts, _ in den]
        for t, v in num:
            row = rows.setdefault(t, [0.0, 0.0])
            row[0] += v
            row[1] += den[max(0, bisect.bisect_right(keys, t) - 1)][1] * scale
    if not rows:
        return None
    ts = sorted(rows)
    val = np.clip(np.array([rows[t][0] / rows[t][1] for t in ts], dtype=np.float64), 0.0, 1.0)
    return summarise.Samples(np.array(ts, dtype=np.float64), val, HOLD_NS)


def patterns(
    doc: dict[str, Any], rank: int, hw: Mapping[str, summarise.Samples] | None = None
) -> list[models.FunctionPattern]:
    """β, μ, sigma per sampled function of one probe output (module docstring); ``hw``: the
    rank's ``sm`` and ``nic`` samples (``hw_samples``), the kinds without any keep μ = sigma = 0.
    """
    start, end = int(doc["start_ns"]), int(doc["end_ns"])
    stacks = [str(s) for s in doc["stacks"]]
    rows = [(int(ts), int(i), float(u)) for ts, i, u in doc["samples"]]
    events: list[summarise.Event] = []
    prev_ts = start
    run_start, run_idx = start, None
    for ts, idx, _ in rows:
        if idx != run_idx:
            if run_idx is not None and run_idx >= 0:
                events.append(
                    summarise.Event(stacks[run_idx], "python", run_start, prev_ts, MAIN_TID)
                )
            run_start, run_idx = prev_ts, idx
        prev_ts = ts
    if run_idx is not None and run_idx >= 0:
        events.append(summarise.Event(stacks[run_idx], "python", run_start, prev_ts, MAIN_TID))
    events += torch_events(doc.get("torch"))
    times = np.array([start] + [r[0] for r in rows], dtype=np.float64)
    cpu = summarise.Samples(
        (times[:-1] + times[1:]) / 2,  # each sample's utilisation is of the interval before it
        np.clip(np.array([r[2] for r in rows], dtype=np.float64), 0.0, 1.0),
    )
    found = summarise.summarise(
        events, main_tid=MAIN_TID, window=(start, end), samples={**(hw or {}), "cpu": cpu}
    )
    return [
        models.FunctionPattern(
            rank=rank,
            fn=p.fn,
            kind=p.kind,
            beta=p.beta,
            mu=p.mu,
            sigma=p.sigma,
            window_ns=max(0, end - start),
        )
        for p in found
        if p.beta > 0
    ]


def torch_events(src: Any) -> list[summarise.Event]:
    """The torch source's ops (``collscope_probe.TorchSource``) as events; [] when it did not
    run. ``[name index, kind, start_ns, end_ns, stream]``, kinds checked."""
    if not isinstance(src, dict) or src.get("state") != "done":
        return []
    names = [str(n) for n in src["names"]]
    out = []
    for i, kind, start, end, stream in src["ops"]:
        if kind not in _OP_KINDS:
            raise ValueError(f"torch op of kind {kind!r}")
        out.append(summarise.Event(names[int(i)], kind, int(start), int(end), int(stream)))
    return out


def resource_use(records: Iterable[models.HwRecord]) -> list[api.ResourceUse]:
    """Mean and max of each (device, metric) among ``records``."""
    by: dict[tuple[str, str], list[float]] = {}
    for r in records:
        by.setdefault((r.device, r.metric), []).append(r.value)
    return [
        api.ResourceUse(device=d, metric=m, mean=sum(v) / len(v), max=max(v), samples=len(v))
        for (d, m), v in sorted(by.items())
    ]


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _write(path: str, doc: dict[str, Any]) -> None:
    tmp = f"{path}.agent.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
    except OSError as e:
        raise errors.UnavailableError(f"cannot write {path}: {e}") from e
