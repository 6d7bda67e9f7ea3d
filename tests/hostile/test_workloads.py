"""Two jobs on one node (issue 15 item 5): another tenant's job cannot read or mix with this one.

The node, faked at its kubelet pods directory (STYLE habit 10): pod A runs ranks 0 and 1 of the
victim's job, pod B ranks 0 and 1 of another tenant's. B's rings copy everything A's could be
confused by: the same pod name and namespace in their headers, the same communicator hash with
the communicator ranks swapped (so a shared peer table would send A's flows to the wrong
rank), and B's rank 1 names a pid that is no process on the host (a forged header). Only the
sizes of the operations tell whose a record is: A moves 4 MiB per op, B 1 KiB.
"""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
from collections.abc import Callable
from typing import Any

import pytest

from collscope.nodeagent import (
    api,
    discovery,
    errors,
    flightrecorder,
    sampler,
    service,
    settings,
    stacks,
    window,
)
from collscope.nodeagent.bundle import tables

A = "aaaaaaaa-0000-1111-2222-333344445555"  # the victim's pod
B = "bbbbbbbb-0000-1111-2222-333344445555"  # the other tenant's pod
BYTES = {A: 4 << 20, B: 1 << 10}
PIDS = {(A, 0): 100, (A, 1): 101, (B, 0): 200, (B, 1): 4242}  # 4242: no such process
HOST = {100: 5100, 101: 5101, 200: 5200}  # host pids of the real writers
COMM = 0x1F3A_0000_BEEF  # one communicator hash for both jobs
S = 1_000_000_000


def _conftest() -> Any:
    """tests/unit/nodeagent/conftest.py (RingBuilder, T0), loaded by path."""
    path = pathlib.Path(__file__).resolve().parents[1] / "unit" / "nodeagent" / "conftest.py"
    spec = importlib.util.spec_from_file_location("collscope_nodeagent_conftest", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


C = _conftest()
T0: int = C.T0


class Dumps:
    """The py-spy and Flight Recorder dumpers: record what they are asked, answer per pid."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.targets: list[tuple[int, int]] = []

    def stacks(self, pids: Any, timeout_s: float) -> stacks.StacksReport:
        self.pids += pids
        return stacks.StacksReport(groups=[stacks.StackGroup(frames=["f"], pids=list(pids))])

    def fr(self, targets: Any, timeout_s: float) -> flightrecorder.FlightRecorderReport:
        self.targets += targets
        return flightrecorder.FlightRecorderReport()


class Node:
    def __init__(self, tmp: pathlib.Path) -> None:
        self.pods = tmp / "pods"
        self.now = T0 + S
        for uid in (A, B):
            vol = self.pods / uid / "volumes" / discovery.EMPTY_DIR / "collscope-trace"
            vol.mkdir(parents=True)
            for rank in (0, 1):
                self._ring(uid, rank).write(vol / f"rank{rank}.ring")
        config = settings.DiscoverySettings(mode="kubelet", kubelet_pods_dir=str(self.pods))
        self.loop = sampler.Sampler(
            discovery.Discovery(config),
            window.Window(window_s=30, memory_cap_bytes=8 << 20),
            settings.SamplingSettings(),
            clock_ns=lambda: self.now,
        )
        self.loop.tick()
        self.dumps = Dumps()
        self.service = service.Service(
            "node",
            self.loop,
            stacks=self.dumps.stacks,
            flightrecorder=self.dumps.fr,
            host_pid=lambda pid, _uid: HOST.get(pid),
            clock_ns=lambda: self.now,
        )

    @staticmethod
    def _ring(uid: str, rank: int) -> Any:
        b = C.RingBuilder()
        h = b.header[0]
        h["rank"], h["local_rank"], h["world_size"], h["pid"] = rank, rank, 2, PIDS[(uid, rank)]
        # B's communicator ranks are A's swapped: B's rank 0 is comm rank 1 of the same hash.
        comm_rank = rank if uid == A else 1 - rank
        b.comm(comm_hash=COMM, rank=comm_rank, nranks=2, nnodes=1)
        b.op(slot=0, serial=0, seq=5, bytes=BYTES[uid])
        b.flow(slot=0, serial=0, peer=1 - comm_rank)  # to the other rank of its own job
        b.event(0, "init", comm_hash=COMM, rank=comm_rank, nranks=2, nnodes=1)
        for i in (1, 2, 3):
            b.event(i, comm_hash=COMM, bytes=BYTES[uid])
        return b

    def retire(self, uid: str) -> None:
        shutil.rmtree(self.pods / uid)
        self.now += S  # past the rescan interval
        self.loop.tick()


@pytest.fixture
def node(tmp_path: pathlib.Path) -> Node:
    return Node(tmp_path)


def _sizes(b: tables.Bundle) -> set[int]:
    return {int(x) for x in b.ops["bytes"]} | {int(x) for x in b.states["bytes"]}


def test_each_job_sees_only_its_own_window(node: Node) -> None:
    ranks = node.service.ranks().ranks
    assert sorted((r.workload, r.rank) for r in ranks) == [(A, 0), (A, 1), (B, 0), (B, 1)]
    for uid in (A, B):
        b = node.service.bundle(None, None, None, workloads=[uid])
        assert _sizes(b) == {BYTES[uid]}
        assert sorted(b.ops["rank"].tolist()) == [0, 0, 0, 1, 1, 1]  # 3 ops per rank, no more
        assert sorted(b.comms["rank"].tolist()) == [0, 1]
        assert [r.rank for r in b.job.ranks] == [0, 1]
        assert sorted(b.liveness["rank"].tolist()) == [0, 1]
    # A's flows go to A's peers: B's swapped communicator ranks did not rewrite A's table.
    a = node.service.bundle(None, None, None, workloads=[A])
    assert sorted(zip(a.states["rank"].tolist(), a.flows["peer"].tolist(), strict=True)) == [
        (0, 1),
        (1, 0),
    ]
    lines = "".join(node.service.window_lines([0], None, None, workloads=[A]))
    assert str(BYTES[A]) in lines and f'"bytes":{BYTES[B]}' not in lines
    exported = node.service.export(None, None, workloads=[B])
    assert exported[:2] == b"\x1f\x8b"  # a gzip of B's records only (the bundle above)


def test_summaries_are_per_workload(node: Node) -> None:
    for uid in (A, B):
        got = node.service.summaries([0, 1], 5.0, workloads=[uid]).summaries
        assert [(s.rank, s.workload, s.pod_uid) for s in got] == [(0, uid, uid), (1, uid, uid)]
        assert {s.completed_bytes for s in got} == {3 * BYTES[uid]}
        assert {o.bytes for s in got for o in s.in_flight} == {BYTES[uid]}
    # All ranks without naming a workload (the agent's own /metrics): each key apart.
    every = node.service.summaries(None, 5.0).summaries
    assert [(s.rank, s.workload, s.completed_bytes) for s in every] == [
        (0, A, 3 * BYTES[A]),
        (0, B, 3 * BYTES[B]),
        (1, A, 3 * BYTES[A]),
        (1, B, 3 * BYTES[B]),
    ]


def test_a_request_that_names_no_workload_is_refused_not_mixed(node: Node) -> None:
    svc = node.service
    refused: list[Callable[[], object]] = [
        lambda: svc.summaries([0], 5.0),
        lambda: svc.bundle([1], None, None),
        lambda: svc.bundle(None, None, None),  # the whole node: ranks 0 and 1 are both twice
        lambda: svc.window_columns([0], None, None),
        lambda: svc.export(None, None),
        lambda: svc.stacks(api.StacksRequest(ranks=[0])),
        lambda: svc.flightrecorder(api.FlightRecorderRequest()),
    ]
    for call in refused:
        with pytest.raises(errors.QueryError, match=f"held by 2 workloads.*{A}, {B}") as e:
            call()
        assert e.value.parameter == "workloads"
    assert node.dumps.pids == [] and node.dumps.targets == []
    # Naming both is still ambiguous for an answer keyed by rank alone.
    with pytest.raises(errors.QueryError, match="held by 2 workloads"):
        svc.bundle([0], None, None, workloads=[A, B])
    # A workload that is not on the node, or a rank it does not hold: nothing to answer.
    with pytest.raises(errors.QueryError, match="rank 0 has no ring on workloads"):
        svc.summaries([0], 5.0, workloads=["cccccccc-0000-1111-2222-333344445555"])


def test_one_workload_left_the_old_form_answers(node: Node) -> None:
    node.retire(B)  # its rings are retired; what was read of them stays in the window
    assert {r.health for r in node.service.ranks().ranks if r.workload == B} == {"retired"}
    got = node.service.summaries([0, 1], 5.0).summaries
    assert [(s.rank, s.workload) for s in got] == [(0, A), (1, A)]
    assert _sizes(node.service.bundle([0, 1], None, None)) == {BYTES[A]}
    # Named, the retired workload's records are still there for whoever asks for them.
    assert _sizes(node.service.bundle([0], None, None, workloads=[B])) == {BYTES[B]}


def test_a_forged_pid_is_that_ranks_error_only(node: Node) -> None:
    """B's rank 1 names pid 4242 (no process of the host): rank 0 is still dumped."""
    report = node.service.stacks(api.StacksRequest(ranks=[0, 1], workloads=[B]))
    assert isinstance(report, stacks.StacksReport)
    assert node.dumps.pids == [HOST[200]]
    assert [(e.rank, e.pid) for e in report.errors] == [(1, None)]
    assert "pid 4242" in report.errors[0].reason and "not visible" in report.errors[0].reason
    fr = node.service.flightrecorder(api.FlightRecorderRequest(workloads=[B]))
    assert node.dumps.targets == [(0, HOST[200])]
    assert [(f.rank, "not visible" in f.reason) for f in fr.errors] == [(1, True)]
    # A's ranks are A's processes, never B's.
    node.service.stacks(api.StacksRequest(ranks=[0, 1], workloads=[A]))
    assert node.dumps.pids == [HOST[200], HOST[100], HOST[101]]


def test_the_window_forgets_a_workload_once_its_rings_are_gone(node: Node) -> None:
    node.retire(B)
    assert (B, 0) in node.loop.window.held()
    node.now += 31 * S  # past the window: B's rings are dropped, and its comm records with them
    node.loop.tick()
    assert {w for w, _ in node.loop.window.held()} == {A}
