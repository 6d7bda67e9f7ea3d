"""``collscope flightrecorder``: raw dumps from the agents' answers, written for torch's tools.

The agents answer through ``httpx.MockTransport`` with what the agent's own code makes of dump
files (``frdump.read`` keeps the bytes, ``flightrecorder.exported`` encodes them); the agent's
route itself is tested in tests/unit/nodeagent/test_server.py. The real dumps are made by torch
2.13 on gloo (``tests/fixtures/flightrecorder/make_dumps.py``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import pathlib
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import httpx
import pytest

from collscope.nodeagent import api, frdump
from collscope.nodeagent import flightrecorder as agent_fr
from collscope.operator.cli import exits
from collscope.operator.cli import flightrecorder as flightrecorder_commands
from collscope.operator.cli import main as cli
from collscope.operator.clients import agents
from collscope.operator.domain import settings

ACCESS = settings.AgentSettings()
MAKE_DUMPS = pathlib.Path(__file__).parents[3] / "fixtures" / "flightrecorder" / "make_dumps.py"


def client(node: str, answer: Mapping[str, Any], asked: list[dict[str, Any]]) -> Any:
    def handler(req: httpx.Request) -> httpx.Response:
        assert req.url.path == "/v1/flightrecorder"
        asked.append(json.loads(req.content))
        return httpx.Response(200, json=answer)

    url = f"http://{node}:9464"
    return agents.AgentClient(
        node, url, transport=httpx.MockTransport(handler), retries=0, access=ACCESS
    )


def agent_answer(files: Mapping[int, pathlib.Path]) -> dict[str, Any]:
    """What an agent sends for a raw request over these dump files."""
    dumps = [frdump.read(str(p), rank=r) for r, p in sorted(files.items())]
    report = agent_fr.exported(agent_fr.FlightRecorderReport(dumps=dumps))
    return json.loads(report.model_dump_json())  # type: ignore[no-any-return]


def export(
    answers: Mapping[str, Mapping[str, Any]], out: pathlib.Path
) -> tuple[dict[int, str], list[dict[str, Any]]]:
    asked: list[dict[str, Any]] = []
    clients = {n: client(n, a, asked) for n, a in answers.items()}
    request = api.FlightRecorderRequest(raw=True)
    missing = asyncio.run(flightrecorder_commands.export(clients, request, out))
    return missing, asked


@pytest.fixture(scope="module")
def torch_dumps(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """torch's own dumps of four gloo ranks, ranks 0-2 waiting in an all_reduce that rank 3
    skipped: ``<dir>/pending/rank_<r>`` (~5 s: one torch import, 2 s of gloo timeout)."""
    pytest.importorskip("torch", reason="real Flight Recorder dumps need CPU PyTorch")
    out = tmp_path_factory.mktemp("frdumps")
    cmd = [sys.executable, str(MAKE_DUMPS), str(out), "one"]
    subprocess.run(cmd, check=True, timeout=100, capture_output=True)
    return out / "pending"


@pytest.mark.slow
def test_torch_dumps_exported_unchanged_from_two_nodes(
    torch_dumps: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    files = {r: torch_dumps / f"rank_{r}" for r in range(4)}
    answers = {
        "node-a": agent_answer({r: files[r] for r in (0, 1)}),
        "node-b": agent_answer({r: files[r] for r in (2, 3)}),
    }
    out = tmp_path / "fr"
    missing, asked = export(answers, out)
    assert missing == {} and [a["raw"] for a in asked] == [True, True]
    assert sorted(p.name for p in out.iterdir()) == [
        *(f"rank_{r}" for r in range(4)),
        "report.json",
    ]
    for r, p in files.items():
        assert (out / f"rank_{r}").read_bytes() == p.read_bytes()  # byte for byte torch's
    report = json.loads((out / "report.json").read_text())
    assert report["files"] == {str(r): f"rank_{r}" for r in range(4)}
    assert report["summary"]["summary"] == (
        "ranks 0-2: entered AllReduce seq 4; rank 3: last completed AllReduce seq 3"
    )
    assert "raw_b64" not in json.dumps(report["agents"])  # the files are beside it
    assert report["agents"]["node-b"]["dumps"][1]["entries"]  # the parsed answer stays


@pytest.mark.slow
def test_torchs_flight_recorder_reads_the_export_as_it_reads_torchs_files(
    torch_dumps: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """torch's loader reads the exported directory with ``--prefix rank_`` exactly as it reads
    the directory torch wrote, and ``fr_trace`` ends the same on both: on these gloo dumps
    torch 2.13 fails in ``build_collectives`` (``pg_config`` keyed ''), exported or not."""
    from torch.distributed.flight_recorder import fr_trace
    from torch.distributed.flight_recorder.components import config_manager, loader

    out = tmp_path / "fr"
    missing, _ = export({"n": agent_answer({r: torch_dumps / f"rank_{r}" for r in range(4)})}, out)
    assert missing == {}

    def read(d: pathlib.Path) -> Any:
        details, version = loader.read_dir(
            config_manager.JobConfig().parse_args([str(d), "--prefix", "rank_"])
        )
        return {pathlib.Path(k).name: v for k, v in details.items()}, version

    assert read(out) == read(torch_dumps)

    def outcome(d: pathlib.Path) -> str:
        try:
            fr_trace.main([str(d), "--prefix", "rank_"])
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "ok"

    assert outcome(out) == outcome(torch_dumps)


def fake(rank: int, raw: bytes | None = None, omitted: str = "") -> dict[str, Any]:
    b64 = None if raw is None else base64.b64encode(raw).decode()
    return {"rank": rank, "file": f"/f{rank}", "raw_b64": b64, "raw_omitted": omitted}


def test_ranks_without_a_file_say_why(tmp_path: pathlib.Path) -> None:
    answers = {
        "node-a": {
            "dumps": [fake(0, b"zero"), fake(1, omitted="over the cap"), fake(2)],
            "errors": [{"rank": 3, "reason": "no debug pipe"}],
        },
        "node-b": {"dumps": [{"rank": 4, "file": "/f4"}, fake(5, b"five"), fake(0, b"other")]},
    }
    missing, _ = export(answers, tmp_path / "fr")
    assert missing == {
        0: "sent by node-a and node-b: name the job's --workloads",
        1: "over the cap",
        2: "node-a sent no file (an older agent)",
        3: "node-a: no debug pipe",
        4: "node-b sent no file (an older agent)",
    }
    assert sorted(p.name for p in (tmp_path / "fr").iterdir()) == ["rank_5", "report.json"]
    report = json.loads((tmp_path / "fr" / "report.json").read_text())
    assert report["missing"]["3"] == "node-a: no debug pipe"


def test_the_command_refuses_a_full_directory_and_unreachable_agents(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "old").write_text("x")
    args = ["flightrecorder", "--agent", "http://127.0.0.1:9", "--timeout-s", "1"]
    assert cli.main([*args, "--out", str(tmp_path)]) == exits.BAD_INPUT
    assert "not empty" in capsys.readouterr().err
    assert cli.main([*args, "--out", str(tmp_path / "new")]) == exits.BAD_INPUT
    assert "no agent answered: http://127.0.0.1:9" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
