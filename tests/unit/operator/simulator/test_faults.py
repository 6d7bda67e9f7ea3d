"""Every injected fault leaves the fingerprint the analysis is meant to find (Mycroft §5.3,
§7.1; CCL-D §2.2), and the truth names it."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest

from collscope.nodeagent.bundle import tables
from collscope.operator.simulator import config, engine, truth

Sim = Callable[..., engine.SimResult]
F = truth.Fault
# pp=1: the only inter-node ops are DP rings, so hang faults strike mid-ring; rank 17's ring
# is dp1 = [1, 9, 17, 25, ...], its predecessor 9 and successor 25.
RING = {"ranks": 64, "tp": 8, "pp": 1, "dp": 8, "target": 17}


def _comm(b: tables.Bundle, name: str) -> int:
    (row,) = [c for c in b.comms if b.strings[c["name"]] == name][:1]
    return int(row["comm"])


def _last_state(b: tables.Bundle, rank: int, back: int = 0) -> int:
    idx = np.flatnonzero(b.states["rank"] == rank)
    return int(idx[-1 - back])


def _flows(b: tables.Bundle, state: int, direction: int, peer: int | None = None) -> tables.Table:
    f = b.state_flows(state)
    sel = f["dir"] == direction
    if peer is not None:
        sel &= f["peer"] == peer
    out: tables.Table = f[sel]
    return out


def _hung_to_the_end(b: tables.Bundle, ranks: list[int]) -> None:
    end = b.states["ts"].max()
    for r in ranks:
        st = b.states[_last_state(b, r)]
        assert st["ts"] == end, f"rank {r} not in flight at the end"


def _check_truth(res: engine.SimResult, fault: F, start: float = 3.0) -> int:
    """Check the truth record of a faulty run; return its onset (ns)."""
    t = res.truth
    assert t.fault == fault.value.name and t.expected_category == fault.value.category
    assert t.onset is not None
    assert config.DEFAULT_START_NS + start * 1e9 <= t.onset < config.DEFAULT_START_NS + 6e9
    assert t.culprit_node == res.bundle.job.ranks[t.culprit_ranks[0]].node
    assert t.detail
    return t.onset


def test_nic_down_sent_but_never_delivered(sim: Sim) -> None:
    res = sim(fault=F.NIC_DOWN, **RING)
    b = res.bundle
    onset = _check_truth(res, F.NIC_DOWN)
    assert res.truth.culprit_ranks == [17] and "NIC mlx5_1 down" in res.truth.detail
    x = _last_state(b, 17)
    assert b.strings[b.states["op"][x]] in ("ReduceScatter", "AllGather")
    send, recv = _flows(b, x, tables.SEND), _flows(b, x, tables.RECV)
    assert len(send) == len(recv) == 4
    assert np.all(send["sent"] > send["done"]) and np.all(send["done"] < send["total"])
    assert np.all(recv["posted"] > recv["done"])
    assert np.all(send["idle_ns"] > 1e9)
    pred = _flows(b, _last_state(b, 9), tables.SEND, peer=17)
    assert len(pred) == 4 and np.all(pred["sent"] > pred["done"])
    # the hang propagates through TP to every DP group: the whole job stops
    _hung_to_the_end(b, list(range(64)))
    assert b.ops["end"].max() < onset + 1e9


def test_nic_down_in_the_default_job_hangs_everyone(sim: Sim) -> None:
    res = sim(fault=F.NIC_DOWN)
    b = res.bundle
    _check_truth(res, F.NIC_DOWN)
    x = res.truth.culprit_ranks[0]
    send = _flows(b, _last_state(b, x), tables.SEND)
    recv_peers = _flows(b, _last_state(b, x), tables.RECV)
    assert len(send) + len(recv_peers) > 0
    if len(send):
        assert np.all(send["sent"] > send["done"])
    _hung_to_the_end(b, list(range(64)))


def test_gpu_hang_ready_frozen_network_delivered(sim: Sim) -> None:
    res = sim(fault=F.GPU_HANG, **RING)
    b = res.bundle
    _check_truth(res, F.GPU_HANG)
    x, before = _last_state(b, 17), _last_state(b, 17, back=5)
    assert b.states["seq"][x] == b.states["seq"][before]
    send = _flows(b, x, tables.SEND)
    assert np.array_equal(send["ready"], _flows(b, before, tables.SEND)["ready"])
    assert np.all(send["ready"] == send["sent"]) and np.all(send["sent"] == send["done"])
    assert np.all(send["ready"] < send["total"])
    recv = _flows(b, x, tables.RECV)
    assert np.all(recv["done"] == recv["posted"]) and np.all(recv["consumed"] < recv["done"])
    pred = _flows(b, _last_state(b, 9), tables.SEND, peer=17)
    assert np.all(pred["sent"] == pred["done"]) and np.all(pred["ready"] > pred["sent"])
    _hung_to_the_end(b, list(range(64)))


def test_not_entered_peers_wait_in_an_op_the_culprit_never_started(sim: Sim) -> None:
    res = sim(fault=F.NOT_ENTERED)
    b = res.bundle
    onset = _check_truth(res, F.NOT_ENTERED)
    x = res.truth.culprit_ranks[0]
    m = re.search(r"seq (\d+) of (\S+)$", res.truth.detail)
    assert m is not None
    seq, comm = int(m.group(1)), _comm(b, m.group(2))
    st = b.states
    stuck = (st["comm"] == comm) & (st["seq"] == seq)
    assert not np.any(stuck & (st["rank"] == x))
    peers = set(np.unique(st["rank"][stuck]).tolist())
    members = {int(c["rank"]) for c in b.comms if c["comm"] == comm}
    assert peers == members - {x}
    assert not np.any((b.ops["comm"] == comm) & (b.ops["seq"] == seq))
    assert st["ts"][st["rank"] == x].max() < onset + 1e8  # x writes nothing after
    # Mycroft §5.4: the stuck group stalls, then the groups that depend on it; at the end
    # every other rank waits in some op forever. Ranks sharing no communicator with the
    # culprit's group get stuck only after that group did.
    others = [r for r in range(64) if r != x]
    _hung_to_the_end(b, others)
    stuck_since = {r: int(st["start"][_last_state(b, r)]) for r in others}
    comms_of_group = np.unique(b.comms["comm"][np.isin(b.comms["rank"], list(members))])
    near = set(b.comms["rank"][np.isin(b.comms["comm"], comms_of_group)].tolist())
    far = [r for r in others if r not in near]
    assert far
    group_stuck = max(stuck_since[r] for r in members - {x})
    assert min(stuck_since[r] for r in far) > group_stuck - 2e7  # clocks disagree by <10 ms


@pytest.mark.parametrize("seed", [0, 3])  # 0: twice the bytes, 3: a different op
def test_inconsistent_culprit_state_differs_from_its_peers(sim: Sim, seed: int) -> None:
    res = sim(fault=F.INCONSISTENT, seed=seed)
    b = res.bundle
    _check_truth(res, F.INCONSISTENT)
    x = res.truth.culprit_ranks[0]
    m = re.search(r"seq (\d+) of (\S+?)( with twice the bytes)?$", res.truth.detail)
    assert m is not None
    seq, comm = int(m.group(1)), _comm(b, m.group(2))
    st = b.states
    stuck = np.flatnonzero((st["comm"] == comm) & (st["seq"] == seq))
    mine = {(int(st["op"][i]), int(st["bytes"][i])) for i in stuck if st["rank"][i] == x}
    theirs = {(int(st["op"][i]), int(st["bytes"][i])) for i in stuck if st["rank"][i] != x}
    assert len(mine) == 1 and len(theirs) == 1 and mine != theirs
    assert not np.any((b.ops["comm"] == comm) & (b.ops["seq"] == seq))
    for i in stuck:  # nobody makes progress in it
        f = b.state_flows(int(i))
        assert np.all(f["done"] == 0)
    members = sorted({int(c["rank"]) for c in b.comms if c["comm"] == comm})
    _hung_to_the_end(b, members)


def _affected_mean_ms(
    b: tables.Bundle, culprits: list[int], after_ns: float, before_ns: float
) -> tuple[float, float]:
    """Mean op duration of the culprits' peers in the culprits' communicators."""
    comms = np.unique(b.comms["comm"][np.isin(b.comms["rank"], culprits)])
    ops = b.ops[np.isin(b.ops["comm"], comms) & ~np.isin(b.ops["rank"], culprits)]
    dur = (ops["end"] - ops["start"]) / 1e6
    return float(dur[ops["start"] < before_ns].mean()), float(dur[ops["start"] > after_ns].mean())


SLOW = [
    F.NIC_SLOW,
    F.BACKGROUND_TRAFFIC,
    F.PCIE_DOWNGRADE,
    F.GPU_POWER_LIMIT,
    F.BACKGROUND_COMPUTE,
    F.PROXY_DELAY,
    F.MIXED_SLOW,
]


@pytest.mark.parametrize("fault", SLOW, ids=lambda f: f.value.name)
def test_slow_faults_slow_the_culprits_groups(sim: Sim, fault: F) -> None:
    res = sim(fault=fault)
    healthy = sim()
    onset = _check_truth(res, fault)
    if fault.value.target == "node":
        assert len(res.truth.culprit_ranks) == 8
    pre, post = _affected_mean_ms(res.bundle, res.truth.culprit_ranks, onset + 2e8, onset)
    h_pre, h_post = _affected_mean_ms(healthy.bundle, res.truth.culprit_ranks, onset + 2e8, onset)
    assert pre == pytest.approx(h_pre, rel=0.5)
    assert post > 1.5 * h_post, (pre, post, h_post)
    assert res.bundle.states["ts"].max() >= onset + 2e9  # a slow job does not hang


@pytest.mark.parametrize(
    "fault", [F.NIC_SLOW, F.BACKGROUND_TRAFFIC, F.MIXED_SLOW], ids=lambda f: f.value.name
)
def test_slow_network_ready_equals_sent_done_lags(sim: Sim, fault: F) -> None:
    res = sim(fault=fault)
    b = res.bundle
    x = res.truth.culprit_ranks[0]
    onset = res.truth.onset
    assert onset is not None
    rows = np.flatnonzero((b.states["rank"] == x) & (b.states["ts"] > onset))
    send = np.concatenate([_flows(b, int(i), tables.SEND) for i in rows])
    assert len(send) > 0
    assert np.all(send["ready"] == send["sent"]) and np.all(send["sent"] > send["done"])


def test_proxy_delay_ready_grows_while_sent_freezes(sim: Sim) -> None:
    res = sim(fault=F.PROXY_DELAY)
    b = res.bundle
    x = res.truth.culprit_ranks[0]
    onset = res.truth.onset
    assert onset is not None
    rows = np.flatnonzero((b.states["rank"] == x) & (b.states["ts"] > onset))
    send = np.concatenate([_flows(b, int(i), tables.SEND) for i in rows])
    stalled = send[(send["ready"] > send["sent"]) & (send["idle_ns"] > 3e8)]
    assert len(stalled) > 0
    assert np.all(stalled["sent"] == stalled["done"])  # what was posted got through


def test_healthy_and_faulty_runs_share_their_past(sim: Sim) -> None:
    healthy, faulty = sim().bundle, sim(fault=F.GPU_POWER_LIMIT).bundle
    cut = config.DEFAULT_START_NS + 3 * 10**9
    h = healthy.ops[healthy.ops["end"] < cut]
    f = faulty.ops[faulty.ops["end"] < cut]
    assert np.array_equal(h, f)
