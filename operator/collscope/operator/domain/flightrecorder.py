"""PyTorch Flight Recorder dumps of a Diagnosis's ranks, summarised into its status.

On a trigger the operator asks the agents of the involved ranks for their Flight Recorder
dumps (``POST /v1/flightrecorder``, ``evidence.collect_flight_recorder``) and keeps
only what a person reads first: ranks grouped by identical last-collective state. The idea is
Mycroft's (``papers/mycroft.txt`` §5, "Flight Recorder", and case three of §8): "figuring out
the device with last operation on each CUDA stream in a process group, and aggregating all
the trace stacks to visualize and identify abnormal devices", e.g. one rank that never
launched the AllGather its peers wait in, or two groups of ranks deadlocked on different
process groups. A typical summary::

    ranks 0-6: entered AllReduce seq 1042; rank 7: last completed AllReduce seq 1041

Per rank and process group the state comes from ``pg_status`` (last enqueued / started /
completed collective sequence numbers) and, for the operation's name, from the newest entries
(the agent trims each dump to ``MAX_ENTRIES`` per process group). A group of ranks is labelled
by its ``desc`` when torch has one (``default_pg``, DeviceMesh's ``mesh_dp``, Megatron's group
names), else by its name, so ranks of different TP groups in the same state fall together.

Keys (torch 2.13, ``FlightRecorder.hpp``): ``pg_status`` and the entries' ``pg_id`` use a
per-process counter of the process groups this rank created, while ``pg_config`` is keyed by
the group's *name*, which is the same on every member (``new_group`` counts groups on every
rank, members or not). Rank 0 of TP groups [0,1] and [2,3] thus has pg_id 1 for group "1",
rank 2 pg_id 1 for group "2". The id is mapped to its name through the entries' own
``process_group`` (name, desc), never by equating id and name; only a dump whose entries carry
no name (older torch) falls back to ``pg_config`` looked up by id.

A collective that ended without completing is not "last completed". torch counts it in
``last_completed_collective`` all the same once its work is gone: NCCL after a timeout (the
entry is then retired but not completed, torch's own definition of timed out), gloo after its
timeout or an abort (gloo records no completion per entry at all). Two rules catch it: the
rank's entry for that sequence number is retired and not completed while other entries of the
dump did complete (NCCL), or another dumped member of the same named group never even enqueued
that sequence number, so it cannot have completed anywhere (any backend). Such a collective
reads "AllReduce seq 4 did not complete (timed out or aborted)".

Pure: dumps arrive as the agent's JSON (``frdump.RankDump`` shape, read defensively since the
agent may be older or newer), no HTTP, no kopf. Everything returned is capped so that a
1,024-rank job still makes a Diagnosis of a few kilobytes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

# Ranks asked per Diagnosis: a hang is read within its communicator, and 256 covers the
# largest groups of a 1,024-rank job; every asked rank costs its training process one dump.
MAX_RANKS: Final = 256
# Entries kept per process group by the agent: the in-flight one and a few completed ones
# before it give the operation names; the sequence numbers come from pg_status anyway.
MAX_ENTRIES: Final = 4
MAX_GROUPS: Final = 16  # like status.MAX_STACK_GROUPS: more distinct states means "everything"
MAX_PGS: Final = 8  # process groups shown per group of ranks
MAX_NOTES: Final = 16
NOTE_MAX_CHARS: Final = 300
SUMMARY_MAX_CHARS: Final = 1024
_UNNAMED_DESC = ("", "undefined")  # torch's desc when new_group got no group_desc

# "failed": counted as completed by torch but ended without completing (see above).
State = Literal["scheduled", "started", "completed", "failed"]


@dataclass(frozen=True, order=True)
class PgState:
    """One rank's last collective on one process group."""

    pg: str  # desc, or name when torch has no desc
    seq: int
    state: State
    op: str = ""  # "AllReduce"; "" when the entry is no longer in the dump
    # The group's name, the same on every member ("" when unknown): which ranks' counters
    # can be compared. Not part of the state, so TP groups in the same state fall together.
    name: str = field(default="", compare=False)
    enqueued: int = field(default=-1, compare=False)  # last collective this rank enqueued

    def text(self) -> str:
        op = f"{self.op} " if self.op else ""
        if self.state == "completed":
            return f"last completed {op}seq {self.seq}"
        if self.state == "failed":
            return f"{op}seq {self.seq} did not complete (timed out or aborted)"
        started = ", kernel started" if self.state == "started" else ""
        return f"entered {op}seq {self.seq}{started}"


RankState = tuple[PgState, ...]  # sorted by process group; () when no collective recorded


def choose(
    culprits: Iterable[int],
    involved: Iterable[int],
    ranks: Iterable[int],
    max_ranks: int = MAX_RANKS,
) -> list[int]:
    """Ranks to dump: the culprits, then the members of the communicator that triggered
    (``involved``); every rank of the job in rank order when that is unknown; at most
    ``max_ranks``, sorted."""
    known = set(ranks)
    members = [r for r in involved if r in known]
    out: list[int] = []
    for r in [*culprits, *(members or sorted(known))]:
        if r in known and r not in out:
            out.append(r)
    return sorted(out[:max_ranks])


def op_name(profiling_name: str) -> str:
    """``nccl:all_reduce`` -> ``AllReduce`` (the ring records' spelling); ``nccl:send 1->2``
    -> ``Send``; other text as it is."""
    _, _, name = profiling_name.rpartition(":")
    word = name.split(" ", 1)[0]
    return "".join(p.capitalize() for p in word.split("_")) if word else ""


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v if v >= 0 else None  # torch starts its counters at -1


def _items(v: Any) -> list[Mapping[str, Any]]:
    return [x for x in v if isinstance(x, Mapping)] if isinstance(v, list) else []


def _pg_names(dump: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """pg_id (per-process counter) -> (name, desc), from the entries' ``process_group``; for
    dumps whose entries carry no name, ``pg_config`` looked up by id (older torch)."""
    out: dict[str, tuple[str, str]] = {}
    for e in _items(dump.get("entries")):
        pg_id, name = e.get("pg_id"), str(e.get("pg_name") or "")
        if pg_id is not None and name:
            out[str(pg_id)] = (name, str(e.get("pg_desc") or ""))
    config = {str(pg.get("id", "")): pg for pg in _items(dump.get("pg_config"))}
    named = {
        pid: (n, d or str((config.get(n) or {}).get("desc") or "")) for pid, (n, d) in out.items()
    }
    if not named:
        named = {
            pid: (str(pg.get("name") or pid), str(pg.get("desc") or ""))
            for pid, pg in config.items()
        }
    return named


def pg_states(dump: Mapping[str, Any]) -> list[PgState]:
    """The last collective of every process group of one rank's dump (``RankDump`` JSON)."""
    names = _pg_names(dump)
    enqueued: dict[str, int] = {}
    started: dict[str, int] = {}
    completed: dict[str, int] = {}
    for st in _items(dump.get("pg_status")):
        pid = str(st.get("id", ""))
        for into, key in ((enqueued, "last_enqueued_collective"),
                          (started, "last_started_collective"),
                          (completed, "last_completed_collective")):  # fmt: skip
            seq = _int(st.get(key))
            if seq is not None:
                into[pid] = seq
    ops: dict[tuple[str, int], str] = {}
    ended: set[tuple[str, int]] = set()  # retired but not completed: torch's "timed out"
    entries = _items(dump.get("entries"))
    # gloo never marks an entry completed: "retired, not completed" means nothing there.
    tracks_completion = any(e.get("state") == "completed" for e in entries)
    for e in entries:
        seq, pg_id = _int(e.get("collective_seq_id")), e.get("pg_id")
        if seq is None or pg_id is None or e.get("is_p2p"):
            continue
        pid = str(pg_id)
        ops[(pid, seq)] = op_name(str(e.get("profiling_name") or ""))
        entry_state = str(e.get("state") or "")
        if tracks_completion and e.get("retired") is True and entry_state != "completed":
            ended.add((pid, seq))
        # Older dumps without pg_status: the entries' states give the same counters.
        enqueued[pid] = max(enqueued.get(pid, -1), seq)
        if entry_state in ("started", "completed"):
            started[pid] = max(started.get(pid, -1), seq)
        if entry_state == "completed":
            completed[pid] = max(completed.get(pid, -1), seq)
    out = []
    for pid in sorted(set(enqueued) | set(completed)):
        enq, done = enqueued.get(pid), completed.get(pid)
        if enq is not None and (done is None or enq > done):
            state: State = "started" if started.get(pid, -1) >= enq else "scheduled"
            seq = enq
        else:
            assert done is not None
            state, seq = ("failed" if (pid, done) in ended else "completed"), done
        name, desc = names.get(pid, ("", ""))
        label = desc if desc not in _UNNAMED_DESC else (name or pid)
        top = max(enq if enq is not None else -1, done if done is not None else -1)
        out.append(PgState(label, seq, state, ops.get((pid, seq), ""), name=name, enqueued=top))
    return out


def rank_state(dump: Mapping[str, Any]) -> RankState:
    """The last collective of each process group of one rank's dump (``RankDump`` JSON): of
    the groups with a collective in flight when there is one, else of all its groups."""
    return _waiting(pg_states(dump))


def _waiting(states: Iterable[PgState]) -> RankState:
    # A rank waiting in a collective is described by what it waits in; its other groups'
    # completed counters differ between TP/PP groups and would split every group of ranks.
    out = list(states)
    waiting = [s for s in out if s.state != "completed"]
    return tuple(sorted(waiting or out))


def unmatched(by_rank: Mapping[int, Sequence[PgState]]) -> dict[int, list[PgState]]:
    """``by_rank`` with "completed" turned "failed" where another dumped member of the same
    named group never enqueued that collective: a collective completes on all members or on
    none, so it ended by a timeout or an abort (gloo's case, whose entries never complete)."""
    lowest: dict[str, int] = {}
    for states in by_rank.values():
        for s in states:
            if s.name:
                lowest[s.name] = min(lowest.get(s.name, s.enqueued), s.enqueued)
    return {
        r: [
            replace(s, state="failed")
            if s.state == "completed" and s.name and s.seq > lowest[s.name]
            else s
            for s in states
        ]
        for r, states in by_rank.items()
    }


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"``."""
    out: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def describe(state: RankState, *, with_pg: bool) -> str:
    if not state:
        return "no collective recorded"
    parts = [f"pg {s.pg} {s.text()}" if with_pg else s.text() for s in state[:MAX_PGS]]
    more = len(state) - MAX_PGS
    return ", ".join(parts) + (f", +{more} more process groups" if more > 0 else "")


def summarise(
    reports: Mapping[str, Mapping[str, Any]],
    *,
    asked: Mapping[str, Sequence[int]],
    unreachable: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``Diagnosis.status.flightRecorder`` from the agents' answers.

    ``reports``: node -> ``FlightRecorderReport`` JSON; ``asked``: node -> ranks asked of it;
    ``unreachable``: node -> why its agent gave nothing (no agent, HTTP error, no Flight
    Recorder capability). Every asked rank ends in a group or in a note.
    """
    all_states: dict[int, list[PgState]] = {}
    notes: list[str] = []
    for node, why in sorted((unreachable or {}).items()):
        ranks = asked.get(node, ())
        notes.append(f"{_ranks_text(ranks)} on {node}: no dump: {why}")
    for node, report in sorted(reports.items()):
        wanted = set(asked.get(node, ()))
        failed: dict[int, str] = {}
        for err in _items(report.get("errors")):
            r = _int(err.get("rank"))
            if r is not None:
                failed[r] = str(err.get("reason") or "no reason given")
        for d in _items(report.get("dumps")):
            r = _int(d.get("rank"))
            if r is not None and r in wanted:
                all_states[r] = pg_states(d)
        for r in sorted(wanted - set(all_states)):
            why = failed.get(r, "the agent returned neither a dump nor an error")
            notes.append(f"rank {r} on {node}: no Flight Recorder dump: {why}")
    states = {r: _waiting(st) for r, st in unmatched(all_states).items()}
    by_state: dict[RankState, list[int]] = defaultdict(list)
    for r, st in states.items():
        by_state[st].append(r)
    ordered = sorted(by_state.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    with_pg = len({s.pg for st in by_state for s in st}) > 1
    groups = [
        {
            "ranks": rank_ranges(ranks),
            "count": len(ranks),
            "state": describe(st, with_pg=with_pg),
            "processGroups": [
                {"pg": s.pg, "op": s.op, "seq": s.seq, "state": s.state} for s in st[:MAX_PGS]
            ],
        }
        for st, ranks in ordered
    ]
    total = sum(len(ranks) for ranks in asked.values())
    return {
        "summary": _summary(groups, total),
        "ranksAsked": total,
        "ranksDumped": len(states),
        "groups": [{k: v for k, v in g.items() if v != []} for g in groups[:MAX_GROUPS]],
        "omittedGroups": max(0, len(groups) - MAX_GROUPS),
        "notes": _capped_notes(notes),
    }


def failed(asked: Mapping[str, Sequence[int]], why: str) -> dict[str, Any]:
    """The status when collection itself went wrong: every asked rank noted, nothing lost."""
    return summarise({}, asked=asked, unreachable=dict.fromkeys(asked, why))


def _ranks_text(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {rank_ranges(ranks)}" if ranks else "its ranks"


def _summary(groups: Sequence[Mapping[str, Any]], total: int) -> str:
    if not groups:
        return f"no Flight Recorder dump from any of the {total} ranks asked (see notes)"
    parts = []
    used = 0
    for i, g in enumerate(groups):
        who = "rank" if g["count"] == 1 else "ranks"
        part = f"{who} {g['ranks']}: {g['state']}"
        rest = len(groups) - i
        if used + len(part) + 2 > SUMMARY_MAX_CHARS - 40 and rest > 0:
            parts.append(f"+{rest} more groups")
            break
        parts.append(part)
        used += len(part) + 2
    return "; ".join(parts)[:SUMMARY_MAX_CHARS]


def _capped_notes(notes: Sequence[str]) -> list[str]:
    out = [n if len(n) <= NOTE_MAX_CHARS else n[: NOTE_MAX_CHARS - 3] + "..." for n in notes]
    if len(out) > MAX_NOTES:
        out = [*out[: MAX_NOTES - 1], f"+{len(out) - MAX_NOTES + 1} more notes"]
    return out
