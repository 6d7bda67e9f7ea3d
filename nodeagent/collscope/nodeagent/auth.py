"""Who may call the agent: the caller's ServiceAccount token, reviewed by the API server.

This is kube-rbac-proxy's model. The caller sends ``Authorization: Bearer <token>``. A
``TokenReview`` (authentication.k8s.io/v1) says who the token belongs to, and a
``SubjectAccessReview`` (authorization.k8s.io/v1) asks whether that user may do what the route
does. RBAC decides, so ``kubectl auth can-i`` explains any answer. Both answers are cached for a
short time (``Cache``). ``/livez`` and ``/readyz`` are open.

What each route asks for (``attributes``). Everything is a virtual subresource of
``collscope.dev/agents``, and the name is the node. These resources do not exist in the API:
RBAC authorizes them all the same, and no other rights are implied (``nodes/proxy`` would also
open the kubelet's exec and logs)::

    GET  /v1/ranks /v1/summaries /v1/window /v1/hardware /v1/export
                                  get    collscope.dev agents/data            name=<node>
    POST /v1/stacks               create collscope.dev agents/stacks          name=<node>
    POST /v1/flightrecorder       create collscope.dev agents/flightrecorder  name=<node>
    POST /v1/profile              create collscope.dev agents/profile         name=<node>
    GET  /v1/profile              get    collscope.dev agents/profile         name=<node>
    GET  /metrics                 get    non-resource /metrics (kube-rbac-proxy's convention,
                                         so Prometheus' usual ClusterRole covers it)

Audiences: with ``audiences`` set (``COLLSCOPE_AUTH_AUDIENCES``; the chart's
``agent.auth.audience``), a token is accepted only if it was issued for one of them: the
operator presents a projected token for that audience, which the API server itself refuses,
so an agent that sees it cannot replay it elsewhere, and a pod's ordinary token stolen
elsewhere is refused here. ``/metrics`` alone takes the API server's own audience (Prometheus
scrapes with its ordinary token; ``KubeReviewer.for_audiences``).

These rights are node-wide. A caller refused them (a job owner) may still be allowed for its
own namespace's pods: a request that names workloads is asked again with ``namespace`` set to
the namespace of each of their pods, as the API server has it (``tenancy.py``, ``server.py``),
so a RoleBinding in that namespace grants it there only.

``KubeReviewer`` makes the calls over aiohttp with the agent's own ServiceAccount (its token
re-read when the kubelet rotates it): the two reviews, and ``node_pods`` (``tenancy.PodLister``:
list pods on this node). Tests pass a fake of the ``Reviewer`` protocol.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

import aiohttp

from collscope.nodeagent import errors, tenancy

GROUP: Final = "collscope.dev"
RESOURCE: Final = "agents"
# (method, path) -> (verb, subresource); routes missing here need a token but no SAR (404).
ROUTES: Final[Mapping[tuple[str, str], tuple[str, str]]] = {
    ("GET", "/v1/ranks"): ("get", "data"),
    ("GET", "/v1/summaries"): ("get", "data"),
    ("GET", "/v1/window"): ("get", "data"),
    ("GET", "/v1/hardware"): ("get", "data"),
    ("GET", "/v1/export"): ("get", "data"),
    ("POST", "/v1/stacks"): ("create", "stacks"),
    ("POST", "/v1/flightrecorder"): ("create", "flightrecorder"),
    ("POST", "/v1/profile"): ("create", "profile"),
    ("GET", "/v1/profile"): ("get", "profile"),
}
OPEN: Final = frozenset({"/livez", "/readyz"})
NON_RESOURCE: Final = frozenset({"/metrics"})
# A cache bigger than this is not the few callers of a node agent but someone trying many
# tokens: the oldest entries go.
MAX_CACHE_ENTRIES: Final = 4096
# Pod lists in metadata only (name, namespace, uid: no specs), JSON if the server cannot.
PARTIAL_METADATA: Final = (
    "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io, application/json;q=0.9"
)


@dataclasses.dataclass(frozen=True, slots=True)
class User:
    """A TokenReview's ``status.user``."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Attributes:
    """What a request does, as a SubjectAccessReview asks it. With ``path`` set, it is a
    non-resource URL and the resource fields are ignored."""

    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    namespace: str = ""
    path: str = ""

    def spec(self) -> dict[str, Any]:
        """The ``resourceAttributes`` or ``nonResourceAttributes`` of a SAR spec."""
        if self.path:
            return {"nonResourceAttributes": {"path": self.path, "verb": self.verb}}
        attrs = {
            "verb": self.verb,
            "group": self.group,
            "resource": self.resource,
            "subresource": self.subresource,
            "name": self.name,
            "namespace": self.namespace,
        }
        return {"resourceAttributes": {k: v for k, v in attrs.items() if v}}


def attributes(method: str, path: str, node: str) -> Attributes | None:
    """What ``method path`` on the agent of ``node`` needs; None for open or unknown routes."""
    if path in NON_RESOURCE and method == "GET":
        return Attributes(verb="get", path=path)
    route = ROUTES.get((method, path))
    if route is None:
        return None
    verb, sub = route
    return Attributes(verb=verb, group=GROUP, resource=RESOURCE, subresource=sub, name=node)


class Reviewer(Protocol):
    """Authentication and authorization of a bearer token (``KubeReviewer``; fakes in tests).

    Both raise ``errors.ReviewUnavailable`` when no answer could be had. That is not a "no":
    the caller gets 503 and retries.
    """

    async def authenticate(self, token: str) -> User | None: ...
    async def authorize(self, user: User, attrs: Attributes) -> bool: ...


class TokenFile:
    """A token file that the kubelet rewrites on rotation. It is read again when its mtime or
    inode changes (a stat per call: microseconds)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._token = ""

    def __call__(self) -> str:
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_mtime_ns)
            if key != self._seen:
                with open(self.path, encoding="ascii") as f:
                    self._token = f.read().strip()
                self._seen = key
        except (OSError, UnicodeDecodeError) as e:
            raise errors.ReviewUnavailable(f"the agent's own token {self.path}: {e}") from e
        return self._token


class KubeReviewer:
    """TokenReview and SubjectAccessReview against ``api_server`` (``https://host:port``).

    ``token`` gives the agent's own bearer token (its ServiceAccount needs ``create`` on
    ``tokenreviews`` and ``subjectaccessreviews``). ``ssl_context`` verifies the API server
    (the ServiceAccount's ``ca.crt``); None uses the system's CAs. ``audiences``: the audiences
    a token must carry (empty: the API server's own).
    """

    def __init__(
        self,
        api_server: str,
        token: Callable[[], str],
        *,
        ssl_context: ssl.SSLContext | None = None,
        audiences: tuple[str, ...] = (),
        timeout_s: float = 5.0,
    ) -> None:
        self.api_server = api_server.rstrip("/")
        self._token = token
        self._ssl = ssl_context
        self._audiences = audiences
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def authenticate(self, token: str) -> User | None:
        spec: dict[str, Any] = {"token": token}
        if self._audiences:
            spec["audiences"] = list(self._audiences)
        status = await self._review("authentication.k8s.io", "tokenreviews", "TokenReview", spec)
        if not status.get("authenticated"):
            return None
        u = status.get("user") or {}
        extra = u.get("extra") or {}
        return User(
            name=str(u.get("username", "")),
            uid=str(u.get("uid", "")),
            groups=tuple(str(g) for g in u.get("groups") or ()),
            extra=tuple(sorted((str(k), tuple(str(x) for x in v)) for k, v in extra.items())),
        )

    async def authorize(self, user: User, attrs: Attributes) -> bool:
        spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups), **attrs.spec()}
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        status = await self._review(
            "authorization.k8s.io", "subjectaccessreviews", "SubjectAccessReview", spec
        )
        return status.get("allowed") is True

    def for_audiences(self, audiences: tuple[str, ...]) -> KubeReviewer:
        """The same reviewer (API server, own token, TLS) accepting tokens of ``audiences``
        instead: ``server.Server`` reviews Prometheus' ordinary token for ``/metrics`` so."""
        return KubeReviewer(self.api_server, self._token, ssl_context=self._ssl,
                            audiences=audiences, timeout_s=self._timeout.total or 5.0)  # fmt: skip

    async def node_pods(self, node: str) -> dict[str, tenancy.PodRef]:
        """uid -> namespace/name of the pods bound to ``node`` (``GET /api/v1/pods`` with
        ``fieldSelector=spec.nodeName=<node>``, metadata only); needs ``list`` on pods."""
        url = f"{self.api_server}/api/v1/pods"
        params = {"fieldSelector": f"spec.nodeName={node}"}
        answer = await self._call("GET", url, "pod list", params=params, accept=PARTIAL_METADATA)
        items = answer.get("items") if isinstance(answer, dict) else None
        out: dict[str, tenancy.PodRef] = {}
        for item in items if isinstance(items, list) else ():
            meta = item.get("metadata") if isinstance(item, dict) else None
            if isinstance(meta, dict) and meta.get("uid") and meta.get("namespace"):
                ref = tenancy.PodRef(str(meta["namespace"]), str(meta.get("name", "")))
                out[str(meta["uid"])] = ref
        return out

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _review(self, group: str, plural: str, kind: str, spec: dict[str, Any]) -> Any:
        url = f"{self.api_server}/apis/{group}/v1/{plural}"
        body = {"apiVersion": f"{group}/v1", "kind": kind, "spec": spec}
        answer = await self._call("POST", url, kind, json=body)
        status = answer.get("status") if isinstance(answer, dict) else None
        return status if isinstance(status, dict) else {}

    async def _call(
        self,
        method: str,
        url: str,
        what: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        accept: str = "application/json",
    ) -> Any:
        headers = {"Authorization": f"Bearer {self._token()}", "Accept": accept}
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.request(
                method,
                url,
                json=json,
                params=params,
                headers=headers,
                ssl=self._ssl if self._ssl is not None else True,
            ) as resp:
                if resp.status not in (200, 201):
                    text = (await resp.text())[:200]
                    raise errors.ReviewUnavailable(f"{what}: HTTP {resp.status}: {text}")
                return await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise errors.ReviewUnavailable(f"{what} at {url}: {type(e).__name__}: {e}") from e


class Cache:
    """``reviewer``'s answers kept for a while: ``ttl_s`` for a user or an allow, ``denied_ttl_s``
    for a refusal (a binding just added is seen soon). A revoked binding or a deleted
    ServiceAccount takes effect within ``ttl_s``.

    Concurrent reviews of the same question share one call to the API server. Errors
    (``ReviewUnavailable``) are not kept.
    """

    def __init__(
        self,
        reviewer: Reviewer,
        *,
        ttl_s: float,
        denied_ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = MAX_CACHE_ENTRIES,
    ) -> None:
        self.reviewer = reviewer
        self._ttl_s, self._denied_ttl_s = ttl_s, denied_ttl_s
        self._clock = clock
        self._max = max_entries
        self._entries: OrderedDict[object, tuple[float, asyncio.Future[Any]]] = OrderedDict()

    async def authenticate(self, token: str) -> User | None:
        key = ("token", hashlib.sha256(token.encode()).hexdigest())  # never the token itself
        user: User | None = await self._cached(key, lambda: self.reviewer.authenticate(token))
        return user

    async def authorize(self, user: User, attrs: Attributes) -> bool:
        allowed: bool = await self._cached(
            ("sar", user, attrs), lambda: self.reviewer.authorize(user, attrs)
        )
        return allowed

    async def _cached(self, key: object, call: Callable[[], Awaitable[Any]]) -> Any:
        now = self._clock()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            return await asyncio.shield(hit[1])
        fut: asyncio.Future[Any] = asyncio.ensure_future(call())
        self._entries[key] = (now + self._ttl_s, fut)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
        try:
            result = await asyncio.shield(fut)
        except BaseException:
            if self._entries.get(key, (0.0, None))[1] is fut:
                del self._entries[key]
            raise
        if not result:  # unauthenticated or denied: kept for less time
            self._entries[key] = (now + self._denied_ttl_s, fut)
        return result


class RateLimit:
    """A token bucket per caller: ``burst`` at once, then ``per_minute``. ``take(key)`` answers 0
    when allowed, else the seconds to wait."""

    def __init__(
        self, *, burst: int, per_minute: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._burst, self._rate = float(burst), per_minute / 60.0
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, key: str) -> float:
        now = self._clock()
        level, then = self._buckets.get(key, (self._burst, now))
        level = min(self._burst, level + (now - then) * self._rate)
        if level < 1.0:
            self._buckets[key] = (level, now)
            return (1.0 - level) / self._rate if self._rate > 0 else float("inf")
        self._buckets[key] = (level - 1.0, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > MAX_CACHE_ENTRIES:
            self._buckets.popitem(last=False)
        return 0.0


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None when absent or malformed."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
        return None
    return token


def in_cluster(
    api_server: str, token_file: str, ca_file: str, audiences: tuple[str, ...]
) -> KubeReviewer:
    """The reviewer of a pod with its ServiceAccount mounted; ``SettingsError`` names what
    is missing."""
    if not api_server:
        raise errors.SettingsError(
            "COLLSCOPE_API_SERVER", "", "no API server (KUBERNETES_SERVICE_HOST unset)"
        )
    if not os.path.isfile(token_file):
        raise errors.SettingsError(
            "COLLSCOPE_AUTH_TOKEN_FILE", token_file, "no ServiceAccount token there"
        )
    ctx = None
    if ca_file:
        try:
            ctx = ssl.create_default_context(cafile=ca_file)
        except OSError as e:
            raise errors.SettingsError("COLLSCOPE_AUTH_CA_FILE", ca_file, str(e)) from e
    return KubeReviewer(api_server, TokenFile(token_file), ssl_context=ctx, audiences=audiences)
