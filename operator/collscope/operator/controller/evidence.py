"""Evidence collected for a Diagnosis once it is Diagnosed: py-spy stacks and PyTorch Flight
Recorder dumps from the agents of the involved ranks (docs/design.md, "Data path" 6; Mycroft §5
collects both on a trigger), each summarised for the status by its pure module (``stackgrid`` +
``status.stack_groups``, ``flightrecorder``). Called by ``diagnosis_handlers``; the two
collections run concurrently and each costs at most its agents' timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from collscope.nodeagent import api as api_models
from collscope.operator.analysis import diagnosis
from collscope.operator.clients import agents
from collscope.operator.controller.state import OperatorState
from collscope.operator.domain import flightrecorder, ids, jobs, resources, stackgrid, status

Logger = logging.Logger | logging.LoggerAdapter[Any]


async def collect(
    state: OperatorState,
    namespace: str,
    *,
    job: str,
    spec: resources.DiagnosisSpec,
    result: diagnosis.Diagnosis,
    logger: Logger,
) -> dict[str, Any]:
    """``stacks`` and ``flightRecorder`` of the status, collected concurrently (each only
    when wanted, see the module docstring); {} when there is nothing to add."""
    requested = set(spec.requested_actions)
    want_stacks = result.anomaly or "stacks" in requested
    want_fr = spec.trigger in ("hang", "slow") or "flightRecorder" in requested
    grid, fr = await asyncio.gather(
        collect_stacks(state, namespace, job, result, logger) if want_stacks else _none(),
        collect_flight_recorder(state, namespace, job=job, spec=spec, result=result, logger=logger)
        if want_fr
        else _none(),
    )
    out: dict[str, Any] = {}
    if grid:
        out["stacks"] = grid
    if fr:
        out["flightRecorder"] = fr
    return out


async def _none() -> None:
    return None


def _clients(
    state: OperatorState, namespace: str, job: str, nodes: Iterable[str], timeout_s: float
) -> dict[str, agents.AgentClient]:
    """Fresh clients of the agents of ``nodes`` for one slow collection (not the trigger's
    cached ones: a longer timeout, no retries since a retry would ask for a second dump)."""
    clients: dict[str, agents.AgentClient] = {}
    pods = state.pods
    wanted = set(nodes)
    for node, ip in pods.nodes((namespace, job)).items():
        url = state.directory(node, ip) if node in wanted else None
        if url is not None:
            access = state.settings.agents
            clients[node] = agents.AgentClient(
                node, url, timeout_s=timeout_s, retries=0, access=access
            )
    return clients


async def collect_flight_recorder(
    state: OperatorState,
    namespace: str,
    *,
    job: str,
    spec: resources.DiagnosisSpec,
    result: diagnosis.Diagnosis,
    logger: Logger,
) -> dict[str, Any] | None:
    """Flight Recorder dumps of the involved ranks (``flightrecorder.choose``), one request per
    node, summarised (``flightrecorder.summarise``). Unreachable agents, agents without the
    capability and ranks without a dump become notes; an unexpected error here is logged and
    noted too: the evidence is optional, the Diagnosis is not."""
    cfg, runtimes = state.settings, state.jobs
    rt = runtimes.get((namespace, job))
    if rt is None or not rt.ranks:
        return None
    culprits = [c.rank for c in result.culprits if c.rank is not None]
    involved = _incident_members(rt, spec, result)
    ranks = flightrecorder.choose(culprits, involved, [int(r) for r in rt.ranks])
    asked = jobs.by_node([ids.Rank(r) for r in ranks], rt.ranks)
    clients = _clients(state, namespace, job, asked, cfg.flight_recorder_timeout_s + 2.0)
    workloads = jobs.workloads_by_node(rt.ranks)  # only this job's processes on each node
    request = {
        node: api_models.FlightRecorderRequest(
            ranks=list(rs),
            workloads=workloads.get(node),
            timeout_s=cfg.flight_recorder_timeout_s,
            max_entries=flightrecorder.MAX_ENTRIES,
        )
        for node, rs in asked.items()
    }
    calls = {n: clients[n].flightrecorder(r) for n, r in request.items() if n in clients}
    try:
        got, failed = await agents.gather(calls)
        unreachable = {f.node: f.reason for f in failed}
        unreachable |= {n: "no agent URL for this node" for n in asked if n not in clients}
        return flightrecorder.summarise(got, asked=asked, unreachable=unreachable)
    except Exception as e:  # a bug in optional evidence must not lose the Diagnosis
        logger.exception("Flight Recorder collection for %s/%s failed", namespace, job)
        return flightrecorder.failed(asked, f"collection failed: {type(e).__name__}: {e}")
    finally:
        for c in clients.values():
            await c.aclose()


def _incident_members(
    rt: jobs.JobRuntime, spec: resources.DiagnosisSpec, result: diagnosis.Diagnosis
) -> list[int]:
    """Members of the communicator named by the incident (``hang/<comm>/<seq>``,
    ``slow/<comm>@<ms>``) or by the culprits; empty when the operator does not know it."""
    parts = (spec.incident or "").split("/")
    comms = {parts[1].split("@")[0]} if len(parts) > 1 else set()
    comms |= {c.comm for c in result.culprits if c.comm}
    return sorted({int(m) for c in rt.groups.comms if c.comm_id in comms for m in c.members})


async def collect_stacks(
    state: OperatorState,
    namespace: str,
    job: str,
    result: diagnosis.Diagnosis,
    logger: Logger,
) -> list[dict[str, Any]]:
    """py-spy stacks of the culprits and sampled ranks (``stackgrid``), grouped; agents that
    cannot dump (no py-spy, no ptrace) only cost a log line."""
    cfg, runtimes = state.settings, state.jobs
    rt = runtimes.get((namespace, job))
    if rt is None or not rt.ranks:
        return []
    culprits = [c.rank for c in result.culprits if c.rank is not None]
    ranks = stackgrid.choose(culprits, [int(r) for r in rt.sample], [int(r) for r in rt.ranks])
    # A longer timeout than the trigger's: py-spy takes seconds.
    nodes = {rt.ranks[ids.Rank(r)].node for r in ranks}
    clients = _clients(state, namespace, job, nodes, cfg.stacks_timeout_s + 2.0)
    workloads = jobs.workloads_by_node(rt.ranks)  # only this job's processes on each node
    calls = {
        f"{rt.ranks[ids.Rank(r)].node}/rank {r}": clients[rt.ranks[ids.Rank(r)].node].stacks(
            api_models.StacksRequest(
                ranks=[r],
                workloads=workloads.get(rt.ranks[ids.Rank(r)].node),
                timeout_s=cfg.stacks_timeout_s,
            )
        )
        for r in ranks
        if rt.ranks[ids.Rank(r)].node in clients
    }
    try:
        got, failed = await agents.gather(calls)
    finally:
        for c in clients.values():
            await c.aclose()
    for f in failed[:3]:
        logger.info("no stacks from %s: %s", f.node, f.reason)
    frames: dict[ids.Rank, list[str]] = {}
    for key, report in got.items():
        picked = stackgrid.rank_frames(report)
        if picked:
            frames[ids.Rank(int(key.rpartition(" ")[2]))] = picked
    return status.stack_groups(frames)
