"""NIC counters through netlink (``pyroute2.IPRoute``) and link speed from sysfs.

One ``RTM_GETLINK`` dump per sample gives every interface's ``IFLA_STATS64`` (64-bit
counters: no wrap to handle), ``IFLA_OPERSTATE`` and flags; the speed is not in netlink, so it
is read from ``<sys_root>/class/net/<ifname>/speed`` (Mb/s; ``-1`` or EINVAL when the link is
down or the driver does not say, and then no speed reading is given). Per interface:

``nic_{tx,rx}_bytes_total``, ``nic_{tx,rx}_packets_total``, ``nic_{tx,rx}_errors_total``,
``nic_{tx,rx}_dropped_total`` (IFLA_STATS64), ``nic_{tx,rx}_bytes_per_second`` (from successive
samples), ``nic_link_up`` (1 when operstate is UP, or UNKNOWN with carrier, i.e. IFF_LOWER_UP;
else 0) and ``nic_link_speed_gbps``.

Which interfaces: by default those backed by a device (``<sys_root>/class/net/<if>/device``
exists), i.e. physical NICs and their virtual functions, not the hundreds of veth, bridge and
tunnel interfaces of a Kubernetes node. RDMA traffic does not pass the kernel's network stack
and is not in these counters: see ``rdma.py`` for InfiniBand and RoCE ports.

The netlink socket lives in the network namespace it was opened in: the agent runs with
``hostNetwork``; tests pass ``netns`` (a ``/proc/<pid>/ns/net`` path) to read another one.
"""

from __future__ import annotations

import errno
import os
import pathlib
from collections.abc import Callable
from typing import Any

from collscope.nodeagent import errors
from collscope.nodeagent.hardware import source

IFF_LOWER_UP = 0x10000  # linux/if.h: the driver signals carrier (L1 up)
STATS = (
    ("tx_bytes", "nic_tx_bytes_total"),
    ("rx_bytes", "nic_rx_bytes_total"),
    ("tx_packets", "nic_tx_packets_total"),
    ("rx_packets", "nic_rx_packets_total"),
    ("tx_errors", "nic_tx_errors_total"),
    ("rx_errors", "nic_rx_errors_total"),
    ("tx_dropped", "nic_tx_dropped_total"),
    ("rx_dropped", "nic_rx_dropped_total"),
)


def physical(sys_root: pathlib.Path) -> Callable[[str], bool]:
    """The default interface filter: interfaces with a backing device in sysfs."""
    return lambda ifname: (sys_root / "class" / "net" / ifname / "device").exists()


def link_speed_gbps(sys_root: pathlib.Path, ifname: str) -> float | None:
    """The link speed from sysfs (``10000`` = 10 Gb/s), None when unknown or down."""
    try:
        mbps = int((sys_root / "class" / "net" / ifname / "speed").read_text().strip())
    except (OSError, ValueError):
        # EINVAL reading speed is the kernel's way of saying "no link" (see module doc).
        return None
    return mbps / 1000.0 if mbps > 0 else None


class NicSource(source.Source):
    name = "netlink"

    def __init__(
        self,
        *,
        sys_root: pathlib.Path = pathlib.Path("/sys"),
        netns: str | None = None,
        include: Callable[[str], bool] | None = None,
    ) -> None:
        super().__init__()
        self._sys_root = sys_root
        self._netns = netns
        self._include = include if include is not None else physical(sys_root)
        self._ipr: Any = None
        self._rates = source.RateTracker()

    def _open(self) -> Any:
        if self._ipr is None:
            # pyroute2 leaks a socket pair and an event loop when the namespace is missing:
            # look first.
            if self._netns is not None and not os.path.exists(self._netns):
                raise errors.HardwareUnavailable(f"netlink: no namespace {self._netns}")
            try:
                from pyroute2 import IPRoute

                # flags=0: never create the namespace when it does not exist.
                self._ipr = (
                    IPRoute() if self._netns is None else IPRoute(netns=self._netns, flags=0)
                )
            except (ImportError, OSError) as e:
                raise errors.HardwareUnavailable(f"netlink: {e}") from e
        return self._ipr

    def close(self) -> None:
        ipr, self._ipr = self._ipr, None
        if ipr is not None:
            ipr.close()

    def sample(self, now_ns: int) -> list[source.Reading]:
        self.warnings = []
        ipr = self._open()
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            links = list(ipr.get_links())
        except (NetlinkError, OSError) as e:
            # A broken socket is reopened at the next sample.
            self.close()
            if isinstance(e, OSError) and e.errno == errno.ENOENT:
                raise errors.HardwareUnavailable(f"netlink: namespace gone: {e}") from e
            raise errors.HardwareReadError(f"netlink: link dump: {e}") from e
        out: list[source.Reading] = []
        for link in links:
            ifname = link.get_attr("IFLA_IFNAME")
            if not ifname or not self._include(ifname):
                continue
            out += self._link(ifname, link, now_ns)
        return source.finite(out)

    def _link(self, ifname: str, link: Any, now_ns: int) -> list[source.Reading]:
        out: list[source.Reading] = []
        stats = link.get_attr("IFLA_STATS64")
        if stats is None:
            self.warnings.append(f"{ifname}: no IFLA_STATS64")
        else:
            for key, metric in STATS:
                out.append(source.Reading(ifname, metric, float(stats[key])))
            for direction in ("tx", "rx"):
                total = float(stats[f"{direction}_bytes"])
                rate = self._rates.rate(ifname, direction, now_ns, total)
                if rate is not None:
                    out.append(source.Reading(ifname, f"nic_{direction}_bytes_per_second", rate))
        oper = link.get_attr("IFLA_OPERSTATE")
        up = oper == "UP" or (oper == "UNKNOWN" and bool(int(link["flags"]) & IFF_LOWER_UP))
        out.append(source.Reading(ifname, "nic_link_up", 1.0 if up else 0.0))
        speed = link_speed_gbps(self._sys_root, ifname)
        if speed is not None:
            out.append(source.Reading(ifname, "nic_link_speed_gbps", speed))
        return out
