"""The netlink source against a real veth pair in a network namespace made by the test.

The namespace is a child ``unshare -rn`` process (a user namespace too, so it works without
root where unprivileged user namespaces are allowed); the source reads it through pyroute2's
``netns`` path, and traffic is real Ethernet frames sent on a raw socket opened inside it.
Link speeds come from a tmp sysfs tree (the namespace's own sysfs is not mounted anywhere).
"""

from __future__ import annotations

import pathlib
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
from pyroute2 import IPRoute, netns

from collscope.nodeagent import errors
from collscope.nodeagent.hardware import nic, source

FRAMES = 50
PAYLOAD = 1000
# Broadcast destination, locally administered source, ethertype 0x88b5 (IEEE "local
# experimental"): a frame nothing on the peer will answer or route.
FRAME = b"\xff" * 6 + b"\x02\x00\x00\x00\x00\x01" + b"\x88\xb5" + b"x" * PAYLOAD


@pytest.fixture
def veth_ns() -> Iterator[str]:
    """A network namespace holding veth pair va <-> vb, both up; yields its ns path."""
    try:
        holder = subprocess.Popen(
            ["unshare", "-rn", "sh", "-c", "echo ready; exec sleep 120"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except FileNotFoundError:
        pytest.skip("no unshare(1) on this machine")
    assert holder.stdout is not None
    if holder.stdout.readline().strip() != "ready":
        err = holder.communicate(timeout=10)[1].strip()
        pytest.skip(f"cannot create a network namespace here (unshare -rn: {err})")
    path = f"/proc/{holder.pid}/ns/net"
    try:
        with IPRoute(netns=path, flags=0) as ipr:
            ipr.link("add", ifname="va", kind="veth", peer="vb")
            for name in ("va", "vb"):
                ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up")
        yield path
    finally:
        holder.kill()
        holder.communicate(timeout=10)  # reaps it and closes its pipes


@pytest.fixture
def sysfs(tmp_path: pathlib.Path) -> pathlib.Path:
    for name, speed in (("va", "10000\n"), ("vb", None), ("eth9", "25000\n")):
        d = tmp_path / "class" / "net" / name
        (d / "device").mkdir(parents=True)
        if speed is not None:
            (d / "speed").write_text(speed)
    return tmp_path


def values(readings: list[source.Reading]) -> dict[tuple[str, str], float]:
    return {(r.device, r.metric): r.value for r in readings}


def send_frames(path: str, ifname: str, count: int) -> None:
    s = netns.create_socket(path, socket.AF_PACKET, socket.SOCK_RAW, 0, flags=0)
    with s:
        s.bind((ifname, 0))
        for _ in range(count):
            s.send(FRAME)


def wait_for(check: nic.NicSource, key: tuple[str, str], minimum: float) -> float:
    """veth delivers synchronously, but counters are per-CPU: poll briefly to be safe."""
    deadline = time.monotonic() + 5
    while True:
        v = values(check.sample(time.time_ns())).get(key, 0.0)
        if v >= minimum or time.monotonic() > deadline:
            return v
        time.sleep(0.01)


def test_counters_grow_with_real_traffic(veth_ns: str, sysfs: pathlib.Path) -> None:
    src = nic.NicSource(sys_root=sysfs, netns=veth_ns)
    t0 = time.time_ns()
    before = values(src.sample(t0))
    assert {d for d, _ in before} == {"va", "vb"}, "lo has no device in sysfs: filtered out"
    assert before[("va", "nic_link_up")] == 1
    assert before[("va", "nic_link_speed_gbps")] == 10.0
    assert ("vb", "nic_link_speed_gbps") not in before, "no speed file: no reading"
    assert ("va", "nic_tx_bytes_per_second") not in before, "no rate from one sample"

    send_frames(veth_ns, "va", FRAMES)
    sent = FRAMES * len(FRAME)
    tx = wait_for(src, ("va", "nic_tx_bytes_total"), before[("va", "nic_tx_bytes_total")] + sent)
    assert tx - before[("va", "nic_tx_bytes_total")] >= sent
    after = values(src.sample(time.time_ns()))
    assert after[("vb", "nic_rx_bytes_total")] - before[("vb", "nic_rx_bytes_total")] >= sent
    assert after[("va", "nic_tx_packets_total")] - before[("va", "nic_tx_packets_total")] >= FRAMES
    assert after[("vb", "nic_rx_packets_total")] - before[("vb", "nic_rx_packets_total")] >= FRAMES
    assert after[("va", "nic_tx_errors_total")] == 0
    assert ("va", "nic_rx_dropped_total") in after
    src.close()


def test_rate_is_bytes_over_sample_interval(veth_ns: str, sysfs: pathlib.Path) -> None:
    src = nic.NicSource(sys_root=sysfs, netns=veth_ns)
    t0 = 1_000_000_000_000
    first = values(src.sample(t0))
    send_frames(veth_ns, "va", FRAMES)
    # Injected timestamps: a 0.5 s interval, whatever the wall clock did.
    second = values(src.sample(t0 + 500_000_000))
    grown = second[("va", "nic_tx_bytes_total")] - first[("va", "nic_tx_bytes_total")]
    assert grown >= FRAMES * len(FRAME)
    assert second[("va", "nic_tx_bytes_per_second")] == pytest.approx(grown * 2)
    assert second[("vb", "nic_rx_bytes_per_second")] >= FRAMES * len(FRAME) * 2
    src.close()


def test_link_down_is_reported(veth_ns: str, sysfs: pathlib.Path) -> None:
    src = nic.NicSource(sys_root=sysfs, netns=veth_ns)
    with IPRoute(netns=veth_ns, flags=0) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="vb")[0], state="down")
    v = values(src.sample(time.time_ns()))
    assert v[("vb", "nic_link_up")] == 0
    assert v[("va", "nic_link_up")] == 0, "peer down: va is LOWERLAYERDOWN"
    src.close()


def test_include_filter_is_injectable(veth_ns: str, sysfs: pathlib.Path) -> None:
    src = nic.NicSource(sys_root=sysfs, netns=veth_ns, include=lambda n: n == "lo")
    assert {r.device for r in src.sample(time.time_ns())} == {"lo"}
    src.close()


def test_missing_namespace_is_unavailable(tmp_path: pathlib.Path) -> None:
    src = nic.NicSource(sys_root=tmp_path, netns=str(tmp_path / "no-such-ns"))
    with pytest.raises(errors.HardwareUnavailable, match="netlink"):
        src.sample(0)


def test_link_speed_parsing(sysfs: pathlib.Path) -> None:
    assert nic.link_speed_gbps(sysfs, "eth9") == 25.0
    assert nic.link_speed_gbps(sysfs, "vb") is None
    (sysfs / "class" / "net" / "vb" / "speed").write_text("-1\n")  # link down
    assert nic.link_speed_gbps(sysfs, "vb") is None
    assert nic.link_speed_gbps(pathlib.Path("/sys"), "lo") is None  # real sysfs: EINVAL
