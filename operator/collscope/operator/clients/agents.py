"""The operator's client of the node agents' HTTP API (``collscope.nodeagent.api``, ``/v1/``).

The trigger loop pulls the recent window of the sampled ranks from their nodes' agents every
tick, and the Diagnosis handler the window around the trigger from the agents of the affected
ranks (docs/design.md, "Data path"). Both fan out to many nodes at once, so every call here is
``async`` (httpx) and ``gather`` runs one call per node concurrently. An unreachable agent is
a result, not a failure: the trigger works with the ranks it could read and the Diagnosis
names the nodes it could not.

The window is asked for in the columnar wire form (``bundle.columnar``, by ``Accept``), which is
decoded straight into numpy tables; an agent that answers JSON lines instead (one older than
that form) is read as before, so the two mix within one pull.

Security: agents serve HTTPS and authorize callers with TokenReview + SubjectAccessReview
(``collscope.nodeagent.auth``). ``access`` (``settings.AgentSettings``) names the CA bundle that
agents' certificates are verified against, the name they carry (one certificate serves every
node's agent, reached by IP: the name is checked, SNI sends it), and the token file presented
as ``Authorization: Bearer``, read again when it changes (the kubelet rotates it) and sent over
https only. The CA file is read again when it changes too: new CAs are added to the same
context, so a rotation never makes an agent untrusted mid-way.

Retries: a connection error, a timeout or a 5xx answer is retried ``retries`` times with
exponential backoff (``backoff_s``, doubled each time); a 4xx answer is our mistake and is not.
The timeout and the retries default to ``access``'s (``settings.AgentSettings``: one source of
truth); callers that need others (a longer timeout for stacks, no retry for a dump) say so.
``access`` is required: it also carries the CA, the certificate name and the token file, and a
client built without them would meet an authorizing agent with 401s (a hardware re-check once
did, so confirmation could never succeed with authorization on).
This module is the one boundary where httpx and pydantic errors become
``errors.AgentUnreachable`` / ``errors.AgentError``, always ``from`` the original. Usage::

    client = agents.AgentClient("node-3", "http://10.0.0.3:9464", access=settings.agents)
    got, failed = await agents.gather({"node-3": client.ranks()})

Why one module: it is that boundary, one client of one API. The calls, the trust and token
files they present (``_Trust``, ``_TokenFile``), the retries and the translation of errors
share one ``httpx`` client and one notion of failure; the callers see ``AgentClient`` and
``gather`` only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import ssl
import threading
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

import httpx
import pydantic

from collscope.nodeagent import api
from collscope.nodeagent import errors as agent_errors
from collscope.nodeagent.bundle import columnar, models, reader, tables
from collscope.operator import errors
from collscope.operator.domain import settings

T = TypeVar("T")
M = TypeVar("M", bound=pydantic.BaseModel)

DEFAULT_BACKOFF_S: Final = 0.1  # first retry after 0.1 s, then 0.2 s: well inside a tick
# An agent's error body longer than this is not its ErrorResponse: cut it in messages.
ERROR_TEXT_MAX: Final = 200
# The window's columnar form first; JSON lines from an agent that does not know it.
WINDOW_ACCEPT: Final = f"{columnar.MEDIA_TYPE}, application/x-ndjson;q=0.5"


@dataclasses.dataclass(frozen=True, slots=True)
class Unreachable:
    """A node whose agent did not answer usefully, and why (for status and Events)."""

    node: str
    reason: str


class AgentClient:
    """One node agent at ``base_url``; ``access``: TLS, token, timeout and retries (None: the
    system's CAs, no token, ``settings.AgentSettings``' defaults); ``timeout_s`` and ``retries``
    override access's. ``transport`` is for tests (an httpx transport)."""

    def __init__(
        self,
        node: str,
        base_url: str,
        *,
        timeout_s: float | None = None,
        retries: int | None = None,
        backoff_s: float = DEFAULT_BACKOFF_S,
        transport: httpx.AsyncBaseTransport | None = None,
        access: settings.AgentSettings,
    ) -> None:
        timeout_s = access.timeout_s if timeout_s is None else timeout_s
        retries = access.retries if retries is None else retries
        if retries < 0 or backoff_s < 0 or timeout_s <= 0:
            raise ValueError(f"agent client {node}: bad timeout/retries/backoff")
        self.node = node
        self.base_url = base_url.rstrip("/")
        self._retries = retries
        self._backoff_s = backoff_s
        secure = self.base_url.startswith("https://")
        ca = access.ca_file
        self._token = _token(access.token_file) if access.token_file and secure else None
        self._extensions = (
            {"sni_hostname": access.server_name} if access.server_name and secure else {}
        )
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=timeout_s,
            transport=transport,
            verify=_trust(ca).context() if ca else _tls(),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def ranks(self) -> api.RanksResponse:
        """``GET /v1/ranks``: the rings on the node with identity and health."""
        return _parse(api.RanksResponse, await self._get("/v1/ranks", {}), self._url("/v1/ranks"))

    async def summaries(
        self,
        ranks: Sequence[int],
        *,
        window_s: float,
        workloads: Sequence[str] | None = None,
    ) -> api.SummariesResponse:
        """``GET /v1/summaries``: per rank its completions over the last ``window_s`` and the
        operation in flight at its latest sample (``api.TriggerSummary``)."""
        params = {"ranks": _csv(ranks), "window_s": f"{window_s:g}"} | _named(workloads)
        body = await self._get("/v1/summaries", params)
        return _parse(api.SummariesResponse, body, self._url("/v1/summaries"))

    async def window_lines(
        self,
        ranks: Sequence[int],
        *,
        since_ns: int,
        until_ns: int,
        workloads: Sequence[str] | None = None,
    ) -> list[bytes]:
        """``GET /v1/window``: the ranks' bundle-v1 record lines in ``[since_ns, until_ns]``."""
        params = {"ranks": _csv(ranks), "since": str(since_ns), "until": str(until_ns)}
        params |= _named(workloads)
        return (await self._get("/v1/window", params)).splitlines()

    async def window(
        self,
        ranks: Sequence[int],
        *,
        since_ns: int,
        until_ns: int,
        workloads: Sequence[str] | None = None,
    ) -> columnar.Part | list[bytes]:
        """``GET /v1/window`` asking for the columnar form: its decoded, validated tables, or
        the record lines (not validated yet) when the agent answers JSON lines. ``workloads``:
        the job's on the node (another job's same ranks there are not ours)."""
        params = {"ranks": _csv(ranks), "since": str(since_ns), "until": str(until_ns)}
        params |= _named(workloads)
        resp = await self._request(
            "GET", "/v1/window", params=params, headers={"Accept": WINDOW_ACCEPT}
        )
        ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != columnar.MEDIA_TYPE:
            return resp.content.splitlines()
        try:
            return columnar.decode(resp.content, where=self._url("/v1/window"))
        except agent_errors.BundleError as e:
            raise errors.AgentError(f"agent {self.node}: its /v1/window is not valid: {e}") from e

    async def hardware(self, *, since_ns: int, until_ns: int) -> api.HardwareResponse:
        """``GET /v1/hardware``: the node's hardware samples in the range, and its sources."""
        params = {"since": str(since_ns), "until": str(until_ns)}
        body = await self._get("/v1/hardware", params)
        return _parse(api.HardwareResponse, body, self._url("/v1/hardware"))

    async def stacks(self, request: api.StacksRequest) -> dict[str, Any]:
        """``POST /v1/stacks``: py-spy stacks of ranks on the node, grouped (JSON as sent)."""
        return await self._post_json("/v1/stacks", request)

    async def flightrecorder(self, request: api.FlightRecorderRequest) -> dict[str, Any]:
        """``POST /v1/flightrecorder``: Flight Recorder dumps of ranks on the node (JSON)."""
        return await self._post_json("/v1/flightrecorder", request)

    async def profile_arm(self, request: api.ProfileRequest) -> api.ProfileArmed:
        """``POST /v1/profile``: arm the probes of ranks on the node for a window."""
        resp = await self._request(
            "POST", "/v1/profile", content=request.model_dump_json().encode()
        )
        return _parse(api.ProfileArmed, resp.content, self._url("/v1/profile"))

    async def profile_report(self, request_id: str) -> api.ProfileReport:
        """``GET /v1/profile``: each armed rank's probe state and patterns."""
        body = await self._get("/v1/profile", {"id": request_id})
        return _parse(api.ProfileReport, body, self._url("/v1/profile"))

    # -- transport ------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    async def _get(self, path: str, params: Mapping[str, str]) -> bytes:
        return (await self._request("GET", path, params=dict(params))).content

    async def _post_json(self, path: str, request: pydantic.BaseModel) -> dict[str, Any]:
        resp = await self._request("POST", path, content=request.model_dump_json().encode())
        return _parse(_JsonObject, resp.content, self._url(path)).root

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        url = self._url(path)
        delay = self._backoff_s
        headers = dict(headers or {})
        token = self._token() if self._token is not None else ""
        if token:
            headers["Authorization"] = f"Bearer {token}"
        for attempt in range(self._retries + 1):
            last = attempt == self._retries
            try:
                resp = await self._http.request(
                    method,
                    path,
                    params=params,
                    content=content,
                    headers=headers,
                    extensions=self._extensions,
                )
            except httpx.TransportError as e:
                if last:
                    raise errors.AgentUnreachable(
                        f"agent {self.node} at {url}: {type(e).__name__}: {e or 'no detail'} "
                        f"(after {attempt + 1} attempts)"
                    ) from e
            else:
                if resp.status_code < 400:
                    return resp
                if resp.status_code < 500 or last:
                    raise errors.AgentError(
                        f"agent {self.node} at {url}: HTTP {resp.status_code}: {_error_text(resp)}"
                    )
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable: the last attempt returns or raises")


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default verifying TLS context, built once per process: httpx builds one per
    client otherwise, about 25 ms each (it loads the CA bundle), which is 3 s of a blocked event
    loop for the 128 agents of a 1,024-rank job (measured by bench/operator_scale.py)."""
    return httpx.create_ssl_context()


# The CA and token files are looked at (a stat) at most this often: they change hourly at most.
FILE_CHECK_S: Final = 10.0


class _Trust:
    """A verifying TLS context over a CA file; CAs that appear in the file later are added to
    the same context (httpx clients keep their context), none is ever removed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._ctx = ssl.create_default_context(cafile=path)
        self._seen = _stat(path)
        self._checked = time.monotonic()

    def context(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked >= FILE_CHECK_S:
            with self._lock:
                self._checked = now
                seen = _stat(self.path)
                if seen != self._seen:
                    try:
                        self._ctx.load_verify_locations(cafile=self.path)
                        self._seen = seen
                    except (OSError, ssl.SSLError):
                        pass  # caught mid-update: tried again next time
        return self._ctx


@functools.cache
def _trust(path: str) -> _Trust:
    """One context per CA file and process (a context costs ~25 ms: see ``_tls``); checked for
    changes whenever a client is made with it."""
    try:
        return _Trust(path)
    except (OSError, ssl.SSLError) as e:
        raise errors.SettingsError("COLLSCOPE_AGENT_CA_FILE", path, str(e)) from e


class _TokenFile:
    """The operator's own ServiceAccount token, read again when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._token = ""
        self._checked = -FILE_CHECK_S

    def __call__(self) -> str:
        now = time.monotonic()
        if now - self._checked < FILE_CHECK_S:
            return self._token
        self._checked = now
        seen = _stat(self.path)
        if seen != self._seen:
            try:
                with open(self.path, encoding="ascii") as f:
                    self._token = f.read().strip()
            except (OSError, UnicodeDecodeError):
                self._token = ""  # no token: the agent answers 401, which names the cause
            self._seen = seen
        return self._token


@functools.cache
def _token(path: str) -> _TokenFile:
    return _TokenFile(path)


def _stat(path: str) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0, 0)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class _JsonObject(pydantic.RootModel[dict[str, Any]]):
    pass


def _parse(model: type[M], body: bytes, url: str) -> M:
    try:
        return model.model_validate_json(body)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise errors.AgentError(
            f"agent answer from {url} is not a v1 {model.__name__}: {where}: {first['msg']}"
        ) from e


def _error_text(resp: httpx.Response) -> str:
    try:
        err = api.ErrorResponse.model_validate_json(resp.content)
    except pydantic.ValidationError:
        return resp.text[:ERROR_TEXT_MAX] or resp.reason_phrase
    return err.error if err.parameter is None else f"{err.error} (parameter {err.parameter})"


def _csv(ranks: Iterable[int]) -> str:
    return ",".join(str(int(r)) for r in ranks)


def _named(workloads: Sequence[str] | None) -> dict[str, str]:
    """The ``workloads`` parameter, none when not named (an older agent rejects it)."""
    return {"workloads": ",".join(workloads)} if workloads else {}


async def gather(calls: Mapping[str, Awaitable[T]]) -> tuple[dict[str, T], list[Unreachable]]:
    """Run one call per node concurrently: ``({node: result}, [nodes that failed, why])``.

    Only ``errors.AgentError`` (unreachable, bad answer) is caught; anything else is a bug and
    propagates.
    """
    nodes = list(calls)
    results = await asyncio.gather(*(calls[n] for n in nodes), return_exceptions=True)
    got: dict[str, T] = {}
    failed: list[Unreachable] = []
    for node, res in zip(nodes, results, strict=True):
        if isinstance(res, errors.AgentError):
            failed.append(Unreachable(node, str(res)))
        elif isinstance(res, BaseException):
            raise res
        else:
            got[node] = res
    return got, failed


async def pull_window(
    clients: Mapping[str, AgentClient],
    ranks_by_node: Mapping[str, Sequence[int]],
    job: models.Job,
    *,
    since_ns: int,
    until_ns: int,
    workloads: Mapping[str, Sequence[str]] | None = None,
) -> tuple[tables.Bundle, list[Unreachable]]:
    """The trigger window of ``ranks_by_node`` from their agents, in parallel, as one Bundle;
    of the ``workloads`` given for a node (``jobs.workloads_by_node``), so that another job's
    ranks on the same node never come with it.

    A node without a client, or whose agent fails or answers with records that are not
    bundle-v1, is listed in the second value; the bundle holds what the others sent (analysis
    works with partial coverage). Nodes are added in name order, so the tables are those
    ``reader.load_lines`` makes of the same records, whichever form each agent answered in.
    The ranks asked of a node without a client or whose agent did not answer get a liveness
    row ``unreachable`` at ``until_ns`` (docs/spec/bundle-v1.md ``liveness.jsonl``): analysis
    tells a lost node from a silent rank by it (``analysis.liveness``).
    """
    calls = {
        node: clients[node].window(
            ranks, since_ns=since_ns, until_ns=until_ns, workloads=(workloads or {}).get(node)
        )
        for node, ranks in ranks_by_node.items()
        if node in clients and ranks
    }
    got, failed = await gather(calls)
    failed += [
        Unreachable(n, "no agent known on this node") for n in ranks_by_node if n not in clients
    ]
    answers = {node: (clients[node].base_url + "/v1/window", got[node]) for node in sorted(got)}
    lost = [
        (r, until_ns) for f in failed for r in ranks_by_node.get(f.node, ()) if f.node not in got
    ]
    try:
        return _merge(job, answers, lost), failed
    except agent_errors.BundleError:
        # Rare: find the agents whose lines are not bundle-v1 (one parse each), report them
        # like unreachable ones and keep the others' records.
        for node, (where, answer) in list(answers.items()):
            if isinstance(answer, columnar.Part):
                continue  # validated when decoded
            try:
                _merge(job, {node: (where, answer)})
            except agent_errors.BundleError as e:
                failed.append(Unreachable(node, f"its /v1/window is not bundle-v1: {e}"))
                del answers[node]
        return _merge(job, answers, lost), failed


async def pull_summaries(
    clients: Mapping[str, AgentClient],
    ranks_by_node: Mapping[str, Sequence[int]],
    workloads: Mapping[str, Sequence[str]] | None = None,
    *,
    window_s: float,
) -> tuple[list[api.TriggerSummary], list[Unreachable]]:
    """Every rank of ``ranks_by_node``'s summary from its node's agent, in parallel, for the
    job-wide hang check (``analysis.jobwide``): the rows in (rank, workload) order and the nodes
    that failed, as ``pull_window`` reports them (a node without a client included). A row of a
    workload not asked for (an agent that ignores the parameter) is dropped."""
    calls = {
        node: clients[node].summaries(
            ranks, window_s=window_s, workloads=(workloads or {}).get(node)
        )
        for node, ranks in ranks_by_node.items()
        if node in clients and ranks
    }
    got, failed = await gather(calls)
    failed += [
        Unreachable(n, "no agent known on this node") for n in ranks_by_node if n not in clients
    ]
    rows = []
    for node, resp in got.items():
        named = set((workloads or {}).get(node) or ())
        rows += [
            s for s in resp.summaries if not named or s.workload is None or s.workload in named
        ]
    rows.sort(key=lambda s: (s.rank, s.workload or ""))
    return rows, failed


def _merge(
    job: models.Job,
    answers: Mapping[str, tuple[str, columnar.Part | list[bytes]]],
    unreachable: Sequence[tuple[int, int]] = (),
) -> tables.Bundle:
    """One Bundle of the nodes' answers (``where`` names an answer in errors), plus an
    ``unreachable`` liveness row for each (rank, ts) of ``unreachable``."""
    builder = tables.BundleBuilder(job, source="agents")
    for where, answer in answers.values():
        if isinstance(answer, columnar.Part):
            builder.add_tables(answer)
        else:
            reader.add_lines(builder, where, answer)
    for rank, ts in unreachable:
        builder.add_liveness(rank=rank, ts=ts, state="unreachable")
    return builder.build()
