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
events of kinds ``kernel``, ``comm`` and ``memory``, which outrank Python on the critical path;
their μ, sigma are 0 (no SM or NIC samples per process yet). A torch source that failed is said
in the rank's ``reason``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
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
        pats = patterns(doc, t.rank)
        n = len(doc["samples"])
    except (KeyError, TypeError, ValueError, IndexError) as e:
        return api.RankProfile(
            rank=t.rank,
            state="failed",
            pid=t.pid,
            reason=f"unreadable probe output: {type(e).__name__}: {e}",
        )
    use: list[api.ResourceUse] = []
    if svc.hardware is not None:
        records = svc.hardware.window(start, end)
        mine = service.hw_owners(job, {r.device for r in records}, [t.rank])
        use = resource_use(r for r in records if r.device in mine)
    src = doc.get("torch")
    why = ""
    if isinstance(src, dict) and src.get("state") == "failed":
        why = f"torch profiler failed: {src.get('reason', '')}"[:500]
    return api.RankProfile(
        rank=t.rank,
        state="done",
        reason=why,
        pid=t.pid,
        start_ns=start,
        end_ns=end,
        samples=n,
        patterns=pats,
        resources=use,
    )


def patterns(doc: dict[str, Any], rank: int) -> list[models.FunctionPattern]:
    """β, μ, sigma per sampled function of one probe output (module docstring)."""
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
        events, main_tid=MAIN_TID, window=(start, end), samples={"cpu": cpu}
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
