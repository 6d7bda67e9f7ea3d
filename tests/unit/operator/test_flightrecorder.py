"""The Flight Recorder summary of a Diagnosis: per-rank last-collective state from the agent's
dump JSON, ranks grouped by identical state, notes for ranks without a dump, sizes capped."""

from __future__ import annotations

from typing import Any

from collscope.operator import flightrecorder


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
    """A ``frdump.RankDump`` as the agent sends it (JSON), one process group."""
    entries = [
        {"pg_id": int(pg), "collective_seq_id": s, "profiling_name": op, "is_p2p": False,
         "state": "completed" if s <= completed else "scheduled"}
        for s in range(max(0, completed - 1), enqueued + 1)
    ]  # fmt: skip
    return {
        "rank": rank,
        "file": f"/tmp/nccl_trace_rank_{rank}",
        "version": "2.5",
        "pg_config": [{"id": pg, "name": pg, "desc": desc, "ranks": [0, 1]}],
        "pg_status": [
            {
                "id": pg,
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
