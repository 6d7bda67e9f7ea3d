"""The agent's /metrics by Prometheus conventions: counters with ``_total``, base units, one
metric per hardware quantity, ``namespace``/``pod``/``rank`` on a rank's series, ``process_*``.
Two rings of the conftest scenario (seqs 15 and 16 completed, 17 in flight) written by pod
``ml/trainer-0``, a fake hardware source giving one record of every known metric."""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import exposition
from prometheus_client.parser import text_string_to_metric_families

from collscope.nodeagent import discovery, metrics, service, settings, window
from collscope.nodeagent import sampler as ringsampler
from collscope.nodeagent.hardware import sampler, source

NODE = "gpu-node-1"


class EveryMetric(source.Source):
    """One record of each metric ``metrics.HW`` knows, an RDMA port counter, an unknown one."""

    name = "fake-all"

    def sample(self, now_ns: int) -> list[source.Reading]:
        out = [
            source.Reading("mlx5_0/1" if m.startswith("nic_") else "gpu0", m, 2.0)
            for m in metrics.HW
        ]
        out.append(source.Reading("mlx5_0/1", "rdma_out_of_sequence", 7.0))
        out.append(source.Reading("gpu0", "brand_new_metric", 1.0))
        return out


def hardware() -> sampler.Sampler:
    hw = sampler.Sampler([EveryMetric()], node=NODE, history_s=30)
    hw.sample_once()
    return hw


@pytest.fixture
def svc(tmp_path: pathlib.Path, scenario: Any) -> Iterator[service.Service]:
    trace = tmp_path / "trace"
    trace.mkdir()
    for rank in (0, 1):
        h = scenario.header[0]
        h["pid"], h["rank"], h["local_rank"], h["world_size"] = os.getpid(), rank, rank, 2
        h["pod_name"], h["pod_namespace"] = b"trainer-0", b"ml"
        scenario.write(trace / f"rank-{rank}.ring")
    config = settings.DiscoverySettings(
        mode="directory", trace_root=str(trace), rescan_interval_s=0.1
    )
    win = window.Window(window_s=30, memory_cap_bytes=32 << 20)
    loop = ringsampler.Sampler(
        discovery.Discovery(config), win, settings.SamplingSettings(sample_interval_s=0.02)
    )
    svc = service.Service(NODE, loop, hardware=hardware())
    loop.start()
    deadline = time.monotonic() + 5
    while loop.stats.ticks < 3 or len(win.completed()) < 2:
        assert time.monotonic() < deadline, "the sampler never ticked"
        time.sleep(0.02)
    yield svc
    loop.stop()


def scrape(svc: service.Service) -> dict[str, Any]:
    text = exposition.generate_latest(metrics.make_registry(svc)).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_rank_series_are_counters_labelled_by_pod(svc: service.Service) -> None:
    got = scrape(svc)
    ops = got["collscope_rank_completed_ops"]
    assert ops.type == "counter"
    pod = {"namespace": "ml", "pod": "trainer-0"}
    assert {(s.name, s.labels["rank"], s.value) for s in ops.samples} == {
        ("collscope_rank_completed_ops_total", "0", 2.0),
        ("collscope_rank_completed_ops_total", "1", 2.0),
    }
    for name in ("completed_ops", "completed_bytes", "up", "inflight_idle_seconds"):
        for s in got[f"collscope_rank_{name}"].samples:
            assert pod.items() <= s.labels.items(), (name, s.labels)
    assert got["collscope_rank_completed_bytes"].samples[0].value > 0
    # The scenario's heartbeat is at its T0, long ago: the rings are stale, not up.
    assert {s.value for s in got["collscope_rank_up"].samples} == {0.0}
    assert len(got["collscope_rank_last_completion_timestamp_seconds"].samples) == 2
    assert {s.labels["op"] for s in got["collscope_rank_inflight_idle_seconds"].samples} == {
        "AllReduce"
    }
    assert not any(
        n.endswith(("_per_second", "_rate")) for n in got if n.startswith("collscope_rank")
    )


def test_hardware_one_metric_per_quantity_in_base_units(svc: service.Service) -> None:
    got = scrape(svc)
    assert "collscope_hardware_value" not in got
    clock = got["collscope_gpu_sm_clock_hertz"]
    assert clock.type == "gauge" and clock.samples[0].value == 2e6
    assert clock.samples[0].labels == {"device": "gpu0"}
    assert got["collscope_gpu_utilization_ratio"].samples[0].value == 0.02
    assert got["collscope_nic_link_speed_bytes_per_second"].samples[0].value == 2e9 / 8
    tx = got["collscope_nic_tx_bytes"]
    assert tx.type == "counter" and tx.samples[0].name == "collscope_nic_tx_bytes_total"
    (rdma,) = got["collscope_rdma_port_counter"].samples
    assert rdma.labels == {"device": "mlx5_0/1", "counter": "out_of_sequence"}
    exported = {m.name for m in metrics.HW.values()}
    assert len(exported) == len(metrics.HW), "two records exported under one name"
    for m in metrics.HW.values():
        family = m.name.removesuffix("_total") if m.counter else m.name
        assert got[family].type == ("counter" if m.counter else "gauge"), m.name
        assert m.name.endswith("_total") == m.counter, m.name


def test_agent_and_process_metrics(svc: service.Service) -> None:
    got = scrape(svc)
    assert got["collscope_agent_ticks"].type == "counter"
    assert got["collscope_agent_window_bytes"].samples[0].value > 0
    assert "process_cpu_seconds" in got  # prometheus_client's ProcessCollector (/proc/self)
