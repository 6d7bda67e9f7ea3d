"""``/metrics``: Prometheus metrics computed at scrape time from the agent's live objects.

One ``CollectorRegistry`` per agent (no import-time globals, STYLE habit 9) holding our collector
and prometheus_client's ``ProcessCollector`` (``process_cpu_seconds_total``,
``process_resident_memory_bytes``, ...). Values are read when Prometheus asks; the only work on
the ingest path is the window's per-rank completion totals (two integer additions per chunk).

Conventions (https://prometheus.io/docs/practices/naming/): what counts is a counter ending in
``_total`` (rates are PromQL's ``rate()``, never a gauge of ours), base units in the name
(seconds, bytes, hertz, watts, celsius, ratios 0..1), one metric per quantity. A series that
belongs to a workload carries ``namespace`` and ``pod`` (the ring's writer, from the downward
API the webhook injects) and ``rank``. Every name starts with ``collscope_``:

- per rank: ``collscope_rank_completed_ops_total``, ``collscope_rank_completed_bytes_total``,
  ``collscope_rank_last_completion_timestamp_seconds``, ``collscope_rank_up`` (1 while its ring
  has a fresh heartbeat), ``collscope_rank_inflight_idle_seconds{comm,op}`` (the trigger's
  stall);
- hardware: one metric per quantity (``HW``), labelled by ``device`` (``gpu0``, ``mlx5_0/1``,
  ``eth0``), from the hardware sampler's latest record; the driver's own RDMA port counters, a
  set that varies by NIC and firmware, as ``collscope_rdma_port_counter_total{device,counter}``;
- the agent: rings by health, records ingested and evicted, window bytes, ring errors, events
  missed, ticks and the last tick's duration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Final

from prometheus_client import exposition, process_collector, registry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from collscope.nodeagent import service

# In-flight operations come from the latest state sample; the summary window only has to hold
# it (the service adds two sampling periods of slack), so the shortest window does.
INFLIGHT_WINDOW_S: Final = 1.0
RANK_LABELS: Final = ["namespace", "pod", "rank"]


@dataclasses.dataclass(frozen=True, slots=True)
class HwMetric:
    """How one hardware record ``metric`` (docs/spec/bundle-v1.md ``hw``) is exported."""

    name: str
    doc: str
    counter: bool = False
    scale: float = 1.0  # record value * scale = the exported value, in base units


def _gpu(name: str, doc: str, *, counter: bool = False, scale: float = 1.0) -> HwMetric:
    return HwMetric(f"collscope_gpu_{name}", doc, counter, scale)


def _nic(name: str, doc: str, *, counter: bool = False, scale: float = 1.0) -> HwMetric:
    return HwMetric(f"collscope_nic_{name}", doc, counter, scale)


# Record metric -> exported metric. Rates the sampler derives from a counter
# (``*_bytes_per_second`` of NICs and NVLink) are left out: rate() the counter. A record not
# listed here is not exported.
HW: Final[dict[str, HwMetric]] = {
    "sm_clock_mhz": _gpu("sm_clock_hertz", "SM clock.", scale=1e6),
    "gpu_utilization_percent": _gpu(
        "utilization_ratio", "Share of time a kernel ran (NVML), 0..1.", scale=0.01
    ),
    "memory_utilization_percent": _gpu(
        "memory_utilization_ratio", "Share of time memory was read or written, 0..1.", scale=0.01
    ),
    "power_watts": _gpu("power_watts", "Power draw."),
    "temperature_celsius": _gpu("temperature_celsius", "GPU die temperature."),
    "clocks_event_reasons": _gpu(
        "clocks_event_reasons", "NVML clocks event (throttle) reasons bitmask; 0: none."
    ),
    "pcie_tx_bytes_per_second": _gpu(
        "pcie_tx_bytes_per_second", "PCIe transmit throughput (NVML gives a rate, no counter)."
    ),
    "pcie_rx_bytes_per_second": _gpu(
        "pcie_rx_bytes_per_second", "PCIe receive throughput (NVML gives a rate, no counter)."
    ),
    "pcie_link_gen": _gpu("pcie_link_generation", "Current PCIe link generation."),
    "pcie_link_gen_max": _gpu("pcie_link_generation_max", "Maximum PCIe link generation."),
    "pcie_link_width": _gpu("pcie_link_width_lanes", "Current PCIe link width."),
    "pcie_link_width_max": _gpu("pcie_link_width_max_lanes", "Maximum PCIe link width."),
    "nvlink_tx_bytes_total": _gpu("nvlink_tx_bytes_total", "NVLink bytes sent.", counter=True),
    "nvlink_rx_bytes_total": _gpu("nvlink_rx_bytes_total", "NVLink bytes received.", counter=True),
    "ecc_corrected_errors_total": _gpu(
        "ecc_corrected_errors_total", "Corrected ECC errors (volatile).", counter=True
    ),
    "ecc_uncorrected_errors_total": _gpu(
        "ecc_uncorrected_errors_total", "Uncorrected ECC errors (volatile).", counter=True
    ),
    "xid_events_total": _gpu("xid_events_total", "Xid events seen by the agent.", counter=True),
    "xid": _gpu("last_xid", "Code of the latest Xid event seen in the last sample."),
    "gpu_lost": _gpu("lost", "1 when NVML reports the GPU lost (fallen off the bus)."),
    "nic_tx_bytes_total": _nic("tx_bytes_total", "Bytes sent.", counter=True),
    "nic_rx_bytes_total": _nic("rx_bytes_total", "Bytes received.", counter=True),
    "nic_tx_packets_total": _nic("tx_packets_total", "Packets sent.", counter=True),
    "nic_rx_packets_total": _nic("rx_packets_total", "Packets received.", counter=True),
    "nic_tx_errors_total": _nic("tx_errors_total", "Transmit errors.", counter=True),
    "nic_rx_errors_total": _nic("rx_errors_total", "Receive errors.", counter=True),
    "nic_tx_dropped_total": _nic("tx_dropped_total", "Packets dropped on send.", counter=True),
    "nic_rx_dropped_total": _nic("rx_dropped_total", "Packets dropped on receive.", counter=True),
    "nic_link_up": _nic("link_up", "1 while the link (or RDMA port) is up."),
    "nic_link_speed_gbps": _nic("link_speed_bytes_per_second", "Link speed.", scale=1e9 / 8),
}
RDMA_PREFIX: Final = "rdma_"


class Collector(registry.Collector):
    """Reads the service's state on every ``collect()``."""

    def __init__(self, svc: service.Service) -> None:
        self.svc = svc

    def collect(self) -> Iterator[Metric]:
        yield from self._ranks()
        yield from self._hardware()
        yield from self._agent()

    def _ranks(self) -> Iterator[Metric]:
        # Keys are (workload, rank), the workload being the ring's pod uid (discovery.py); the
        # labels name that pod as its writer states it (downward API). Only keys of rings the
        # sampler still tracks are exported: a finished pod's series end with it.
        pods: dict[str, tuple[str, str]] = {}
        live: dict[tuple[str, int], bool] = {}
        for t in self.svc.sampler.rings():
            i = t.identity
            if i is None or i.rank is None:
                continue
            if t.health == "live" or t.workload not in pods:
                pods[t.workload] = (i.pod_namespace, i.pod_name)
            key = (t.workload, i.rank)
            live[key] = live.get(key, False) or t.health == "live"

        def labels(workload: str, rank: int) -> list[str]:
            ns, pod = pods.get(workload, ("", ""))
            return [ns, pod, str(rank)]

        ops = CounterMetricFamily(
            "collscope_rank_completed_ops",
            "Collective and point-to-point operations completed.",
            labels=RANK_LABELS,
        )
        nbytes = CounterMetricFamily(
            "collscope_rank_completed_bytes",
            "Bytes of the operations completed (NCCL's count times the type's size).",
            labels=RANK_LABELS,
        )
        for (w, r), (n, b) in sorted(self.svc.window.completed().items()):
            if (w, r) in live:
                ops.add_metric(labels(w, r), n)
                nbytes.add_metric(labels(w, r), b)
        last = GaugeMetricFamily(
            "collscope_rank_last_completion_timestamp_seconds",
            "Unix time the rank's latest operation completed.",
            labels=RANK_LABELS,
        )
        up = GaugeMetricFamily(
            "collscope_rank_up",
            "1 while the rank's ring has a fresh heartbeat.",
            labels=RANK_LABELS,
        )
        for (w, r), is_live in sorted(live.items()):
            up.add_metric(labels(w, r), 1.0 if is_live else 0.0)
            end = self.svc.window.last_completion(r, w)
            if end is not None:
                last.add_metric(labels(w, r), end / 1e9)
        idle = GaugeMetricFamily(
            "collscope_rank_inflight_idle_seconds",
            "Time since the in-flight operation of a communicator last moved.",
            labels=[*RANK_LABELS, "comm", "op"],
        )
        for s in self.svc.summaries(None, INFLIGHT_WINDOW_S).summaries:
            who = labels(s.workload or "", s.rank)
            for op in s.in_flight:
                idle.add_metric([*who, op.comm, op.op], op.stalled_ns / 1e9)
        yield from (ops, nbytes, last, up, idle)

    def _hardware(self) -> Iterator[Metric]:
        hw = self.svc.hardware
        if hw is None:
            return
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        rdma = CounterMetricFamily(
            "collscope_rdma_port_counter",
            "An RDMA port's own counter (sysfs counters/ and hw_counters/), by file name.",
            labels=["device", "counter"],
        )
        seen: set[tuple[str, str]] = set()
        for rec in reversed(hw.latest()):  # the latest of repeated records (xid) wins
            if (rec.device, rec.metric) in seen:
                continue
            seen.add((rec.device, rec.metric))
            if rec.metric.startswith(RDMA_PREFIX):
                rdma.add_metric([rec.device, rec.metric.removeprefix(RDMA_PREFIX)], rec.value)
                continue
            m = HW.get(rec.metric)
            if m is None:
                continue
            fam = families.get(m.name)
            if fam is None:
                if m.counter:
                    name = m.name.removesuffix("_total")
                    fam = CounterMetricFamily(name, m.doc, labels=["device"])
                else:
                    fam = GaugeMetricFamily(m.name, m.doc, labels=["device"])
                families[m.name] = fam
            fam.add_metric([rec.device], rec.value * m.scale)
        for name in sorted(families):
            yield families[name]
        if rdma.samples:
            yield rdma

    def _agent(self) -> Iterator[Metric]:
        rings = GaugeMetricFamily(
            "collscope_agent_rings", "Ring files known, by health.", labels=["health"]
        )
        by: dict[str, int] = {}
        for t in self.svc.sampler.rings():
            by[t.health] = by.get(t.health, 0) + 1
        for h, n in sorted(by.items()):
            rings.add_metric([h], n)
        yield rings
        c = self.svc.window.counters
        st = self.svc.sampler.stats
        ingested = CounterMetricFamily(
            "collscope_agent_records_ingested",
            "Rows taken into the window: state records, their flows, op records.",
            labels=["kind"],
        )
        for kind, n in (("state", c.states), ("flow", c.flows), ("op", c.ops)):
            ingested.add_metric([kind], n)
        yield ingested
        for name, doc, n in (
            (
                "evicted_records",
                "Records dropped from the window (age, memory).",
                c.evicted_records,
            ),
            ("evicted_bytes", "Estimated bytes dropped from the window.", c.evicted_bytes),
            ("evictions_for_memory", "Chunks dropped for the memory cap.", c.evicted_for_memory),
            ("ring_errors", "Ring files found unreadable (corrupt, truncated).", st.ring_errors),
            ("events_missed", "Ring records overwritten before read.", st.events_missed),
            ("ticks", "Sampling ticks run.", st.ticks),
            ("loop_errors", "Sampling ticks that failed (a bug: see the log).", st.loop_errors),
        ):
            yield CounterMetricFamily(f"collscope_agent_{name}", doc, value=n)
        yield GaugeMetricFamily(
            "collscope_agent_window_bytes",
            "Estimated bytes held by the window.",
            value=self.svc.window.nbytes,
        )
        yield GaugeMetricFamily(
            "collscope_agent_sample_duration_seconds",
            "Duration of the last sampling tick.",
            value=st.last_duration_s,
        )


def make_registry(svc: service.Service, *, process: bool = True) -> registry.CollectorRegistry:
    """The agent's registry; ``process``: also prometheus_client's ``process_*`` metrics of
    this process (``/proc/self``; absent where there is no procfs)."""
    reg = registry.CollectorRegistry(auto_describe=False)
    reg.register(Collector(svc))
    if process:
        process_collector.ProcessCollector(registry=reg)
    return reg


def render(reg: registry.CollectorRegistry) -> tuple[bytes, str]:
    """The text exposition and its content type."""
    return exposition.generate_latest(reg), exposition.CONTENT_TYPE_LATEST
