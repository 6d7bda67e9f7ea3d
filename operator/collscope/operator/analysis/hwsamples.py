"""Hardware samples (bundle ``hw`` records, taken by the node agent through NVML and netlink)
as corroborating evidence for the comm-level verdicts.

Collective traces alone cannot always tell two endpoints apart: when the only blocked path runs
between two ranks (a pipeline send, a 2-rank DP ring), both look the same from NCCL's side. The
hardware state of each endpoint breaks the tie: a NIC whose port reports link down, a GPU
capped by a power limit, a PCIe link trained below its generation. Mycroft §5.3 leaves this step
to "further hardware inspection"; the agent has the counters, so analysis reads them.

Only samples at or before the analysis time are read (the window is cut that way already).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import placement

SW_POWER_CAP = 0x4  # NVML clocks-event reason: software power cap
HW_SLOWDOWN = 0x8 | 0x40 | 0x80  # hardware slowdown, thermal, power brake


@dataclass(frozen=True)
class Sample:
    ts: int
    device: str
    value: float


def latest(bundle: tables.Bundle, metric: str, ranks: list[int] | None) -> dict[int, Sample]:
    """The last sample of ``metric`` for each of ``ranks`` (None: every rank) that has one."""
    idx = bundle.string_index(metric)
    if idx is None or len(bundle.hw) == 0:
        return {}
    keep = bundle.hw["metric"] == idx
    if ranks is not None:
        keep &= np.isin(bundle.hw["rank"], ranks)
    hw = bundle.hw[keep]
    out: dict[int, Sample] = {}
    for row in hw[np.argsort(hw["ts"], kind="stable")]:
        out[int(row["rank"])] = Sample(
            int(row["ts"]), bundle.string(int(row["device"])), float(row["value"])
        )
    return out


def nic_down(bundle: tables.Bundle, ranks: list[int]) -> dict[int, Sample]:
    """Ranks whose NIC's last ``nic_link_up`` sample says the port is down."""
    return {r: s for r, s in latest(bundle, "nic_link_up", ranks).items() if s.value < 0.5}


def gpu_throttled(bundle: tables.Bundle, ranks: list[int]) -> dict[int, Sample]:
    """Ranks whose GPU's last clocks-event reasons include a power cap or hardware slowdown."""
    return {
        r: s
        for r, s in latest(bundle, "clocks_event_reasons", ranks).items()
        if int(s.value) & (SW_POWER_CAP | HW_SLOWDOWN)
    }


def nic_slow(bundle: tables.Bundle, ranks: list[int]) -> dict[int, Sample]:
    """Those of ``ranks`` whose NIC's last ``nic_link_speed_gbps`` is below the job's most
    common NIC speed (a link that trained down, or is limited)."""
    speeds = latest(bundle, "nic_link_speed_gbps", None)
    if len(speeds) < 2:
        return {}
    values, counts = np.unique([s.value for s in speeds.values()], return_counts=True)
    usual = float(values[np.argmax(counts)])
    return {r: s for r, s in speeds.items() if r in ranks and s.value < usual}


def nic_slow_text(slow: dict[int, Sample], where: placement.Placement) -> list[str]:
    return [
        f"{s.device} of {where.label(r)} reports a link speed of {s.value:g} Gb/s"
        for r, s in sorted(slow.items())
    ]


def nic_busy(bundle: tables.Bundle, ranks: list[int], factor: float = 2.0) -> dict[int, Sample]:
    """Those of ``ranks`` whose NIC transmits ``factor`` x the job's usual rate or more: on a
    job whose collective traffic is alike across NICs, bytes it did not send (background
    traffic, Mycroft #6). "Usual" is the lower quartile, since on a two-node job half the
    NICs may be the busy ones."""
    rates = latest(bundle, "nic_tx_bytes_per_second", None)
    if len(rates) < 2:
        return {}
    usual = float(np.percentile([s.value for s in rates.values()], 25))
    return {
        r: s for r, s in rates.items() if r in ranks and usual > 0 and s.value >= factor * usual
    }


def nic_busy_text(busy: dict[int, Sample], where: placement.Placement) -> list[str]:
    return [
        f"{s.device} of {where.label(r)} transmits {s.value / 1e9:.1f} GB/s, several times the "
        f"job's usual rate: traffic that is not this job's"
        for r, s in sorted(busy.items())
    ]


def pcie_degraded(bundle: tables.Bundle, ranks: list[int]) -> dict[int, Sample]:
    """Those of ``ranks`` whose GPU's PCIe link generation is below the job's most common one."""
    gens = latest(bundle, "pcie_link_gen", None)
    if len(gens) < 2:
        return {}
    values, counts = np.unique([s.value for s in gens.values()], return_counts=True)
    usual = float(values[np.argmax(counts)])
    return {r: s for r, s in gens.items() if r in ranks and s.value < usual}


def notes(bundle: tables.Bundle, rank: int, where: placement.Placement) -> list[str]:
    """Every hardware symptom the last samples show for ``rank``, as evidence sentences."""
    who = where.label(rank)
    out: list[str] = []
    if rank in (down := nic_down(bundle, [rank])):
        out.append(f"hardware: {down[rank].device} of {who} reports its link down")
    out += [f"hardware: {t}" for t in nic_slow_text(nic_slow(bundle, [rank]), where)]
    out += [f"hardware: {t}" for t in nic_busy_text(nic_busy(bundle, [rank]), where)]
    if rank in (hot := gpu_throttled(bundle, [rank])):
        clock = latest(bundle, "sm_clock_mhz", [rank]).get(rank)
        mhz = f", SM clock {clock.value:.0f} MHz" if clock is not None else ""
        out.append(
            f"hardware: {hot[rank].device} of {who} is throttled (clocks-event reasons "
            f"{int(hot[rank].value):#x}{mhz})"
        )
    if rank in (pcie := pcie_degraded(bundle, [rank])):
        out.append(
            f"hardware: {pcie[rank].device} of {who} runs its PCIe link at generation "
            f"{pcie[rank].value:g}, below the other GPUs'"
        )
    return out
