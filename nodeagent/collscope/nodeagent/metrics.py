"""``/metrics``: Prometheus metrics computed at scrape time from the agent's live objects.

One ``CollectorRegistry`` per agent (no import-time globals, STYLE habit 9) holding one custom
collector, so every value is read when Prometheus asks and nothing is updated on the hot path.
All names start with ``collscope_``:

- per rank: ``collscope_rank_inflight_idle_seconds{rank,comm,op}`` (the trigger's stall),
  ``collscope_rank_op_rate_per_second{rank}`` and ``collscope_rank_throughput_bytes_per_second``
  over the last ``RATE_WINDOW_S``, ``collscope_rank_up{rank}`` (1 while its ring is live);
- hardware: ``collscope_hardware_value{device,metric}``, the hardware sampler's latest record
  per GPU and NIC metric;
- the agent: rings by health, records ingested and evicted, window bytes, ring errors, events
  missed, ticks and the last tick's duration.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from prometheus_client import exposition, registry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from collscope.nodeagent import service

# Rates over 10 s: long enough to hold a few iterations of a training step, short enough that
# a rate falling to zero shows within one scrape interval of 15 s.
RATE_WINDOW_S: Final = 10.0


class Collector(registry.Collector):
    """Reads the service's state on every ``collect()``."""

    def __init__(self, svc: service.Service) -> None:
        self.svc = svc

    def collect(self) -> Iterator[Metric]:
        yield from self._ranks()
        yield from self._hardware()
        yield from self._agent()

    def _ranks(self) -> Iterator[Metric]:
        idle = GaugeMetricFamily(
            "collscope_rank_inflight_idle_seconds",
            "Time since the in-flight operation of a communicator last moved.",
            labels=["rank", "comm", "op"],
        )
        rate = GaugeMetricFamily(
            "collscope_rank_op_rate_per_second",
            f"Operations completed per second over the last {RATE_WINDOW_S:g} s.",
            labels=["rank"],
        )
        thr = GaugeMetricFamily(
            "collscope_rank_throughput_bytes_per_second",
            f"Bytes of operations completed per second over the last {RATE_WINDOW_S:g} s.",
            labels=["rank"],
        )
        up = GaugeMetricFamily(
            "collscope_rank_up", "1 while the rank's ring has a fresh heartbeat.", labels=["rank"]
        )
        for s in self.svc.summaries(None, RATE_WINDOW_S).summaries:
            r = str(s.rank)
            rate.add_metric([r], s.completed_ops / s.window_s)
            thr.add_metric([r], s.throughput_bytes_per_s)
            up.add_metric([r], 1.0 if s.health == "live" else 0.0)
            for op in s.in_flight:
                idle.add_metric([r, op.comm, op.op], op.stalled_ns / 1e9)
        yield from (idle, rate, thr, up)

    def _hardware(self) -> Iterator[Metric]:
        hw = self.svc.hardware
        if hw is None:
            return
        value = GaugeMetricFamily(
            "collscope_hardware_value",
            "Latest sample of a GPU or NIC counter (metric names: docs/spec/bundle-v1.md hw).",
            labels=["device", "metric"],
        )
        for rec in hw.latest():
            value.add_metric([rec.device, rec.metric], rec.value)
        yield value

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


def make_registry(svc: service.Service) -> registry.CollectorRegistry:
    reg = registry.CollectorRegistry(auto_describe=False)
    reg.register(Collector(svc))
    return reg


def render(reg: registry.CollectorRegistry) -> tuple[bytes, str]:
    """The text exposition and its content type."""
    return exposition.generate_latest(reg), exposition.CONTENT_TYPE_LATEST
