"""The simulated bundle as a whole: reproducibility, healthy-run consistency, record validity."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import pytest

from collscope.nodeagent.bundle import models, tables
from collscope.operator import errors
from collscope.operator.simulator import config, engine, truth

Sim = Callable[..., engine.SimResult]
TABLES = ("comms", "ops", "states", "flows", "hw")


def _ops(b: tables.Bundle) -> list[models.OpRecord]:
    return [r for r in b.iter_records() if isinstance(r, models.OpRecord)]


def test_same_seed_same_bundle_other_seed_differs(sim: Sim) -> None:
    a = engine.simulate(config.SimConfig(duration_s=2.0, onset_s=1.0, seed=3))
    b = engine.simulate(config.SimConfig(duration_s=2.0, onset_s=1.0, seed=3))
    c = engine.simulate(config.SimConfig(duration_s=2.0, onset_s=1.0, seed=4))
    for name in TABLES:
        assert np.array_equal(getattr(a.bundle, name), getattr(b.bundle, name)), name
    assert a.bundle.comm_ids == b.bundle.comm_ids and a.bundle.strings == b.bundle.strings
    assert a.bundle.job == b.bundle.job and a.truth == b.truth
    assert a.bundle.comm_ids != c.bundle.comm_ids
    assert not np.array_equal(a.bundle.ops["end"], c.bundle.ops["end"])


def test_healthy_run_every_rank_completes_every_op(sim: Sim) -> None:
    res = sim()
    b = res.bundle
    assert res.truth.fault == "none" and res.truth.culprit_ranks == []
    assert res.truth.onset is None and res.truth.expected_category is None
    members: dict[str, set[int]] = defaultdict(set)
    for c in b.comms:
        members[b.comm_ids[c["comm"]]].add(int(c["rank"]))
    done: dict[tuple[str, int], dict[int, models.OpRecord]] = defaultdict(dict)
    for op in _ops(b):
        done[(op.comm, op.seq)][op.rank] = op
    per_comm: dict[str, list[int]] = defaultdict(list)
    for (comm, seq), recs in done.items():
        first = next(iter(recs.values()))
        for rec in recs.values():  # every member issued the same op
            assert (rec.op in ("Send", "Recv")) == (first.op in ("Send", "Recv"))
            if rec.op not in ("Send", "Recv"):
                assert rec.op == first.op
            assert rec.bytes == first.bytes and rec.start <= rec.end
        per_comm[comm].append(seq)
    for comm, seqs in per_comm.items():
        top = max(seqs)
        assert sorted(seqs) == list(range(top + 1)), comm  # no gaps
        for seq in range(top):  # all but the op the run was cut in are complete on all
            assert set(done[(comm, seq)]) == members[comm], (comm, seq)
    # ~18 iterations of 10 ops in 6 s, every rank
    counts = np.bincount(b.ops["rank"])
    assert len(counts) == 64 and counts.min() >= 100


def test_healthy_run_no_stall_and_stable_durations(sim: Sim) -> None:
    b = sim().bundle
    assert b.flows["idle_ns"].max() < 0.5e9
    for name in ("AllGather", "ReduceScatter", "Send"):
        sel = b.ops["op"] == b.string_index(name)
        dur = b.ops["end"][sel] - b.ops["start"][sel]
        # ReduceScatter waits for the slowest pipeline's backward: jitter, a few %
        assert dur.min() > 0 and np.median(dur) < 2 * dur.min() and dur.max() < 5 * dur.min()


def test_records_are_valid_bundle_records(sim: Sim) -> None:
    for res in (sim(), sim(fault=truth.Fault.NIC_DOWN), sim(fault=truth.Fault.PROXY_DELAY)):
        b = res.bundle
        n = 0
        for rec in b.iter_records():  # models validate counts and ranges
            n += 1
            if isinstance(rec, models.StateRecord):
                assert rec.kernel is not None and rec.kernel.channels == 4
        assert n == len(b.comms) + len(b.ops) + len(b.states) + len(b.hw)
        assert len(b.hw) > 0
        models.Job.model_validate(b.job.model_dump(by_alias=True))


def test_comm_records_describe_every_membership(sim: Sim) -> None:
    b = sim().bundle
    assert len(b.comms) == 64 * 3 - 0  # tp, dp and one pp pair per rank (pp=2)
    names = {b.strings[c["name"]] for c in b.comms}
    assert {"tp0", "dp15", "pp0-1.31"} <= names
    for c in b.comms:
        assert 0 <= c["comm_rank"] < c["nranks"]


def test_nothing_after_the_end_of_the_run(sim: Sim) -> None:
    b = sim().bundle
    end = config.DEFAULT_START_NS + 6 * 10**9
    assert b.ops["ts"].max() < end and b.states["ts"].max() < end
    assert b.states["ts"].max() >= end - 2 * 10**8  # sampled right up to the end


def test_p2p_ops_carry_peer_and_empty_algo(sim: Sim) -> None:
    b = sim().bundle
    for op in itertools.islice((o for o in _ops(b) if o.op in ("Send", "Recv")), 200):
        assert op.peer is not None and op.algo == ""
        assert abs(op.peer - op.rank) == 32  # the other pipeline stage
    for op in itertools.islice((o for o in _ops(b) if o.op == "AllReduce"), 50):
        assert op.peer is None and op.algo == "Ring" and op.proto == "Simple"
        assert op.dtype == "bf16" and op.channels == 4


def test_tp_inside_a_node_has_no_flows_only_kernel_progress(sim: Sim) -> None:
    b = sim().bundle
    tp = {
        i
        for i, cid in enumerate(b.comm_ids)
        if cid in {b.comm_ids[c["comm"]] for c in b.comms if b.strings[c["name"]].startswith("tp")}
    }
    st = b.states
    is_tp = np.isin(st["comm"], list(tp))
    assert is_tp.any()
    assert np.all(st["flow_hi"][is_tp] == st["flow_lo"][is_tp])
    assert np.all(st["kernel_channels"] == 4)
    # every flow's peer is on another node (8 GPUs per node)
    for i in np.flatnonzero(~is_tp)[:300]:
        for f in b.state_flows(int(i)):
            assert f["peer"] // 8 != st["rank"][i] // 8


def test_tp_across_nodes_has_flows_only_on_crossing_hops(sim: Sim) -> None:
    b = sim(ranks=32, gpus_per_node=4, tp=8, pp=1, dp=4).bundle
    st = b.states
    seen: set[tuple[int, int]] = set()
    for i in range(len(st)):
        for f in b.state_flows(i):
            r, p = int(st["rank"][i]), int(f["peer"])
            assert r // 4 != p // 4
            seen.add((r, p))
    assert (3, 4) in seen and (4, 3) in seen and (1, 2) not in seen


@pytest.mark.parametrize("algo, dp_mode", [("ring", "allreduce"), ("tree", "allreduce")])
def test_allreduce_modes(sim: Sim, algo: str, dp_mode: str) -> None:
    b = sim(algo=algo, dp_mode=dp_mode).bundle
    dp_ops = [o for o in _ops(b) if o.bytes == 256 * 1024 * 1024]
    assert dp_ops and {o.op for o in dp_ops} == {"AllReduce"}
    assert {o.algo for o in dp_ops} == {algo.capitalize()}
    assert b.flows["idle_ns"].max() < 0.5e9


def test_small_and_odd_layouts_run() -> None:
    for cfg in (
        config.SimConfig(ranks=2, gpus_per_node=1, tp=1, pp=1, dp=2, duration_s=1.0, onset_s=0.5),
        config.SimConfig(
            ranks=12,
            gpus_per_node=4,
            tp=3,
            pp=2,
            dp=2,
            duration_s=1.0,
            onset_s=0.5,
            order="dp-tp-cp-ep-pp",
        ),
        config.SimConfig(
            ranks=8,
            gpus_per_node=8,
            tp=1,
            pp=8,
            dp=1,
            duration_s=2.0,
            onset_s=0.5,
            fault=truth.Fault.GPU_POWER_LIMIT,
        ),
    ):
        b = engine.simulate(cfg).bundle
        assert len(b.ops) > 0
        assert set(b.ranks.tolist()) == set(range(cfg.ranks))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"ranks": 10}, r"tp\*pp\*dp"),
        ({"channels": 1}, "channels"),
        ({"onset_s": 20.0}, "onset_s"),
        ({"fault": truth.Fault.NIC_SLOW, "target": 64}, "target"),
        ({"fault": truth.Fault.BACKGROUND_COMPUTE, "target": 8}, "target"),
        ({"algo": "tree"}, "tree"),
        ({"severity": 0.5}, "severity"),
        ({"ranks": 1, "tp": 1, "pp": 1, "dp": 1}, "ranks"),
    ],
)
def test_invalid_configs_are_rejected(fields: dict[str, object], message: str) -> None:
    cfg = config.SimConfig(**fields)  # type: ignore[arg-type]
    with pytest.raises(errors.SimulationError, match=message):
        engine.simulate(cfg)


def test_network_fault_on_a_single_node_is_rejected() -> None:
    cfg = config.SimConfig(ranks=8, tp=8, pp=1, dp=1, fault=truth.Fault.NIC_DOWN)
    with pytest.raises(errors.SimulationError, match="more than one node"):
        engine.simulate(cfg)


def test_a_workload_that_never_advances_is_rejected() -> None:
    cfg = config.SimConfig(ranks=8, tp=8, pp=1, dp=1, workload=config.Workload(layers=0))
    with pytest.raises(errors.SimulationError, match="no time"):
        engine.simulate(cfg)
