"""A tenant against the node agent's API (issue 15 item 1). A real agent over TLS asks a real
``auth.KubeReviewer`` to review tokens. That reviewer talks to an API server stand-in that
speaks authentication.k8s.io/v1 and authorization.k8s.io/v1 (test_auth.py's ``FakeApiServer``):
the operator's token is allowed everything, a tenant's ServiceAccount token is authenticated but
allowed nothing.

Unauthenticated, forged and wrongly authorized requests to the endpoints that pause processes,
arm probes or give away other tenants' data (``/v1/stacks``, ``/v1/flightrecorder``,
``/v1/profile``, ``/v1/window``, ``/v1/export``) are refused before any work. py-spy never runs
for them. Meanwhile the operator keeps being served. A job owner allowed in its own namespace
reads its own pods' data only, whatever namespace another tenant's ring header claims.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import ssl
import threading
from collections.abc import Iterator, Sequence
from typing import Final

import httpx
import pydantic
import pytest
from aiohttp import web
from tests.hostile import test_workloads as two_jobs
from tests.unit.nodeagent import test_auth, test_server_limits

from collscope.nodeagent import agent, auth, server, settings, stacks

ENDPOINTS = [
    ("POST", "/v1/stacks", {"pids": [1]}),
    ("POST", "/v1/flightrecorder", {}),
    ("POST", "/v1/profile", {"id": "p1"}),  # would arm every rank's probe on the node
    ("GET", "/v1/profile?id=p1", None),
    ("GET", "/v1/window", None),
    ("GET", "/v1/export", None),
    ("GET", "/v1/ranks", None),
    ("GET", "/metrics", None),
]


class ApiServerThread:
    """``test_auth.FakeApiServer`` on its own event loop thread (the agent runs in another)."""

    def __init__(self, fake: test_auth.FakeApiServer | None = None) -> None:
        self.fake = fake or test_auth.FakeApiServer(
            users={"op-token": test_auth.OPERATOR, "tenant-token": "system:serviceaccount:ml:t"},
            allowed={(test_auth.OPERATOR, "get", "agents/data"),
                     (test_auth.OPERATOR, "create", "agents/stacks"),
                     (test_auth.OPERATOR, "create", "agents/flightrecorder"),
                     (test_auth.OPERATOR, "create", "agents/profile"),
                     (test_auth.OPERATOR, "get", "agents/profile"),
                     (test_auth.OPERATOR, "get", "/metrics")},
        )  # fmt: skip
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.url = ""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self.fake.tokenreviews)
        app.router.add_post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews", self.fake.subjectaccessreviews
        )
        if isinstance(self.fake, NamespacedApiServer):
            app.router.add_get("/api/v1/pods", self.fake.list_pods)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class CountingStacks:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, pids: Sequence[int], timeout_s: float) -> pydantic.BaseModel:
        self.calls += 1
        return stacks.StacksReport(groups=[])


class Node:
    def __init__(self, url: str, ca: pathlib.Path, pyspy: CountingStacks) -> None:
        self.url, self.ca, self.pyspy = url, ca, pyspy

    def client(self, token: str | None) -> httpx.Client:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        verify = ssl.create_default_context(cafile=str(self.ca))
        return httpx.Client(base_url=self.url, headers=headers, verify=verify, timeout=10)


@pytest.fixture
def node(tmp_path: pathlib.Path) -> Iterator[Node]:
    api = ApiServerThread()
    token = tmp_path / "agent-token"
    token.write_text(test_auth.AGENT_TOKEN)
    crt, key = test_server_limits.self_signed(tmp_path / "tls", "agent.test")
    cfg = test_server_limits.config(
        tmp_path / "trace", tls=settings.TLSSettings(cert_file=str(crt), key_file=str(key))
    )
    pyspy = CountingStacks()
    reviewer = auth.KubeReviewer(api.url, auth.TokenFile(str(token)))
    a = agent.Agent(cfg, stacks_dumper=pyspy, proc_root=None, reviewer=reviewer)
    a.start()
    host, port = a.server.address
    try:
        yield Node(f"https://{host}:{port}", crt, pyspy)
    finally:
        a.stop()
        api.stop()


@pytest.mark.parametrize("token", [None, "forged-token", "tenant-token"])
def test_tenant_requests_are_refused_before_any_work(node: Node, token: str | None) -> None:
    want = 403 if token == "tenant-token" else 401
    with node.client(token) as c:
        for method, path, body in ENDPOINTS:
            r = c.request(method, path, json=body)
            assert r.status_code == want, (path, r.text)
            assert r.json()["error"], path  # an ErrorResponse, not a traceback
    assert node.pyspy.calls == 0
    with node.client("op-token") as c:  # the operator is still served
        assert c.post("/v1/stacks", json={"pids": [1]}).status_code in (200, 400)
        assert c.get("/v1/ranks").status_code == 200


def test_a_token_in_the_wrong_place_or_shape_is_no_token(node: Node) -> None:
    tricks = [
        {"Authorization": "Basic b3AtdG9rZW46"},
        {"Authorization": "Bearer op-token extra"},
        {"X-Forwarded-User": test_auth.OPERATOR},
        {"Impersonate-User": test_auth.OPERATOR},
    ]
    with node.client(None) as c:
        for headers in tricks:
            assert c.get("/v1/window", headers=headers).status_code == 401, headers
        assert c.get("/v1/window", params={"access_token": "op-token"}).status_code == 401


def test_a_refused_tenant_does_not_crowd_out_the_operator(node: Node) -> None:
    """A tenant hammering with tokens the API server must review: the operator's pulls,
    answered from the cache, still come back."""
    stop = threading.Event()

    def hammer() -> None:
        with node.client(None) as c:
            i = 0
            while not stop.is_set():
                i += 1
                c.get("/v1/window", headers={"Authorization": f"Bearer forged-{i}"})

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        with node.client("op-token") as c:
            for _ in range(20):
                assert c.get("/v1/summaries", params={"window_s": "1"}).status_code == 200
    finally:
        stop.set()
        for t in threads:
            t.join()


class NamespacedApiServer(test_auth.FakeApiServer):
    """The API server stand-in with namespaces: a SubjectAccessReview is allowed for a grant of
    (user, verb, resource, namespace) (a RoleBinding there), and the node's pods are listed."""

    def __init__(self, grants: set[tuple[str, str, str, str]], pods: dict[str, str]) -> None:
        super().__init__(users={"owner-train": OWNER_TRAIN}, allowed=set())
        self.grants, self.pods = grants, pods

    async def subjectaccessreviews(self, request: web.Request) -> web.Response:
        body = await self._check(request)
        spec, ra = body["spec"], body["spec"].get("resourceAttributes", {})
        key = (spec["user"], ra.get("verb"), f"agents/{ra.get('subresource')}", ra.get("namespace"))
        return web.json_response({**body, "status": {"allowed": key in self.grants}}, status=201)

    async def list_pods(self, request: web.Request) -> web.Response:
        self.auth_headers.append(request.headers.get("Authorization", ""))
        assert request.query["fieldSelector"] == "spec.nodeName=node"
        items = [{"metadata": {"uid": uid, "namespace": ns, "name": f"p-{ns}"}}
                 for uid, ns in self.pods.items()]  # fmt: skip
        return web.json_response({"kind": "PodList", "items": items})


OWNER_TRAIN = "system:serviceaccount:train:runner"


def test_a_job_owner_cannot_read_another_namespaces_window(tmp_path: pathlib.Path) -> None:
    """Two jobs on one node (test_workloads.Node): pod A of namespace "train" and pod B of
    namespace "other", whose ring headers both claim namespace "train". The owner of "train"
    (a RoleBinding there, nothing node-wide) reads its own pod's window and Flight Recorder;
    B's window, B's dumps, both at once and the whole node are refused: the namespace is the
    API server's for the pod uid of the kubelet path, never the tenant-written header."""
    fake = NamespacedApiServer(
        grants={(OWNER_TRAIN, "get", "agents/data", "train"),
                (OWNER_TRAIN, "create", "agents/flightrecorder", "train")},
        pods={two_jobs.A: "train", two_jobs.B: "other"},
    )  # fmt: skip
    api = ApiServerThread(fake)
    token = tmp_path / "agent-token"
    token.write_text(test_auth.AGENT_TOKEN)
    crt, key = test_server_limits.self_signed(tmp_path / "tls", "agent.test")
    tls = settings.TLSSettings(cert_file=str(crt), key_file=str(key))
    node = two_jobs.Node(tmp_path / "node")
    assert {r.pod_namespace for r in node.service.ranks().ranks} == {"train"}  # B's forged too
    srv = server.Server(
        node.service,
        test_server_limits.config(tmp_path / "trace", tls=tls),
        reviewer=auth.KubeReviewer(api.url, auth.TokenFile(str(token))),
    )
    srv.start()
    host, port = srv.address
    owner = Node(f"https://{host}:{port}", crt, CountingStacks())
    try:
        with owner.client("owner-train") as c:
            mine = c.get("/v1/window", params={"workloads": two_jobs.A})
            assert mine.status_code == 200, mine.text
            assert f'"bytes":{two_jobs.BYTES[two_jobs.A]}' in mine.text
            assert f'"bytes":{two_jobs.BYTES[two_jobs.B]}' not in mine.text
            fr = c.post("/v1/flightrecorder", json={"workloads": [two_jobs.A]})
            assert fr.status_code == 200, fr.text
            assert node.dumps.targets == [(0, two_jobs.HOST[100]), (1, two_jobs.HOST[101])]
            theirs = [
                c.get("/v1/window", params={"workloads": two_jobs.B}),
                c.get("/v1/window", params={"workloads": f"{two_jobs.A},{two_jobs.B}"}),
                c.get("/v1/export", params={"workloads": two_jobs.B}),
                c.get("/v1/summaries", params={"workloads": two_jobs.B}),
                c.post("/v1/flightrecorder", json={"workloads": [two_jobs.B]}),
                c.post("/v1/stacks", json={"workloads": [two_jobs.A], "pids": [5200]}),
                c.get("/v1/window"),  # the whole node
                c.get("/v1/ranks"),
            ]
            for r in theirs:
                assert r.status_code == 403, (r.request.url, r.text)
                assert r.json()["error"]
        assert node.dumps.targets == [(0, two_jobs.HOST[100]), (1, two_jobs.HOST[101])]
        assert node.dumps.pids == []
    finally:
        srv.stop()
        api.stop()


class AudienceApiServer(test_auth.FakeApiServer):
    """Tokens carry an audience: the API server's own ("api") or the agents' ("collscope-agent").
    A TokenReview without audiences accepts only "api" tokens, one with audiences only those."""

    TOKENS: Final = {
        "op-agent-token": (test_auth.OPERATOR, "collscope-agent"),  # projected, for agents
        "op-api-token": (test_auth.OPERATOR, "api"),  # the operator's ordinary token, stolen
        "prometheus-token": ("system:serviceaccount:monitoring:prometheus", "api"),
    }

    def __init__(self) -> None:
        users = {t: u for t, (u, _) in self.TOKENS.items()}
        allowed = {(test_auth.OPERATOR, "get", "agents/data"),
                   ("system:serviceaccount:monitoring:prometheus", "get", "/metrics")}  # fmt: skip
        super().__init__(users=users, allowed=allowed)

    async def tokenreviews(self, request: web.Request) -> web.Response:
        body = await self._check(request)
        user, aud = self.TOKENS.get(body["spec"]["token"], ("", ""))
        wanted = body["spec"].get("audiences") or ["api"]
        if not user or aud not in wanted:
            return web.json_response({**body, "status": {"authenticated": False}}, status=201)
        status = {"authenticated": True, "audiences": [aud],
                  "user": {"username": user, "groups": ["system:authenticated"]}}  # fmt: skip
        return web.json_response({**body, "status": status}, status=201)


def test_a_token_for_another_audience_is_refused(tmp_path: pathlib.Path) -> None:
    """With COLLSCOPE_AUTH_AUDIENCES (the chart: agent.auth.audience), the operator's ordinary
    ServiceAccount token, stolen from its pod, opens nothing; its projected token for the
    agents does. /metrics still takes Prometheus' ordinary token."""
    api = ApiServerThread(AudienceApiServer())
    token = tmp_path / "agent-token"
    token.write_text(test_auth.AGENT_TOKEN)
    crt, key = test_server_limits.self_signed(tmp_path / "tls", "agent.test")
    cfg = test_server_limits.config(
        tmp_path / "trace", tls=settings.TLSSettings(cert_file=str(crt), key_file=str(key))
    )
    cfg = dataclasses.replace(
        cfg, auth=dataclasses.replace(cfg.auth, audiences=("collscope-agent",))
    )
    reviewer = auth.KubeReviewer(api.url, auth.TokenFile(str(token)), audiences=cfg.auth.audiences)
    a = agent.Agent(cfg, stacks_dumper=CountingStacks(), proc_root=None, reviewer=reviewer)
    a.start()
    host, port = a.server.address
    node = Node(f"https://{host}:{port}", crt, CountingStacks())
    try:
        with node.client("op-api-token") as c:
            assert c.get("/v1/ranks").status_code == 401
            assert c.get("/metrics").status_code == 403  # authenticated there, not allowed
        with node.client("op-agent-token") as c:
            assert c.get("/v1/ranks").status_code == 200
            assert c.get("/metrics").status_code == 401  # not a token for the API server
        with node.client("prometheus-token") as c:
            assert c.get("/metrics").status_code == 200
            assert c.get("/v1/ranks").status_code == 401
    finally:
        a.stop()
        api.stop()
