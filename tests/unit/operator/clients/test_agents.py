"""agents: the node-agent client's retries, error mapping and fan-out.

These tests answer through ``httpx.MockTransport`` (httpx's own transport interface) to script
failures a real agent cannot be made to produce on demand (a 503 then a 200, a non-v1 body);
``test_agents_live.py`` runs the same client against a real agent serving real rings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from collscope.nodeagent import agent, api
from collscope.nodeagent import settings as agent_settings
from collscope.nodeagent.bundle import columnar, models, reader, tables
from collscope.operator import errors
from collscope.operator.clients import agents
from collscope.operator.domain import settings

Handler = Callable[[httpx.Request], httpx.Response]
T0 = 1_732_001_234_000_000_000


def client(handler: Handler, *, retries: int = 2) -> agents.AgentClient:
    """A client whose requests ``handler`` answers; no backoff, so retries cost no time."""
    return agents.AgentClient(
        "node-1",
        "http://agent.test:9464",
        transport=httpx.MockTransport(handler),
        retries=retries,
        backoff_s=0.0,
        access=settings.AgentSettings(),
    )


def ranks_body(rank: int) -> dict[str, object]:
    r = {
        "rank": rank,
        "ring_path": f"/run/collscope/rank{rank}.ring",
        "health": "live",
        "a_field_from_a_newer_agent": 1,
    }
    return {"api": "v1", "node": "node-1", "now_ns": T0, "ranks": [r]}


def test_ranks_parses_the_answer_and_ignores_fields_it_does_not_know() -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json=ranks_body(7))

    got = asyncio.run(client(handler).ranks())
    assert got.ranks[0].rank == 7 and got.ranks[0].health == "live"
    assert seen[0].url.path == "/v1/ranks"


def test_timeout_and_retries_default_to_the_agent_settings() -> None:
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req)
        raise httpx.ConnectError("connection refused", request=req)

    plain = agents.AgentClient(
        "node-1",
        "http://agent.test:9464",
        transport=httpx.MockTransport(handler),
        backoff_s=0.0,
        access=settings.AgentSettings(),
    )
    with pytest.raises(errors.AgentUnreachable):
        asyncio.run(plain.ranks())
    assert len(calls) == settings.AgentSettings().retries + 1
    assert plain._http.timeout.read == settings.AgentSettings().timeout_s
    access = dataclasses.replace(settings.AgentSettings(), timeout_s=7.0, retries=0)
    mine = agents.AgentClient("node-1", "http://agent.test:9464", access=access)
    assert mine._http.timeout.read == 7.0 and mine._retries == 0


def test_a_5xx_is_retried_with_backoff_then_succeeds() -> None:
    answers = [
        httpx.Response(503, json={"error": "warming up"}),
        httpx.Response(200, json=ranks_body(1)),
    ]

    def handler(req: httpx.Request) -> httpx.Response:
        return answers.pop(0)

    got = asyncio.run(client(handler, retries=1).ranks())
    assert got.ranks[0].rank == 1 and not answers


def test_a_4xx_is_not_retried_and_names_the_parameter() -> None:
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req)
        return httpx.Response(400, json={"error": "not an integer: 'x'", "parameter": "ranks"})

    with pytest.raises(errors.AgentError) as info:
        asyncio.run(client(handler, retries=3).ranks())
    assert len(calls) == 1
    msg = str(info.value)
    assert "node-1" in msg and "HTTP 400" in msg and "parameter ranks" in msg
    assert not isinstance(info.value, errors.AgentUnreachable)


def test_connection_errors_after_every_retry_are_unreachable() -> None:
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req)
        raise httpx.ConnectError("connection refused", request=req)

    with pytest.raises(errors.AgentUnreachable, match=r"node-1 .*ConnectError.*after 3 attempts"):
        asyncio.run(client(handler, retries=2).ranks())
    assert len(calls) == 3


def test_an_answer_that_is_not_v1_is_an_agent_error_naming_the_field() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"api": "v1", "node": "n", "now_ns": 1, "ranks": [{}]})

    with pytest.raises(errors.AgentError, match=r"/v1/ranks is not a v1 RanksResponse: ranks\.0"):
        asyncio.run(client(handler).ranks())


def test_gather_reports_failed_nodes_and_keeps_the_others() -> None:
    def ok(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=ranks_body(2))

    def down(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=req)

    async def run() -> tuple[dict[str, api.RanksResponse], list[agents.Unreachable]]:
        a, b = client(ok), client(down, retries=0)
        return await agents.gather({"node-a": a.ranks(), "node-b": b.ranks()})

    got, failed = asyncio.run(run())
    assert list(got) == ["node-a"] and got["node-a"].ranks[0].rank == 2
    assert [f.node for f in failed] == ["node-b"] and "ConnectTimeout" in failed[0].reason


def test_gather_does_not_swallow_bugs() -> None:
    async def broken() -> int:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        asyncio.run(agents.gather({"node-a": broken()}))


def test_pull_window_merges_nodes_and_names_missing_ones() -> None:
    def comm(rank: int) -> bytes:
        rec = {"type": "comm", "rank": rank, "ts": T0, "comm": "0x1f", "comm_rank": rank,
               "nranks": 2, "nnodes": 2, "name": "dp"}  # fmt: skip
        return json.dumps(rec).encode()

    def handler_for(rank: int) -> Handler:
        def handler(req: httpx.Request) -> httpx.Response:
            assert req.url.params["ranks"] == str(rank)
            return httpx.Response(200, content=comm(rank) + b"\n")

        return handler

    job = models.Job.model_validate({"schema": "collscope.bundle/v1", "job": "j", "world_size": 2})
    clients = {"node-0": client(handler_for(0)), "node-1": client(handler_for(1))}
    bundle, failed = asyncio.run(
        agents.pull_window(
            clients,
            {"node-0": [0], "node-1": [1], "node-9": [5]},
            job,
            since_ns=T0,
            until_ns=T0 + 1,
        )
    )
    assert sorted(bundle.comms["rank"].tolist()) == [0, 1]
    assert [(f.node, f.reason) for f in failed] == [("node-9", "no agent known on this node")]


def test_pull_window_reports_agents_whose_lines_are_not_bundle_v1() -> None:
    def bad(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'{"type": "op", "rank": 0}\n')

    def good(req: httpx.Request) -> httpx.Response:
        rec = {"type": "comm", "rank": 1, "ts": T0, "comm": "0x1f", "comm_rank": 1,
               "nranks": 2, "nnodes": 2, "name": "dp"}  # fmt: skip
        return httpx.Response(200, content=json.dumps(rec).encode() + b"\n")

    job = models.Job.model_validate({"schema": "collscope.bundle/v1", "job": "j", "world_size": 2})
    bundle, failed = asyncio.run(
        agents.pull_window(
            {"n": client(bad), "m": client(good)},
            {"n": [0], "m": [1]},
            job,
            since_ns=0,
            until_ns=T0 + 1,
        )
    )
    assert bundle.comms["rank"].tolist() == [1]  # the good agent's records are kept
    ((node, reason),) = [(f.node, f.reason) for f in failed]
    assert (
        node == "n" and "not bundle-v1" in reason and "http://agent.test:9464/v1/window:1" in reason
    )


def test_pull_window_marks_the_ranks_of_unreachable_agents() -> None:
    """Ranks asked of an agent that did not answer (or of a node without one) get a liveness
    row ``unreachable`` at the window's end; an agent that answered badly is not unreachable."""

    def good(req: httpx.Request) -> httpx.Response:
        rec = {"type": "comm", "rank": 0, "ts": T0, "comm": "0x1f", "comm_rank": 0,
               "nranks": 2, "nnodes": 2, "name": "dp"}  # fmt: skip
        return httpx.Response(200, content=json.dumps(rec).encode() + b"\n")

    def down(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=req)

    def bad(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'{"type": "op", "rank": 6}\n')

    job = models.Job.model_validate({"schema": "collscope.bundle/v1", "job": "j", "world_size": 8})
    clients = {"n0": client(good), "n1": client(down, retries=0), "n2": client(bad)}
    bundle, failed = asyncio.run(
        agents.pull_window(
            clients,
            {"n0": [0], "n1": [2, 3], "n2": [6], "n9": [5]},
            job,
            since_ns=T0,
            until_ns=T0 + 7,
        )
    )
    assert sorted(f.node for f in failed) == ["n1", "n2", "n9"]
    assert [(r.rank, r.ts, r.state, r.heartbeat) for r in bundle.iter_liveness()] == [
        (2, T0 + 7, "unreachable", None),
        (3, T0 + 7, "unreachable", None),
        (5, T0 + 7, "unreachable", None),
    ]


# -- the columnar window -----------------------------------------------------------------------
def node_lines(rank: int) -> list[bytes]:
    """Records of one rank: its comm, an op and a state with a send and a recv flow."""
    comm = {"type": "comm", "rank": rank, "ts": T0, "comm": "0x1f", "comm_rank": rank,
            "nranks": 2, "nnodes": 2, "name": "dp"}  # fmt: skip
    op = {"type": "op", "rank": rank, "ts": T0 + 9, "comm": f"0x{rank + 10:x}", "seq": 4,
          "op": "Send" if rank else "AllReduce", "bytes": 64, "start": T0 + 2,
          "end": T0 + 9}  # fmt: skip
    flows = [
        {"channel": 0, "peer": 1 - rank, "dir": "send", "total": 4, "ready": 3, "sent": 2,
         "done": 1, "idle_ns": 5},
        {"channel": 1, "peer": 1 - rank, "dir": "recv", "total": 4, "posted": 4, "done": 2,
         "consumed": 2, "idle_ns": 7},
    ]  # fmt: skip
    state = {"type": "state", "rank": rank, "ts": T0 + 11, "comm": "0x1f", "seq": 5,
             "op": "AllReduce", "bytes": 64, "start": T0 + 10, "flows": flows}  # fmt: skip
    return [json.dumps(r).encode() for r in (comm, op, state)]


JOB = models.Job(world_size=2)


def columnar_agent(rank: int, seen: list[httpx.Request]) -> Handler:
    """An agent that answers in columns when asked, as ``server.py`` does."""
    window = reader.load_lines(JOB, [("agent", node_lines(rank))])

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        if columnar.MEDIA_TYPE not in req.headers.get("accept", ""):
            return httpx.Response(200, content=b"\n".join(node_lines(rank)))
        body = columnar.encode(window)
        return httpx.Response(200, content=body, headers={"content-type": columnar.MEDIA_TYPE})

    return handler


def json_agent(rank: int) -> Handler:
    """An agent from before the columnar form: JSON lines whatever the Accept header."""

    def handler(req: httpx.Request) -> httpx.Response:
        body = b"\n".join(node_lines(rank))
        return httpx.Response(200, content=body, headers={"content-type": "application/x-ndjson"})

    return handler


def pull(handlers: dict[str, Handler]) -> tuple[tables.Bundle, list[agents.Unreachable]]:
    clients = {node: client(h) for node, h in handlers.items()}
    ranks = {node: [i] for i, node in enumerate(handlers)}
    return asyncio.run(agents.pull_window(clients, ranks, JOB, since_ns=T0, until_ns=T0 + 99))


def assert_same(a: tables.Bundle, b: tables.Bundle) -> None:
    assert a.comm_ids == b.comm_ids and a.strings == b.strings
    for name in ("comms", "ops", "states", "flows", "hw"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("kinds", ["columns", "json", "mixed"])
def test_pull_window_builds_the_json_paths_tables_whatever_each_agent_answers(kinds: str) -> None:
    seen: list[httpx.Request] = []
    handlers = {
        "node-0": json_agent(0) if kinds == "json" else columnar_agent(0, seen),
        "node-1": columnar_agent(1, seen) if kinds == "columns" else json_agent(1),
    }
    bundle, failed = pull(handlers)
    assert failed == []
    want = reader.load_lines(JOB, [("0", node_lines(0)), ("1", node_lines(1))])
    assert_same(bundle, want)
    assert len(bundle.flows) == 4 and bundle.flows["posted"].tolist().count(-1) == 2
    for req in seen:
        assert req.headers["accept"] == agents.WINDOW_ACCEPT


def test_pull_window_reports_an_agent_whose_columns_are_malformed() -> None:
    good = reader.load_lines(JOB, [("agent", node_lines(1))])
    broken = columnar.encode(dataclasses.replace(good, comm_ids=("0xZZ",)))

    def bad(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=broken, headers={"content-type": columnar.MEDIA_TYPE})

    bundle, failed = pull({"node-0": bad, "node-1": columnar_agent(1, [])})
    assert bundle.comms["rank"].tolist() == [1]  # the good agent's records are kept
    ((node, reason),) = [(f.node, f.reason) for f in failed]
    assert node == "node-0" and "agent node-1" in reason  # the client's name for its agent
    assert "http://agent.test:9464/v1/window" in reason and "comm_ids[0]" in reason


def test_a_malformed_columnar_answer_is_not_retried() -> None:
    calls: list[httpx.Request] = []

    def bad(req: httpx.Request) -> httpx.Response:
        calls.append(req)
        return httpx.Response(
            200, content=b"garbage", headers={"content-type": columnar.MEDIA_TYPE}
        )

    with pytest.raises(errors.AgentError, match="too short"):
        asyncio.run(client(bad).window([0], since_ns=0, until_ns=1))
    assert len(calls) == 1


def test_tls_and_the_token_reach_a_real_agent(tmp_path: pathlib.Path) -> None:
    """The operator's client against a real agent with TLS and authorization on: the agent's
    certificate names a Service, not the IP it is reached at (server_name), and the token is
    read from its file, again after a rotation."""
    from tests.unit.nodeagent import test_server_limits as agent_tests

    crt, key = agent_tests.self_signed(tmp_path / "tls", "agent.collscope.svc", ip=False)
    token = tmp_path / "token"
    token.write_text("op")
    reviewer = agent_tests.FakeReviewer()
    cfg = agent_tests.config(
        tmp_path / "trace", tls=agent_settings.TLSSettings(cert_file=str(crt), key_file=str(key))
    )
    a = agent.Agent(cfg, proc_root=None, reviewer=reviewer)
    a.start()
    host, port = a.server.address
    access = settings.AgentSettings(
        ca_file=str(crt), server_name="agent.collscope.svc", token_file=str(token)
    )

    async def call(access: settings.AgentSettings) -> api.RanksResponse:
        c = agents.AgentClient("gpu-1", f"https://{host}:{port}", retries=0, access=access)
        try:
            return await c.ranks()
        finally:
            await c.aclose()

    try:
        assert asyncio.run(call(access)).node == "gpu-1"
        assert reviewer.authn == ["op"]
        wrong_name = dataclasses.replace(access, server_name="")  # the IP is not in the cert
        with pytest.raises(errors.AgentUnreachable):
            asyncio.run(call(wrong_name))
        token.write_text("tenant")
        agents._token(str(token))._checked = -1e9  # as if FILE_CHECK_S had passed
        with pytest.raises(errors.AgentError, match="HTTP 403"):
            asyncio.run(call(access))
        plain = dataclasses.replace(access, token_file="")
        with pytest.raises(errors.AgentError, match="HTTP 401"):
            asyncio.run(call(plain))
    finally:
        a.stop()


def test_pull_window_names_the_jobs_workloads_to_agents_that_key_by_them() -> None:
    """Another job's ranks 0 and 1 on node-0 are not this job's: the request names this job's
    pod uids there; node-1's agent is older (no workloads in its /v1/ranks): no parameter."""
    seen: dict[str, dict[str, str]] = {}

    def handler_for(node: str) -> Handler:
        def handler(req: httpx.Request) -> httpx.Response:
            seen[node] = dict(req.url.params)
            return httpx.Response(200, content=b"")

        return handler

    job = models.Job.model_validate({"schema": "collscope.bundle/v1", "job": "j", "world_size": 3})
    clients = {n: client(handler_for(n)) for n in ("node-0", "node-1")}
    asyncio.run(
        agents.pull_window(
            clients,
            {"node-0": [0, 1], "node-1": [2]},
            job,
            since_ns=T0,
            until_ns=T0 + 1,
            workloads={"node-0": ["uid-a", "uid-b"]},
        )
    )
    assert seen["node-0"]["workloads"] == "uid-a,uid-b" and seen["node-0"]["ranks"] == "0,1"
    assert "workloads" not in seen["node-1"]


def summary_body(ranks: list[int], workload: str) -> dict[str, object]:
    rows: list[dict[str, object]] = [
        {
            "rank": r,
            "window_s": 1.0,
            "from_ns": T0 - 10**9,
            "to_ns": T0,
            "health": "live",
            "completed_ops": 0,
            "completed_bytes": 0,
            "throughput_bytes_per_s": 0.0,
            "mean_op_interval_ns": None,
            "last_completion_ns": T0 - 5,
            "comms": [],
            "in_flight": [],
            "workload": workload,
        }
        for r in ranks
    ]
    return {"api": "v1", "node": "node-1", "now_ns": T0, "summaries": rows}


def test_pull_summaries_gathers_every_node_and_names_failed_ones() -> None:
    """Each node is asked for its ranks, the job's workloads and the window; the rows come
    back in rank order; a node whose agent fails and one without a client are reported."""
    seen: list[httpx.Request] = []

    def agent_of(ranks: list[int]) -> Handler:
        def handler(req: httpx.Request) -> httpx.Response:
            seen.append(req)
            assert req.url.path == "/v1/summaries"
            other = summary_body([99], "other")["summaries"]
            body = summary_body(ranks, "ns/llama")
            body["summaries"] = [*body["summaries"], *other]  # type: ignore[misc]
            return httpx.Response(200, json=body)

        return handler

    down = client(lambda req: httpx.Response(503, json={"error": "busy"}), retries=0)
    clients = {"node-0": client(agent_of([2, 0])), "node-1": client(agent_of([1])), "n-2": down}
    rows, failed = asyncio.run(
        agents.pull_summaries(
            clients,
            {"node-0": [0, 2], "node-1": [1], "n-2": [3], "node-9": [5]},
            {"node-0": ["ns/llama"], "node-1": ["ns/llama"]},
            window_s=1.0,
        )
    )
    assert [r.rank for r in rows] == [0, 1, 2]  # rank 99 is another workload's
    assert sorted(f.node for f in failed) == ["n-2", "node-9"]
    params = sorted((r.url.params["ranks"], r.url.params["window_s"]) for r in seen)
    assert params == [("0,2", "1"), ("1", "1")]
    assert {r.url.params["workloads"] for r in seen} == {"ns/llama"}
