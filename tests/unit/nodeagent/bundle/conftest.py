"""Fixtures for the bundle tests: a small valid job and one valid record of every kind."""

from __future__ import annotations

import gzip
import json
import pathlib
from collections.abc import Callable, Iterable
from typing import Any

import pytest

# Any fixed epoch time works; a realistic one keeps 19-digit timestamps in the JSON.
T0 = 1_732_001_234_000_000_000

Record = dict[str, Any]
MakeBundle = Callable[..., pathlib.Path]


@pytest.fixture
def job() -> dict[str, Any]:
    return {
        "schema": "collscope.bundle/v1",
        "job": "unit",
        "world_size": 4,
        "parallelism": {"tp": 2, "dp": 2},
        "ranks": [{"rank": r, "node": f"node-{r // 2}", "gpu": r % 2} for r in range(4)],
    }


@pytest.fixture
def records() -> list[Record]:
    """Comms of ranks 0 and 1, a collective and a Send, a state with both flow kinds, a hw."""
    send = {
        "channel": 3,
        "peer": 1,
        "dir": "send",
        "total": 64,
        "ready": 40,
        "sent": 40,
        "done": 31,
        "idle_ns": 2_100_000_000,
    }
    recv = {
        "channel": 3,
        "peer": 1,
        "dir": "recv",
        "total": 64,
        "posted": 64,
        "done": 30,
        "consumed": 30,
        "idle_ns": 2_100_000_000,
    }
    return [
        {
            "type": "comm",
            "rank": 0,
            "ts": T0,
            "comm": "0x1f3a",
            "comm_rank": 0,
            "nranks": 2,
            "nnodes": 1,
            "name": "tp",
        },
        {
            "type": "comm",
            "rank": 1,
            "ts": T0,
            "comm": "0x1f3a",
            "comm_rank": 1,
            "nranks": 2,
            "nnodes": 1,
            "name": "tp",
        },
        {
            "type": "op",
            "rank": 0,
            "ts": T0 + 10,
            "comm": "0x1f3a",
            "seq": 0,
            "op": "AllReduce",
            "bytes": 4096,
            "dtype": "bf16",
            "algo": "Ring",
            "proto": "Simple",
            "channels": 4,
            "start": T0 + 1,
            "end": T0 + 10,
        },
        {
            "type": "op",
            "rank": 1,
            "ts": T0 + 20,
            "comm": "0x1f3a",
            "seq": 1,
            "op": "Send",
            "bytes": 128,
            "start": T0 + 11,
            "end": T0 + 20,
            "peer": 0,
        },
        {
            "type": "state",
            "rank": 0,
            "ts": T0 + 30,
            "comm": "0x1f3a",
            "seq": 2,
            "op": "AllReduce",
            "bytes": 4096,
            "start": T0 + 25,
            "flows": [send, recv],
            "kernel": {"channels": 8, "done": 5},
        },
        {
            "type": "hw",
            "rank": 1,
            "ts": T0 + 40,
            "node": "node-0",
            "device": "gpu1",
            "metric": "power_watts",
            "value": 412.5,
        },
    ]


def dump(record: Record) -> str:
    return json.dumps(record, separators=(",", ":"))


@pytest.fixture
def make_bundle(tmp_path: pathlib.Path, job: dict[str, Any]) -> MakeBundle:
    """``make_bundle(lines, gz=False, job=..., name="b", extra={})`` -> a bundle directory.

    ``lines`` are records (dicts) or raw lines (str/bytes, written as given plus a newline).
    """

    def make(
        lines: Iterable[Record | str | bytes],
        *,
        gz: bool = False,
        job_text: str | bytes | None = None,
        name: str = "b",
        extra: dict[str, bytes] | None = None,
    ) -> pathlib.Path:
        root = tmp_path / name
        root.mkdir()
        text = json.dumps(job) if job_text is None else job_text
        (root / "job.json").write_bytes(text if isinstance(text, bytes) else text.encode())
        data = b"".join(
            (
                line
                if isinstance(line, bytes)
                else (line if isinstance(line, str) else dump(line)).encode()
            )
            + b"\n"
            for line in lines
        )
        if gz:
            (root / "records.jsonl.gz").write_bytes(gzip.compress(data))
        else:
            (root / "records.jsonl").write_bytes(data)
        for fname, content in (extra or {}).items():
            (root / fname).write_bytes(content)
        return root

    return make
