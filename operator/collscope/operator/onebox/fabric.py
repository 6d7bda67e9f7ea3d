"""The ranks' shared state over TCP: ``rank.Shared`` for ranks that do not share a machine.

On one machine the rank processes exchange their chunk counters through one memory-mapped file
(``rank.Shared``). On a cluster they run in pods on different nodes, so one of them (pod index
0 of the workload, ``workload.py``) or the one-box itself (``box.OneBox(state="tcp")``) runs a
``Server`` holding the same slots, and every rank keeps a local copy through a ``Client``:

- the rank's own slots (its operation and its counters) are written locally and pushed, its
  peers' slots are pulled, in one ``SYNC`` round trip: right after a write, and at least every
  ``sync_interval_s`` while nothing changes, never more often than every ``min_gap_s``
  (bounded: at most 1 / ``min_gap_s`` round trips per rank and second);
- ``stop`` and ``arm`` are round trips of their own; the server can also arm the onset itself
  ``onset_after_s`` after every rank joined and stop the job ``duration_s`` after that, which
  is how a workload on a cluster is driven without anyone reaching into its pods.

A peer's slot is then at most one interval plus a round trip old: a chunk's dependency waits
that much longer than through shared memory, as if the network were slower; nothing else of
the ring's order changes, since every slot still has one writer and only grows (or, for the
operation's signature, is set before its sequence number). Measured on a 2-core machine with
8 ranks on loopback: ~8 AllReduces per rank and second against ~15 through shared memory, for
about twice the CPU (a 2 ms interval gained 15 % more for another 15 % of CPU).

Wire format (little-endian), one request and one reply per round trip::

    header  <I magic 0x31465343 ("CSF1") | H version 1 | H kind | i rank | I n>   16 bytes
    payload n x int64

Requests: ``SYNC`` (rank r, n = its block: ``2 + nchannels * rank.COUNTERS`` values),
``ARM`` (n = 1: the onset, wall-clock ns), ``STOP`` and ``PULL`` (n = 0). Every reply is
``REPLY`` with rank = the world size and n = every slot: ``stop``, ``onset``, then one block per
rank (``CUR_SEQ``, ``CUR_SIG``, then per channel the ``COUNTERS`` counters). The server closes
a connection that sends anything else; the client checks the reply against its own world.

Why one module: the server and the client are the two ends of this one wire format and its
slot layout (``Layout``, ``_pack``, ``_read_message``); they change together.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from typing import Final

from collscope.operator import errors
from collscope.operator.onebox import rank

log = logging.getLogger(__name__)

MAGIC: Final = 0x31465343  # b"CSF1" read as a little-endian uint32
VERSION: Final = 1
SYNC, ARM, STOP, PULL, REPLY = 1, 2, 3, 4, 0x80
HEADER: Final = struct.Struct("<IHHiI")
# Far above any world this workload runs (1,024 ranks x 2 channels: ~6k slots): a header
# asking for more is garbage, not a big job.
MAX_SLOTS: Final = 1 << 20
# Port of the workload's coordinator (examples/workload/workload.yaml's headless Service).
PORT: Final = 7070


def parse_address(text: str, default_port: int = PORT) -> tuple[str, int]:
    """``"host:port"``, ``"host"`` or ``"tcp://host:port"`` -> ``(host, port)``."""
    text = text.removeprefix("tcp://")
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, str(default_port)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"fabric address {text!r}: want host:port")
    return host, int(port)


class Layout:
    """Where each slot lives: ``stop``, ``onset``, then one block per rank."""

    def __init__(self, world: int, nchannels: int) -> None:
        if world < 1 or nchannels < 1:
            raise ValueError(f"world {world} and nchannels {nchannels} must be positive")
        self.world, self.nch = world, nchannels
        self.block = 2 + nchannels * rank.COUNTERS
        self.size = 2 + world * self.block

    def base(self, r: int) -> int:
        return 2 + r * self.block

    def op(self, r: int, which: int) -> int:
        return self.base(r) + which

    def counter(self, r: int, channel: int, which: int) -> int:
        return self.base(r) + 2 + channel * rank.COUNTERS + which


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionResetError("peer closed the connection")
        got += k
    return bytes(buf)


def _pack(kind: int, r: int, values: list[int]) -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, r, len(values)) + struct.pack(
        f"<{len(values)}q", *values
    )


def _read_message(sock: socket.socket) -> tuple[int, int, list[int]]:
    """(kind, rank, values) of one message; ValueError on a bad header."""
    magic, version, kind, r, n = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a fabric v{VERSION} message (magic {magic:#x}, v{version})")
    if n > MAX_SLOTS:
        raise ValueError(f"message of {n} slots")
    values = list(struct.unpack(f"<{n}q", _recv_exact(sock, 8 * n))) if n else []
    return kind, r, values


class Server:
    """The slots and a thread per connection; ``start`` serves in the background.

    ``onset_after_s`` (None: only ``ARM`` arms): the onset is armed that long after the last
    rank's first ``SYNC``; ``duration_s`` (None: only ``STOP`` stops): ``stop`` is set that long
    after it. ``clock`` is ``time.time_ns`` (wall clock: the ranks compare the onset with their
    own wall clock, as the one-box's ``Shared.arm`` does).
    """

    def __init__(
        self,
        address: tuple[str, int],
        world: int,
        nchannels: int,
        *,
        onset_after_s: float | None = None,
        duration_s: float | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.layout = Layout(world, nchannels)
        self.slots = [0] * self.layout.size
        self.joined: set[int] = set()
        self.all_joined_ns = 0
        self.onset_after_s, self.duration_s, self.clock = onset_after_s, duration_s, clock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                server._serve(self.request)

        class TCPServer(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        try:
            self._tcp = TCPServer(address, Handler)
        except OSError as e:
            raise errors.FabricError(
                f"fabric: cannot listen on {address[0]}:{address[1]}: {e}"
            ) from e

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._tcp.server_address[:2]
        return str(host), int(port)

    def start(self) -> Server:
        self._thread = threading.Thread(
            target=self._tcp.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening and drop every connection (the ranks see their coordinator gone)."""
        if self._thread is not None:
            self._tcp.shutdown()
            self._thread.join(5)
            self._thread = None
        self._tcp.server_close()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state ---------------------------------------------------------------------------
    def apply(self, kind: int, r: int, values: list[int]) -> list[int]:
        """One request on the slots; the slots after it. ValueError when malformed."""
        lay = self.layout
        with self._lock:
            now = self.clock()
            if kind == SYNC:
                if not 0 <= r < lay.world or len(values) != lay.block:
                    raise ValueError(f"SYNC of rank {r} with {len(values)} values")
                self.slots[lay.base(r) : lay.base(r) + lay.block] = values
                if r not in self.joined:
                    self.joined.add(r)
                    if len(self.joined) == lay.world:
                        self.all_joined_ns = now
                        if self.onset_after_s is not None and self.slots[1] == 0:
                            self.slots[1] = now + int(self.onset_after_s * 1e9)
            elif kind == ARM:
                if len(values) != 1:
                    raise ValueError(f"ARM with {len(values)} values")
                self.slots[1] = values[0]
            elif kind == STOP:
                self.slots[0] = 1
            elif kind != PULL:
                raise ValueError(f"unknown request kind {kind}")
            if (
                self.duration_s is not None
                and self.all_joined_ns
                and now >= self.all_joined_ns + int(self.duration_s * 1e9)
            ):
                self.slots[0] = 1
            return list(self.slots)

    def _serve(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = sock.getpeername()
        with self._lock:
            self._conns.add(sock)
        try:
            self._serve_requests(sock, peer)
        finally:
            with self._lock:
                self._conns.discard(sock)

    def _serve_requests(self, sock: socket.socket, peer: object) -> None:
        while True:
            try:
                kind, r, values = _read_message(sock)
                slots = self.apply(kind, r, values)
                sock.sendall(_pack(REPLY, self.layout.world, slots))
            except (OSError, struct.error):
                return  # the rank went away: its last slots stay, as a crashed rank's ring does
            except ValueError as e:
                log.warning("fabric: closing %s: %s", peer, e)
                return


class Client:
    """``rank.State`` backed by a ``Server``.

    ``me`` is the rank this process writes for; its slots are pushed by a background thread
    (``sync_interval_s``, ``min_gap_s``: see the module docstring). ``me=None`` is a
    controller (the one-box, a test): no thread, every read pulls, ``arm``/``stop`` only.
    Connecting retries for ``connect_timeout_s``: a coordinator pod may start after its peers.
    """

    def __init__(
        self,
        address: tuple[str, int],
        world: int,
        nchannels: int,
        me: int | None,
        *,
        sync_interval_s: float = 0.005,
        min_gap_s: float = 0.0005,
        connect_timeout_s: float = 30.0,
    ) -> None:
        self.address, self.me = address, me
        self.layout = Layout(world, nchannels)
        if me is not None and not 0 <= me < world:
            raise ValueError(f"rank {me} outside a world of {world}")
        self.slots = [0] * self.layout.size
        self.sync_interval_s, self.min_gap_s = sync_interval_s, min_gap_s
        self.syncs = 0  # round trips done (tests, logs)
        self.lost: errors.FabricError | None = None  # why the sync thread ended, if it failed
        self._io = threading.Lock()
        self._dirty = threading.Event()
        self._closing = threading.Event()
        self._sock = self._connect(connect_timeout_s)
        self._thread: threading.Thread | None = None
        if me is not None:
            try:
                self._sync()  # joined, and the slots are the server's before the first read
            except errors.FabricError:
                self._sock.close()
                raise
            self._thread = threading.Thread(target=self._loop, name="fabric-sync", daemon=True)
            self._thread.start()

    def _where(self) -> str:
        return f"fabric {self.address[0]}:{self.address[1]}"

    def _connect(self, timeout_s: float) -> socket.socket:
        end = time.monotonic() + timeout_s
        while True:
            try:
                sock = socket.create_connection(self.address, timeout=5.0)
            except OSError as e:  # refused, or a name not resolvable yet (headless Service)
                if time.monotonic() > end:
                    raise errors.FabricError(f"{self._where()}: cannot connect: {e}") from e
                time.sleep(0.2)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(10.0)  # a coordinator that stops answering is lost, not slow
            return sock

    def _call(self, kind: int, r: int, values: list[int]) -> list[int]:
        try:
            with self._io:
                self._sock.sendall(_pack(kind, r, values))
                got_kind, world, slots = _read_message(self._sock)
        except (OSError, ValueError, struct.error) as e:
            raise errors.FabricError(f"{self._where()}: {e}") from e
        if got_kind != REPLY or world != self.layout.world or len(slots) != self.layout.size:
            raise errors.FabricError(
                f"{self._where()}: reply for a world of {world} ({len(slots)} slots); this "
                f"rank's world is {self.layout.world} ({self.layout.size} slots)"
            )
        self.syncs += 1
        return slots

    def _sync(self) -> None:
        assert self.me is not None
        lo = self.layout.base(self.me)
        hi = lo + self.layout.block
        slots = self._call(SYNC, self.me, self.slots[lo:hi])
        # Everything but our own block: we are its only writer, and may have moved on since.
        self.slots[:lo] = slots[:lo]
        self.slots[hi:] = slots[hi:]

    def _loop(self) -> None:
        while not self._closing.is_set():
            self._dirty.wait(self.sync_interval_s)
            self._dirty.clear()
            try:
                self._sync()
            except errors.FabricError as e:
                if not self._closing.is_set() and not self.slots[0]:
                    self.lost = e
                    log.error("%s", e)
                self.slots[0] = 1  # no peers any more: stop, as the job does without them
                return
            time.sleep(self.min_gap_s)

    def _pull(self) -> None:
        if self.me is None:
            self.slots = self._call(PULL, -1, [])

    def close(self) -> None:
        """Push the last state, end the thread and the connection; raise ``lost`` if any."""
        self._closing.set()
        self._dirty.set()
        if self._thread is not None:
            self._thread.join(5)
        with contextlib.suppress(OSError):
            self._sock.close()
        if self.lost is not None:
            raise self.lost

    # -- rank.State ----------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        self._pull()
        return bool(self.slots[0])

    def stop(self) -> None:
        self.slots = self._call(STOP, -1, [])

    @property
    def onset_ns(self) -> int:
        self._pull()
        return int(self.slots[1])

    def arm(self, onset_ns: int) -> None:
        self.slots = self._call(ARM, -1, [onset_ns])

    def op(self, r: int, which: int) -> int:
        self._pull()
        return int(self.slots[self.layout.op(r, which)])

    def set_op(self, r: int, which: int, value: int) -> None:
        self._own(r)
        self.slots[self.layout.op(r, which)] = value
        self._dirty.set()

    def counter(self, r: int, channel: int, which: int) -> int:
        self._pull()
        return int(self.slots[self.layout.counter(r, channel, which)])

    def set_counter(self, r: int, channel: int, which: int, value: int) -> None:
        self._own(r)
        self.slots[self.layout.counter(r, channel, which)] = value
        self._dirty.set()

    def _own(self, r: int) -> None:
        if r != self.me:
            raise ValueError(f"rank {self.me} cannot write rank {r}'s slots (one writer each)")
