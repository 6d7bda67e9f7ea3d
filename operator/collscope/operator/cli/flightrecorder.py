"""``collscope flightrecorder``: a job's raw Flight Recorder dumps, for PyTorch's own tools.

    collscope flightrecorder --agent https://10.0.0.3:9464 --agent https://10.0.0.4:9464 \\
        --workloads <pod uid>,<pod uid> --ca-file ca.crt --token-file token --out ./fr
    python -m torch.distributed.flight_recorder.fr_trace ./fr --prefix rank_

The operator keeps only a summary of the dumps in the Diagnosis (``flightrecorder.py``). This
command asks each named node agent for its ranks' dumps with ``raw`` (``POST
/v1/flightrecorder``, the same right as the operator's: ``create`` on ``collscope.dev``
``agents/flightrecorder``) and writes every file unchanged as ``OUT/rank_<rank>``, the names
torch's ``flight_recorder`` reads with ``--prefix rank_``, plus ``OUT/report.json``: the agents'
parsed answers (without the files), the collscope summary of them, which rank went to which
file, and why a rank has none. OUT must be empty: torch reads every ``rank_`` file there.

Torch's analyzer needs NCCL dumps: on gloo dumps (``pg_config`` keyed ``''``) torch 2.13's
``fr_trace`` fails with a KeyError in ``build_collectives``, exported or not (the files here
are byte for byte the ones torch wrote). ``report.json``'s summary reads both.

Exit codes: 0 every rank that answered has its file; 1 some rank has none (each listed on
stderr, and in report.json); 2 bad arguments, OUT not empty, or no agent answered.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import errno
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collscope.nodeagent import api
from collscope.operator import errors
from collscope.operator.clients import agents
from collscope.operator.domain import flightrecorder, settings

# The agent's own deadline for the ranks' dumps; the HTTP call waits this much longer for the
# answer (up to 32 MiB of files in base64).
HTTP_MARGIN_S = 30.0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "flightrecorder",
        help="export a job's raw Flight Recorder dumps for torch's flight_recorder tools",
        description="Ask node agents for their ranks' PyTorch Flight Recorder dumps and write "
        "them unchanged as OUT/rank_<rank> (python -m torch.distributed.flight_recorder.fr_trace "
        "OUT --prefix rank_ reads them), with OUT/report.json holding the collscope summary.",
    )
    p.add_argument(
        "--agent",
        action="append",
        required=True,
        metavar="URL",
        help="a node agent's URL, e.g. https://10.0.0.3:9464 (repeat for each node of the job)",
    )
    p.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="directory to write (empty or new)"
    )
    p.add_argument(
        "--ranks", type=_ints, metavar="R,R", help="comma-separated ranks (default: all)"
    )
    p.add_argument(
        "--workloads",
        type=_strs,
        metavar="UID,UID",
        help="comma-separated pod uids of the job, needed when two jobs share a node's ranks",
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=10.0,
        help="how long the ranks have to dump, in seconds (default: %(default)s)",
    )
    p.add_argument("--ca-file", default="", help="CA bundle for the agents' certificates")
    p.add_argument("--server-name", default="", help="name on the agents' certificate")
    p.add_argument(
        "--token-file",
        default="",
        help="bearer token file (sent over https only), e.g. from kubectl create token",
    )
    p.set_defaults(func=run)


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a list of ranks: {text!r}") from e


def _strs(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def run(args: argparse.Namespace) -> int:
    request = api.FlightRecorderRequest(
        ranks=args.ranks, workloads=args.workloads, timeout_s=args.timeout_s, raw=True
    )
    access = settings.AgentSettings(
        ca_file=args.ca_file, server_name=args.server_name, token_file=args.token_file
    )
    clients = {
        url: agents.AgentClient(
            url, url, timeout_s=args.timeout_s + HTTP_MARGIN_S, retries=0, access=access
        )
        for url in dict.fromkeys(args.agent)
    }
    missing = asyncio.run(export(clients, request, args.out))
    for rank, why in sorted(missing.items()):
        print(f"rank {rank}: no file: {why}", file=sys.stderr)
    print(f"wrote {args.out}")
    return 1 if missing else 0


async def export(
    clients: Mapping[str, agents.AgentClient],
    request: api.FlightRecorderRequest,
    out: Path,
) -> dict[int, str]:
    """Ask every agent, write the files and ``report.json`` into ``out``; rank -> why it has
    no file (its dump failed, was left out, or an agent did not answer)."""
    if out.exists() and any(out.iterdir()):
        why = "not empty (torch reads every rank_ file there)"
        raise FileExistsError(errno.EEXIST, why, str(out))
    try:
        calls = {node: c.flightrecorder(request) for node, c in clients.items()}
        got, failed = await agents.gather(calls)
    finally:
        for c in clients.values():
            await c.aclose()
    if not got:
        why = "; ".join(f"{u.node}: {u.reason}" for u in failed) or "no agent named"
        raise errors.AgentError(f"no agent answered: {why}")
    out.mkdir(parents=True, exist_ok=True)
    files, missing, reports = _write_files(got, out)
    asked = {node: _ranks_of(r) for node, r in reports.items()}
    unreachable = {u.node: u.reason for u in failed}
    report = {
        "agents": reports,
        "unreachable": unreachable,
        "files": {str(r): f for r, f in sorted(files.items())},
        "missing": {str(r): why for r, why in sorted(missing.items())},
        "summary": flightrecorder.summarise(reports, asked=asked, unreachable=unreachable),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return missing


def _write_files(
    got: Mapping[str, Mapping[str, Any]], out: Path
) -> tuple[dict[int, str], dict[int, str], dict[str, dict[str, Any]]]:
    """Each dump's file as ``out/rank_<rank>``; rank -> file name, rank -> why none, and the
    agents' answers without the files."""
    files: dict[int, str] = {}
    sender: dict[int, str] = {}
    missing: dict[int, str] = {}
    reports: dict[str, dict[str, Any]] = {}
    for node, answer in sorted(got.items()):
        dumps = []
        for item in _items(answer.get("dumps")):
            d = dict(item)
            rank, b64 = d.get("rank"), d.pop("raw_b64", None)
            if not isinstance(rank, int):
                continue
            dumps.append(d)
            if rank in sender:
                # Two jobs' ranks: neither file is known to be this job's.
                (out / f"rank_{rank}").unlink(missing_ok=True)
                files.pop(rank, None)
                missing[rank] = f"sent by {sender[rank]} and {node}: name the job's --workloads"
                continue
            sender[rank] = node
            data = _decoded(node, d, b64)
            if isinstance(data, str):
                missing[rank] = data
            else:
                files[rank] = f"rank_{rank}"
                (out / files[rank]).write_bytes(data)
        for e in _items(answer.get("errors")):
            if isinstance(e.get("rank"), int):
                missing.setdefault(e["rank"], f"{node}: {e.get('reason', '')}")
        reports[node] = {**answer, "dumps": dumps}
    return files, missing, reports


def _decoded(node: str, dump: Mapping[str, Any], b64: Any) -> bytes | str:
    """A dump's file from its ``raw_b64``, or why there is none."""
    if not isinstance(b64, str):
        # An agent from before raw exports sends no raw_omitted either.
        return str(dump.get("raw_omitted") or f"{node} sent no file (an older agent)")
    try:
        return base64.b64decode(b64, validate=True)
    except binascii.Error as e:
        return f"{node} sent a file that is not base64: {e}"


def _ranks_of(report: Mapping[str, Any]) -> list[int]:
    got = [*_items(report.get("dumps")), *_items(report.get("errors"))]
    return sorted({x["rank"] for x in got if isinstance(x.get("rank"), int)})


def _items(v: Any) -> list[Mapping[str, Any]]:
    return [x for x in v if isinstance(x, Mapping)] if isinstance(v, list) else []
