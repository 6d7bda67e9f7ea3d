"""Confirmation of a hardware verdict before any node mark (issue 14): corroboration by the
culprit device's own hardware samples, then persistence on a re-check.

A verdict drawn from collective traces alone names a rank whose collectives stall; it cannot
tell a failing GPU from a process that died, nor a bad NIC from another tenant's traffic. The
node agent samples the hardware independently of those traces (``hw`` records of
docs/spec/bundle-v1.md: NVML, netlink, RDMA sysfs), so a mark needs both:

1. *corroboration* (``judge``): over the window of the Diagnosis, a **fault** symptom on the
   culprit's device (GPU ``gpu<i>``, or its NIC for a ``nic``/``link`` culprit);
2. *persistence* (``recheck``): after ``policy.RemediationPolicy.confirm_delay_s``, the same
   symptom on the same device still holds, judged on hardware samples only since the job may
   have restarted or moved meanwhile.

Fault symptoms (what a healthy device under any load does not show):

- GPU: lost (``gpu_lost``); an XID of the hardware kind (``HARDWARE_XIDS``: not 13/31/43/45,
  which a crashing or killed application causes); uncorrected ECC errors; clocks-event reasons
  with a hardware slowdown, thermal or power-brake bit; a software power cap holding its SM
  clock well below the node's other GPUs' (a lowered limit; a busy GPU at its TDP runs as fast
  as its busy peers); a PCIe link narrower than its maximum,
  or at a lower generation than its maximum while another GPU of the node runs at its own
  (an idle GPU lowers its generation to save power, so a lone GPU is not judged by it);
- NIC: link down; a link speed below its own earlier sample in the window or below the node's
  usual NIC speed; error counters rising (``ERROR_COUNTERS``, each with its own threshold).

Load symptoms (``kind == "load"``) explain a slowdown without a faulty device: a NIC sending
several times what the node's other NICs send (traffic that is not the job's), a GPU at its
software power cap running as fast as its peers (what a busy GPU does). A verdict with load
symptoms and no fault is tenant contention: never a mark.

Persistence of an XID: the ones whose documented recovery is a GPU reset or a reboot
(``STICKY_XIDS``) hold while the agent still counts them (``xid_events_total`` above 0 in the
re-check's samples: no reset, no agent restart in between); the others only if one comes again.

The culprit's device: ``gpu`` (index) and ``nic`` from job.json's device map when known; when
not, the node's only device of that kind, if it has exactly one; otherwise the verdict cannot
be corroborated (a device of the node no rank of the job uses is never evidence).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from collscope.nodeagent.bundle import models
from collscope.operator.analysis import diagnosis

# XIDs that name the hardware (NVIDIA's XID catalogue): 48 double-bit ECC, 61/62 internal
# micro-controller, 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92 high single-bit
# ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP, 140 unrecovered ECC. Left out on
# purpose: 13 (graphics engine exception), 31 (MMU fault), 43 (reset channel), 45 (preemptive
# cleanup: what killing a CUDA process leaves), all caused by applications.
HARDWARE_XIDS: Final = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
# Of those, the XIDs NVIDIA documents as needing a GPU reset or a node reboot to clear.
STICKY_XIDS: Final = frozenset({48, 62, 79, 95, 119, 120, 140})
# A power-capped GPU whose SM clock is below this share of its node's other GPUs' median runs
# under a lowered limit, not at a busy GPU's TDP (the one-box cap: 1100 of 1980 MHz).
CAPPED_CLOCK_SHARE: Final = 0.8
SW_POWER_CAP: Final = 0x4  # NVML clocks-event reason bits (nvml.h)
HW_SLOWDOWN: Final = 0x8 | 0x40 | 0x80  # hardware slowdown, hardware thermal, power brake
# Error counters and how much one must rise within a window to be a fault. A link that went
# down and up, or had to recover, is one event too many; receive/symbol errors come in small
# numbers on healthy links under load (a few per hour), so a burst of 10 within the window is
# the bar (NVSentinel's and DCGM's health checks also watch rates, not single errors).
ERROR_COUNTERS: Final = {
    "rdma_link_downed": 1.0,
    "rdma_link_error_recovery": 1.0,
    "rdma_symbol_error": 10.0,
    "rdma_port_rcv_errors": 10.0,
    "rdma_local_link_integrity_errors": 10.0,
    "rdma_excessive_buffer_overrun_errors": 10.0,
    "nic_rx_errors_total": 10.0,
    "nic_tx_errors_total": 10.0,
}
# A NIC sending this many times what the node's other NICs send (their lower quartile) carries
# traffic that is not the job's: a job's collective traffic is alike across its NICs
# (analysis.hwsamples.nic_busy uses the same factor).
BUSY_FACTOR: Final = 2.0
_GPU = re.compile(r"gpu(\d+)")

Kind = Literal["fault", "load"]
Reason = Literal[
    "Corroborated", "NoHardwareSamples", "DeviceUnresolved", "NotCorroborated",
    "TenantContention", "Persistent", "NotPersistent",
]  # fmt: skip


@dataclass(frozen=True)
class Symptom:
    """One observation on one device; ``key`` identifies the rule (persistence compares it)."""

    device: str
    key: str
    kind: Kind
    text: str


@dataclass(frozen=True)
class Finding:
    """What the samples say about the culprit's device(s)."""

    reason: Reason
    message: str
    devices: tuple[str, ...] = ()
    symptoms: tuple[Symptom, ...] = ()

    @property
    def faults(self) -> tuple[Symptom, ...]:
        return tuple(s for s in self.symptoms if s.kind == "fault")

    @property
    def holds(self) -> bool:
        """Corroborated (first check) or persistent (re-check)."""
        return self.reason in ("Corroborated", "Persistent")


def is_gpu(device: str) -> bool:
    return _GPU.fullmatch(device) is not None


def _port(name: str) -> tuple[str, str | None]:
    """``mlx5_0/1`` (agent), ``mlx5_0:1`` (NCCL_IB_HCA) -> (``mlx5_0``, ``1``)."""
    for sep in ("/", ":"):
        if sep in name:
            hca, port = name.split(sep, 1)
            return hca, port
    return name, None


def _nic_matches(device: str, nic: str) -> bool:
    hca, port = _port(device)
    want_hca, want_port = _port(nic)
    return hca == want_hca and (port is None or want_port is None or port == want_port)


def devices_of(culprit: diagnosis.Culprit, sampled: Iterable[str]) -> tuple[tuple[str, ...], str]:
    """The sampled devices that are the culprit's, or () and why not."""
    names = sorted(set(sampled))
    if culprit.component == "gpu":
        kind = [d for d in names if is_gpu(d)]
        if culprit.gpu is not None:
            mine = [d for d in kind if d == f"gpu{culprit.gpu}"]
            return tuple(mine), "" if mine else f"no samples of gpu{culprit.gpu}"
        what = "GPU"
    else:
        kind = [d for d in names if not is_gpu(d)]
        if culprit.nic is not None:
            mine = [d for d in kind if _nic_matches(d, culprit.nic)]
            return tuple(mine), "" if mine else f"no samples of NIC {culprit.nic}"
        what = "NIC"
    if len(kind) == 1:
        return tuple(kind), ""
    return (), (
        f"the culprit's {what} is not known (device map unresolved) and the node has "
        f"{len(kind)} {what}s sampled"
    )


def _series(records: Iterable[models.HwRecord]) -> dict[tuple[str, str], list[float]]:
    """(device, metric) -> values in time order."""
    out: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for r in records:
        out[(r.device, r.metric)].append((r.ts, r.value))
    return {k: [v for _, v in sorted(vs)] for k, vs in out.items()}


def _most_common(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    return max(sorted(set(values)), key=values.count)


def symptoms(records: Sequence[models.HwRecord], devices: Iterable[str]) -> list[Symptom]:
    """Every fault and load symptom the ``records`` (one node's) show on ``devices``."""
    s = _series(records)
    gpus = sorted({d for d, _ in s if is_gpu(d)})
    nics = sorted({d for d, m in s if not is_gpu(d) and m.startswith(("nic_", "rdma_"))})
    out: list[Symptom] = []
    for dev in devices:
        out += _gpu(dev, s, gpus) if is_gpu(dev) else _nic(dev, s, nics)
    return out


def _last(s: dict[tuple[str, str], list[float]], dev: str, metric: str) -> float | None:
    values = s.get((dev, metric))
    return values[-1] if values else None


def _gpu(dev: str, s: dict[tuple[str, str], list[float]], gpus: list[str]) -> list[Symptom]:
    out: list[Symptom] = []
    if s.get((dev, "gpu_lost")):
        out.append(Symptom(dev, "gpu_lost", "fault", f"{dev} is lost (fell off the bus)"))
    xids = sorted({int(v) for v in s.get((dev, "xid"), []) if int(v) in HARDWARE_XIDS})
    if xids:
        key = "xid_sticky" if set(xids) & STICKY_XIDS else "xid"
        out.append(Symptom(dev, key, "fault", f"{dev} reported XID {', '.join(map(str, xids))}"))
    ecc = _last(s, dev, "ecc_uncorrected_errors_total")
    if ecc is not None and ecc > 0:
        out.append(Symptom(dev, "ecc", "fault", f"{dev} has {ecc:g} uncorrected ECC errors"))
    reasons = _last(s, dev, "clocks_event_reasons")
    if reasons is not None and int(reasons) & HW_SLOWDOWN:
        text = f"{dev} is slowed by hardware (clocks-event reasons {int(reasons):#x})"
        out.append(Symptom(dev, "hw_slowdown", "fault", text))
    elif reasons is not None and int(reasons) & SW_POWER_CAP:
        clock = _last(s, dev, "sm_clock_mhz")
        peers = sorted(c for g in gpus if g != dev and (c := _last(s, g, "sm_clock_mhz")))
        usual = peers[len(peers) // 2] if peers else None
        if clock is not None and usual is not None and clock < CAPPED_CLOCK_SHARE * usual:
            text = (
                f"{dev} is held at its software power cap, SM clock {clock:g} MHz against "
                f"{usual:g} MHz on the node's other GPUs: a lowered power limit"
            )
            out.append(Symptom(dev, "power_capped", "fault", text))
        else:
            text = f"{dev} runs at its software power cap (reasons {int(reasons):#x}) as fast "
            out.append(Symptom(dev, "power_cap", "load", text + "as its peers: load"))
    width, width_max = _last(s, dev, "pcie_link_width"), _last(s, dev, "pcie_link_width_max")
    if width is not None and width_max is not None and width < width_max:
        text = f"{dev} runs its PCIe link at x{width:g} of x{width_max:g}"
        out.append(Symptom(dev, "pcie_width", "fault", text))
    gen, gen_max = _last(s, dev, "pcie_link_gen"), _last(s, dev, "pcie_link_gen_max")
    peers_at_max = any(
        _last(s, g, "pcie_link_gen") is not None
        and _last(s, g, "pcie_link_gen") == _last(s, g, "pcie_link_gen_max")
        for g in gpus
        if g != dev
    )
    if gen is not None and gen_max is not None and gen < gen_max and peers_at_max:
        text = f"{dev} runs its PCIe link at generation {gen:g} of {gen_max:g}, below its peers"
        out.append(Symptom(dev, "pcie_gen", "fault", text))
    return out


def _nic(dev: str, s: dict[tuple[str, str], list[float]], nics: list[str]) -> list[Symptom]:
    out: list[Symptom] = []
    up = _last(s, dev, "nic_link_up")
    if up is not None and up < 0.5:
        out.append(Symptom(dev, "link_down", "fault", f"{dev} reports its link down"))
    speeds = s.get((dev, "nic_link_speed_gbps")) or []
    usual = _most_common([v for n in nics if (v := _last(s, n, "nic_link_speed_gbps"))])
    if speeds and (speeds[-1] < max(speeds) or (usual is not None and speeds[-1] < usual)):
        ref = max(*speeds, usual or 0.0)
        text = f"{dev} reports a link speed of {speeds[-1]:g} Gb/s (was or usual: {ref:g})"
        out.append(Symptom(dev, "link_speed", "fault", text))
    for metric, bar in ERROR_COUNTERS.items():
        values = s.get((dev, metric)) or []
        rise = values[-1] - values[0] if len(values) >= 2 else 0.0
        if rise >= bar:
            text = f"{dev}: {metric} rose by {rise:g} within the window"
            out.append(Symptom(dev, metric, "fault", text))
    rate = _last(s, dev, "nic_tx_bytes_per_second")
    others = sorted(
        v for n in nics if n != dev and (v := _last(s, n, "nic_tx_bytes_per_second")) is not None
    )
    if rate is not None and others:
        usual_rate = others[len(others) // 4]  # lower quartile
        if usual_rate > 0 and rate >= BUSY_FACTOR * usual_rate:
            text = (
                f"{dev} transmits {rate / 1e9:.1f} GB/s, {rate / usual_rate:.1f}x the node's "
                f"other NICs: traffic that is not this job's"
            )
            out.append(Symptom(dev, "busy", "load", text))
    return out


def judge(
    culprit: diagnosis.Culprit,
    records: Sequence[models.HwRecord],
    *,
    node_wide: bool = False,
) -> Finding:
    """Corroboration of a verdict naming ``culprit`` by its node's ``records`` over the
    Diagnosis window. ``node_wide``: the verdict implicates several ranks of the node alike
    (a node-level slowdown, what another tenant's load produces)."""
    if not records:
        return Finding("NoHardwareSamples", "the culprit node's agent gave no hardware samples")
    devices, why = devices_of(culprit, {r.device for r in records})
    if not devices:
        return Finding("DeviceUnresolved", why)
    found = tuple(symptoms(records, devices))
    faults = [x.text for x in found if x.kind == "fault"]
    loads = [x.text for x in found if x.kind == "load"]
    where = ", ".join(devices)
    if faults:
        return Finding("Corroborated", "; ".join(faults), devices, found)
    if loads or node_wide:
        why = "; ".join(loads) or (
            "the slowdown covers several ranks of the node alike and its hardware is healthy"
        )
        return Finding("TenantContention", f"load, not a fault, on {where}: {why}", devices, found)
    return Finding(
        "NotCorroborated",
        f"the hardware samples of {where} show no fault (link, speed, errors, XID, ECC, "
        f"clocks, PCIe)",
        devices,
        found,
    )


def recheck(first: Sequence[Symptom], records: Sequence[models.HwRecord]) -> Finding:
    """Whether a fault of ``first`` (the corroborating symptoms) still holds in ``records``
    (the node's samples since the first check). An XID or an error burst holds only when it
    happened again since; a state (link down, a narrow PCIe link, ECC count) while it lasts."""
    devices = tuple(sorted({x.device for x in first if x.kind == "fault"}))
    wanted = {(x.device, x.key) for x in first if x.kind == "fault"}
    if not records:
        return Finding("NotPersistent", "no hardware samples at the re-check", devices)
    now = [x for x in symptoms(records, devices) if (x.device, x.key) in wanted]
    s = _series(records)
    for x in first:
        counted = (s.get((x.device, "xid_events_total")) or [0.0])[-1]
        seen = {(n.device, n.key) for n in now}
        if (
            x.key == "xid_sticky"
            and x.kind == "fault"
            and counted > 0
            and ((x.device, x.key) not in seen)
        ):
            text = f"{x.text}, not cleared since (no GPU reset: {counted:g} XIDs counted)"
            now.append(Symptom(x.device, x.key, "fault", text))
    if now:
        return Finding("Persistent", "; ".join(x.text for x in now), devices, tuple(now))
    gone = "; ".join(x.text for x in first if x.kind == "fault")
    return Finding("NotPersistent", f"no longer seen at the re-check: {gone}", devices)
