"""The flow simulator: fabric paths, job schedules, faults, collector noise, bundle output."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from collscope.nodeagent.bundle import models, reader
from collscope.operator import errors
from collscope.operator.simulator.flows import collector, config, engine, fabric, pipeline

S = 1_000_000_000


# Three jobs on 16 servers under 4 leaves (4 servers each), spread so that their rings and
# pipelines cross leaves and spines: train-00 PP 2 x DP 2, train-01 DP 4, train-02 PP 2 x DP 2.
FABRIC = config.Fabric(servers=16, servers_per_leaf=4, spines=4)
JOBS = (
    config.JobSpec(name="train-00", servers=(0, 5, 10, 15), pp=2, dp=2),
    config.JobSpec(name="train-01", servers=(1, 6, 11, 12), pp=1, dp=4),
    config.JobSpec(name="train-02", servers=(2, 7, 3, 8), pp=2, dp=2, fwd_ms=90, bwd_ms=180),
)


@functools.lru_cache(maxsize=8)
def _sim(*faults: config.FlowFault, duration_s: float = 60.0) -> engine.FlowSimResult:
    cfg = config.FlowSimConfig(
        fabric=FABRIC, jobs=JOBS, duration_s=duration_s, faults=faults, seed=4
    )
    return engine.simulate(cfg)


def _names(res: engine.FlowSimResult, idx: np.ndarray) -> list[str]:
    return [res.endpoints[i] for i in idx.tolist()]


def test_flows_follow_the_true_pairs() -> None:
    res = _sim()
    types = res.truth.pair_types()
    train = res.kind != collector.OTHER
    src, dst = _names(res, res.src[train]), _names(res, res.dst[train])
    kinds = res.kind[train].tolist()
    for a, b, k in zip(src, dst, kinds, strict=True):
        assert types[(min(a, b), max(a, b))] == ("pp" if k == pipeline.PP else "dp")
    assert np.all(np.diff(res.ts) >= 0) and np.all(res.duration > 0)
    # storage traffic goes to endpoints job.json does not list
    gpus = {r.nic for r in res.job.ranks}
    assert set(_names(res, res.src[~train])) - gpus == set(collector.STORAGE_ENDPOINTS)


def test_pp_sizes_repeat_and_dp_sizes_vary_per_step() -> None:
    res = _sim()
    for k, recurring in ((pipeline.PP, 1), (pipeline.DP, 4)):  # JobSpec default: 4 buckets
        sel = res.kind == k
        lo, hi = np.minimum(res.src[sel], res.dst[sel]), np.maximum(res.src[sel], res.dst[sel])
        pair = lo * 10**6 + hi
        _, counts = np.unique(res.nbytes[sel][pair == pair[0]], return_counts=True)
        # a record split by the collector adds two one-off sizes; real sizes recur every step
        assert int(np.sum(counts > 1)) == recurring


def test_paths_are_leaf_or_leaf_spine_leaf_and_stable_per_pair() -> None:
    fab = fabric.FabricModel(config.Fabric(servers=8, servers_per_leaf=2, spines=4))
    same = fab.path(np.array([0]), np.array([8 + 3]))  # servers 0 and 1: one leaf
    assert [int(x[0]) for x in same] == [0, -1, -1]
    src, dst = np.array([0, 0, 1]), np.array([40, 40, 40])  # server 0 -> 5: leaves 0 -> 2
    la, spine, lb = fab.path(src, dst)
    assert la.tolist() == [0, 0, 0] and lb.tolist() == [2, 2, 2]
    assert spine[0] == spine[1] and all(4 <= s < 8 for s in spine.tolist())
    assert fab.switch_names[:4] == ("leaf-00", "leaf-01", "leaf-02", "leaf-03")


def test_congested_switch_slows_only_flows_through_it_after_onset() -> None:
    res = _sim(config.FlowFault("congested-switch", "leaf-01", 30.0))
    i = res.switches.index("leaf-01")
    through = np.zeros(len(res), dtype=bool)
    rows = np.repeat(np.arange(len(res)), np.diff(res.sw_ptr))
    through[rows[res.sw_idx == i]] = True
    after = res.ts >= res.truth.faults[0].onset
    dp = res.kind == pipeline.DP
    rate = res.nbytes / res.duration
    slow = np.median(rate[dp & through & after])
    before = np.median(rate[dp & through & ~after])
    assert slow < before / 2
    pp = res.kind == pipeline.PP
    assert np.median(rate[pp & ~through & after]) > 0.9 * np.median(rate[pp & ~through & ~after])


def test_slow_job_lengthens_its_steps_only() -> None:
    res = _sim(config.FlowFault("slow-job", "train-01", 30.0, severity=1.5))
    onset = res.truth.faults[0].onset
    job = next(j for j in res.truth.jobs if j.name == "train-01")
    other = next(j for j in res.truth.jobs if j.name != "train-01")

    def pace(name: str) -> tuple[float, float]:
        ends = np.array(res.truth.step_ends[name])
        d = np.diff(ends)
        return float(np.median(d[ends[1:] < onset])), float(np.median(d[ends[:-1] > onset + 5 * S]))

    before, after = pace(job.endpoints[0])
    assert after > 1.3 * before
    before, after = pace(other.endpoints[0])
    assert abs(after / before - 1) < 0.02


def test_slow_group_truth_names_its_ring_and_nic() -> None:
    res = _sim(config.FlowFault("slow-group", None, 30.0))
    f = res.truth.faults[0]
    ring = next(g for g in res.truth.dp_groups if g.label == f.culprit)
    assert f.members == ring.members and f.nic in ring.members
    assert f.expected_category == "slow.network"


def test_bad_configs_are_refused() -> None:
    job = config.JobSpec(name="j", servers=(0, 1, 2), pp=2, dp=2)
    with pytest.raises(errors.SimulationError, match="servers != pp"):
        config.FlowSimConfig(jobs=(job,)).validate()
    with pytest.raises(errors.SimulationError, match="no switch"):
        engine.simulate(config.preset(64, faults=(config.FlowFault("congested-switch", "x"),)))
    with pytest.raises(errors.SimulationError, match="JOB/ppS/tpT"):
        engine.simulate(config.preset(64, faults=(config.FlowFault("slow-group", "nope"),)))


def test_bundle_round_trip(tmp_path: Path) -> None:
    res = _sim(duration_s=20.0)
    out = res.write(tmp_path / "b")
    assert sorted(p.name for p in out.iterdir()) == [
        "flows.jsonl.gz",
        "job.json",
        "records.jsonl.gz",
        "truth.json",
    ]
    assert list(reader.iter_net_flows(out)) == list(res.net_flows())
    bundle = reader.load(out)
    assert len(bundle.ops) == 0 and bundle.job.world_size == 128
    assert {r.nic for r in bundle.job.ranks} == set(res.endpoints[:128])
    truth = json.loads((out / "truth.json").read_text())
    assert truth["schema"] == "collscope.flowtruth/v1" and truth["jobs"]
    assert isinstance(next(reader.iter_net_flows(out)), models.NetFlow)


def test_one_f_one_b_order() -> None:
    assert pipeline.one_f_one_b(3, 4, 0) == [
        ("F", 0),
        ("F", 1),
        ("F", 2),
        ("B", 0),
        ("F", 3),
        ("B", 1),
        ("B", 2),
        ("B", 3),
    ]
    last = pipeline.one_f_one_b(3, 4, 2)
    assert last[:2] == [("F", 0), ("B", 0)] and len(last) == 8
