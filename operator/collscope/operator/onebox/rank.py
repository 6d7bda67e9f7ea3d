"""One training rank of the one-box job: a process driving the real plugin as NCCL would.

Each rank is its own OS process (``python -m collscope.operator.onebox.rank SPEC``) that loads
``libnccl-profiler-collscope.so`` through ``nccl.Nccl`` with the environment a training pod
gives it (``COLLSCOPE_TRACE_DIR``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``POD_NAME``,
``POD_NAMESPACE``, ``NODE_NAME``), initialises one communicator over the whole job and then
trains: a compute phase, then a ring AllReduce, again and again.

The AllReduce is a ring over ``nchannels`` channels (NCCL's Ring algorithm): on every channel a
rank sends to ``rank + 1`` and receives from ``rank - 1``, ``nsteps`` chunks each. A progress
loop plays NCCL's proxy thread (shared/notes/nccl-profiler.md §3): every ProxyStep goes through
the states NCCL records, and each transition waits for what it waits for in NCCL, read from
memory shared by all ranks (``Shared``):

- send chunk ``s`` becomes GPU-ready (``SendPeerWait``) once the kernel produced it: for ``s >
  0`` that needs our own receive of chunk ``s - 1`` consumed (the ring's reduce dependency);
- it goes on the network (``SendWait``) once the peer posted a receive buffer for it;
- it completes (stop) when the network delivered it: the sender publishes ``delivered``;
- receive chunk ``s`` is posted (``RecvWait``), arrives (``RecvFlushWait``, ``RecvGPUWait``)
  once the left peer's ``delivered`` covers it and the peer runs the same operation, and is
  consumed (stop) after the GPU's time for it.

So a chunk is never received before its sender produced it, and a rank that stops (a hung GPU,
a NIC that stops delivering, a collective not entered) stops its neighbours, then the ring, the
way a real job hangs (Mycroft §2.2: a fault propagates along the data dependencies). A stalled
rank keeps its process alive, so its ring holds the frozen state (the plugin's heartbeat goes
on); only the process faults (``process-killed``, ``process-frozen``) stop the process itself,
heartbeat thread included, once a chunk of the current AllReduce moved. The fault
(``faults.Injection``, given at start) acts from the onset the one-box arms in shared memory
(``Shared.arm``) while the job runs.

The shared state is a ``State``: ``Shared`` (one memory-mapped file) on one machine, or
``fabric.Client`` (the same slots behind a TCP server) for ranks in pods on different nodes
(``workload.py``); the second argument of ``python -m collscope.operator.onebox.rank SPEC
WHERE`` is the file's path or ``tcp://host:port``.

Why one module: it is one process's program, the rank's progress loop (``Rank``) and the
shared slots it reads and writes (``Shared``, ``State``), which are one protocol between ranks;
``fabric`` already holds the TCP variant of that state.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib.util
import json
import mmap
import os
import pathlib
import random
import signal
import sys
import time
from typing import Any, Final, Protocol

from collscope.operator.onebox import faults, nccl

# Cumulative counters per (rank, channel); int64 in shared memory, one writer each.
DELIVERED: Final = 0  # chunks the rank's send flow delivered to its right peer
POSTED: Final = 1  # receive buffers the rank posted for its left peer
COUNTERS: Final = 2
# Per rank: the operation it runs now (seq) and its signature (bytes): a peer with another
# signature for the same seq is an inconsistent collective (CCL-D H2) and exchanges nothing.
CUR_SEQ: Final = 0
CUR_SIG: Final = 1
COMM_HASH: Final = 0x0E_B0C5_0000_0001


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds of the simulated hardware; chosen so one iteration takes ~60 ms on a laptop
    core (enough completions per trigger window, little CPU for 8 ranks on 2 cores)."""

    compute_s: float = 0.03  # forward/backward between two AllReduces
    gpu_chunk_s: float = 0.0005  # the kernel producing or consuming one chunk
    net_chunk_s: float = 0.001  # the NIC moving one chunk
    nchannels: int = 2
    nsteps: int = 8  # chunks per channel per operation
    count: int = 1 << 20  # float32 elements per AllReduce (4 MiB)
    poll_s: float = 0.001  # the proxy loop's sleep when nothing advanced
    # The data loader's time per batch before the compute phase (host work: ``load_batch``),
    # 0 unless asked: the fault scenarios' verdicts were tuned without it (a host phase before
    # the compute shifts a power-capped GPU's straggling towards slow.host). The profiling e2e
    # gives it 5 ms, and one rank's loader ``slow_loader_factor`` times that (-1: none), from
    # the onset (``Shared.arm``) when one is armed, else from the start.
    loader_s: float = 0.0
    slow_loader_rank: int = -1
    slow_loader_factor: float = 8.0


@dataclasses.dataclass(frozen=True)
class RankSpec:
    rank: int
    local_rank: int
    world: int
    nnodes: int
    node: str
    pod: str
    namespace: str
    trace_dir: str
    plugin: str
    timing: Timing
    injection: faults.Injection | None
    seed: int


class State(Protocol):
    """What a rank reads of its peers and writes of itself (``Shared``, ``fabric.Client``)."""

    @property
    def stopped(self) -> bool: ...
    def stop(self) -> None: ...
    @property
    def onset_ns(self) -> int: ...
    def arm(self, onset_ns: int) -> None: ...
    def op(self, rank: int, which: int) -> int: ...
    def set_op(self, rank: int, which: int, value: int) -> None: ...
    def counter(self, rank: int, channel: int, which: int) -> int: ...
    def set_counter(self, rank: int, channel: int, which: int, value: int) -> None: ...
    def close(self) -> None: ...


class Shared:
    """What the rank processes share: int64 slots in one memory-mapped file (``path``), each
    written by one rank only (aligned 8-byte stores: no torn reads on x86-64 or arm64).

    Layout: ``stop`` (1 = every rank returns), ``onset`` (wall-clock ns from which the
    injected fault acts; 0 = not armed), then per rank ``CUR_SEQ``, ``CUR_SIG``, then per
    (rank, channel) the ``COUNTERS`` cumulative chunk counters.
    """

    def __init__(self, path: pathlib.Path, world: int, nchannels: int) -> None:
        self.path, self.world, self.nch = path, world, nchannels
        n = 2 + world * 2 + world * nchannels * COUNTERS
        if not path.exists() or path.stat().st_size != n * 8:
            path.write_bytes(bytes(n * 8))
        with path.open("r+b") as f:
            self._mm = mmap.mmap(f.fileno(), n * 8)
        self.slots = (ctypes.c_int64 * n).from_buffer(self._mm)
        self._ops = 2
        self._counters = 2 + world * 2

    @property
    def stopped(self) -> bool:
        return bool(self.slots[0])

    def stop(self) -> None:
        self.slots[0] = 1

    @property
    def onset_ns(self) -> int:
        return int(self.slots[1])

    def arm(self, onset_ns: int) -> None:
        """The injected fault acts from ``onset_ns`` (``time.time_ns()``) on."""
        self.slots[1] = onset_ns

    def op(self, rank: int, which: int) -> int:
        return int(self.slots[self._ops + rank * 2 + which])

    def set_op(self, rank: int, which: int, value: int) -> None:
        self.slots[self._ops + rank * 2 + which] = value

    def counter(self, rank: int, channel: int, which: int) -> int:
        return int(self.slots[self._counters + (rank * self.nch + channel) * COUNTERS + which])

    def set_counter(self, rank: int, channel: int, which: int, value: int) -> None:
        self.slots[self._counters + (rank * self.nch + channel) * COUNTERS + which] = value

    def close(self) -> None:
        """Nothing to do: the file outlives the ranks (the one-box removes its directory), and
        the mapping cannot be closed while ``slots`` exports it."""


@dataclasses.dataclass
class _Flow:
    channel: int
    send: bool
    handle: int | None
    step: int = 0
    phase: int = 0
    step_handle: int | None = None
    due_s: float = 0.0


class Rank:
    """The training loop of one rank (runs in its own process: ``main``)."""

    def __init__(self, spec: RankSpec, shared: State) -> None:
        self.spec, self.shared, self.t = spec, shared, spec.timing
        self.rng = random.Random(spec.seed * 1000 + spec.rank)
        self.n = nccl.Nccl(pathlib.Path(spec.plugin), 5)
        self.ctx = self.n.init(COMM_HASH, "dp0", spec.nnodes, spec.world, spec.rank)
        self.right = (spec.rank + 1) % spec.world
        self.left = (spec.rank - 1) % spec.world
        self.base = 0  # chunks per channel exchanged in earlier operations
        self.seq = 0
        self.next_proxy_stall_s = 0.0
        self.frozen = False
        self.consumed: dict[int, int] = {}  # channel -> chunks of the current op consumed

    # -- faults --------------------------------------------------------------------------
    def _active(self, *kinds: str, rank: int | None = None) -> bool:
        """Is one of ``kinds`` injected into ``rank`` (default: this rank) by now?"""
        inj = self.spec.injection
        if inj is None or inj.kind not in kinds:
            return False
        onset = self.shared.onset_ns
        if onset == 0 or time.time_ns() < onset:
            return False
        return (self.spec.rank if rank is None else rank) in inj.ranks

    def _nic(self, *kinds: str) -> bool:
        """A NIC fault on this path: a NIC carries both directions, so a send is hit by the
        sender's NIC and by the receiver's (Mycroft §5.2: both endpoints of a path)."""
        return self._active(*kinds) or self._active(*kinds, rank=self.right)

    def _gpu_factor(self) -> float:
        if self._active("pcie-downgrade"):
            return faults.NET_SLOW_FACTOR  # every chunk crosses the slowed link (Mycroft #3)
        return faults.SLOW_FACTOR if self._active(*faults.SLOW_GPU) else 1.0

    def _net_factor(self) -> float:
        return faults.NET_SLOW_FACTOR if self._nic(*faults.SLOW_NET) else 1.0

    # -- the loop ------------------------------------------------------------------------
    def stopped(self) -> bool:
        return self.shared.stopped

    def train(self) -> None:
        while not self.stopped():
            self.load_batch()
            self.compute()
            if self._active("not-entered"):
                self._sleep(float("inf"))  # stuck in host code: never enters the collective
            self.allreduce()

    def load_batch(self) -> None:
        """The data loader (what the profiling e2e names on its slow rank)."""
        onset = self.shared.onset_ns  # slow from the one-box's onset when one is armed
        slow = self.spec.rank == self.t.slow_loader_rank and time.time_ns() >= onset
        self._sleep(self.t.loader_s * (self.t.slow_loader_factor if slow else 1.0))

    def compute(self) -> None:
        """Forward and backward between two AllReduces."""
        compute = self.t.compute_s * (faults.SLOW_FACTOR if self._active(*faults.LATE) else 1)
        self._sleep(compute * self.rng.uniform(0.9, 1.1))

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopped() and time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def allreduce(self) -> None:
        n, t = self.n, self.t
        self.seq += 1
        count = t.count
        nsteps = t.nsteps
        if self._active("inconsistent") and self.spec.injection is not None:
            count, nsteps = count * 2, nsteps * 2  # CCL-D H2: a different size on one rank
        self.shared.set_op(self.spec.rank, CUR_SIG, count)
        self.shared.set_op(self.spec.rank, CUR_SEQ, self.seq)
        op, enqueued = n.enqueue(
            self.ctx, nccl.COLL, seqNumber=self.seq, func=b"AllReduce", count=count,
            datatype=b"ncclFloat32", nChannels=t.nchannels, algo=b"RING", proto=b"SIMPLE",
        )  # fmt: skip
        enqueued()
        self.consumed = {}
        flows: list[_Flow] = []
        kernels = []
        for ch in range(t.nchannels):
            for send, peer in ((True, self.right), (False, self.left)):
                h = n.proxy_op(self.ctx, op, ch, peer, nsteps, send=send)
                n.record(h, nccl.PROXY_OP_IN_PROGRESS)
                flows.append(_Flow(ch, send, h))
            kernels.append(n.start(self.ctx, nccl.KERNEL_CH, op, channelId=ch))
        while any(f.step < nsteps for f in flows):
            if self.stopped():
                return
            moved = False
            for f in flows:
                if f.step < nsteps:
                    moved |= self._advance(f, count)
            if moved and any(f.step > 0 for f in flows):
                self._process_fault()
            if not moved:
                time.sleep(t.poll_s)
        for f in flows:
            n.stop(f.handle)
        for ch, h in enumerate(kernels):
            n.record(h, nccl.KERNEL_CH_STOP, time.monotonic_ns() + ch)
            n.stop(h)
        self.base += nsteps

    def _process_fault(self) -> None:
        """The whole process stops here, mid-operation, as a SIGKILL (the OOM killer, a
        crash) or a SIGSTOP (a debugger, CCL-D §6.1's process blocking) would stop it."""
        if self._active("process-killed"):
            os.kill(os.getpid(), signal.SIGKILL)
        elif self._active("process-frozen") and not self.frozen:
            self.frozen = True  # once: a SIGCONT (by hand) lets it train on
            os.kill(os.getpid(), signal.SIGSTOP)

    def _proxy_stall(self) -> None:
        """Mycroft #7: the proxy thread stalls ~1 s now and then, with a chunk GPU-ready and
        its receiver's buffer posted (the local cause of Mycroft's table)."""
        if not self._active("proxy-delay"):
            return
        now = time.monotonic()
        if self.next_proxy_stall_s == 0.0:
            self.next_proxy_stall_s = now + self.rng.uniform(0.2, 0.6)
        elif now >= self.next_proxy_stall_s:
            self._sleep(faults.PROXY_STALL_S)
            self.next_proxy_stall_s = time.monotonic() + self.rng.uniform(1.0, 2.0)

    def _advance(self, f: _Flow, sig: int) -> bool:
        """One state transition of flow ``f`` if its dependency allows; True if it moved."""
        n, t, sh, me = self.n, self.t, self.shared, self.spec.rank
        idx = self.base + f.step  # this chunk's cumulative index on the channel
        now = time.monotonic()
        if f.send:
            if f.phase == 0:
                f.step_handle = n.start(self.ctx, nccl.PROXY_STEP, f.handle, rank=1, step=f.step)
                n.record(f.step_handle, nccl.SEND_GPU_WAIT)
                f.phase, f.due_s = 1, 0.0
                return True
            if f.phase == 1:  # waiting for the GPU to produce the chunk
                if self._active("gpu-hang"):
                    return False
                if f.due_s == 0.0:
                    if f.step > 0 and self._consumed(f.channel) < f.step:
                        return False
                    f.due_s = now + t.gpu_chunk_s * self._gpu_factor()
                if now < f.due_s:
                    return False
                n.record(f.step_handle, nccl.SEND_PEER_WAIT)
                f.phase = 2
                return True
            if f.phase == 2:  # waiting for the peer's receive buffer
                if sh.counter(self.right, f.channel, POSTED) <= idx:
                    return False
                self._proxy_stall()  # chunk ready, peer ready: only the proxy holds it
                n.record(f.step_handle, nccl.SEND_WAIT)
                f.phase, f.due_s = 3, now + t.net_chunk_s * self._net_factor()
                return True
            # phase 3: on the network until delivered
            if now < f.due_s or self._nic("nic-down"):
                return False
            sh.set_counter(me, f.channel, DELIVERED, idx + 1)
            n.stop(f.step_handle)
            f.step, f.phase = f.step + 1, 0
            return True
        if f.phase == 0:
            f.step_handle = n.start(self.ctx, nccl.PROXY_STEP, f.handle, rank=1, step=f.step)
            n.record(f.step_handle, nccl.RECV_WAIT)
            sh.set_counter(me, f.channel, POSTED, idx + 1)
            f.phase = 1
            return True
        if f.phase == 1:  # waiting for the data
            if sh.counter(self.left, f.channel, DELIVERED) <= idx or not self._peer_agrees(sig):
                return False
            n.record(f.step_handle, nccl.RECV_FLUSH_WAIT)
            n.record(f.step_handle, nccl.RECV_GPU_WAIT)
            f.phase, f.due_s = 2, now + t.gpu_chunk_s * self._gpu_factor()
            return True
        # phase 2: handed to the GPU, consumed after its time
        if now < f.due_s or self._active("gpu-hang"):
            return False
        n.stop(f.step_handle)
        f.step, f.phase = f.step + 1, 0
        self.consumed[f.channel] = f.step
        return True

    def _consumed(self, channel: int) -> int:
        return self.consumed.get(channel, 0)

    def _peer_agrees(self, sig: int) -> bool:
        """The left peer runs this op (or finished it) with the same signature."""
        seq = self.shared.op(self.left, CUR_SEQ)
        return seq > self.seq or (seq == self.seq and self.shared.op(self.left, CUR_SIG) == sig)


def spec_json(spec: RankSpec) -> str:
    return json.dumps(dataclasses.asdict(spec))


def spec_from_json(text: str) -> RankSpec:
    d: dict[str, Any] = json.loads(text)
    inj = d.pop("injection")
    return RankSpec(
        **{k: v for k, v in d.items() if k != "timing"},
        timing=Timing(**d["timing"]),
        injection=None
        if inj is None
        else faults.Injection(**(inj | {"ranks": tuple(inj["ranks"])})),
    )


def open_state(where: str, spec: RankSpec) -> State:
    """``tcp://host:port``: a ``fabric.Client`` writing for ``spec.rank``; else ``Shared`` at
    the path ``where``."""
    if where.startswith("tcp://"):
        from collscope.operator.onebox import fabric  # fabric imports this module

        address = fabric.parse_address(where)
        return fabric.Client(address, spec.world, spec.timing.nchannels, spec.rank)
    return Shared(pathlib.Path(where), spec.world, spec.timing.nchannels)


def probe_env(spec: RankSpec, pythonpath: str = "") -> dict[str, str]:
    """What the webhook gives a training container for the dormant probe (``injection``):
    the probe's site directory first on ``PYTHONPATH``, ``COLLSCOPE_PROBE=dormant``, and the
    trace directory and rank it needs at interpreter start (``sitecustomize`` runs then)."""
    found = importlib.util.find_spec("collscope.probe.site")
    if found is None or not found.submodule_search_locations:
        return {}
    site = next(iter(found.submodule_search_locations))
    return {
        "PYTHONPATH": os.pathsep.join(p for p in (site, pythonpath) if p),
        "COLLSCOPE_PROBE": "dormant",
        "COLLSCOPE_TRACE_DIR": spec.trace_dir,
        "RANK": str(spec.rank),
    }


def main(spec: RankSpec, shared: State) -> None:
    """The rank process: the pod's environment, then train until told to stop."""
    os.environ.update(
        {
            "COLLSCOPE_TRACE_DIR": spec.trace_dir,
            "COLLSCOPE_RING_BYTES": "1m",  # ~16k completion records: a demo's worth
            "RANK": str(spec.rank),
            "LOCAL_RANK": str(spec.local_rank),
            "WORLD_SIZE": str(spec.world),
            "POD_NAME": spec.pod,
            "POD_NAMESPACE": spec.namespace,
            "NODE_NAME": spec.node,
            "HOSTNAME": spec.pod,
        }
    )
    rank = Rank(spec, shared)
    with contextlib.suppress(KeyboardInterrupt):
        rank.train()


if __name__ == "__main__":
    _spec = spec_from_json(sys.argv[1])
    _state = open_state(sys.argv[2], _spec)
    try:
        main(_spec, _state)
    finally:
        _state.close()  # a fabric client raises here if it lost the coordinator: exit 1
