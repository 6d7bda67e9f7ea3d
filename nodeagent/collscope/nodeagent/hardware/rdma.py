"""RDMA port counters (InfiniBand and RoCE) from sysfs.

NCCL's network traffic on an RDMA NIC never passes the kernel's network stack, so netlink
does not see it; the HCA's port counters do. Layout read, under the injected ``sys_root``::

    class/infiniband/mlx5_0/ports/1/state          "4: ACTIVE"
    class/infiniband/mlx5_0/ports/1/rate           "400 Gb/sec (4X NDR)"
    class/infiniband/mlx5_0/ports/1/counters/      port_xmit_data, port_rcv_data, ... (one
                                                   decimal integer per file)
    class/infiniband/mlx5_0/ports/1/hw_counters/   out_of_sequence, np_cnp_sent, ...

Device name: ``<hca>/<port>`` (``mlx5_0/1``), see ``device_name``. Per port:

- ``nic_{tx,rx}_bytes_total``: ``port_{xmit,rcv}_data`` x 4. The IB spec (PortCounters,
  PortXmitData) counts data in 4-byte words ("octets divided by 4"), which the kernel exports
  unchanged; the legacy 32-bit counter saturates at 16 GiB, drivers with extended counters
  (mlx5) give 64 bits.
- ``nic_{tx,rx}_packets_total``, ``nic_rx_errors_total`` (``port_rcv_errors``),
  ``nic_tx_dropped_total`` (``port_xmit_discards``), ``nic_{tx,rx}_bytes_per_second``,
  ``nic_link_up`` (1 when ``state`` is ACTIVE), ``nic_link_speed_gbps`` (from ``rate``): the
  same names as netlink's, so analysis treats both kinds of NIC alike.
- ``rdma_<file>`` for every file in ``counters/`` and ``hw_counters/`` as read (raw units;
  ``port_xmit_data`` in words), e.g. ``rdma_rp_cnp_handled`` (congestion), ``rdma_
  local_ack_timeout_err`` (retransmission timeouts), ``rdma_link_downed``.
"""

from __future__ import annotations

import pathlib
import re

from collscope.nodeagent import errors
from collscope.nodeagent.hardware import source

WORD_BYTES = 4  # port_xmit_data / port_rcv_data unit (IB spec PortCounters)
# Files under hw_counters/ that are settings, not counters.
NOT_COUNTERS = frozenset({"lifespan"})
NORMALISED = (
    ("port_xmit_data", "nic_tx_bytes_total", WORD_BYTES),
    ("port_rcv_data", "nic_rx_bytes_total", WORD_BYTES),
    ("port_xmit_packets", "nic_tx_packets_total", 1),
    ("port_rcv_packets", "nic_rx_packets_total", 1),
    ("port_rcv_errors", "nic_rx_errors_total", 1),
    ("port_xmit_discards", "nic_tx_dropped_total", 1),
)
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")
_STATE = re.compile(r"^\s*\d+:\s*(\w+)")


def device_name(hca: str, port: str | int) -> str:
    """The ``device`` of this port's hw records: ``mlx5_0/1``."""
    return f"{hca}/{port}"


def parse_rate_gbps(text: str) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> 400.0; None when unparseable."""
    m = _RATE.match(text)
    return float(m.group(1)) if m else None


def parse_state(text: str) -> str:
    """``"4: ACTIVE"`` -> ``"ACTIVE"`` (the text itself when not in that shape)."""
    m = _STATE.match(text)
    return m.group(1) if m else text.strip()


class RdmaSource(source.Source):
    name = "rdma"

    def __init__(self, *, sys_root: pathlib.Path = pathlib.Path("/sys")) -> None:
        super().__init__()
        self._root = sys_root / "class" / "infiniband"
        self._rates = source.RateTracker()

    def sample(self, now_ns: int) -> list[source.Reading]:
        self.warnings = []
        try:
            hcas = sorted(p for p in self._root.iterdir() if p.is_dir())
        except FileNotFoundError as e:
            raise errors.HardwareUnavailable(f"rdma: no {self._root}") from e
        except OSError as e:
            raise errors.HardwareReadError(f"rdma: {self._root}: {e}") from e
        if not hcas:
            raise errors.HardwareUnavailable(f"rdma: no device in {self._root}")
        out: list[source.Reading] = []
        for hca in hcas:
            try:
                ports = sorted((hca / "ports").iterdir(), key=lambda p: p.name)
            except OSError as e:
                self.warnings.append(f"{hca.name}: {e}")
                continue
            for port in ports:
                out += self._port(device_name(hca.name, port.name), port, now_ns)
        return source.finite(out)

    def _read(self, path: pathlib.Path) -> str | None:
        try:
            return path.read_text()
        except OSError as e:
            # Some counters answer EINVAL/EOPNOTSUPP on some firmware: leave that one out.
            self.warnings.append(f"{path}: {e.strerror or e}")
            return None

    def _counters(self, port: pathlib.Path) -> dict[str, int]:
        values: dict[str, int] = {}
        for sub in ("counters", "hw_counters"):
            directory = port / sub
            if not directory.is_dir():
                continue
            for f in sorted(directory.iterdir()):
                if f.name in NOT_COUNTERS or not f.is_file():
                    continue
                text = self._read(f)
                if text is None:
                    continue
                try:
                    values[f.name] = int(text.strip())
                except ValueError:
                    self.warnings.append(f"{f}: not an integer: {text.strip()[:40]!r}")
        return values

    def _port(self, dev: str, port: pathlib.Path, now_ns: int) -> list[source.Reading]:
        out: list[source.Reading] = []
        counters = self._counters(port)
        for name, value in counters.items():
            out.append(source.Reading(dev, f"rdma_{name}", float(value)))
        for name, metric, scale in NORMALISED:
            if name in counters:
                out.append(source.Reading(dev, metric, float(counters[name] * scale)))
        for direction, name in (("tx", "port_xmit_data"), ("rx", "port_rcv_data")):
            if name in counters:
                total = float(counters[name] * WORD_BYTES)
                rate = self._rates.rate(dev, direction, now_ns, total)
                if rate is not None:
                    out.append(source.Reading(dev, f"nic_{direction}_bytes_per_second", rate))
        state = self._read(port / "state")
        if state is not None:
            up = parse_state(state) == "ACTIVE"
            out.append(source.Reading(dev, "nic_link_up", 1.0 if up else 0.0))
        rate_text = self._read(port / "rate")
        speed = parse_rate_gbps(rate_text) if rate_text is not None else None
        if speed is not None:
            out.append(source.Reading(dev, "nic_link_speed_gbps", speed))
        return out
