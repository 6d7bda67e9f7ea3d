"""tenancy.py and the namespaced authorization of server.py: a job owner allowed in its own
namespace reads and dumps its own pods only, the namespace coming from the API server's pod
(by the uid from the kubelet path), never from the request or a ring header."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Iterator, Mapping

import pytest
from aiohttp import web
from tests.unit.nodeagent import test_auth, test_server_limits

from collscope.nodeagent import agent, auth, errors, tenancy

A = "aaaaaaaa-0000-1111-2222-333344445555"  # a pod of namespace team-a on this node
B = "bbbbbbbb-0000-1111-2222-333344445555"  # a pod of namespace team-b on this node
C = "cccccccc-0000-1111-2222-333344445555"  # no pod of this node
PODS = {A: tenancy.PodRef("team-a", "train-a"), B: tenancy.PodRef("team-b", "train-b")}
OWNER_A = "system:serviceaccount:team-a:runner"


class NamespacedReviewer(test_server_limits.FakeReviewer):
    """``op`` may do everything node-wide; ``owner-a`` everything in namespace team-a only;
    the node's pods are ``pods`` (``tenancy.PodLister``)."""

    def __init__(self, pods: Mapping[str, tenancy.PodRef]) -> None:
        super().__init__()
        self.pods = dict(pods)
        self.lists = 0
        self.down = False

    async def authenticate(self, token: str) -> auth.User | None:
        return auth.User(name=OWNER_A) if token == "owner-a" else await super().authenticate(token)

    async def authorize(self, user: auth.User, attrs: auth.Attributes) -> bool:
        self.authz.append((user.name, attrs))
        if user.name == OWNER_A:
            return attrs.namespace == "team-a"
        return user.name == test_server_limits.OPERATOR

    async def node_pods(self, node: str) -> Mapping[str, tenancy.PodRef]:
        self.lists += 1
        if self.down:
            raise errors.ReviewUnavailable("pod list: connection refused")
        return dict(self.pods)


@pytest.fixture
def node(tmp_path: pathlib.Path) -> Iterator[tuple[test_server_limits.Running, NamespacedReviewer]]:
    reviewer = NamespacedReviewer(PODS)
    cfg = test_server_limits.config(tmp_path / "trace")
    a = agent.Agent(cfg, stacks_dumper=test_server_limits.SlowStacks(0), proc_root=None,
                    reviewer=reviewer)  # fmt: skip
    a.start()
    host, port = a.server.address
    try:
        yield test_server_limits.Running(a, reviewer, f"http://{host}:{port}"), reviewer
    finally:
        a.stop()


def test_a_job_owner_is_allowed_in_its_namespace_only(
    node: tuple[test_server_limits.Running, NamespacedReviewer],
) -> None:
    r, reviewer = node
    with r.client("owner-a") as c:
        for path in ("/v1/window", "/v1/summaries", "/v1/export"):
            assert c.get(path, params={"workloads": A}).status_code == 200, path
            got = c.get(path, params={"workloads": B})
            assert got.status_code == 403 and "namespace team-b" in got.json()["error"], path
            assert c.get(path, params={"workloads": f"{A},{B}"}).status_code == 403, path
        # Naming no workload is the whole node: the node-wide permission, which it lacks.
        assert c.get("/v1/window").status_code == 403
        assert c.get("/v1/ranks").status_code == 403
        assert c.get("/metrics").status_code == 403
        assert c.post("/v1/flightrecorder", json={"workloads": [A]}).status_code != 403
        assert c.post("/v1/flightrecorder", json={"workloads": [B]}).status_code == 403
        assert c.post("/v1/stacks", json={"workloads": [A], "ranks": []}).status_code != 403
        # Raw pids may be any process of the node: never on a namespaced permission.
        pids = c.post("/v1/stacks", json={"workloads": [A], "pids": [1]})
        assert pids.status_code == 403 and "raw pids" in pids.json()["error"]
    asked = {(a.subresource, a.namespace) for name, a in reviewer.authz if name == OWNER_A}
    assert ("data", "") in asked and ("data", "team-a") in asked and ("data", "team-b") in asked
    assert {a.name for _, a in reviewer.authz if not a.path} == {"gpu-1"}  # same resource
    with r.client("op") as c:  # node-wide, as before: no pod lookup needed
        assert c.get("/v1/window", params={"workloads": B}).status_code == 200
        assert c.get("/v1/ranks").status_code == 200


def test_an_unknown_pod_uid_is_refused_after_one_fresh_list(
    node: tuple[test_server_limits.Running, NamespacedReviewer],
) -> None:
    r, reviewer = node
    with r.client("owner-a") as c:
        assert c.get("/v1/window", params={"workloads": A}).status_code == 200
        assert reviewer.lists == 1
        pods = r.agent.server.pods
        assert pods is not None
        pods._listed_at = -100.0  # the last list is older than MIN_REFRESH_S
        for uid in (C, "dir-0123456789abcdef"):  # no pod of this node; a ring in no pod
            got = c.get("/v1/window", params={"workloads": uid})
            assert got.status_code == 403 and "no pod of node gpu-1" in got.json()["error"]
        # C made one fresh list; the next unknown uid came too soon after it to list again.
        assert reviewer.lists == 2
        reviewer.down = True  # no answer is not a refusal: 503, asked again next time
        pods._listed_at = None
        assert c.get("/v1/window", params={"workloads": C}).status_code == 503


def test_pods_lists_again_only_for_an_unknown_uid_and_not_too_often() -> None:
    now = [0.0]
    lister = NamespacedReviewer({A: PODS[A]})
    pods = tenancy.Pods(lister, "gpu-1", min_refresh_s=2.0, clock=lambda: now[0])

    async def run() -> None:
        assert await pods.lookup([A]) == {A: PODS[A]}
        assert await pods.lookup([A]) == {A: PODS[A]} and lister.lists == 1
        lister.pods[B] = PODS[B]  # a pod created just now
        assert await pods.lookup([B]) == {B: None} and lister.lists == 1  # too soon
        now[0] = 2.0
        assert await pods.lookup([A, B]) == {A: PODS[A], B: PODS[B]} and lister.lists == 2
        now[0] = 10.0
        got = await asyncio.gather(*(pods.lookup([C]) for _ in range(5)))
        assert got == [{C: None}] * 5 and lister.lists == 3  # concurrent: one list

    asyncio.run(run())


@pytest.mark.asyncio
async def test_kube_reviewer_lists_the_nodes_pods(tmp_path: pathlib.Path) -> None:
    seen: list[web.Request] = []

    async def pods(request: web.Request) -> web.Response:
        seen.append(request)
        if request.headers.get("Authorization") != f"Bearer {test_auth.AGENT_TOKEN}":
            raise web.HTTPUnauthorized()
        items = [{"metadata": {"uid": A, "namespace": "team-a", "name": "train-a"}},
                 {"metadata": {"uid": B, "namespace": "team-b", "name": "train-b"}},
                 {"metadata": {"name": "no-uid"}}, "junk"]  # fmt: skip
        return web.json_response({"kind": "PartialObjectMetadataList", "items": items})

    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    r = auth.KubeReviewer(f"http://127.0.0.1:{port}", lambda: test_auth.AGENT_TOKEN)
    try:
        assert isinstance(r, tenancy.PodLister)
        assert await r.node_pods("gpu-1") == PODS
    finally:
        await r.aclose()
        await runner.cleanup()
    assert seen[0].query["fieldSelector"] == "spec.nodeName=gpu-1"
    assert seen[0].headers["Accept"].startswith("application/json;as=PartialObjectMetadataList")
