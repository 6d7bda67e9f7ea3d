"""The chart's RBAC grants exactly what collscope-operator uses: every API call is covered, and
nothing is granted that no call needs.

Calls are derived from the code, not listed by hand:
- ``kube.Cluster`` (the only module that imports the Kubernetes client): every public coroutine
  is called against a recording ``ApiClient`` and the HTTP requests it makes are kept; a new
  method fails ``test_every_adapter_method_is_exercised`` until it is added to ``CALLS``;
- kopf: the handlers ``__main__.build`` registers (with the webhook on) are read from the
  registry, and each handler kind maps to the requests kopf makes for it; plus kopf's own
  (Events, peering, CRD observation);
- the agents' API: every public coroutine of ``agents.AgentClient`` is called against a
  recording transport and each request is mapped to the SubjectAccessReview the agent asks for
  it (``collscope.nodeagent.auth.attributes``); the operator must be granted exactly those.
The agent's own rights are what ``auth.KubeReviewer`` sends (TokenReview and
SubjectAccessReview creates, and the list of its node's pods that gives a job owner's workloads
their namespaces), recorded from real calls of every public coroutine, and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import inspect
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import kubernetes
from aiohttp import web

from collscope.nodeagent import api as agent_api
from collscope.nodeagent import auth
from collscope.operator import __main__ as operator_main
from collscope.operator import errors
from collscope.operator.clients import agents, kube
from collscope.operator.domain import jobs, owners, remediation, settings

NS = "ml"


class Call(NamedTuple):
    group: str
    resource: str  # plural, or plural/subresource
    verb: str
    name: str | None = None
    namespace: str | None = None


# -- kube.Cluster: real requests -------------------------------------------------------------


class Recorder(kubernetes.client.ApiClient):
    """Keeps (method, url) of each request; answers 409 to creates and 404 to the rest, which
    takes every method down its whole path (create-or-patch included) without a server."""

    def __init__(self) -> None:
        super().__init__(kubernetes.client.Configuration(host="http://k8s"))
        self.requests: list[tuple[str, str]] = []

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        self.requests.append((method, url))
        status, reason = (409, "Conflict") if method == "POST" else (404, "Not Found")
        raise kubernetes.client.ApiException(status=status, reason=reason)


TJ = {"metadata": {"name": "tj", "namespace": NS}}
CALLS: dict[str, list[tuple[Any, ...]]] = {
    "owner_metadata": [(owners.OwnerRef(kind=k, api_version=f"{g}/v1", name="w", uid="u"), NS)
                       for k, (g, _) in kube.READABLE_OWNERS.items()],
    "create_trainingjob": [(TJ,)],
    "create_diagnosis": [({"metadata": {"name": "d", "namespace": NS}},)],
    "patch_status": [(kube.DIAGNOSES, NS, "d", {"phase": "Diagnosed"})],
    "get_trainingjob": [(NS, "tj")],
    "annotate_trainingjob": [(NS, "tj", {"collscope.dev/profile": "auto-d"})],
    "get_diagnosis": [(NS, "d")],
    "list_diagnoses": [(NS,)],
    "delete_diagnosis": [(NS, "d")],
    "get_node": [("n1",)],
    "list_nodes": [()],
    "patch_node": [("n1", [{"op": "add", "path": "/spec/unschedulable", "value": True}])],
    "patch_node_status": [("n1", [{"type": "CollscopeFaulty", "status": "True"}])],
    "create_event": [(remediation.EVENT_NAMESPACE, remediation.event(
        {"metadata": {"name": "n1", "uid": "u1"}}, reason="CollscopeCordoned", message="m",
        warning=True, now=datetime.datetime(2026, 11, 22, tzinfo=datetime.UTC)))],
    "read_configmap": [(settings.Settings().namespace, settings.Settings().breaker_configmap)],
    "write_configmap": [(settings.Settings().namespace, settings.Settings().breaker_configmap,
                         {"state": "{}"})],
}  # fmt: skip

_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?"
    r"/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/?]+))?"
)
_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def to_call(method: str, url: str) -> Call:
    path = url.removeprefix("http://k8s").split("?")[0]
    m = _PATH.match(path)
    assert m, path
    name = m["name"]
    verb = _VERBS.get(method) or ("get" if name else ("watch" if "watch=" in url else "list"))
    resource = m["plural"] + (f"/{m['sub']}" if m["sub"] else "")
    return Call(m["group"] or "", resource, verb, name, m["ns"])


def public_coroutines(cls: type) -> set[str]:
    return {n for n, f in inspect.getmembers(cls, inspect.iscoroutinefunction)
            if not n.startswith("_")}  # fmt: skip


def test_every_adapter_method_is_exercised() -> None:
    assert public_coroutines(kube.Cluster) == set(CALLS)


def adapter_calls() -> list[Call]:
    recorder = Recorder()
    cluster = kube.Cluster(recorder)

    async def run_all() -> None:
        for method, arg_lists in CALLS.items():
            for args in arg_lists:
                # Creates answered 404 raise KubeError; only the requests matter here.
                with contextlib.suppress(errors.KubeError):
                    await getattr(cluster, method)(*args)

    asyncio.run(run_all())
    assert len(recorder.requests) >= len(CALLS)
    return [to_call(m, u) for m, u in recorder.requests]


def test_only_kube_py_talks_to_the_api_server() -> None:
    src = Path(kube.__file__).parent
    client = re.compile(r"^\s*(import|from) kubernetes\b", re.M)
    users = sorted(p.name for p in src.rglob("*.py") if client.search(p.read_text()))
    assert users == ["kube.py"]


# -- kopf: from the handler registry ---------------------------------------------------------


def kopf_calls() -> list[Call]:
    config = settings.Settings(webhook_port=9443)
    registry, _ = operator_main.build(
        config, kube.Cluster(Recorder()), jobs.template_directory(config.agents.url_template)
    )
    calls: list[Call] = []

    def add(handlers: Iterable[Any], verbs: Iterable[str], status: bool) -> None:
        for h in handlers:
            group, plural = h.selector.group or "", h.selector.plural or h.selector.any_name
            calls.extend(Call(group, plural, v) for v in verbs)
            if status:  # handler results, patch.status (kopf sends these to /status)
                calls.append(Call(group, f"{plural}/status", "patch"))

    # on.event / index: a watch stream (initial list + watch); nothing written.
    add(registry._watching.get_all_handlers(), ("list", "watch"), status=False)
    add(registry._indexing.get_all_handlers(), ("list", "watch"), status=False)
    # on.create/resume/delete, timers, daemons: watched, and patched for finalizers, progress
    # annotations and status.
    add(registry._changing.get_all_handlers(), ("list", "watch", "patch"), status=True)
    add(registry._spawning.get_all_handlers(), ("list", "watch", "patch"), status=True)
    # on.mutate is served, not called: kopf writes webhook configurations only when
    # settings.admission.managed is set, which collscope never does (the chart owns it).
    assert registry._webhooks.get_all_handlers()
    assert "admission.managed" not in Path(operator_main.__file__).read_text()
    # kopf itself: Events (kopf.info/warn and handler outcomes), cluster-wide peering, and
    # the CRD observer.
    calls += [Call("", "events", "create")]
    calls += [Call("kopf.dev", "clusterkopfpeerings", v) for v in ("list", "watch", "patch")]
    calls += [Call("apiextensions.k8s.io", "customresourcedefinitions", v)
              for v in ("list", "watch")]  # fmt: skip
    return calls


# -- the chart's rules -----------------------------------------------------------------------


class Grant(NamedTuple):
    group: str
    resource: str
    verb: str
    names: frozenset[str]
    namespace: str | None  # None: cluster-wide


def grants(chart: Any, workload: str = "Deployment") -> list[Grant]:
    docs = chart.render()
    sa = chart.find(docs, workload)["spec"]["template"]["spec"]["serviceAccountName"]
    out: list[Grant] = []
    for binding in docs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa
                   for s in binding["subjects"]):  # fmt: skip
            continue
        role = chart.find(docs, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        scope = (
            None if binding["kind"] == "ClusterRoleBinding" else binding["metadata"]["namespace"]
        )
        for rule in role["rules"]:
            if "nonResourceURLs" in rule:
                out += [Grant("", u, v, frozenset(), None) for u in rule["nonResourceURLs"]
                        for v in rule["verbs"]]  # fmt: skip
                continue
            names = frozenset(rule.get("resourceNames", ()))
            out += [Grant(g, r, v, names, scope) for g in rule["apiGroups"]
                    for r in rule["resources"] for v in rule["verbs"]]  # fmt: skip
    return out


def covers(g: Grant, c: Call) -> bool:
    if (g.group, g.resource, g.verb) != (c.group, c.resource, c.verb):
        return False
    if g.names and c.name not in g.names:
        return False
    return g.namespace is None or g.namespace == c.namespace


# -- the agents' API: what the agent asks RBAC for each request the operator makes -------------

AGENT_CALLS: dict[str, tuple[Any, ...]] = {
    "ranks": (),
    "summaries": ([1],),
    "window_lines": ([1],),
    "window": ([1],),
    "hardware": (),
    "stacks": (agent_api.StacksRequest(ranks=[1]),),
    "flightrecorder": (agent_api.FlightRecorderRequest(ranks=[1]),),
    "profile_arm": (agent_api.ProfileRequest(id="p", ranks=[1]),),
    "profile_report": ("p",),
}
AGENT_KWARGS: dict[str, dict[str, Any]] = {
    "summaries": {"window_s": 1.0},
    "window_lines": {"since_ns": 0, "until_ns": 1},
    "window": {"since_ns": 0, "until_ns": 1},
    "hardware": {"since_ns": 0, "until_ns": 1},
}


def test_every_agent_client_method_is_exercised() -> None:
    assert public_coroutines(agents.AgentClient) - {"aclose"} == set(AGENT_CALLS)


def agent_api_calls() -> list[Call]:
    seen: list[tuple[str, str]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        return httpx.Response(404, json={"error": "recorded"})

    async def run_all() -> None:
        c = agents.AgentClient("n1", "https://agent", retries=0, access=settings.AgentSettings(),
                               transport=httpx.MockTransport(answer))  # fmt: skip
        for method, args in AGENT_CALLS.items():
            with contextlib.suppress(errors.AgentError):
                await getattr(c, method)(*args, **AGENT_KWARGS.get(method, {}))
        await c.aclose()

    asyncio.run(run_all())
    assert len(seen) == len(AGENT_CALLS)
    out = []
    for method, path in seen:
        a = auth.attributes(method, path, "n1")
        assert a is not None, path
        out.append(Call(a.group, f"{a.resource}/{a.subresource}", a.verb, a.name))
    return out


def required() -> list[Call]:
    return adapter_calls() + kopf_calls() + agent_api_calls()


def test_every_call_is_allowed(chart: Any) -> None:
    have = grants(chart)
    missing = sorted({c for c in required() if not any(covers(g, c) for g in have)}, key=str)
    assert missing == []


def test_nothing_is_granted_that_no_call_needs(chart: Any) -> None:
    calls = required()
    unused = sorted({g for g in grants(chart) if not any(covers(g, c) for c in calls)}, key=str)
    assert unused == []


def test_no_wildcards_and_no_secrets(chart: Any) -> None:
    for g in grants(chart):
        assert "*" not in (g.group, g.resource, g.verb)
        assert g.resource != "secrets"


def test_the_breaker_configmap_is_namespaced(chart: Any) -> None:
    for g in grants(chart):
        if g.resource == "configmaps":
            assert g.namespace == chart.namespace


def test_recorder_sees_what_the_adapter_sends() -> None:
    calls = set(adapter_calls())
    assert Call("", "nodes", "patch", "n1") in calls
    # Remediation says it where Kubernetes tools look: a Node condition and Events on it.
    assert Call("", "nodes/status", "patch", "n1") in calls
    assert Call("", "events", "create", None, "default") in calls
    assert Call("collscope.dev", "diagnoses/status", "patch", "d", NS) in calls
    assert Call("", "configmaps", "patch", "collscope-breaker", "collscope-system") in calls


def reviewer_calls() -> list[Call]:
    """The requests ``auth.KubeReviewer`` makes: one TokenReview, one SAR, one pod list."""
    seen: list[tuple[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append((request.method, request.path_qs))
        answer = {"status": {"authenticated": True, "allowed": True}, "items": []}
        return web.json_response(answer, status=201 if request.method == "POST" else 200)

    async def run() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", record)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        r = auth.KubeReviewer(f"http://127.0.0.1:{port}", lambda: "agent-token")
        user = await r.authenticate("t")
        assert user is not None
        await r.authorize(user, auth.Attributes(verb="get", path="/metrics"))
        assert await r.node_pods("n1") == {}
        await r.aclose()
        await runner.cleanup()

    assert public_coroutines(auth.KubeReviewer) - {"aclose"} == {
        "authenticate",
        "authorize",
        "node_pods",
    }
    asyncio.run(run())
    return [to_call(m, "http://k8s" + p) for m, p in seen]


def test_the_agent_may_only_review_tokens_and_list_pods(chart: Any) -> None:
    calls = set(reviewer_calls())
    assert calls == {Call("authentication.k8s.io", "tokenreviews", "create"),
                     Call("authorization.k8s.io", "subjectaccessreviews", "create"),
                     Call("", "pods", "list")}  # fmt: skip
    have = grants(chart, "DaemonSet")
    assert {(g.group, g.resource, g.verb, g.names, g.namespace) for g in have} == {
        (c.group, c.resource, c.verb, frozenset(), None) for c in calls
    }
    ds = chart.find(chart.render(), "DaemonSet")
    assert ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is True


def test_without_agent_auth_the_agent_has_no_token_and_no_rules(chart: Any) -> None:
    docs = chart.render({"agent": {"auth": {"enabled": False}}})
    ds = chart.find(docs, "DaemonSet")
    sa = ds["spec"]["template"]["spec"]["serviceAccountName"]
    assert ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    bound = [b for b in docs if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and any(s["name"] == sa for s in b["subjects"])]  # fmt: skip
    assert bound == []


def test_a_metrics_reader_role_for_prometheus(chart: Any) -> None:
    role = chart.find(chart.render(), "ClusterRole", "collscope-agent-metrics-reader")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert auth.attributes("GET", "/metrics", "n1") == auth.Attributes(verb="get", path="/metrics")


def test_a_job_owner_role_to_bind_per_namespace(chart: Any) -> None:
    """Bound by a RoleBinding in a job's namespace, it opens that namespace's pods only
    (tests/unit/nodeagent/test_tenancy.py); the chart binds it to nobody."""
    docs = chart.render()
    role = chart.find(docs, "ClusterRole", "collscope-agent-job-owner")
    got = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert got == {("agents/data", "get"), ("agents/stacks", "create"),
                   ("agents/flightrecorder", "create")}  # fmt: skip
    for sub, verb in (("data", "get"), ("stacks", "create"), ("flightrecorder", "create")):
        a = auth.Attributes(verb=verb, group=auth.GROUP, resource=auth.RESOURCE, subresource=sub)
        assert (f"{a.resource}/{a.subresource}", a.verb) in got
    bound = [b for b in docs if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and b["roleRef"]["name"] == "collscope-agent-job-owner"]  # fmt: skip
    assert bound == []
