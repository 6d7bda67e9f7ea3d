"""NCCL's side of the profiler plugin ABI, in ctypes: what drives the real plugin without NCCL.

The one-box data path (``collscope demo``, ``tests/e2e``) and the plugin's own tests
(``tests/unit/native``, ``tests/unit/nodeagent``) load ``libnccl-profiler-collscope.so`` with
``ctypes`` and call its exported ``ncclProfiler_v4``/``_v5``/``_v6`` tables in the order NCCL
does (shared/notes/nccl-profiler.md §3).

``Nccl`` mirrors the ABI of notes §2: the v4 descriptor (uint8 ``type``) and the v5/v6 one
(uint64 ``type``, API events, ``parentGroup``), both with the union at offset 24, and the two
init argument orders (v4: context, mask, name, hash, ...; v5/v6: context, commId, mask, name,
...). Sizes are asserted at import against the values the plugin's ``nccl_profiler_abi.h`` pins
with ``_Static_assert``. A call the plugin refuses (non-zero return) raises
``errors.PluginError``: the plugin must never fail NCCL.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
from collections.abc import Callable
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    Union,
    c_bool,
    c_char_p,
    c_int,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Any, Final

from collscope.operator import errors

LIB_NAME: Final = "libnccl-profiler-collscope.so"

# Event types (also the activation-mask bits) and states, notes §1 and §2.4.
GROUP, COLL, P2P, PROXY_OP, PROXY_STEP, KERNEL_CH = 1, 2, 4, 8, 16, 64
GROUP_API, COLL_API, P2P_API, KERNEL_LAUNCH = 256, 512, 1024, 2048
SEND_GPU_WAIT, SEND_WAIT, RECV_WAIT, RECV_FLUSH_WAIT, RECV_GPU_WAIT = 8, 9, 10, 11, 12
PROXY_OP_IN_PROGRESS, SEND_PEER_WAIT, KERNEL_CH_STOP = 19, 20, 22
GROUP_START_API_STOP, GROUP_END_API_START = 23, 24


class ProxyOp(Structure):
    _fields_ = [
        ("pid", c_int),
        ("channelId", c_uint8),
        ("peer", c_int),
        ("nSteps", c_int),
        ("chunkSize", c_int),
        ("isSend", c_int),
    ]


class ProxyStep(Structure):
    _fields_ = [("step", c_int)]


class KernelCh(Structure):
    _fields_ = [("channelId", c_uint8), ("pTimer", c_uint64)]


class NetPlugin(Structure):
    _fields_ = [("id", c_int64), ("data", c_void_p)]


class CollV4(Structure):
    _fields_ = [
        ("seqNumber", c_uint64),
        ("func", c_char_p),
        ("sendBuff", c_void_p),
        ("recvBuff", c_void_p),
        ("count", c_size_t),
        ("root", c_int),
        ("datatype", c_char_p),
        ("nChannels", c_uint8),
        ("nWarps", c_uint8),
        ("algo", c_char_p),
        ("proto", c_char_p),
    ]


class CollV5(CollV4):
    _fields_ = [("parentGroup", c_void_p)]


class P2pV4(Structure):
    _fields_ = [
        ("func", c_char_p),
        ("buff", c_void_p),
        ("datatype", c_char_p),
        ("count", c_size_t),
        ("peer", c_int),
        ("nChannels", c_uint8),
    ]


class P2pV5(P2pV4):
    _fields_ = [("parentGroup", c_void_p)]


class GroupApi(Structure):
    _fields_ = [("graphCaptured", c_bool), ("groupDepth", c_int)]


class CollApi(Structure):
    _fields_ = [
        ("func", c_char_p),
        ("count", c_size_t),
        ("datatype", c_char_p),
        ("root", c_int),
        ("stream", c_void_p),
        ("graphCaptured", c_bool),
    ]


class CeColl(Structure):
    _fields_ = [
        ("seqNumber", c_uint64),
        ("func", c_char_p),
        ("sendBuff", c_void_p),
        ("recvBuff", c_void_p),
        ("count", c_size_t),
        ("root", c_int),
        ("datatype", c_char_p),
        ("syncStrategy", c_char_p),
        ("intraBatchSync", c_bool),
        ("batchSize", c_uint32),
        ("numBatches", c_uint32),
        ("ceSeqNum", c_uint32),
        ("stream", c_void_p),
    ]


class UnionV4(Union):
    _fields_ = [
        ("coll", CollV4),
        ("p2p", P2pV4),
        ("proxyOp", ProxyOp),
        ("proxyStep", ProxyStep),
        ("kernelCh", KernelCh),
        ("netPlugin", NetPlugin),
    ]


class UnionV5(Union):
    _fields_ = [
        ("groupApi", GroupApi),
        ("collApi", CollApi),
        ("coll", CollV5),
        ("p2p", P2pV5),
        ("proxyOp", ProxyOp),
        ("proxyStep", ProxyStep),
        ("kernelCh", KernelCh),
        ("netPlugin", NetPlugin),
    ]


class UnionV6(Union):
    _fields_ = [*UnionV5._fields_, ("ceColl", CeColl)]


class DescrV4(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", c_uint8), ("parentObj", c_void_p), ("rank", c_int), ("u", UnionV4)]


class DescrV5(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", c_uint64), ("parentObj", c_void_p), ("rank", c_int), ("u", UnionV5)]


class DescrV6(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", c_uint64), ("parentObj", c_void_p), ("rank", c_int), ("u", UnionV6)]


class StateArgs(Union):
    _fields_ = [("transSize", c_size_t), ("pTimer", c_uint64)]


INIT_V4 = CFUNCTYPE(
    c_int, POINTER(c_void_p), POINTER(c_int), c_char_p, c_uint64, c_int, c_int, c_int, c_void_p
)
INIT_V5 = CFUNCTYPE(
    c_int, POINTER(c_void_p), c_uint64, POINTER(c_int), c_char_p, c_int, c_int, c_int, c_void_p
)
START = CFUNCTYPE(c_int, c_void_p, POINTER(c_void_p), c_void_p)
STOP = CFUNCTYPE(c_int, c_void_p)
RECORD = CFUNCTYPE(c_int, c_void_p, c_int, c_void_p)
FINALIZE = CFUNCTYPE(c_int, c_void_p)


class Table(Structure):
    """``ncclProfiler_vN_t``: the exported data symbol (init's type differs by version)."""

    _fields_ = [
        ("name", c_char_p),
        ("init", c_void_p),
        ("startEvent", START),
        ("stopEvent", STOP),
        ("recordEventState", RECORD),
        ("finalize", FINALIZE),
    ]


# What nccl_profiler_abi.h pins with _Static_assert (LP64).
assert ctypes.sizeof(CollV4) == 80 and ctypes.sizeof(CollV5) == 88
assert ctypes.sizeof(DescrV4) == 104 and DescrV4.u.offset == 24
assert ctypes.sizeof(DescrV5) == 112 and DescrV5.u.offset == 24
assert ctypes.sizeof(DescrV6) == 112 and ctypes.sizeof(CeColl) == 88
assert ctypes.sizeof(Table) == 48 and ctypes.sizeof(StateArgs) == 8


class Nccl:
    """NCCL's side of the plugin ABI for one API version; never stops or records a NULL handle
    (NCCL does not either)."""

    def __init__(self, lib: pathlib.Path, api: int) -> None:
        self.api = api
        self.lib = ctypes.CDLL(str(lib), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        self.table = Table.in_dll(self.lib, f"ncclProfiler_v{api}")
        self._init = ctypes.cast(self.table.init, INIT_V4 if api == 4 else INIT_V5)
        self._descr = {4: DescrV4, 5: DescrV5, 6: DescrV6}[api]
        self.mask = c_int(0)  # NCCL's process-wide ncclProfilerEventMask
        self.pid = os.getpid()
        self.contexts: set[int] = set()

    def init(self, comm_hash: int, name: str, nnodes: int, nranks: int, rank: int) -> int:
        ctx = c_void_p()
        if self.api == 4:
            rc = self._init(
                ctypes.byref(ctx), ctypes.byref(self.mask), name.encode(), comm_hash,
                nnodes, nranks, rank, None,
            )  # fmt: skip
        else:
            rc = self._init(
                ctypes.byref(ctx), comm_hash, ctypes.byref(self.mask), name.encode(),
                nnodes, nranks, rank, None,
            )  # fmt: skip
        if rc != 0 or ctx.value is None:
            raise errors.PluginError(f"ncclProfiler_v{self.api}.init returned {rc}, no context")
        self.contexts.add(ctx.value)
        return ctx.value

    def finalize(self, ctx: int) -> None:
        self.contexts.remove(ctx)
        _check(self.table.finalize(ctx), "finalize")

    def start(self, ctx: int, kind: int, parent: int | None = None, **fields: Any) -> int | None:
        """startEvent with a descriptor of ``kind``; ``fields`` go to its union member."""
        d = self._descr()
        d.type = kind
        d.parentObj = parent
        member = {
            COLL: "coll",
            P2P: "p2p",
            PROXY_OP: "proxyOp",
            PROXY_STEP: "proxyStep",
            KERNEL_CH: "kernelCh",
            GROUP_API: "groupApi",
            COLL_API: "collApi",
        }.get(kind)
        for name, value in fields.items():
            if name == "rank":
                d.rank = value
            else:
                if member is None:
                    raise errors.PluginError(f"event {kind} has no field {name}")
                setattr(getattr(d, member), name, value)
        handle = c_void_p()
        _check(self.table.startEvent(ctx, ctypes.byref(handle), ctypes.addressof(d)), "startEvent")
        return handle.value

    def stop(self, handle: int | None) -> None:
        if handle is not None:
            _check(self.table.stopEvent(handle), "stopEvent")

    def record(self, handle: int | None, state: int, arg: int | None = None) -> None:
        if handle is None:
            return
        args = None
        if arg is not None:
            args = ctypes.addressof(StateArgs(pTimer=arg))
        _check(self.table.recordEventState(handle, state, args), "recordEventState")

    # NCCL's sequences (notes §3) ---------------------------------------------------------

    def api_enter(self, ctx: int, func: bytes) -> tuple[int | None, int | None]:
        """User thread, v5+: GroupApi start, GroupStartApiStop, CollApi start/stop,
        GroupEndApiStart, KernelLaunch. Returns (GroupApi, CollApi) handles; v4: (None, None)."""
        if self.api == 4:
            return None, None
        group_api = self.start(ctx, GROUP_API, groupDepth=1)
        self.record(group_api, GROUP_START_API_STOP)
        coll_api = self.start(ctx, COLL_API, group_api, func=func, count=1, datatype=b"x")
        self.stop(coll_api)
        self.record(group_api, GROUP_END_API_START)
        self.stop(self.start(ctx, KERNEL_LAUNCH, group_api))
        return group_api, coll_api

    def enqueue(self, ctx: int, kind: int, **fields: Any) -> tuple[int | None, Callable[[], None]]:
        """hostStreamPlanTask: Group start, then the Coll/P2p start (parent: CollApi in v5+,
        Group in v4). Returns the op handle and what stops the enqueue (Coll stop only means
        "enqueued"), Group and GroupApi."""
        func = fields.get("func", b"")
        group_api, coll_api = self.api_enter(ctx, func)
        group = self.start(ctx, GROUP)
        op = self.start(ctx, kind, coll_api if self.api >= 5 else group, rank=1, **fields)

        def done() -> None:
            self.stop(op)
            self.stop(group)
            self.stop(group_api)

        return op, done

    def proxy_op(self, ctx: int, op: int | None, channel: int, peer: int, nsteps: int, *,
                 send: bool, pid: int | None = None) -> int | None:  # fmt: skip
        return self.start(
            ctx, PROXY_OP, op, rank=1, pid=self.pid if pid is None else pid,
            channelId=channel, peer=peer, nSteps=nsteps, chunkSize=1 << 19, isSend=int(send),
        )  # fmt: skip

    def step(self, ctx: int, proxy_op: int | None, step: int, states: list[int],
             stop: bool) -> int | None:  # fmt: skip
        """One ProxyStep: start, its states in order, and its stop if ``stop``."""
        h = self.start(ctx, PROXY_STEP, proxy_op, rank=1, step=step)
        for state in states:
            self.record(h, state)
        if stop:
            self.stop(h)
        return h


SEND_STATES = [SEND_GPU_WAIT, SEND_PEER_WAIT, SEND_WAIT]
RECV_STATES = [RECV_WAIT, RECV_FLUSH_WAIT, RECV_GPU_WAIT]


def _check(rc: int, call: str) -> None:
    if rc != 0:
        raise errors.PluginError(f"the plugin's {call} returned {rc}")
