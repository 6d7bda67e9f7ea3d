"""RDMA port counters from a sysfs tree laid out as the kernel's ib_core exports it."""

from __future__ import annotations

import pathlib

import pytest

from collscope.nodeagent import errors
from collscope.nodeagent.hardware import rdma, source

T0 = 1_732_001_234_000_000_000


def port(
    root: pathlib.Path,
    hca: str,
    n: int,
    *,
    state: str = "4: ACTIVE",
    rate: str = "400 Gb/sec (4X NDR)",
    counters: dict[str, str] | None = None,
    hw: dict[str, str] | None = None,
) -> pathlib.Path:
    d = root / "class" / "infiniband" / hca / "ports" / str(n)
    (d / "counters").mkdir(parents=True, exist_ok=True)
    (d / "state").write_text(state + "\n")
    (d / "rate").write_text(rate + "\n")
    base = {
        "port_xmit_data": "1000",
        "port_rcv_data": "2000",
        "port_xmit_packets": "10",
        "port_rcv_packets": "20",
        "port_rcv_errors": "0",
        "port_xmit_discards": "3",
        "link_downed": "1",
    }
    for name, value in {**base, **(counters or {})}.items():
        (d / "counters" / name).write_text(value + "\n")
    if hw is not None:
        (d / "hw_counters").mkdir(exist_ok=True)
        for name, value in hw.items():
            (d / "hw_counters" / name).write_text(value + "\n")
    return d


def values(readings: list[source.Reading]) -> dict[tuple[str, str], float]:
    return {(r.device, r.metric): r.value for r in readings}


def test_no_infiniband_class_is_unavailable(tmp_path: pathlib.Path) -> None:
    with pytest.raises(errors.HardwareUnavailable, match=r"no .*class/infiniband"):
        rdma.RdmaSource(sys_root=tmp_path).sample(T0)
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    with pytest.raises(errors.HardwareUnavailable, match="no device"):
        rdma.RdmaSource(sys_root=tmp_path).sample(T0)


def test_real_sysfs_of_this_machine() -> None:
    src = rdma.RdmaSource()
    if not pathlib.Path("/sys/class/infiniband").is_dir():
        with pytest.raises(errors.HardwareUnavailable):
            src.sample(T0)
    else:  # an RDMA machine: every port gives a link state
        assert any(r.metric == "nic_link_up" for r in src.sample(T0))


def test_words_become_bytes_and_names_match_netlink(tmp_path: pathlib.Path) -> None:
    port(tmp_path, "mlx5_0", 1, hw={"rp_cnp_handled": "7", "lifespan": "10"})
    port(tmp_path, "mlx5_1", 1, state="1: DOWN", rate="200 Gb/sec (2X HDR)")
    v = values(rdma.RdmaSource(sys_root=tmp_path).sample(T0))
    assert v[("mlx5_0/1", "nic_tx_bytes_total")] == 4000  # port_xmit_data counts 4-byte words
    assert v[("mlx5_0/1", "nic_rx_bytes_total")] == 8000
    assert v[("mlx5_0/1", "rdma_port_xmit_data")] == 1000  # raw, as the kernel gives it
    assert v[("mlx5_0/1", "nic_tx_packets_total")] == 10
    assert v[("mlx5_0/1", "nic_tx_dropped_total")] == 3
    assert v[("mlx5_0/1", "rdma_link_downed")] == 1
    assert v[("mlx5_0/1", "rdma_rp_cnp_handled")] == 7
    assert ("mlx5_0/1", "rdma_lifespan") not in v, "a setting, not a counter"
    assert v[("mlx5_0/1", "nic_link_up")] == 1
    assert v[("mlx5_0/1", "nic_link_speed_gbps")] == 400
    assert v[("mlx5_1/1", "nic_link_up")] == 0
    assert v[("mlx5_1/1", "nic_link_speed_gbps")] == 200


def test_rates_from_successive_samples(tmp_path: pathlib.Path) -> None:
    d = port(tmp_path, "mlx5_0", 1)
    src = rdma.RdmaSource(sys_root=tmp_path)
    assert ("mlx5_0/1", "nic_tx_bytes_per_second") not in values(src.sample(T0))
    (d / "counters" / "port_xmit_data").write_text(str(1000 + 250_000_000) + "\n")  # +1 GB
    v = values(src.sample(T0 + 2_000_000_000))
    assert v[("mlx5_0/1", "nic_tx_bytes_per_second")] == pytest.approx(0.5e9)
    assert v[("mlx5_0/1", "nic_rx_bytes_per_second")] == 0
    (d / "counters" / "port_xmit_data").write_text("5\n")  # reset: no negative rate
    assert ("mlx5_0/1", "nic_tx_bytes_per_second") not in values(src.sample(T0 + 3 * 10**9))


def test_unreadable_counter_is_left_out_with_a_warning(tmp_path: pathlib.Path) -> None:
    d = port(tmp_path, "mlx5_0", 1, counters={"port_rcv_errors": "N/A"})
    (d / "counters" / "symbol_error").mkdir()  # not a file: skipped silently
    src = rdma.RdmaSource(sys_root=tmp_path)
    v = values(src.sample(T0))
    assert ("mlx5_0/1", "nic_rx_errors_total") not in v
    assert v[("mlx5_0/1", "nic_tx_bytes_total")] == 4000
    assert len(src.warnings) == 1
    assert "port_rcv_errors: not an integer" in src.warnings[0]


def test_two_ports_are_two_devices(tmp_path: pathlib.Path) -> None:
    port(tmp_path, "mlx5_0", 1)
    port(tmp_path, "mlx5_0", 2, rate="100 Gb/sec (4X EDR)")
    v = values(rdma.RdmaSource(sys_root=tmp_path).sample(T0))
    assert v[("mlx5_0/2", "nic_link_speed_gbps")] == 100
    assert rdma.device_name("mlx5_0", 2) == "mlx5_0/2"


def test_parsers() -> None:
    assert rdma.parse_rate_gbps("2.5 Gb/sec (1X SDR)") == 2.5
    assert rdma.parse_rate_gbps("garbage") is None
    assert rdma.parse_state("4: ACTIVE\n") == "ACTIVE"
    assert rdma.parse_state("1: DOWN") == "DOWN"
