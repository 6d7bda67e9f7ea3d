"""The Flight Recorder summary of a Diagnosis: per-rank last-collective state from the agent's
dump JSON, ranks grouped by identical state, notes for ranks without a dump, sizes capped;
and the same on real dumps made by torch 2.13 on gloo (``tests/fixtures/flightrecorder``),
compared with torch's own analyzer."""

from __future__ import annotations

import concurrent.futures
import pathlib
import pickle
import subprocess
import sys
from typing import Any

import pytest

from collscope.nodeagent import frdump
from collscope.operator.domain import flightrecorder

MAKE_DUMPS = pathlib.Path(__file__).parents[3] / "fixtures" / "flightrecorder" / "make_dumps.py"


def dump(
    rank: int,
    *,
    enqueued: int,
    completed: int,
    started: int = -1,
    op: str = "nccl:all_reduce",
    pg: str = "0",
    desc: str = "default_pg",
) -> dict[str, Any]:
    """A ``frdump.RankDump`` as the agent sends it (JSON), one process group, NCCL-shaped:
    ``pg_config`` keyed by the group's name, ``pg_status`` and entries by the per-process
    ``pg_id``, which differs from the name (as on a rank that skipped other groups)."""
    pg_id = int(pg) + 10
    entries = [
        {"pg_id": pg_id, "pg_name": pg, "pg_desc": desc, "collective_seq_id": s,
         "profiling_name": op, "is_p2p": False, "retired": s <= completed,
         "state": "completed" if s <= completed else "scheduled"}
        for s in range(max(0, completed - 1), enqueued + 1)
    ]  # fmt: skip
    return {
        "rank": rank,
        "file": f"/root/.cache/torch/comm_lib_trace_rank_{rank}",
        "version": "2.10",
        "pg_config": [{"id": pg, "name": pg, "desc": desc, "ranks": [0, 1]}],
        "pg_status": [
            {
                "id": str(pg_id),
                "last_enqueued_collective": enqueued,
                "last_started_collective": started,
                "last_completed_collective": completed,
            }
        ],
        "entries": entries,
    }


def test_hang_groups_the_waiting_ranks_and_singles_out_the_one_behind() -> None:
    waiting = [dump(r, enqueued=1042, completed=1041) for r in range(7)]
    behind = dump(7, enqueued=1041, completed=1041)
    got = flightrecorder.summarise(
        {"node-a": {"dumps": waiting[:4], "errors": []},
         "node-b": {"dumps": [*waiting[4:], behind], "errors": []}},
        asked={"node-a": [0, 1, 2, 3], "node-b": [4, 5, 6, 7]},
    )  # fmt: skip
    assert got["summary"] == (
        "ranks 0-6: entered AllReduce seq 1042; rank 7: last completed AllReduce seq 1041"
    )
    assert got["groups"][0] == {
        "ranks": "0-6", "count": 7, "state": "entered AllReduce seq 1042",
        "processGroups": [{"pg": "default_pg", "op": "AllReduce", "seq": 1042,
                           "state": "scheduled"}],
    }  # fmt: skip
    assert (got["ranksAsked"], got["ranksDumped"], got["notes"]) == (8, 8, [])


def test_started_differs_from_scheduled_and_a_rank_without_collectives_stands_out() -> None:
    # Mycroft case three: ranks that started the op vs ranks whose op was only scheduled,
    # and a rank that never launched any collective.
    empty = {"rank": 3, "file": "f", "pg_config": [], "pg_status": [], "entries": []}
    got = flightrecorder.summarise(
        {"n": {"dumps": [dump(0, enqueued=5, started=5, completed=4),
                         dump(1, enqueued=5, started=5, completed=4),
                         dump(2, enqueued=5, completed=4), empty]}},
        asked={"n": [0, 1, 2, 3]},
    )  # fmt: skip
    assert [g["state"] for g in got["groups"]] == [
        "entered AllReduce seq 5, kernel started",
        "entered AllReduce seq 5",
        "no collective recorded",
    ]
    assert "processGroups" not in got["groups"][2]


def test_process_groups_are_labelled_when_there_are_several() -> None:
    tp = dump(0, enqueued=9, completed=9, op="nccl:all_gather", pg="1", desc="undefined")
    got = flightrecorder.summarise(
        {"n": {"dumps": [dump(1, enqueued=3, completed=2), tp]}}, asked={"n": [0, 1]}
    )
    assert got["summary"] == (
        "rank 0: pg 1 last completed AllGather seq 9; rank 1: pg default_pg entered AllReduce seq 3"
    )


def test_missing_dumps_are_notes_not_errors() -> None:
    got = flightrecorder.summarise(
        {"node-a": {"dumps": [dump(0, enqueued=2, completed=1)],
                    "errors": [{"rank": 1, "reason": "pid 9: TORCH_NCCL_DEBUG_INFO_PIPE_FILE "
                                                     "is not set"}]}},
        asked={"node-a": [0, 1, 2], "node-b": [3, 4]},
        unreachable={"node-b": "agent node-b: HTTP 503: Flight Recorder: not available"},
    )  # fmt: skip
    assert got["notes"] == [
        "ranks 3-4 on node-b: no dump: agent node-b: HTTP 503: Flight Recorder: not available",
        "rank 1 on node-a: no Flight Recorder dump: pid 9: TORCH_NCCL_DEBUG_INFO_PIPE_FILE is "
        "not set",
        "rank 2 on node-a: no Flight Recorder dump: the agent returned neither a dump nor an error",
    ]
    assert got["ranksDumped"] == 1 and got["ranksAsked"] == 5


def test_nothing_dumped_says_so() -> None:
    got = flightrecorder.failed({"n": [0, 1]}, "collection failed: boom")
    assert got["summary"] == "no Flight Recorder dump from any of the 2 ranks asked (see notes)"
    assert got["notes"] == ["ranks 0-1 on n: no dump: collection failed: boom"]


def test_malformed_json_is_tolerated() -> None:
    bad = {"rank": 0, "pg_config": "x", "pg_status": [None, {"id": "0"}], "entries": [1, {}]}
    got = flightrecorder.summarise(
        {"n": {"dumps": [bad, "junk"], "errors": [{}]}}, asked={"n": [0]}
    )
    assert got["groups"][0]["state"] == "no collective recorded"


def test_sizes_are_capped_at_1024_ranks(crds: Any) -> None:
    # Every rank in its own state: 1,024 groups, 16 listed, the summary cut with a count.
    dumps = [dump(r, enqueued=r + 1, completed=r) for r in range(1024)]
    errors = [{"rank": r, "reason": "x" * 500} for r in range(1024, 1100)]
    got = flightrecorder.summarise(
        {"n": {"dumps": dumps, "errors": errors}}, asked={"n": list(range(1100))}
    )
    assert len(got["groups"]) == flightrecorder.MAX_GROUPS and got["omittedGroups"] == 1008
    assert len(got["summary"]) <= flightrecorder.SUMMARY_MAX_CHARS
    assert got["summary"].endswith("more groups")
    assert len(got["notes"]) == flightrecorder.MAX_NOTES and got["notes"][-1] == "+61 more notes"
    assert all(len(n) <= flightrecorder.NOTE_MAX_CHARS for n in got["notes"])
    crds.validator("diagnoses", "status").validate({"flightRecorder": got})


def test_helpers() -> None:
    assert flightrecorder.rank_ranges([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
    assert flightrecorder.op_name("nccl:reduce_scatter") == "ReduceScatter"
    assert flightrecorder.op_name("nccl:send 1->2") == "Send"
    # Culprits first, then the triggering communicator's members; all ranks when unknown.
    assert flightrecorder.choose([7], [4, 5, 6, 7], range(16)) == [4, 5, 6, 7]
    assert flightrecorder.choose([9], [], range(4), max_ranks=3) == [0, 1, 2]
    assert flightrecorder.choose([299], [], range(300)) == [*range(255), 299]
    assert len(flightrecorder.choose([], [], range(1024))) == flightrecorder.MAX_RANKS


def test_pg_id_is_mapped_to_its_name_through_the_entries() -> None:
    # Rank 0 created TP group "1" as its pg_id 1, rank 2 TP group "2" as its pg_id 1: the
    # same id names different groups, and pg_config (keyed by name) says nothing of ids.
    a = dump(0, enqueued=5, completed=4, pg="1", desc="undefined")
    b = dump(2, enqueued=5, completed=4, pg="2", desc="undefined")
    for d in (a, b):
        for e in d["entries"]:
            e["pg_id"] = 1
        d["pg_status"][0]["id"] = "1"
    got = flightrecorder.summarise({"n": {"dumps": [a, b]}}, asked={"n": [0, 2]})
    assert (
        got["summary"]
        == "rank 0: pg 1 entered AllReduce seq 5; rank 2: pg 2 entered AllReduce seq 5"
    )


def test_a_retired_collective_that_never_completed_timed_out() -> None:
    # NCCL after a watchdog timeout: pg_status counts seq 5 as completed, but its entry is
    # retired without completing (torch: "a retired but not completed event has timed out").
    d = dump(0, enqueued=5, completed=5)
    d["entries"][-1]["state"] = "started"
    got = flightrecorder.summarise(
        {"n": {"dumps": [d, dump(1, enqueued=4, completed=4)]}}, asked={"n": [0, 1]}
    )
    assert got["summary"] == (
        "rank 0: AllReduce seq 5 did not complete (timed out or aborted); "
        "rank 1: last completed AllReduce seq 4"
    )
    assert got["groups"][0]["processGroups"][0]["state"] == "failed"


def test_completed_by_some_members_but_never_entered_by_another_is_not_completed() -> None:
    # gloo marks no entry completed; only the peers' counters tell that seq 5 could not have.
    def gloo(rank: int, seq: int) -> dict[str, Any]:
        d = dump(rank, enqueued=seq, completed=seq)
        for e in d["entries"]:
            e["state"] = "scheduled"
        return d

    got = flightrecorder.summarise(
        {"n": {"dumps": [gloo(0, 5), gloo(1, 5), gloo(2, 4)]}}, asked={"n": [0, 1, 2]}
    )
    assert got["summary"] == (
        "ranks 0-1: AllReduce seq 5 did not complete (timed out or aborted); "
        "rank 2: last completed AllReduce seq 4"
    )


# -- real dumps made by torch --------------------------------------------------------------
# Group names of make_dumps.py's "several" scenario: new_group numbers groups in call order.
SEVERAL = {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}


@pytest.fixture(scope="module")
def torch_dumps(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """``<dir>/{one,several}/{pending,ended}/rank_<r>``, made once for this module (both
    scenarios at once, ~10 s on two cores: one torch import each, the ranks forked, 2 s of
    gloo timeout)."""
    pytest.importorskip("torch", reason="real Flight Recorder dumps need CPU PyTorch")
    out = tmp_path_factory.mktemp("frdumps")

    def make(scenario: str) -> None:
        cmd = [sys.executable, str(MAKE_DUMPS), str(out / scenario), scenario]
        subprocess.run(cmd, check=True, timeout=100, capture_output=True)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(make, ["one", "several"]))
    return out


def _summary(directory: pathlib.Path) -> dict[str, Any]:
    """What the operator makes of a directory of dumps, each parsed as the agent parses it
    (``frdump.Parser``: the limited child) and sent as JSON."""
    parser = frdump.Parser()
    dumps = [
        parser.parse(p.read_bytes(), rank=int(p.name.removeprefix("rank_")), file=str(p))
        for p in sorted(directory.iterdir())
    ]
    report = {"dumps": [d.model_dump(mode="json") for d in dumps]}
    return flightrecorder.summarise({"n": report}, asked={"n": [0, 1, 2, 3]})


@pytest.mark.slow
def test_real_dumps_one_process_group(torch_dumps: pathlib.Path) -> None:
    assert _summary(torch_dumps / "one" / "pending")["summary"] == (
        "ranks 0-2: entered AllReduce seq 4; rank 3: last completed AllReduce seq 3"
    )
    # After gloo's 2 s timeout torch counts seq 4 as completed on ranks 0-2.
    assert _summary(torch_dumps / "one" / "ended")["summary"] == (
        "ranks 0-2: AllReduce seq 4 did not complete (timed out or aborted); "
        "rank 3: last completed AllReduce seq 3"
    )


@pytest.mark.slow
def test_real_dumps_several_process_groups(torch_dumps: pathlib.Path) -> None:
    raw = pickle.loads((torch_dumps / "several" / "pending" / "rank_2").read_bytes())
    assert raw["pg_config"] == {"": {"name": "", "desc": "", "ranks": "[]"}}  # gloo's
    assert {(e["pg_id"], e["process_group"][0]) for e in raw["entries"]} == {
        (0, "0"),
        (1, "2"),
        (2, "3"),
    }  # pg_id 1 is group "2" on rank 2 (group "1" on rank 0)
    got = _summary(torch_dumps / "several" / "pending")
    assert got["summary"] == (
        "ranks 0-1: pg default_pg entered AllReduce seq 4; rank 2: pg 2 entered AllReduce "
        "seq 4; rank 3: pg 2 last completed AllReduce seq 3, pg 4 last completed AllReduce "
        "seq 3, pg default_pg last completed AllReduce seq 3"
    )
    ended = _summary(torch_dumps / "several" / "ended")["groups"]
    assert [(g["ranks"], [p["state"] for p in g["processGroups"]]) for g in ended] == [
        ("0-1", ["failed"]),
        ("2", ["failed"]),
        ("3", ["completed"] * 3),
    ]


def _torch_analysis(
    directory: pathlib.Path, groups: dict[str, list[int]], tmp: pathlib.Path
) -> list[Any]:
    """torch.distributed.flight_recorder's collectives for the dumps of ``directory``, with
    ``pg_config`` rebuilt as NCCL writes it (gloo writes one entry keyed '', on which the
    analyzer fails): keyed by group name, desc from the entries, ranks from ``groups``."""
    builder = pytest.importorskip("torch.distributed.flight_recorder.components.builder")
    from torch.distributed.flight_recorder.components import config_manager, loader

    tmp.mkdir()
    for p in directory.iterdir():
        d = pickle.loads(p.read_bytes())
        named = {tuple(e["process_group"]) for e in d["entries"]}
        d["pg_config"] = {
            n: {"name": n, "desc": desc, "ranks": str(groups[n])} for n, desc in named
        }
        (tmp / p.name).write_bytes(pickle.dumps(d))
    args = config_manager.JobConfig().parse_args([str(tmp), "--prefix", "rank_"])
    details, version = loader.read_dir(args)
    return list(builder.build_db(details, args, version).collectives)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["one", "several"])
def test_real_dumps_agree_with_torchs_analyzer(
    torch_dumps: pathlib.Path, scenario: str, tmp_path: pathlib.Path
) -> None:
    groups = SEVERAL if scenario == "several" else {"0": [0, 1, 2, 3]}
    directory = torch_dumps / scenario / "pending"
    unmatched = [c for c in _torch_analysis(directory, groups, tmp_path / "fr") if c.missing_ranks]
    assert unmatched, "torch's analyzer found the hang"
    ours = _summary(directory)["groups"]
    for c in unmatched:
        # Every rank torch saw in the collective, and only those, entered it in our summary.
        label = "default_pg" if c.group_id == "0" else c.group_id
        entered = {
            r
            for g in ours
            for p in g.get("processGroups", [])
            if (p["pg"], p["seq"], p["state"]) == (label, c.collective_seq_id, "scheduled")
            for r in _ranks(g["ranks"])
        }
        assert entered == set(groups[c.group_id]) - set(c.missing_ranks)


def _ranks(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out
