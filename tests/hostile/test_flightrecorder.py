"""Hostile tenants against stacks and Flight Recorder collection (issue 15 item 2).

A node as the agent sees it, faked at its two roots (STYLE habit 10): a kubelet pods directory
with one ring per pod, and a /proc tree of the same layout (``status`` NSpid, ``cgroup``,
``environ``, ``root/``). Pod A's rank 0 and pod C's rank 2 are honest; pod B's rank 1 is the
attacker. The service is wired as ``agent.Agent`` wires it (``stacks.guarded`` and
``flightrecorder.guarded`` around ``procs.TrainingProcesses``, the real ``agent.fr_dumper``),
without the HTTP server, whose authentication is another test's business. Every attack asserts
the honest ranks are still served.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pathlib
import pickle
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pydantic
import pytest

from collscope.nodeagent import (
    agent,
    api,
    discovery,
    flightrecorder,
    frdump,
    procs,
    sampler,
    service,
    settings,
    stacks,
    window,
)

UIDS = {0: "aaaaaaaa-0000-1111-2222-333344445555", 1: "bbbbbbbb-0000-1111-2222-333344445555",
        2: "cccccccc-0000-1111-2222-333344445555"}  # fmt: skip
HOST = {0: 5000, 1: 6000, 2: 7000}  # each rank's host pid; pid 1 in its own container
VICTIM = 4242  # a host daemon, outside every pod
FAST = frdump.ParseLimits(timeout_s=0.5)  # a normal dump parses in ~50 ms


def _ring_builder() -> Any:
    """tests/unit/nodeagent/conftest.py's RingBuilder (a ring written field by field)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "unit" / "nodeagent" / "conftest.py"
    spec = importlib.util.spec_from_file_location("collscope_nodeagent_conftest", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RingBuilder


def _proc(root: pathlib.Path, pid: int, nspid: str, cgroup: str, env: bytes = b"") -> None:
    d = root / str(pid)
    (d / "root" / "tmp").mkdir(parents=True)
    (d / "status").write_text(f"Name:\tpython\nPid:\t{pid}\nNSpid:\t{nspid}\n")
    (d / "cgroup").write_text(cgroup)
    (d / "environ").write_bytes(env)


class Calls:
    def __init__(self) -> None:
        self.pids: list[int] = []

    def stacks(self, pids: Sequence[int], timeout_s: float) -> pydantic.BaseModel:
        self.pids += pids
        return stacks.StacksReport(groups=[stacks.StackGroup(frames=["f"], pids=list(pids))])


class Node:
    def __init__(self, tmp: pathlib.Path, *, forged_pid: int) -> None:
        self.proc = tmp / "proc"
        self.calls = Calls()
        pods = tmp / "pods"
        builder = _ring_builder()
        env = b"TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/fr_\0TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/tmp/d_\0"
        for rank, uid in UIDS.items():
            vol = pods / uid / "volumes" / discovery.EMPTY_DIR / "collscope-trace"
            vol.mkdir(parents=True)
            b = builder()
            b.header[0]["rank"] = rank
            b.header[0]["pid"] = forged_pid if rank == 1 else 1
            b.write(vol / f"rank{rank}.ring")
            cgroup = f"0::/kubepods/burstable/pod{uid}/cri-containerd-{rank}\n"
            _proc(self.proc, HOST[rank], f"{HOST[rank]} 1", cgroup, env)
        _proc(self.proc, VICTIM, str(VICTIM), "0::/system.slice/victim.service\n", env)
        config = settings.DiscoverySettings(mode="kubelet", kubelet_pods_dir=str(pods))
        loop = sampler.Sampler(
            discovery.Discovery(config),
            window.Window(window_s=30, memory_cap_bytes=8 << 20),
            settings.SamplingSettings(),
        )
        loop.tick()
        host_pid = functools.partial(procs.host_pid, proc_root=self.proc)

        def pods_now() -> set[str]:  # as agent.Agent._pods
            return {t.pod_uid for t in loop.rings() if t.pod_uid and t.health != "retired"}

        def writers() -> list[tuple[int, int]]:  # kubelet mode: every ring is in a pod
            return []

        self.targets = procs.TrainingProcesses(pods_now, writers, proc_root=self.proc)
        fr = agent.fr_dumper(self.proc, limits=FAST)
        self.service = service.Service(
            "node",
            loop,
            stacks=stacks.guarded(self.calls.stacks, self.targets.refusal),
            flightrecorder=flightrecorder.guarded(fr, self.targets.refusal),
            host_pid=host_pid,
        )

    def container(self, rank: int) -> pathlib.Path:
        return self.proc / str(HOST[rank]) / "root"


@pytest.fixture
def node(tmp_path: pathlib.Path) -> Node:
    return Node(tmp_path, forged_pid=VICTIM)


def test_a_forged_ring_pid_never_reaches_the_victim(node: Node) -> None:
    """Pod B's ring says its writer is pid 4242 (the victim's host pid, in no pod)."""
    ranks = {r.rank: r.host_pid for r in node.service.ranks().ranks}
    assert ranks == {0: HOST[0], 1: None, 2: HOST[2]}  # never the victim
    # Rank 1's writer cannot be found on the host: that rank's error, py-spy never runs for it.
    alone = node.service.stacks(api.StacksRequest(ranks=[1]))
    assert isinstance(alone, stacks.StacksReport) and not node.calls.pids
    assert [(e.rank, e.pid) for e in alone.errors] == [(1, None)]
    assert "not visible" in alone.errors[0].reason
    report = node.service.stacks(api.StacksRequest(pids=[VICTIM, HOST[1], 1]))
    assert isinstance(report, stacks.StacksReport)
    assert {e.pid for e in report.errors} == {VICTIM, 1}
    assert all(e.reason.startswith("refused:") for e in report.errors)
    node.service.stacks(api.StacksRequest(ranks=[0, 2]))
    assert VICTIM not in node.calls.pids and node.calls.pids == [HOST[1], HOST[0], HOST[2]]


class Rank(threading.Thread):
    """One rank's DumpPipe in its container root: on a poke, ``act(root)`` leaves its dump."""

    def __init__(self, root: pathlib.Path, rank: int, act: Callable[[pathlib.Path], Any]) -> None:
        super().__init__(daemon=True)
        self.root, self.rank, self.act = root, rank, act
        self.stop = threading.Event()
        pipe = root / "tmp" / f"fr_{rank}.pipe"
        os.mkfifo(pipe)
        self.fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                poked = os.read(self.fd, 64)
            except BlockingIOError:
                poked = b""
            if poked:
                self.act(self.root)
            time.sleep(0.005)
        os.close(self.fd)


def _dump(rank: int) -> bytes:
    return pickle.dumps({"version": "2.5", "entries": [{"collective_seq_id": 40 + rank}]})


def _bomb() -> bytes:
    matrix = [list(range(2000))] * 2000  # 12 KB; converting it takes 2000**3 steps
    return pickle.dumps({"entries": [{"input_sizes": matrix}] * 2000}, protocol=2)


class _Evil:
    def __reduce__(self) -> Any:
        return (os.system, ("touch /tmp/collscope-pwned",))


def _writes(payload: bytes, rank: int = 1) -> Callable[[pathlib.Path], Any]:
    return lambda root: (root / "tmp" / f"d_{rank}").write_bytes(payload)


def _symlink(root: pathlib.Path) -> None:
    secret = root.parents[2] / "etc-hostname"  # outside every container root
    secret.write_bytes(_dump(1))  # dump-shaped, so a followed link would "work"
    (root / "tmp" / "d_1").symlink_to(secret)


def _sparse(root: pathlib.Path) -> None:
    with open(root / "tmp" / "d_1", "wb") as f:
        f.truncate(65 << 20)  # past frdump.MAX_DUMP_BYTES, costing no disk


# What the attacker's rank leaves as its dump when poked, and the reason it must get.
ATTACKS: dict[str, tuple[Callable[[pathlib.Path], Any], str]] = {
    "pickle bomb": (_writes(_bomb()), "longer than 0.5 s (killed)"),
    "code in the pickle": (
        _writes(pickle.dumps({"entries": [_Evil()]})),
        "refused global posix.system",
    ),
    "symlink to a host file": (_symlink, "a symbolic link: not followed"),
    "FIFO as the dump": (lambda root: os.mkfifo(root / "tmp" / "d_1"), "not a regular file"),
    "65 MB sparse dump": (_sparse, "larger than 67108864 bytes"),
}


@pytest.fixture
def honest_node(tmp_path: pathlib.Path) -> Iterator[tuple[Node, dict[int, Rank]]]:
    n = Node(tmp_path, forged_pid=1)  # pod B's ring is honest about its pid here
    ranks = {r: Rank(n.container(r), r, _writes(_dump(r), r)) for r in UIDS}
    for t in ranks.values():
        t.start()
    yield n, ranks
    for t in ranks.values():
        t.stop.set()
        t.join(timeout=5)


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_hostile_dump_costs_its_rank_only(
    honest_node: tuple[Node, dict[int, Rank]], attack: str
) -> None:
    node, ranks = honest_node
    ranks[1].act, reason = ATTACKS[attack]
    start = time.monotonic()
    report = node.service.flightrecorder(api.FlightRecorderRequest(timeout_s=2))
    assert time.monotonic() - start < 5
    assert [(d.rank, d.entries[0].collective_seq_id) for d in report.dumps] == [(0, 40), (2, 42)]
    assert [e.rank for e in report.errors] == [1]
    assert reason in report.errors[0].reason, report.errors[0].reason
    assert not pathlib.Path("/tmp/collscope-pwned").exists()
