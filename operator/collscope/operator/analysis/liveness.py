"""Hangs caused by a process or a node, not by the fabric: dead, frozen and lost ranks.

A rank whose process was killed (SIGKILL, the OOM killer), crashed or was frozen (SIGSTOP, a
debugger) stops moving chunks, and its peers wait in the collective exactly as they wait for a
NIC that stopped delivering: Mycroft's real-time state log simply ends "when the NCCL proxy
thread exits or crashes" (§4.2), and CCL-D's decision tree (§4.2.2, Fig. 7) has no branch for
it, so its H3 ("hardware or driver fault") takes the blame, and remediation cordons a healthy
node. CCL-D's own evaluation injects exactly this hang ("process blocking, e.g. SIGSTOP", §6.1),
and MegaScale's heartbeats (CCL-D §7) are what tells it apart: a dead NIC or a hung GPU leaves
the process alive and beating, a dead or frozen process does not.

Input: the bundle's ``liveness`` rows (``liveness.jsonl``: each rank's writer as its node agent
saw it when the window was pulled, with the ring's last heartbeat), and the hang trigger.

1. *Silent ranks*: the latest row of each rank says ``dead`` or ``stopped`` (the agent read it
   in ``/proc``), or ``unknown`` with a heartbeat older than ``SILENT_NS`` (the agent could not
   see the process; the heartbeat alone speaks). ``running`` never makes a rank silent, even
   with an old heartbeat: the process is there (it may have closed its communicators, which
   stops the heartbeat by design); ``exited`` (gone after closing its communicators) is left
   to the collective analysis, which sees a rank that never entered.
2. A silence is the cause only if it began by the time the hang did: the rank's last heartbeat
   at most ``onset_slack_ns`` after the stall the trigger saw began (``ONSET_SLACK_INTERVALS``
   measured sampling intervals, at least ``ONSET_SLACK_NS``). A process killed later (by
   a watchdog, by someone who gave up on the hang) is a consequence, not the cause.
3. At least one other rank is heard (``running``, fresh heartbeat): a job where every rank went
   silent at once tells nothing about which one started it.
4. Verdict ``hang.process`` (component host), the silent ranks first-silent first, unless the
   GPU of a culprit (``job.json``'s rank -> node, GPU; never by rank alone) has independent
   hardware evidence in the bundle's ``hw`` samples up to the observation: a hardware Xid
   (``HARDWARE_XIDS``) or an increase of its uncorrected ECC count. The process may have died
   because its GPU did: ``hang.gpu``.
5. *Lost node*: when no rank is silent, a node whose every rank is ``unreachable`` (the
   collector could not reach its agent) and none of whose ranks has a record after the stall
   began: ``hang.node`` (component host), its ranks as culprits at node precision.

Neither ``hang.process`` nor ``hang.node`` is a hardware category: remediation never cordons
on them (``diagnosis.Category``). Old bundles without ``liveness.jsonl`` give no finding here
and are analysed as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import diagnosis, failure, inflight, placement, trigger

NS: Final = 1_000_000_000
# The plugin beats every 100 ms and the agent re-reads a ring's header every 0.5 s
# (sampler.STATUS_EVERY), so a running writer's heartbeat is seen at most ~0.6 s old; 1 s is
# ten missed beats: a writer that is descheduled now and then is not silent, one that stopped
# is.
SILENT_NS: Final = NS
# A hang's onset as the trigger sees it (``TriggerResult.since_ns``) is the last progress in
# the sampled states, on the clock of another node (tens of ms apart): the culprit may have
# beaten until the next sample showed no progress, up to ``state_max_age_intervals`` sampling
# intervals later (one late or missed sample tolerated, as the trigger tolerates it), plus the
# skew. So the slack is that many *measured* intervals (``inflight.infer_interval_ns``, the
# interval the trigger's ``hang_floor_ns`` uses), never less than ``ONSET_SLACK_NS``: 1 s,
# which covers the default 0.1 s sampling with room for the skew (and so sampling up to 0.5 s
# gives 1 s as before; 2 s sampling gives 4 s). Either is far shorter than any watchdog
# (PyTorch's NCCL watchdog waits minutes) that would kill a process because of the hang.
# Picked, not from a paper (Mycroft's and CCL-D's logs have no liveness); checked on the
# hand-built rings of test_liveness.py and eval-dev (bench/accuracy.py).
ONSET_SLACK_NS: Final = NS
ONSET_SLACK_INTERVALS: Final[float] = trigger.TriggerSettings.state_max_age_intervals
# NVIDIA Xid codes that report the GPU or its links, not the application: 48 double-bit ECC,
# 61/62 internal micro-controller halt, 63/64 ECC page retirement or row remapping, 74 NVLink,
# 79 fallen off the bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120
# GSP, 140 unrecovered ECC. Application-caused ones (13, 31, 43, 45: the last is logged when a
# process with GPU work is killed) say nothing about the hardware and are left out.
HARDWARE_XIDS: Final = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
ECC_METRIC: Final = "ecc_uncorrected_errors_total"
XID_METRIC: Final = "xid"

_STATE = {name: code for code, name in enumerate(tables.LIVENESS_STATES)}


@dataclass(frozen=True)
class Seen:
    """The latest liveness row of one rank."""

    rank: int
    ts: int
    heartbeat: int | None
    state: str

    @property
    def silent_for_ns(self) -> int | None:
        return None if self.heartbeat is None else self.ts - self.heartbeat


def latest(bundle: tables.Bundle) -> dict[int, Seen]:
    """Each rank's latest liveness row (the table is sorted by rank, then time)."""
    out: dict[int, Seen] = {}
    for row in bundle.liveness:
        beat = int(row["heartbeat"])
        out[int(row["rank"])] = Seen(
            int(row["rank"]),
            int(row["ts"]),
            None if beat < 0 else beat,
            tables.LIVENESS_STATES[int(row["state"])],
        )
    return out


def onset_slack_ns(interval_ns: int) -> int:
    """How long after the trigger's stall start a silence still began with the hang (see
    ``ONSET_SLACK_NS``): ``ONSET_SLACK_INTERVALS`` sampling intervals, at least 1 s."""
    return max(ONSET_SLACK_NS, int(ONSET_SLACK_INTERVALS * interval_ns))


def analyze(
    bundle: tables.Bundle,
    hit: trigger.TriggerResult,
    *,
    where: placement.Placement,
    interval_ns: int | None = None,
) -> failure.Finding | None:
    """The finding of a hang caused by silent processes or a lost node; None otherwise.

    ``bundle`` is the whole bundle as given to the engine (its liveness rows are observations
    made when the window was pulled: their heartbeat says when each writer last beat).
    ``interval_ns``: the state sampling interval; None: measured from ``bundle``'s states
    (``inflight.infer_interval_ns``, the trigger's default when they are too few).
    """
    if hit.kind != "hang" or len(bundle.liveness) == 0:
        return None
    if interval_ns is None:
        default = int(trigger.TriggerSettings().state_interval_s * NS)
        interval_ns = inflight.infer_interval_ns(bundle, default)
    slack = onset_slack_ns(interval_ns)
    seen = latest(bundle)
    heard = [s for s in seen.values() if _heard(s)]
    silent = [s for s in seen.values() if _silent(s)]
    if silent and heard:
        onset = hit.since_ns + slack
        causes = [s for s in silent if s.heartbeat is None or s.heartbeat <= onset]
        if causes:
            later = len(silent) - len(causes)
            return _process(bundle, hit, causes, heard, later=later, at=where, slack_ns=slack)
    if not silent:
        return _lost_node(bundle, hit, seen, where, slack_ns=slack)
    return None


def _heard(s: Seen) -> bool:
    age = s.silent_for_ns
    return s.state == "running" and age is not None and age < SILENT_NS


def _silent(s: Seen) -> bool:
    if s.state in ("dead", "stopped"):
        return True
    age = s.silent_for_ns
    return s.state == "unknown" and age is not None and age >= SILENT_NS


def _process(
    bundle: tables.Bundle,
    hit: trigger.TriggerResult,
    causes: list[Seen],
    heard: list[Seen],
    *,
    later: int,
    at: placement.Placement,
    slack_ns: int,
) -> failure.Finding:
    causes.sort(key=lambda s: (s.heartbeat if s.heartbeat is not None else s.ts, s.rank))
    evidence = [_sentence(s, hit, at) for s in causes]
    evidence.append(
        f"{len(heard)} other rank(s) kept beating (heartbeat under {SILENT_NS / NS:g} s old): "
        "the hang is the silent process(es), not their NICs or GPUs, which a live process "
        "would still be driving"
    )
    if later:
        evidence.append(
            f"{later} more rank(s) fell silent more than {slack_ns / NS:g} s after the "
            "stall began: consequences of the hang, not its cause"
        )
    hardware = {s.rank: why for s in causes if (why := _gpu_fault(bundle, s, at))}
    if hardware:
        evidence += [f"{at.label(r)}: {why}" for r, why in sorted(hardware.items())]
        evidence.append("independent hardware evidence: the process died because its GPU did")
        culprits = [at.culprit(r, component="gpu", score=1.0) for r in sorted(hardware)]
        culprits += [
            at.culprit(s.rank, component="host", score=0.5)
            for s in causes
            if s.rank not in hardware
        ]
        category = diagnosis.Category.HANG_GPU
    else:
        evidence.append(
            "no hardware evidence (hardware Xid, uncorrected ECC) on the culprits' GPUs: "
            "not a hardware fault; restart the job (and look at why the process stopped: "
            "its exit status, the OOM killer, a debugger)"
        )
        culprits = [at.culprit(s.rank, component="host", score=1.0) for s in causes]
        category = diagnosis.Category.HANG_PROCESS
    # Clean evidence (the agent saw the process dead or stopped, the heartbeat dates it) is
    # near certain; a heartbeat alone (process not visible to the agent), or a silence not
    # dated, leaves room for a wedged agent view.
    clean = all(s.state in ("dead", "stopped") and s.heartbeat is not None for s in causes)
    return failure.Finding(
        category=category,
        culprits=culprits,
        evidence=evidence,
        margin=1.0 if clean else 0.6,
        coverage=min(1.0, (len(heard) + len(causes)) / max(1, bundle.job.world_size)),
    )


def _sentence(s: Seen, hit: trigger.TriggerResult, at: placement.Placement) -> str:
    what = {
        "dead": "its process is gone (killed or crashed)",
        "stopped": "its process is stopped (SIGSTOP or a debugger)",
        "unknown": "its process is not visible to the agent",
    }[s.state]
    if s.heartbeat is None:
        return f"{at.label(s.rank)}: {what}; its heartbeat is unknown"
    lead = (s.heartbeat - hit.since_ns) / NS
    when = f"{-lead:.1f} s before" if lead < 0 else f"{lead:.1f} s after"
    return (
        f"{at.label(s.rank)}: {what}; its last heartbeat was {when} the stall began "
        f"(silent for {(s.ts - s.heartbeat) / NS:.1f} s when observed)"
    )


def _gpu_fault(bundle: tables.Bundle, s: Seen, at: placement.Placement) -> str | None:
    """Hardware evidence on the GPU of ``s.rank`` up to the observation, or None."""
    info = at.by_rank.get(s.rank)
    if info is None or info.node is None or info.gpu is None or len(bundle.hw) == 0:
        return None
    node, device = bundle.string_index(info.node), bundle.string_index(f"gpu{info.gpu}")
    if node is None or device is None:
        return None
    hw = bundle.hw
    mine = hw[(hw["node"] == node) & (hw["device"] == device) & (hw["ts"] <= s.ts)]
    xid = bundle.string_index(XID_METRIC)
    if xid is not None:
        codes = {int(v) for v in mine["value"][mine["metric"] == xid]}
        bad = sorted(codes & HARDWARE_XIDS)
        if bad:
            return f"its GPU reported Xid {', '.join(map(str, bad))}"
    ecc = bundle.string_index(ECC_METRIC)
    if ecc is not None:
        counts = mine[mine["metric"] == ecc]
        if len(counts) >= 2:
            counts = counts[np.argsort(counts["ts"], kind="stable")]
            grew = float(counts["value"][-1] - counts["value"][0])
            if grew > 0:
                return f"its GPU's uncorrected ECC error count grew by {grew:g}"
    return None


def _lost_node(
    bundle: tables.Bundle,
    hit: trigger.TriggerResult,
    seen: dict[int, Seen],
    at: placement.Placement,
    *,
    slack_ns: int,
) -> failure.Finding | None:
    unreachable = {r for r, s in seen.items() if s.state == "unreachable"}
    if not unreachable or not any(_heard(s) for s in seen.values()):
        return None
    after = hit.since_ns + slack_ns
    spoke = {
        int(r)
        for t in (bundle.ops, bundle.states)
        for r in np.unique(t["rank"][t["ts"] > after]).tolist()
    }
    lost = [
        n
        for n, ranks in sorted(at.by_node.items())
        if ranks and set(ranks) <= unreachable and not set(ranks) & spoke
    ]
    if not lost:
        return None
    culprits = [at.culprit(r, component="host", score=1.0) for n in lost for r in at.ranks_on(n)]
    evidence = [
        f"node {n}: its agent did not answer and none of its {len(at.ranks_on(n))} rank(s) "
        f"({', '.join(map(str, at.ranks_on(n)))}) sent a record after the stall began"
        for n in lost
    ]
    evidence.append(
        "the other ranks are alive and beating, waiting for these: the node is lost (power, "
        "kernel, its network); its Kubernetes Node condition (Ready) and a ping settle whether "
        "the node or only its agent is down; no node is cordoned on this evidence"
    )
    return failure.Finding(
        category=diagnosis.Category.HANG_NODE,
        culprits=culprits,
        evidence=evidence,
        # The agent and the ranks are silent together: a lost node, or a lost agent beside
        # a hang on that node. Half-way between a guess and a verdict.
        margin=0.2,
        coverage=1.0,
        precision="node",
    )
