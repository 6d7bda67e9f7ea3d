"""The sampling loop over rings written by the real plugin (tests/unit/native's build)."""

from __future__ import annotations

import os
import pathlib
import shutil
import threading
import time
from typing import Any

from collscope.nodeagent import discovery, sampler, settings, window
from collscope.nodeagent.bundle import models
from collscope.nodeagent.ring import layout

UIDS = ("0a0a0a0a-1111-2222-3333-444444444444", "0b0b0b0b-1111-2222-3333-444444444444")
VOLUME = "collscope-trace"


def make(
    root: pathlib.Path, *, kubelet: bool = False, stale_after_s: float = 2.0
) -> sampler.Sampler:
    mode: settings.DiscoveryMode = "kubelet" if kubelet else "directory"
    d = settings.DiscoverySettings(
        mode=mode, kubelet_pods_dir=str(root), ring_volume=VOLUME, trace_root=str(root)
    )
    w = window.Window(window_s=60, memory_cap_bytes=64 << 20)
    config = settings.SamplingSettings(sample_interval_s=0.02, stale_after_s=stale_after_s)
    return sampler.Sampler(discovery.Discovery(d), w, config, rescan_interval_s=0.1)


def records(s: sampler.Sampler, rank: int | None = None) -> list[Any]:
    b = s.window.bundle(models.Job(world_size=8), ranks=None if rank is None else [rank])
    return list(b.iter_records())


def of(recs: list[Any], kind: type) -> list[Any]:
    return [r for r in recs if isinstance(r, kind)]


def by_health(s: sampler.Sampler) -> dict[str, str]:
    return {pathlib.Path(t.path).name: t.health for t in s.rings()}


def test_kubelet_tree_rings_are_sampled_per_rank(tmp_path: pathlib.Path, plugin_rank: Any) -> None:
    pods = tmp_path / "pods"
    dirs = [pods / u / "volumes" / discovery.EMPTY_DIR / VOLUME for u in UIDS]
    r0 = plugin_rank(dirs[0], 0)
    r1 = plugin_rank(dirs[1], 1)
    r0.complete(3)
    r1.complete(2)
    stuck = r1.allreduce(nch=2, nsteps=8)
    stuck.advance(2)
    s = make(pods, kubelet=True)
    s.tick()
    rings = {t.identity.rank: t for t in s.rings() if t.identity}
    assert {r: t.pod_uid for r, t in rings.items()} == {0: UIDS[0], 1: UIDS[1]}
    assert {t.health for t in rings.values()} == {"live"}
    ops0 = of(records(s, 0), models.OpRecord)
    assert [o.seq for o in ops0] == [1, 2, 3] and ops0[0].op == "AllReduce"
    (state,) = of(records(s, 1), models.StateRecord)
    assert state.seq == 3 and len(state.flows) == 4
    assert {f.peer for f in state.flows} == {0, 2}  # comm ranks 0 and 2 (rank 0 is known)
    assert [c.comm_rank for c in of(records(s), models.CommRecord)] == [0, 1]
    assert of(records(s, 0), models.StateRecord) == []  # nothing in flight on rank 0
    s.tick()
    assert len(of(records(s, 1), models.StateRecord)) == 2  # sampled again: still in flight
    s.stop()


def test_live_sampling_while_a_driver_writes(tmp_path: pathlib.Path, plugin_rank: Any) -> None:
    trace = tmp_path / "trace"
    rk = plugin_rank(trace, 2)
    s = make(trace)
    s.start()
    stop = threading.Event()
    done: list[int] = []

    def drive() -> None:
        while not stop.is_set() and len(done) < 400:
            op = rk.allreduce(nch=2, nsteps=4)
            op.advance(2)
            time.sleep(0.001)
            op.finish()
            done.append(rk.seq)

    t = threading.Thread(target=drive)
    t.start()
    time.sleep(0.6)
    stop.set()
    t.join()
    # A new ring appears while the loop runs: picked up within a second.
    late = plugin_rank(trace, 3)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and len(s.rings()) < 2:
        time.sleep(0.02)
    assert len(s.rings()) == 2
    time.sleep(0.1)  # one more tick reads the last completions
    s.stop()
    ops = of(records(s, 2), models.OpRecord)
    assert [o.seq for o in ops] == done  # every completion, once, in order
    assert s.stats.events_missed == 0 and s.stats.loop_errors == 0
    assert s.stats.ticks >= 10
    assert late.ring_path.exists()


def test_restart_mid_stream_recovers_what_the_ring_holds(
    tmp_path: pathlib.Path, plugin_rank: Any
) -> None:
    trace = tmp_path / "trace"
    rk = plugin_rank(trace, 0)
    rk.complete(5)
    first = make(trace)
    first.tick()
    first.stop()
    rk.complete(3)  # written while no agent runs
    second = make(trace)
    second.tick()
    rk.complete(2)
    second.tick()
    assert [o.seq for o in of(records(second), models.OpRecord)] == list(range(1, 11))
    second.stop()


def test_corrupt_and_truncated_rings_are_skipped_and_counted(
    tmp_path: pathlib.Path, plugin_rank: Any
) -> None:
    trace = tmp_path / "trace"
    good = plugin_rank(trace, 0)
    good.complete(2)
    (trace / "garbage.ring").write_bytes(os.urandom(8192))
    cut = trace / "cut.ring"
    cut.write_bytes(good.ring_path.read_bytes()[:5000])
    s = make(trace)
    s.tick()
    health = by_health(s)
    assert health["garbage.ring"] == "error" and health["cut.ring"] == "error"
    assert health[good.ring_path.name] == "live"
    assert s.stats.ring_errors == 2
    time.sleep(0.12)
    s.tick()  # rescanned: unchanged files are not retried nor counted again
    assert s.stats.ring_errors == 2
    assert [o.seq for o in of(records(s), models.OpRecord)] == [1, 2]
    shutil.copy(good.ring_path, cut)  # fixed in place: opened at the next scan
    time.sleep(0.12)
    s.tick()
    assert by_health(s)["cut.ring"] == "live"
    s.stop()


def test_a_ring_truncated_while_open_is_closed_and_its_data_kept(
    tmp_path: pathlib.Path, plugin_rank: Any
) -> None:
    rk = plugin_rank(tmp_path / "writer", 1)
    rk.complete(3)
    trace = tmp_path / "trace"
    trace.mkdir()
    copy = trace / "copy.ring"  # a copy: truncating the live file would SIGBUS its writer
    shutil.copy(rk.ring_path, copy)
    s = make(trace)
    s.tick()
    os.truncate(copy, 4096)
    s.tick()
    (t,) = s.rings()
    assert t.health == "error" and "shrank" in t.error and s.stats.ring_errors == 1
    assert len(of(records(s), models.OpRecord)) == 3
    shutil.copy(rk.ring_path, copy)  # whole again: reopened, nothing read twice
    time.sleep(0.12)
    s.tick()
    assert s.rings()[0].health == "live"
    assert [o.seq for o in of(records(s), models.OpRecord)] == [1, 2, 3]
    s.stop()


def test_dead_writer_is_still_sampled_and_vanished_rings_retire(
    tmp_path: pathlib.Path, plugin_rank: Any
) -> None:
    rk = plugin_rank(tmp_path / "writer", 1)
    op = rk.allreduce(nch=1, nsteps=8)
    op.advance(1)
    trace = tmp_path / "trace"
    trace.mkdir()
    copy = trace / "dead.ring"  # nobody beats its heartbeat: a dead process's ring
    shutil.copy(rk.ring_path, copy)
    s = make(trace, stale_after_s=0.2)
    time.sleep(0.3)
    s.tick()
    s.tick()
    (t,) = s.rings()
    assert t.health == "stale"
    states = of(records(s), models.StateRecord)
    assert len(states) == 2 and states[0].seq == 1  # its last state, sampled every tick
    assert states[1].flows[0].idle_ns > states[0].flows[0].idle_ns
    copy.unlink()
    time.sleep(0.12)
    s.tick()
    (t,) = s.rings()
    assert t.health == "retired"
    assert len(of(records(s), models.StateRecord)) == 2  # what was read stays
    s.stop()


def _erase_rank(ring_dir: pathlib.Path) -> None:
    """Make the header say rank -1, as the plugin writes it when RANK is unset."""
    (path,) = ring_dir.glob("*.ring")
    fields = layout.HEADER.fields
    assert fields is not None
    offset = fields["rank"][1]
    with path.open("r+b") as f:
        f.seek(offset)
        f.write((-1).to_bytes(4, "little", signed=True))


def test_a_ring_without_rank_takes_it_from_its_launchers_environment(
    tmp_path: pathlib.Path, plugin_rank: Any
) -> None:
    """mpirun, srun, PMIx launchers and Indexed Jobs set no RANK: the rank comes from the
    writer's environment (issue 15 item 7); a ring whose rank cannot be known is listed with
    the reason, not windowed, never dropped silently."""
    dirs = {name: tmp_path / name for name in ("mpi", "nothing", "unreadable")}
    for i, d in enumerate(dirs.values()):
        plugin_rank(d, i).complete(2)
        _erase_rank(d)
    envs = {"mpi": {"OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8"},
            "nothing": {"PATH": "/bin"}}  # fmt: skip
    got: list[str] = []

    def rank_env(t: sampler.Tracked) -> dict[str, str] | None:
        name = pathlib.Path(t.path).parent.name
        got.append(name)
        return envs.get(name)

    found = settings.DiscoverySettings(mode="directory", trace_root=str(tmp_path))
    w = window.Window(window_s=60, memory_cap_bytes=64 << 20)
    config = settings.SamplingSettings(sample_interval_s=0.02, stale_after_s=2.0)
    s = sampler.Sampler(discovery.Discovery(found), w, config, rank_env=rank_env)
    s.tick()
    s.tick()
    rings = {pathlib.Path(t.path).parent.name: t for t in s.rings()}
    mpi = rings["mpi"]
    assert mpi.identity is not None and mpi.identity.rank == 6 and mpi.error == ""
    assert mpi.identity.world_size == 4  # the header's own value is kept when it has one
    assert [o.seq for o in of(records(s, 6), models.OpRecord)] == [1, 2]
    for name, why in (("nothing", "none of RANK,"), ("unreadable", "environment unreadable")):
        t = rings[name]
        assert t.identity is not None and t.identity.rank is None and t.health == "live"
        assert t.error.startswith("rank unknown") and why in t.error, t.error
    assert sorted(got) == ["mpi", "nothing", "unreadable"]  # asked once per ring opened
