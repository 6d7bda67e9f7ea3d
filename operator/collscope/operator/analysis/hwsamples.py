"""Hardware samples (bundle ``hw`` records, taken by the node agent through NVML and netlink)
as corroborating evidence for the comm-level verdicts.

Collective traces alone cannot always tell two endpoints apart: when the only blocked path runs
between two ranks (a pipeline send, a 2-rank DP ring), both look the same from NCCL's side. The
hardware state of each endpoint breaks the tie: a NIC whose port reports link down, a GPU
capped by a power limit, a PCIe link trained below its generation. Mycroft §5.3 leaves this step
to "further hardware inspection"; the agent has the counters, so analysis reads them.

A sample belongs to a device of a node, not to a rank (the agent writes its records with rank 0
and leaves the mapping to whoever knows it), so samples are joined to ranks through job.json's
``ranks[]`` only, by device, never by the record's ``rank``:

- ``gpu<i>`` on node N: the ranks with ``node == N`` and ``gpu == i``;
- a NIC on node N: the ranks with ``node == N`` whose ``nic`` names it. The agent names an RDMA
  port ``mlx5_0/1`` (HCA/port), NCCL_IB_HCA spells it ``mlx5_0:1``, job.json may give the HCA
  alone (``mlx5_0``: NCCL then uses its ports, so any of them is the rank's); netlink names an
  interface (``ib0``, ``eth2``), which matches a job.json ``nic`` of the same name only.

A device no rank of the job uses (a spare NIC that is down, another tenant's GPU) is never
evidence, and the job-wide "usual" values (speed, rate, PCIe generation) are taken over the
devices the job uses, each device once however many ranks share it.

Only samples at or before the analysis time are read (the window is cut that way already).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import placement

SW_POWER_CAP = 0x4  # NVML clocks-event reason: software power cap
HW_SLOWDOWN = 0x8 | 0x40 | 0x80  # hardware slowdown, thermal, power brake
_GPU = re.compile(r"gpu(\d+)")


@dataclass(frozen=True)
class Sample:
    ts: int
    node: str
    device: str
    value: float


def _port(name: str) -> tuple[str, str | None]:
    """``mlx5_0/1`` (agent), ``mlx5_0:1`` (NCCL) -> (``mlx5_0``, ``1``); ``mlx5_0``: no port."""
    for sep in ("/", ":"):
        if sep in name:
            hca, port = name.split(sep, 1)
            return hca, port
    return name, None


@dataclass(frozen=True)
class Devices:
    """Which ranks of the job use each device, from job.json ``ranks[]`` (node, gpu, nic)."""

    gpus: dict[tuple[str, int], tuple[int, ...]]
    nics: dict[tuple[str, str], tuple[tuple[str | None, int], ...]]  # (node, HCA) -> (port, rank)

    @classmethod
    def of(cls, job: models.Job) -> Devices:
        gpus: dict[tuple[str, int], list[int]] = defaultdict(list)
        nics: dict[tuple[str, str], list[tuple[str | None, int]]] = defaultdict(list)
        for r in job.ranks:
            if r.node is None:
                continue  # a device is known by its node: without one, nothing joins
            if r.gpu is not None:
                gpus[(r.node, r.gpu)].append(r.rank)
            if r.nic is not None:
                hca, port = _port(r.nic)
                nics[(r.node, hca)].append((port, r.rank))
        return cls(
            gpus={k: tuple(sorted(v)) for k, v in gpus.items()},
            nics={k: tuple(sorted(v, key=lambda pr: pr[1])) for k, v in nics.items()},
        )

    def users(self, node: str, device: str) -> tuple[int, ...]:
        """Ranks of the job that use ``device`` of ``node`` (empty: none, not evidence)."""
        m = _GPU.fullmatch(device)
        if m is not None:
            return self.gpus.get((node, int(m.group(1))), ())
        hca, port = _port(device)
        return tuple(
            r for p, r in self.nics.get((node, hca), ()) if p is None or port is None or p == port
        )


def _devices(bundle: tables.Bundle, metric: str) -> list[tuple[Sample, tuple[int, ...]]]:
    """The last sample of ``metric`` of every device some rank of the job uses, with its users."""
    idx = bundle.string_index(metric)
    if idx is None or len(bundle.hw) == 0:
        return []
    hw = bundle.hw[bundle.hw["metric"] == idx]
    if len(hw) == 0:
        return []
    hw = hw[np.lexsort((hw["ts"], hw["device"], hw["node"]))]
    # The last row of each (node, device) run: its latest sample.
    last = np.r_[
        (hw["node"][1:] != hw["node"][:-1]) | (hw["device"][1:] != hw["device"][:-1]), True
    ]
    dev = Devices.of(bundle.job)
    out = []
    for row in hw[last]:
        s = Sample(
            int(row["ts"]),
            bundle.string(int(row["node"])),
            bundle.string(int(row["device"])),
            float(row["value"]),
        )
        users = dev.users(s.node, s.device)
        if users:
            out.append((s, users))
    return out


def latest(bundle: tables.Bundle, metric: str, ranks: list[int] | None) -> dict[int, Sample]:
    """The last sample of ``metric`` of the device each of ``ranks`` (None: every rank) uses,
    for those whose device has one. When a rank matches several devices (job.json names an HCA,
    the agent samples each of its ports), the latest sample wins."""
    want = None if ranks is None else set(ranks)
    out: dict[int, Sample] = {}
    for s, users in sorted(_devices(bundle, metric), key=lambda su: su[0].ts):
        for r in users:
            if want is None or r in want:
                out[r] = s
    return out


def nic_down(bundle: tables.Bundle, ranks: list[int]) -> dict[int, Sample]:
    """Those of ``ranks`` whose NIC (a port of it, when job.json names the HCA alone) says down
    in its last ``nic_link_up`` sample."""
    want = set(ranks)
    out: dict[int, Sample] = {}
    for s, users in _devices(bundle, "nic_link_up"):
        if s.value < 0.5:
            out.update({r: s for r in users if r in want and r not in out})
    return out


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
    usual = _usual(bundle, "nic_link_speed_gbps")
    if usual is None:
        return {}
    speeds = latest(bundle, "nic_link_speed_gbps", ranks)
    return {r: s for r, s in speeds.items() if s.value < usual}


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
    rates = [s.value for s, _ in _devices(bundle, "nic_tx_bytes_per_second")]
    if len(rates) < 2:
        return {}
    usual = float(np.percentile(rates, 25))
    return {
        r: s
        for r, s in latest(bundle, "nic_tx_bytes_per_second", ranks).items()
        if usual > 0 and s.value >= factor * usual
    }


def nic_busy_text(busy: dict[int, Sample], where: placement.Placement) -> list[str]:
    return [
        f"{s.device} of {where.label(r)} transmits {s.value / 1e9:.1f} GB/s, several times the "
        f"job's usual rate: traffic that is not this job's"
        for r, s in sorted(busy.items())
    ]


def pcie_degraded(bundle: tables.Bundle, ranks: list[int]) -> dict[int, Sample]:
    """Those of ``ranks`` whose GPU's PCIe link generation is below the job's most common one."""
    usual = _usual(bundle, "pcie_link_gen")
    if usual is None:
        return {}
    return {r: s for r, s in latest(bundle, "pcie_link_gen", ranks).items() if s.value < usual}


def _usual(bundle: tables.Bundle, metric: str) -> float | None:
    """The most common last value of ``metric`` over the job's devices (None: fewer than 2)."""
    values = [s.value for s, _ in _devices(bundle, metric)]
    if len(values) < 2:
        return None
    uniq, counts = np.unique(values, return_counts=True)
    return float(uniq[np.argmax(counts)])


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
