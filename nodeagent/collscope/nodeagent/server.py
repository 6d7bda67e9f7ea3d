"""The agent's HTTP server: standard library ``ThreadingHTTPServer`` over ``service.Service``.

Routes and models: ``api.py``. Query parameters are parsed here; a bad one answers 400 with
``api.ErrorResponse`` naming it (``errors.QueryError``), a missing capability 503
(``errors.UnavailableError``), an unknown path 404. ``/v1/window`` streams bundle-v1 lines as
they are formatted (``application/x-ndjson``, no Content-Length, connection closed at the end:
HTTP/1.0 framing, which every client reads); a request whose ``Accept`` names
``bundle.columnar.MEDIA_TYPE`` (with q > 0) gets the same records in that columnar form
instead, with a Content-Length (the operator asks for it; old operators do not). Example::

    curl 'http://NODE:9464/v1/summaries?ranks=0,1&window_s=5'
    curl 'http://NODE:9464/v1/window?ranks=3&since=1732001234000000000' > rank3.jsonl
    curl -H 'Accept: application/vnd.collscope.columns.v1' 'http://NODE:9464/v1/window?ranks=3'
    curl -o node.tar.gz 'http://NODE:9464/v1/export?since=1732001234000000000'
"""

from __future__ import annotations

import http
import http.server
import logging
import math
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

import pydantic

from collscope.nodeagent import api, errors, metrics, service
from collscope.nodeagent.bundle import columnar

log = logging.getLogger(__name__)
_M = TypeVar("_M", bound=pydantic.BaseModel)

# A request body larger than this is not a stacks/Flight Recorder request: refuse it.
MAX_BODY_BYTES: Final = 64 << 10
NDJSON: Final = "application/x-ndjson"


class Server:
    """Serves ``svc`` on ``(host, port)`` from a background thread; port 0 picks a free one."""

    def __init__(
        self, svc: service.Service, host: str, port: int, *, live_max_age_s: float = 5.0
    ) -> None:
        self.svc = svc
        self.live_max_age_s = live_max_age_s
        self.registry = metrics.make_registry(svc)
        handler = type("Handler", (_Handler,), {"server_ctx": self})
        self.httpd = http.server.ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        # serve_forever polls for shutdown() every poll_interval: 0.1 s keeps stop() quick at
        # ten idle wake-ups a second.
        self._thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="collscope-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


class _Handler(http.server.BaseHTTPRequestHandler):
    server_ctx: Server
    server_version = "collscope-agent/1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        route = _ROUTES.get((method, url.path))
        try:
            if route is None:
                known = {p for m, p in _ROUTES if m != method and p == url.path}
                code = http.HTTPStatus.METHOD_NOT_ALLOWED if known else http.HTTPStatus.NOT_FOUND
                self._json(code, api.ErrorResponse(error=f"{method} {url.path}: {code.phrase}"))
                return
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            route(self, query)
        except errors.QueryError as e:
            self._json(400, api.ErrorResponse(error=str(e), parameter=e.parameter))
        except errors.UnavailableError as e:
            self._json(503, api.ErrorResponse(error=str(e)))
        except BrokenPipeError:
            pass  # the client went away mid-stream
        except Exception as e:
            log.exception("%s %s failed", method, self.path)
            self._json(500, api.ErrorResponse(error=f"internal error: {type(e).__name__}: {e}"))

    # -- responses ------------------------------------------------------------------------
    def _json(self, code: int, model: pydantic.BaseModel) -> None:
        self._bytes(code, model.model_dump_json().encode(), "application/json")

    def _bytes(self, code: int, body: bytes, ctype: str, **headers: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, blocks: Iterable[str], ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for block in blocks:
            self.wfile.write(block.encode())

    def _body(self, model: type[_M]) -> _M:
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY_BYTES:
            raise errors.QueryError("body", f"{n} bytes, at most {MAX_BODY_BYTES}")
        raw = self.rfile.read(n) if n else b"{}"
        try:
            return model.model_validate_json(raw)
        except pydantic.ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise errors.QueryError(where, first["msg"]) from e

    # -- routes ---------------------------------------------------------------------------
    def ranks(self, q: dict[str, list[str]]) -> None:
        _no_params(q)
        self._json(200, self.server_ctx.svc.ranks())

    def summaries(self, q: dict[str, list[str]]) -> None:
        _no_params(q, "ranks", "window_s")
        window_s = _float(q, "window_s", 5.0)
        if window_s > self.server_ctx.svc.window.window_ns / 1e9:
            raise errors.QueryError("window_s", "longer than the agent's window")
        self._json(200, self.server_ctx.svc.summaries(_ranks(q), window_s))

    def window(self, q: dict[str, list[str]]) -> None:
        _no_params(q, "ranks", "since", "until")
        since, until = _range(q)
        if accepts(self.headers.get_all("Accept") or [], columnar.MEDIA_TYPE):
            body = self.server_ctx.svc.window_columns(_ranks(q), since, until)
            self._bytes(200, body, columnar.MEDIA_TYPE)
            return
        blocks = self.server_ctx.svc.window_lines(_ranks(q), since, until)
        self._stream(blocks, NDJSON)

    def hardware(self, q: dict[str, list[str]]) -> None:
        _no_params(q, "since", "until")
        since, until = _range(q)
        self._json(200, self.server_ctx.svc.hardware_samples(since, until))

    def export(self, q: dict[str, list[str]]) -> None:
        _no_params(q, "since", "until")
        since, until = _range(q)
        body = self.server_ctx.svc.export(since, until)
        name = f"collscope-{self.server_ctx.svc.node}.tar.gz"
        self._bytes(
            200, body, "application/gzip", Content_Disposition=f'attachment; filename="{name}"'
        )

    def stacks(self, q: dict[str, list[str]]) -> None:
        _no_params(q)
        self._json(200, self.server_ctx.svc.stacks(self._body(api.StacksRequest)))

    def flightrecorder(self, q: dict[str, list[str]]) -> None:
        _no_params(q)
        self._json(200, self.server_ctx.svc.flightrecorder(self._body(api.FlightRecorderRequest)))

    def metrics(self, q: dict[str, list[str]]) -> None:
        body, ctype = metrics.render(self.server_ctx.registry)
        self._bytes(200, body, ctype)

    def livez(self, q: dict[str, list[str]]) -> None:
        h = self.server_ctx.svc.livez(self.server_ctx.live_max_age_s)
        self._json(200 if h.status == "ok" else 503, h)

    readyz = livez  # ready = sampling: the agent needs no API server to serve its node


_ROUTES: dict[tuple[str, str], Callable[[_Handler, dict[str, list[str]]], None]] = {
    ("GET", "/v1/ranks"): _Handler.ranks,
    ("GET", "/v1/summaries"): _Handler.summaries,
    ("GET", "/v1/window"): _Handler.window,
    ("GET", "/v1/hardware"): _Handler.hardware,
    ("GET", "/v1/export"): _Handler.export,
    ("POST", "/v1/stacks"): _Handler.stacks,
    ("POST", "/v1/flightrecorder"): _Handler.flightrecorder,
    ("GET", "/metrics"): _Handler.metrics,
    ("GET", "/livez"): _Handler.livez,
    ("GET", "/readyz"): _Handler.readyz,
}


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


def _no_params(q: dict[str, list[str]], *allowed: str) -> None:
    for name in q:
        if name not in allowed:
            ok = ", ".join(allowed) or "none"
            raise errors.QueryError(name, f"unknown parameter (allowed: {ok})")


def _one(q: dict[str, list[str]], name: str) -> str | None:
    values = q.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise errors.QueryError(name, "given more than once")
    return values[0]


def _ranks(q: dict[str, list[str]]) -> list[int] | None:
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


def _float(q: dict[str, list[str]], name: str, default: float) -> float:
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


def _time(q: dict[str, list[str]], name: str) -> int | None:
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


def _range(q: dict[str, list[str]]) -> tuple[int | None, int | None]:
    since, until = _time(q, "since"), _time(q, "until")
    if since is not None and until is not None and until < since:
        raise errors.QueryError("until", f"{until} is before since={since}")
    return since, until
