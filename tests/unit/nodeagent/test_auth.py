"""auth.py: the route table, the cache, the rate limit, and the real TokenReview and
SubjectAccessReview calls against a small API server that speaks authentication.k8s.io/v1 and
authorization.k8s.io/v1 (kmock stores a POSTed review as an object and answers no status)."""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from collscope.nodeagent import auth, errors

AGENT_TOKEN = "agent-sa-token"
OPERATOR = "system:serviceaccount:collscope-system:collscope-operator"


class FakeApiServer:
    """POST tokenreviews / subjectaccessreviews as a real API server answers them: 201 and the
    review with its ``status``; 401 when the agent's own token is wrong."""

    def __init__(self, users: dict[str, str], allowed: set[tuple[str, str, str]]) -> None:
        self.users, self.allowed = users, allowed
        self.bodies: list[dict[str, Any]] = []
        self.auth_headers: list[str] = []

    async def tokenreviews(self, request: web.Request) -> web.Response:
        body = await self._check(request)
        name = self.users.get(body["spec"]["token"])
        status: dict[str, Any] = {"authenticated": name is not None}
        if name is not None:
            pod = {"authentication.kubernetes.io/pod-name": ["op-0"]}
            groups = ["system:authenticated"]
            status["user"] = {"username": name, "uid": "u-1", "groups": groups, "extra": pod}
            status["audiences"] = body["spec"].get("audiences", ["https://kubernetes.default"])
        return web.json_response({**body, "status": status}, status=201)

    async def subjectaccessreviews(self, request: web.Request) -> web.Response:
        body = await self._check(request)
        spec = body["spec"]
        if "nonResourceAttributes" in spec:
            what = spec["nonResourceAttributes"]["path"]
            verb = spec["nonResourceAttributes"]["verb"]
        else:
            ra = spec["resourceAttributes"]
            what, verb = f"{ra['resource']}/{ra.get('subresource', '')}", ra["verb"]
        allowed = (spec["user"], verb, what) in self.allowed
        return web.json_response({**body, "status": {"allowed": allowed}}, status=201)

    async def _check(self, request: web.Request) -> dict[str, Any]:
        self.auth_headers.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != f"Bearer {AGENT_TOKEN}":
            raise web.HTTPUnauthorized(text='{"kind":"Status","code":401}')
        body: dict[str, Any] = await request.json()
        self.bodies.append(body)
        return body


@pytest_asyncio.fixture
async def api_server() -> AsyncIterator[tuple[FakeApiServer, str]]:
    fake = FakeApiServer(
        users={"op-token": OPERATOR, "tenant-token": "system:serviceaccount:ml:default"},
        allowed={(OPERATOR, "get", "agents/data"), (OPERATOR, "create", "agents/stacks"),
                 (OPERATOR, "get", "/metrics")},
    )  # fmt: skip
    app = web.Application()
    app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", fake.tokenreviews)
    app.router.add_post(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews", fake.subjectaccessreviews
    )
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.mark.asyncio
async def test_real_reviews_against_the_review_apis(
    api_server: tuple[FakeApiServer, str], tmp_path: pathlib.Path
) -> None:
    fake, url = api_server
    token_file = tmp_path / "token"
    token_file.write_text(AGENT_TOKEN + "\n")
    r = auth.KubeReviewer(url, auth.TokenFile(str(token_file)), audiences=("collscope-agent",))
    try:
        user = await r.authenticate("op-token")
        assert user is not None and user.name == OPERATOR and user.uid == "u-1"
        assert user.extra == (("authentication.kubernetes.io/pod-name", ("op-0",)),)
        assert await r.authenticate("forged") is None
        data = auth.attributes("GET", "/v1/window", "gpu-7")
        stacks = auth.attributes("POST", "/v1/stacks", "gpu-7")
        fr = auth.attributes("POST", "/v1/flightrecorder", "gpu-7")
        assert data is not None and stacks is not None and fr is not None
        assert await r.authorize(user, data) and await r.authorize(user, stacks)
        assert not await r.authorize(user, fr)
        metrics = auth.attributes("GET", "/metrics", "gpu-7")
        assert metrics is not None and await r.authorize(user, metrics)
    finally:
        await r.aclose()
    review, _, sar, *_ = fake.bodies
    assert review["apiVersion"] == "authentication.k8s.io/v1" and review["kind"] == "TokenReview"
    assert review["spec"] == {"token": "op-token", "audiences": ["collscope-agent"]}
    assert sar["apiVersion"] == "authorization.k8s.io/v1"
    assert sar["kind"] == "SubjectAccessReview"
    assert sar["spec"]["resourceAttributes"] == {
        "verb": "get", "group": "collscope.dev", "resource": "agents", "subresource": "data",
        "name": "gpu-7",
    }  # fmt: skip
    assert sar["spec"]["user"] == OPERATOR and sar["spec"]["uid"] == "u-1"
    assert sar["spec"]["groups"] == ["system:authenticated"]
    assert fake.bodies[-1]["spec"]["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
    assert set(fake.auth_headers) == {f"Bearer {AGENT_TOKEN}"}


@pytest.mark.asyncio
async def test_the_agents_own_token_is_read_again_when_rotated(
    api_server: tuple[FakeApiServer, str], tmp_path: pathlib.Path
) -> None:
    _, url = api_server
    token_file = tmp_path / "token"
    token_file.write_text("expired")
    r = auth.KubeReviewer(url, auth.TokenFile(str(token_file)))
    try:
        with pytest.raises(errors.ReviewUnavailable, match="HTTP 401"):
            await r.authenticate("op-token")
        rotated = tmp_path / "token.new"  # the kubelet swaps the file: a new inode
        rotated.write_text(AGENT_TOKEN)
        rotated.replace(token_file)
        assert await r.authenticate("op-token") is not None
    finally:
        await r.aclose()


@pytest.mark.asyncio
async def test_an_unreachable_api_server_is_unavailable_not_a_refusal(
    tmp_path: pathlib.Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(AGENT_TOKEN)
    r = auth.KubeReviewer("http://127.0.0.1:9", auth.TokenFile(str(token_file)), timeout_s=2)
    try:
        with pytest.raises(errors.ReviewUnavailable, match="TokenReview"):
            await r.authenticate("op-token")
    finally:
        await r.aclose()
    with pytest.raises(errors.ReviewUnavailable, match="token"):
        auth.TokenFile(str(tmp_path / "missing"))()


class Counting:
    """A Reviewer fake that counts calls and can be made to fail or to be slow."""

    def __init__(self) -> None:
        self.authn = 0
        self.authz = 0
        self.fail = False
        self.allow = True

    async def authenticate(self, token: str) -> auth.User | None:
        self.authn += 1
        await asyncio.sleep(0.01)
        if self.fail:
            raise errors.ReviewUnavailable("down")
        return auth.User(name=f"user-{token}") if token.startswith("good") else None

    async def authorize(self, user: auth.User, attrs: auth.Attributes) -> bool:
        self.authz += 1
        return self.allow


@pytest.mark.asyncio
async def test_cache_keeps_answers_for_their_ttl_and_never_errors() -> None:
    now = [0.0]
    inner = Counting()
    c = auth.Cache(inner, ttl_s=60, denied_ttl_s=10, clock=lambda: now[0])
    # Concurrent first requests share one review.
    users = await asyncio.gather(*(c.authenticate("good-1") for _ in range(20)))
    assert {u.name for u in users if u} == {"user-good-1"} and inner.authn == 1
    assert await c.authenticate("bad") is None and inner.authn == 2
    attrs = auth.Attributes(verb="get", group=auth.GROUP, resource="agents", subresource="data")
    user = users[0]
    assert user is not None
    assert await c.authorize(user, attrs) and await c.authorize(user, attrs)
    assert inner.authz == 1
    now[0] = 30.0  # the refusal expired (10 s), the user not (60 s)
    await c.authenticate("bad")
    await c.authenticate("good-1")
    assert inner.authn == 3
    now[0] = 61.0
    inner.allow = False
    assert not await c.authorize(user, attrs) and inner.authz == 2
    inner.fail = True
    for _ in range(2):  # an error is not kept: the next request asks again
        with pytest.raises(errors.ReviewUnavailable):
            await c.authenticate("good-2")
    assert inner.authn == 5


@pytest.mark.asyncio
async def test_cache_is_bounded() -> None:
    c = auth.Cache(Counting(), ttl_s=60, denied_ttl_s=10, max_entries=8)
    for i in range(50):
        await c.authenticate(f"token-{i}")
    assert len(c._entries) == 8


def test_rate_limit_per_caller() -> None:
    now = [0.0]
    rl = auth.RateLimit(burst=2, per_minute=6, clock=lambda: now[0])
    assert rl.take("op") == 0 and rl.take("op") == 0
    assert rl.take("op") == pytest.approx(10.0)
    assert rl.take("other") == 0  # buckets are per caller
    now[0] = 10.0
    assert rl.take("op") == 0 and rl.take("op") > 0


@pytest.mark.parametrize(
    ("header", "token"),
    [("Bearer abc.def", "abc.def"), ("bearer  abc ", "abc"), ("Basic abc", None),
     ("Bearer", None), ("Bearer a b", None), (None, None), ("", None)],
)  # fmt: skip
def test_bearer(header: str | None, token: str | None) -> None:
    assert auth.bearer(header) == token


def test_every_route_but_health_needs_a_review() -> None:
    from collscope.nodeagent import server

    for method, path in server._ROUTES:
        attrs = auth.attributes(method, path, "n")
        assert (attrs is None) == (path in auth.OPEN), path
    expensive = {p for (m, p), (verb, _) in auth.ROUTES.items() if verb == "create"}
    assert expensive == {"/v1/stacks", "/v1/flightrecorder", "/v1/profile"}
    spec = json.dumps(auth.Attributes(verb="get", path="/metrics").spec())
    assert "resourceAttributes" not in spec.replace("nonResourceAttributes", "")
