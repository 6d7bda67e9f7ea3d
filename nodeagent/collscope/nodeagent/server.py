"""The agent's HTTP server: aiohttp on its own event loop thread, over ``service.Service``.

Routes and models: ``api.py``; who may call what: ``auth.py``. Query parameters are parsed
here. A bad one answers 400 with ``api.ErrorResponse`` naming it (``errors.QueryError``). A
missing capability answers 503 (``errors.UnavailableError``), an unknown path 404. A request
without a valid token answers 401, one that RBAC does not allow 403, and one over the per-caller
rate of py-spy and Flight Recorder requests 429; all of them carry an ``ErrorResponse``. A caller
refused node-wide is asked again per namespace when its request names workloads (a job owner:
``_scoped``, ``tenancy.py``).
``/v1/window`` streams bundle-v1 lines as they are formatted (``application/x-ndjson``, chunked,
no Content-Length). A request whose ``Accept`` names ``bundle.columnar.MEDIA_TYPE`` (with
q > 0) gets the same records in that columnar form instead, with a Content-Length (the operator
asks for it; old operators do not). Example::

    T=$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)
    curl --cacert ca.crt --connect-to agent.svc:9464:NODE:9464 -H "Authorization: Bearer $T" \
        'https://agent.svc:9464/v1/summaries?ranks=0,1&window_s=5'
    curl 'http://NODE:9464/v1/window?ranks=3&since=1732001234000000000' > rank3.jsonl  # --auth none
    curl -H 'Accept: application/vnd.collscope.columns.v1' 'http://NODE:9464/v1/window?ranks=3'
    curl -o node.tar.gz 'http://NODE:9464/v1/export?since=1732001234000000000'

What bounds it (``settings.ServerSettings``): a connection cap, total and per peer address (503
and close); a real listen backlog; an idle timeout that also closes a connection whose request
headers do not arrive (aiohttp's keep-alive timer runs from the connection's start); limits on
header fields, header count and body size; a body timeout (a Content-Length larger than the
body holds nothing); a send timeout per write; a TLS handshake timeout. The event loop never
blocks: the service's methods run in two thread pools, one for quick reads and one for slow
work (py-spy, Flight Recorder, export). That way a slow request never delays the operator's
pulls.

Why one module: it is the agent's whole HTTP surface, what a hostile caller meets: the routes
with their query parsing and refusals (``Server``), and the transport guards beneath them
(``Connections``, ``Guarded``, ``Certificate``), which the routes' answers depend on (a refusal
before the body closes the connection). The guards are the part that would move out first,
into a transport module, if either side grows.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import http
import logging
import math
import os
import re
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final, TypeVar

import pydantic
from aiohttp import web

from collscope.nodeagent import (
    api,
    auth,
    errors,
    metrics,
    profiling,
    service,
    settings,
    tenancy,
)
from collscope.nodeagent.bundle import columnar

log = logging.getLogger(__name__)
_M = TypeVar("_M", bound=pydantic.BaseModel)
_T = TypeVar("_T")

NDJSON: Final = "application/x-ndjson"
# One write of the streamed window: big enough that the executor round trip is negligible,
# small enough that a slow client holds little of it.
STREAM_CHUNK_BYTES: Final = 256 << 10
_REFUSED: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: 34\r\n\r\n"
    b'{"error":"too many connections"}\r\n'
)

Query = dict[str, list[str]]
_WORKLOAD: Final = re.compile(r"[0-9A-Za-z-]{1,64}")  # a pod uid, or discovery's dir-<hex>


class Refusal(Exception):  # noqa: N818 - an answer, not an error: never leaves this module
    """A request answered with ``status`` and an ``ErrorResponse`` (401, 403, 408, 413, 429)."""

    def __init__(self, status: int, message: str, *, close: bool = False, **headers: str) -> None:
        super().__init__(message)
        self.status, self.headers, self.close = status, headers, close


class Server:
    """Serves ``svc`` on ``config.server``'s address from a background thread; port 0 picks a
    free one. ``reviewer``: who authenticates and authorizes callers when
    ``config.auth.mode`` is ``kubernetes`` (None: the in-cluster ``auth.KubeReviewer``)."""

    def __init__(
        self,
        svc: service.Service,
        config: settings.Settings,
        *,
        reviewer: auth.Reviewer | None = None,
        live_max_age_s: float = 5.0,
    ) -> None:
        self.svc = svc
        self.config = config
        self.limits = config.server
        self.live_max_age_s = live_max_age_s
        self.registry = metrics.make_registry(svc)
        a = config.auth
        if a.mode == "kubernetes" and reviewer is None:
            reviewer = auth.in_cluster(a.api_server, a.token_file, a.ca_file, a.audiences)
        self.reviewer: auth.Cache | None = (
            None
            if a.mode == "none" or reviewer is None
            else auth.Cache(reviewer, ttl_s=a.cache_ttl_s, denied_ttl_s=a.denied_ttl_s)
        )
        # /metrics: Prometheus' ordinary token, of the API server's audience (auth.py).
        self.metrics_reviewer = self.reviewer
        if self.reviewer is not None and isinstance(reviewer, auth.KubeReviewer) and a.audiences:
            plain = reviewer.for_audiences(())
            self.metrics_reviewer = auth.Cache(
                plain, ttl_s=a.cache_ttl_s, denied_ttl_s=a.denied_ttl_s
            )
        # Job owners' namespaced access needs the pods' namespaces from the API server.
        self.pods = (
            tenancy.Pods(reviewer, svc.node)
            if self.reviewer is not None and isinstance(reviewer, tenancy.PodLister)
            else None
        )
        self.rate = auth.RateLimit(burst=a.expensive_burst, per_minute=a.expensive_per_minute)
        self.tls = Certificate(config.tls) if config.tls.cert_file else None
        # Bound now, so that the address is known (and a port in use fails) before start().
        self._sock = socket.create_server(
            (config.server.listen_host, config.server.listen_port),
            family=socket.AF_INET6 if ":" in config.server.listen_host else socket.AF_INET,
            backlog=config.server.backlog,
        )
        self._quick = concurrent.futures.ThreadPoolExecutor(
            config.server.quick_workers, thread_name_prefix="collscope-http-quick"
        )
        self._slow = concurrent.futures.ThreadPoolExecutor(
            config.server.slow_workers, thread_name_prefix="collscope-http-slow"
        )
        self._conns = Connections(config.server)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="collscope-http", daemon=True)
        self._thread.start()
        self._ready.wait(10.0)
        if self._failed is not None:
            raise self._failed

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        self._quick.shutdown(wait=False, cancel_futures=True)
        self._slow.shutdown(wait=False, cancel_futures=True)
        self._sock.close()

    # -- event loop -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported to start(), or logged when it died later
            self._failed = e
            log.exception("the HTTP server stopped")
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        lim = self.limits
        app = web.Application(client_max_size=lim.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            keepalive_timeout=lim.idle_timeout_s,
            max_line_size=lim.max_field_bytes,
            max_field_size=lim.max_field_bytes,
            max_headers=lim.max_headers,
            # Lingering reads the rest of a refused body; a hostile one gets none of our time.
            lingering_time=0,
        )
        await runner.setup()
        assert runner.server is not None
        factory = functools.partial(Guarded, runner.server, self._conns)
        tls = self.tls
        srv = await self._loop.create_server(
            factory,
            sock=self._sock,
            backlog=lim.backlog,
            ssl=tls.context if tls else None,
            ssl_handshake_timeout=self.config.tls.handshake_timeout_s if tls else None,
        )
        reload = asyncio.create_task(self._reload_certificate()) if tls else None
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            if reload is not None:
                reload.cancel()
            srv.close()
            await runner.cleanup()
            for cache in {id(c): c for c in (self.reviewer, self.metrics_reviewer) if c}.values():
                if hasattr(cache.reviewer, "aclose"):
                    await cache.reviewer.aclose()

    async def _reload_certificate(self) -> None:
        assert self.tls is not None
        while True:
            await asyncio.sleep(self.config.tls.reload_interval_s)
            self.tls.reload()

    async def _run_in(self, pool: concurrent.futures.Executor, fn: Callable[[], _T]) -> _T:
        assert self._loop is not None
        return await self._loop.run_in_executor(pool, fn)

    # -- dispatch -------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method, path = request.method, request.rel_url.path
        try:
            caller = await self._authorize(request, method, path)
            route = _ROUTES.get((method, path))
            if route is None:
                known = {p for m, p in _ROUTES if m != method and p == path}
                code = http.HTTPStatus.METHOD_NOT_ALLOWED if known else http.HTTPStatus.NOT_FOUND
                err = api.ErrorResponse(error=f"{method} {path}: {code.phrase}")
                return await self._json(request, code, err)
            query = urllib.parse.parse_qs(request.rel_url.raw_query_string, keep_blank_values=True)
            return await route(self, request, query, caller)
        except Refusal as e:
            err = api.ErrorResponse(error=str(e), parameter="body" if e.status == 413 else None)
            return await self._json(request, e.status, err, close=e.close, **e.headers)
        except errors.QueryError as e:
            err = api.ErrorResponse(error=str(e), parameter=e.parameter)
            return await self._json(request, 400, err)
        except errors.ReviewUnavailable as e:
            log.warning("%s %s from %s: %s", method, path, request.remote, e)
            err = api.ErrorResponse(error=f"authorization unavailable: {e}")
            return await self._json(request, 503, err)
        except errors.UnavailableError as e:
            return await self._json(request, 503, api.ErrorResponse(error=str(e)))
        except (ConnectionError, asyncio.CancelledError):
            raise  # the client went away
        except Exception as e:
            log.exception("%s %s failed", method, path)
            err = api.ErrorResponse(error=f"internal error: {type(e).__name__}: {e}")
            return await self._json(request, 500, err)

    async def _authorize(self, request: web.Request, method: str, path: str) -> str:
        """The caller's name for logs and rate limits; ``Refusal`` 401/403 when it may not."""
        if path in auth.OPEN or self.reviewer is None:
            return f"anonymous@{request.remote}"
        token = auth.bearer(request.headers.get("Authorization"))
        challenge = 'Bearer realm="collscope-agent"'
        if token is None:
            msg = "a bearer token is required (Authorization: Bearer)"
            raise Refusal(401, msg, WWW_Authenticate=challenge)
        cache = self.metrics_reviewer if path in auth.NON_RESOURCE else self.reviewer
        assert cache is not None
        user = await cache.authenticate(token)
        if user is None:
            msg = "the token was not accepted (TokenReview)"
            raise Refusal(401, msg, WWW_Authenticate=challenge)
        attrs = auth.attributes(method, path, self.svc.node)
        if attrs is None or await cache.authorize(user, attrs):
            return user.name
        scope = await self._scoped(request, user, attrs)
        if scope is not None:
            log.info("%s %s from %s: %s allowed in %s", method, path, request.remote, user.name,
                     scope)  # fmt: skip
            return user.name
        log.info("%s %s from %s: %s is not allowed", method, path, request.remote, user.name)
        what = attrs.path or f"{attrs.resource}/{attrs.subresource} {attrs.name}"
        raise Refusal(403, f"{user.name} may not {attrs.verb} {what} ({attrs.group or 'url'})")

    async def _scoped(
        self, request: web.Request, user: auth.User, attrs: auth.Attributes
    ) -> str | None:
        """A caller refused node-wide, allowed for the workloads its request names: RBAC allows
        ``attrs`` in the namespace of each one's pod, as the API server places it (never the
        ring header's). None when the request names none (node-wide is needed then);
        ``Refusal`` 403 when one has no pod here, is in a namespace not allowed, or the request
        also names raw pids (they may be any process of the node)."""
        if self.pods is None or self.reviewer is None or attrs.path:
            return None
        if request.method == "GET":
            q = urllib.parse.parse_qs(request.rel_url.raw_query_string, keep_blank_values=True)
            workloads, pids = _workloads(q), None
        else:
            named = await self._body(request, _Named)
            workloads, pids = named.workloads, named.pids
        if not workloads:
            return None
        if pids:
            raise Refusal(403, f"{user.name}: raw pids need {attrs.subresource} on the whole node")
        pods = await self.pods.lookup(workloads)
        unknown = sorted(w for w, pod in pods.items() if pod is None)
        if unknown:
            msg = f"workloads {', '.join(unknown)[:300]}: no pod of node {self.svc.node}"
            raise Refusal(403, msg)
        namespaces = sorted({pod.namespace for pod in pods.values() if pod is not None})
        for ns in namespaces:
            if not await self.reviewer.authorize(user, dataclasses.replace(attrs, namespace=ns)):
                what = f"{attrs.resource}/{attrs.subresource} {attrs.name}"
                raise Refusal(403, f"{user.name} may not {attrs.verb} {what} in namespace {ns}")
        return "namespace " + ", ".join(namespaces)

    def _limit(self, caller: str) -> None:
        wait_s = self.rate.take(caller)
        if wait_s > 0:
            retry = str(math.ceil(wait_s)) if math.isfinite(wait_s) else "3600"
            what = f"{caller}: too many stacks/Flight Recorder requests"
            raise Refusal(429, what, Retry_After=retry)

    # -- responses ------------------------------------------------------------------------
    async def _json(
        self,
        request: web.Request,
        status: int,
        model: pydantic.BaseModel,
        *,
        close: bool = False,
        **headers: str,
    ) -> web.StreamResponse:
        body = model.model_dump_json().encode()
        return await self._bytes(request, status, body, "application/json", close=close, **headers)

    async def _bytes(
        self,
        request: web.Request,
        status: int,
        body: bytes,
        ctype: str,
        *,
        close: bool = False,
        **headers: str,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=status)
        # Not reused when the connection is in an unknown state (a body cut short), or when the
        # request's body was never read (a refusal answered before it): the server may close
        # the connection rather than drain that body, and a client that reused it would see
        # its next request go unanswered ("Server disconnected").
        if close or (request.body_exists and not request.content.is_eof()):
            resp.force_close()
        resp.headers["Content-Type"] = ctype
        for k, v in headers.items():
            resp.headers[k.replace("_", "-")] = v
        resp.content_length = len(body)
        await self._send(request, resp, body)
        return resp

    async def _send(self, request: web.Request, resp: web.StreamResponse, *chunks: bytes) -> None:
        try:
            async with asyncio.timeout(self.limits.send_timeout_s):
                if not resp.prepared:
                    await resp.prepare(request)
                for chunk in chunks:
                    await resp.write(chunk)
        except TimeoutError:
            log.info("%s %s: client not reading, dropped", request.method, request.path)
            resp.force_close()
            if request.transport is not None:
                request.transport.close()
            raise ConnectionResetError("send timeout") from None

    async def _body(self, request: web.Request, model: type[_M]) -> _M:
        n = request.content_length
        if n is not None and n > self.limits.max_body_bytes:
            raise Refusal(413, f"body of {n} bytes, at most {self.limits.max_body_bytes}")
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                raw = await request.read()
        except TimeoutError:
            limit = self.limits.body_timeout_s
            msg = f"the body did not arrive within {limit:g} s"
            raise Refusal(408, msg, close=True) from None
        except web.HTTPRequestEntityTooLarge as e:
            raise Refusal(413, f"body above {self.limits.max_body_bytes} bytes") from e
        try:
            return model.model_validate_json(raw or b"{}")
        except pydantic.ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise errors.QueryError(where, first["msg"]) from e

    # -- routes ---------------------------------------------------------------------------
    async def ranks(self, request: web.Request, q: Query, caller: str) -> web.StreamResponse:
        _no_params(q)
        return await self._json(request, 200, await self._run_in(self._quick, self.svc.ranks))

    async def summaries(self, request: web.Request, q: Query, caller: str) -> web.StreamResponse:
        _no_params(q, "ranks", "window_s", "workloads")
        window_s = _float(q, "window_s", 5.0)
        if window_s > self.svc.window.window_ns / 1e9:
            raise errors.QueryError("window_s", "longer than the agent's window")
        fn = functools.partial(self.svc.summaries, _ranks(q), window_s, _workloads(q))
        return await self._json(request, 200, await self._run_in(self._quick, fn))

    async def window(self, request: web.Request, q: Query, caller: str) -> web.StreamResponse:
        _no_params(q, "ranks", "since", "until", "workloads")
        since, until = _range(q)
        ranks, workloads = _ranks(q), _workloads(q)
        if accepts(request.headers.getall("Accept", []), columnar.MEDIA_TYPE):
            fn = functools.partial(self.svc.window_columns, ranks, since, until, workloads)
            body = await self._run_in(self._quick, fn)
            return await self._bytes(request, 200, body, columnar.MEDIA_TYPE)
        lines = functools.partial(self.svc.window_lines, ranks, since, until, workloads)
        blocks = iter(await self._run_in(self._quick, lines))
        resp = web.StreamResponse(status=200)
        resp.headers["Content-Type"] = NDJSON
        await self._send(request, resp)
        while chunk := await self._run_in(self._quick, functools.partial(_take, blocks)):
            await self._send(request, resp, chunk)
        await resp.write_eof()
        return resp

    async def hardware(self, request: web.Request, q: Query, caller: str) -> web.StreamResponse:
        _no_params(q, "since", "until")
        fn = functools.partial(self.svc.hardware_samples, *_range(q))
        return await self._json(request, 200, await self._run_in(self._quick, fn))

    async def export(self, request: web.Request, q: Query, caller: str) -> web.StreamResponse:
        _no_params(q, "since", "until", "workloads")
        fn = functools.partial(self.svc.export, *_range(q), _workloads(q))
        body = await self._run_in(self._slow, fn)
        name = f"collscope-{self.svc.node}.tar.gz"
        disposition = f'attachment; filename="{name}"'
        return await self._bytes(
            request, 200, body, "application/gzip", Content_Disposition=disposition
        )

    async def stacks(self, request: web.Request, q: Query, caller: str) -> web.StreamResponse:
        _no_params(q)
        req = await self._body(request, api.StacksRequest)
        self._limit(caller)
        peer = request.remote
        log.info("stacks for %s from %s: ranks=%s pids=%s", caller, peer, req.ranks, req.pids)
        report = await self._run_in(self._slow, functools.partial(self.svc.stacks, req))
        return await self._json(request, 200, report)

    async def flightrecorder(
        self, request: web.Request, q: Query, caller: str
    ) -> web.StreamResponse:
        _no_params(q)
        req = await self._body(request, api.FlightRecorderRequest)
        self._limit(caller)
        log.info("Flight Recorder for %s from %s: ranks=%s raw=%s", caller, request.remote,
                 req.ranks, req.raw)  # fmt: skip
        report = await self._run_in(self._slow, functools.partial(self.svc.flightrecorder, req))
        return await self._json(request, 200, report)

    async def profile_arm(self, request: web.Request, q: Query, caller: str) -> web.StreamResponse:
        _no_params(q)
        req = await self._body(request, api.ProfileRequest)
        self._limit(caller)
        log.info("profile %s for %s from %s: ranks=%s window_s=%g", req.id, caller,
                 request.remote, req.ranks, req.window_s)  # fmt: skip
        fn = functools.partial(profiling.arm, self.svc, req)
        return await self._json(request, 200, await self._run_in(self._quick, fn))

    async def profile_report(
        self, request: web.Request, q: Query, caller: str
    ) -> web.StreamResponse:
        _no_params(q, "id")
        req_id = _one(q, "id")
        if not req_id:
            raise errors.QueryError("id", "the profile request's id is required")
        fn = functools.partial(profiling.report, self.svc, req_id)
        return await self._json(request, 200, await self._run_in(self._slow, fn))

    async def metrics(self, request: web.Request, q: Query, caller: str) -> web.StreamResponse:
        fn = functools.partial(metrics.render, self.registry)
        body, ctype = await self._run_in(self._quick, fn)
        return await self._bytes(request, 200, body, ctype)

    async def livez(self, request: web.Request, q: Query, caller: str) -> web.StreamResponse:
        # Inline (a few attribute reads): a full thread pool must not fail the kubelet's probe.
        h = self.svc.livez(self.live_max_age_s)
        return await self._json(request, 200 if h.status == "ok" else 503, h)

    readyz = livez  # ready = sampling: the agent needs no API server to serve its node


class _Named(pydantic.BaseModel):
    """What a POST body names, read for a namespaced caller before its route parses it all."""

    model_config = pydantic.ConfigDict(extra="ignore")
    workloads: list[str] | None = None
    pids: list[int] | None = None


Route = Callable[[Server, web.Request, Query, str], Awaitable[web.StreamResponse]]
_ROUTES: dict[tuple[str, str], Route] = {
    ("GET", "/v1/ranks"): Server.ranks,
    ("GET", "/v1/summaries"): Server.summaries,
    ("GET", "/v1/window"): Server.window,
    ("GET", "/v1/hardware"): Server.hardware,
    ("GET", "/v1/export"): Server.export,
    ("POST", "/v1/stacks"): Server.stacks,
    ("POST", "/v1/flightrecorder"): Server.flightrecorder,
    ("POST", "/v1/profile"): Server.profile_arm,
    ("GET", "/v1/profile"): Server.profile_report,
    ("GET", "/metrics"): Server.metrics,
    ("GET", "/livez"): Server.livez,
    ("GET", "/readyz"): Server.readyz,
}


def _take(blocks: Iterator[str]) -> bytes:
    """The next ``STREAM_CHUNK_BYTES`` or so of ``blocks`` (b"" at the end), in a worker."""
    out: list[bytes] = []
    n = 0
    for block in blocks:
        b = block.encode()
        out.append(b)
        n += len(b)
        if n >= STREAM_CHUNK_BYTES:
            break
    return b"".join(out)


# -- connections and TLS ---------------------------------------------------------------------
class Connections:
    """Open connections, in all and per peer address, against the caps."""

    def __init__(self, limits: settings.ServerSettings) -> None:
        self.limits = limits
        self.total = 0
        self.by_peer: collections.Counter[str] = collections.Counter()
        self.refused = 0

    def admit(self, peer: str) -> bool:
        lim = self.limits
        if self.total >= lim.max_connections or self.by_peer[peer] >= lim.max_connections_per_peer:
            self.refused += 1
            return False
        self.total += 1
        self.by_peer[peer] += 1
        return True

    def release(self, peer: str) -> None:
        self.total -= 1
        self.by_peer[peer] -= 1
        if self.by_peer[peer] <= 0:
            del self.by_peer[peer]


class Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, admitted only under the connection caps;
    an extra connection gets a 503 and is closed."""

    def __init__(self, factory: Callable[[], Any], conns: Connections) -> None:
        self._inner: asyncio.Protocol = factory()
        self._conns = conns
        self._peer: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if peer else ""
        if not self._conns.admit(host):
            if self._conns.refused % 100 == 1:
                n = self._conns.refused
                log.warning("connection cap reached (%d refused so far; last %s)", n, host)
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(_REFUSED)
            transport.close()
            return
        self._peer = host
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._peer is not None:
            self._conns.release(self._peer)
            self._peer = None
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._peer is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._peer is not None else None

    def pause_writing(self) -> None:
        if self._peer is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._peer is not None:
            self._inner.resume_writing()


class Certificate:
    """The serving certificate, loaded again into the same ``ssl.SSLContext`` when its files
    change: new handshakes get the new one, open connections keep theirs."""

    def __init__(self, tls: settings.TLSSettings) -> None:
        self.cert_file, self.key_file = tls.cert_file, tls.key_file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._seen = self._stat()
        try:
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            raise errors.SettingsError("COLLSCOPE_TLS_CERT_FILE", self.cert_file, str(e)) from e
        self.loads = 1

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for path in (self.cert_file, self.key_file):
            try:
                st = os.stat(path)
            except OSError:
                out.append((0, 0, 0))
            else:
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def reload(self) -> bool:
        """Load the files again if they changed; a bad pair (caught mid-update) keeps the old
        certificate and is tried again next time."""
        seen = self._stat()
        if seen == self._seen:
            return False
        try:
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            log.warning("TLS certificate %s not reloaded (kept the old one): %s", self.cert_file, e)
            return False
        self._seen = seen
        self.loads += 1
        log.info("TLS certificate %s reloaded", self.cert_file)
        return True


# -- query parsing ---------------------------------------------------------------------------
def accepts(headers: list[str], media_type: str) -> bool:
    """Whether ``Accept`` header values name ``media_type`` exactly with a q above 0
    (``a/b;q=0.5, c/d``); wildcards do not count: the default answer is for them."""
    for header in headers:
        for item in header.split(","):
            kind, *params = (p.strip() for p in item.split(";"))
            if kind.lower() != media_type:
                continue
            q = next((p[2:] for p in params if p.lower().startswith("q=")), "1")
            try:
                if float(q) > 0:
                    return True
            except ValueError:
                continue
    return False


def _no_params(q: Query, *allowed: str) -> None:
    for name in q:
        if name not in allowed:
            ok = ", ".join(allowed) or "none"
            raise errors.QueryError(name, f"unknown parameter (allowed: {ok})")


def _one(q: Query, name: str) -> str | None:
    values = q.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise errors.QueryError(name, "given more than once")
    return values[0]


def _ranks(q: Query) -> list[int] | None:
    raw = _one(q, "ranks")
    if raw is None:
        return None
    try:
        out = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError as e:
        raise errors.QueryError("ranks", f"{raw!r} is not a comma-separated list of ranks") from e
    if not out or min(out) < 0:
        raise errors.QueryError("ranks", f"{raw!r}: need one or more ranks >= 0")
    return out


def _workloads(q: Query) -> list[str] | None:
    """``workloads=<pod uid>,..`` (``api.RankInfo.workload``), None when not given."""
    raw = _one(q, "workloads")
    if raw is None:
        return None
    out = [x.strip() for x in raw.split(",") if x.strip()]
    if not out or not all(_WORKLOAD.fullmatch(x) for x in out):
        raise errors.QueryError("workloads", f"{raw[:200]!r}: need one or more workload ids")
    return out


def _float(q: Query, name: str, default: float) -> float:
    raw = _one(q, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError as e:
        raise errors.QueryError(name, f"{raw!r} is not a number") from e
    if not math.isfinite(value) or value <= 0:
        raise errors.QueryError(name, f"{raw!r}: must be a positive number")
    return value


def _time(q: Query, name: str) -> int | None:
    raw = _one(q, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError as e:
        raise errors.QueryError(name, f"{raw!r} is not a time in ns since the epoch") from e
    if not 0 <= value < 2**63:
        raise errors.QueryError(name, f"{raw!r} is outside [0, 2^63)")
    return value


def _range(q: Query) -> tuple[int | None, int | None]:
    since, until = _time(q, "since"), _time(q, "until")
    if since is not None and until is not None and until < since:
        raise errors.QueryError("until", f"{until} is before since={since}")
    return since, until
