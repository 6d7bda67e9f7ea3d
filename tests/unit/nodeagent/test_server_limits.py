"""server.py under callers that are not the operator: no token, a wrong one, a slow or idle
client, oversized requests, too many connections, and a slow request beside quick ones; TLS with
a certificate replaced on disk. A real agent on 127.0.0.1 (port 0) with no rings: the
reviewer is a fake of ``auth.Reviewer``, test_auth.py covers the real one."""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence

import httpx
import pydantic
import pytest

from collscope.nodeagent import agent, auth, settings, stacks

OPERATOR = "system:serviceaccount:collscope-system:collscope-operator"
TENANT = "system:serviceaccount:ml:default"
TOKENS = {"op": OPERATOR, "tenant": TENANT}
# Timeouts short enough for a test, long enough for a loaded 2-core CI machine to send a
# normal request well within them.
IDLE_S = 1.0
BODY_S = 1.0


class FakeReviewer:
    """Tokens ``op`` (may do everything) and ``tenant`` (may do nothing); counts reviews."""

    def __init__(self) -> None:
        self.authn: list[str] = []
        self.authz: list[tuple[str, auth.Attributes]] = []

    async def authenticate(self, token: str) -> auth.User | None:
        self.authn.append(token)
        name = TOKENS.get(token)
        return None if name is None else auth.User(name=name)

    async def authorize(self, user: auth.User, attrs: auth.Attributes) -> bool:
        self.authz.append((user.name, attrs))
        return user.name == OPERATOR


class SlowStacks:
    """A py-spy stand-in that takes ``delay_s``."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, pids: Sequence[int], timeout_s: float) -> pydantic.BaseModel:
        time.sleep(self.delay_s)
        return stacks.StacksReport(groups=[])


@dataclasses.dataclass
class Running:
    agent: agent.Agent
    reviewer: FakeReviewer
    url: str

    def client(self, token: str | None = "op", **kw: object) -> httpx.Client:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10.0, **kw)  # type: ignore[arg-type]

    def raw(self) -> socket.socket:
        host, port = self.agent.server.address
        return socket.create_connection((host, port), timeout=10)


def config(
    trace: pathlib.Path,
    *,
    server: dict[str, object] | None = None,
    tls: settings.TLSSettings | None = None,
    mode: settings.AuthMode = "kubernetes",
) -> settings.Settings:
    trace.mkdir(exist_ok=True)
    limits = {"idle_timeout_s": IDLE_S, "body_timeout_s": BODY_S, **(server or {})}
    return settings.Settings(
        node_name="gpu-1",
        discovery=settings.DiscoverySettings(mode="directory", trace_root=str(trace)),
        sampling=settings.SamplingSettings(sample_interval_s=0.05),
        server=settings.ServerSettings(listen_host="127.0.0.1", listen_port=0, **limits),  # type: ignore[arg-type]
        tls=tls or settings.TLSSettings(),
        auth=settings.AuthSettings(mode=mode, expensive_burst=2, expensive_per_minute=1),
    )


@pytest.fixture
def make(tmp_path: pathlib.Path) -> Iterator[object]:
    started: list[agent.Agent] = []

    def start(delay_s: float = 0.0, **kw: object) -> Running:
        reviewer = FakeReviewer()
        a = agent.Agent(
            config(tmp_path / "trace", **kw),  # type: ignore[arg-type]
            stacks_dumper=SlowStacks(delay_s),
            proc_root=None,
            reviewer=reviewer,
        )
        a.start()
        started.append(a)
        host, port = a.server.address
        return Running(a, reviewer, f"{a.server.scheme}://{host}:{port}")

    yield start
    for a in started:
        a.stop()


# -- authentication and authorization ---------------------------------------------------------


def test_no_token_or_a_bad_one_is_401_and_a_refused_one_403(make: object) -> None:
    r: Running = make()  # type: ignore[operator]
    for token in (None, "forged"):
        with r.client(token) as c:
            got = c.get("/v1/ranks")
            assert got.status_code == 401, token
            assert got.headers["www-authenticate"].startswith("Bearer")
            assert "token" in got.json()["error"]
    with r.client("tenant") as c:
        got = c.get("/v1/ranks")
        assert got.status_code == 403 and TENANT in got.json()["error"]
        assert c.post("/v1/stacks", json={"pids": [1]}).status_code == 403
        assert c.get("/metrics").status_code == 403
    with r.client("op") as c:
        assert c.get("/v1/ranks").status_code == 200
        assert c.get("/metrics").status_code == 200
    with httpx.Client(base_url=r.url, headers={"Authorization": "Basic b3A6"}) as c:
        assert c.get("/v1/ranks").status_code == 401


def test_a_refusal_before_the_body_is_read_closes_the_connection(make: object) -> None:
    """A POST refused before its body has arrived says ``Connection: close``: the server drops
    such a connection rather than drain the body (``lingering_time=0``), and a client that
    reused it would lose its next request ("Server disconnected", once in a CI run, when a body
    came in a later segment than its headers). Headers are sent here, the body held back."""
    r: Running = make()  # type: ignore[operator]
    host, port = r.agent.server.address
    assert r.url.startswith("http://")
    body = b'{"pids": [1]}'
    head = (
        f"POST /v1/stacks HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer forged\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((host, port), timeout=5.0) as sock:
        sock.sendall(head.encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            assert chunk, answer
            answer += chunk
    status, *headers = answer.split(b"\r\n\r\n")[0].decode().split("\r\n")
    assert status.split()[1] == "401", status
    assert "connection: close" in [h.lower() for h in headers], headers
    with r.client("op") as c:  # an answer after the body was read keeps the connection
        assert "close" not in c.get("/v1/ranks").headers.get("connection", "")


def test_health_is_open(make: object) -> None:
    r: Running = make()  # type: ignore[operator]
    deadline = time.monotonic() + 5
    with r.client(None) as c:
        while c.get("/livez").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert c.get("/readyz").status_code == 200
    assert r.reviewer.authn == []


def test_reviews_are_cached(make: object) -> None:
    r: Running = make()  # type: ignore[operator]
    with r.client("op") as c:
        for _ in range(5):
            assert c.get("/v1/ranks").status_code == 200
            assert c.get("/v1/summaries", params={"window_s": "1"}).status_code == 200
    assert r.reviewer.authn == ["op"]
    # ranks and summaries ask the same question (agents/data on this node): one review
    ((user, attrs),) = r.reviewer.authz
    assert user == OPERATOR
    assert (attrs.verb, attrs.subresource, attrs.name) == ("get", "data", "gpu-1")


def test_stacks_are_rate_limited_per_caller(make: object, caplog: pytest.LogCaptureFixture) -> None:
    r: Running = make()  # type: ignore[operator]
    caplog.set_level("INFO", logger="collscope.nodeagent.server")
    with r.client("op") as c:
        codes = [c.post("/v1/stacks", json={"pids": [1]}).status_code for _ in range(3)]
        last = c.post("/v1/stacks", json={"pids": [1]})
    assert codes[:2] != [429, 429] and codes[2] == 429
    assert last.status_code == 429 and int(last.headers["retry-after"]) > 0
    assert OPERATOR in caplog.text and "stacks for" in caplog.text


def test_an_unreachable_api_server_is_503(make: object) -> None:
    r: Running = make()  # type: ignore[operator]
    from collscope.nodeagent import errors

    async def down(token: str) -> auth.User | None:
        raise errors.ReviewUnavailable("connection refused")

    r.reviewer.authenticate = down  # type: ignore[method-assign]
    with r.client("someone-new") as c:
        got = c.get("/v1/window")
    assert got.status_code == 503 and "authorization unavailable" in got.json()["error"]


# -- limits -----------------------------------------------------------------------------------


def read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """What the server sent on ``sock`` until it closed it, and the seconds that took.

    Stops at ``limit_s`` (the socket's timeout then raises, failing the test).
    """
    with sock:
        sock.settimeout(limit_s)
        t0 = time.monotonic()
        got = b""
        try:
            while chunk := sock.recv(4096):
                got += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
        return got, time.monotonic() - t0


def closed_within(sock: socket.socket, limit_s: float) -> float:
    """Seconds until the server closed ``sock`` (reading until EOF), at most ``limit_s``."""
    return read_until_closed(sock, limit_s)[1]


def test_slow_and_idle_clients_are_dropped(make: object) -> None:
    r: Running = make()  # type: ignore[operator]
    idle = r.raw()
    slow = r.raw()
    slow.sendall(b"GET /v1/ranks HTTP/1.1\r\nHost: x\r\n")

    def drip() -> None:  # a header line every 0.2 s, never the blank line
        try:
            for i in range(30):
                slow.sendall(f"X-{i}: y\r\n".encode())
                time.sleep(0.2)
        except OSError:
            return

    t = threading.Thread(target=drip)
    t.start()
    try:
        assert closed_within(idle, 5 * IDLE_S) < 3 * IDLE_S
        assert closed_within(slow, 5 * IDLE_S) < 3 * IDLE_S
    finally:
        t.join()
        idle.close()
        slow.close()


def test_a_body_shorter_than_its_length_does_not_hold_the_server(make: object) -> None:
    r: Running = make()  # type: ignore[operator]
    with r.raw() as s:
        s.sendall(
            b"POST /v1/stacks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer op\r\n"
            b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"pids"'
        )
        with r.client("op") as c:  # served meanwhile
            assert c.get("/v1/ranks").status_code == 200
        # the answer may come in several segments (head, then body): read until the close
        answer, took = read_until_closed(s, 5 * BODY_S + 2.0)
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive" in answer, answer
        assert took < 5 * BODY_S + 2.0


def test_oversized_requests_are_refused(make: object) -> None:
    r: Running = make(server={"max_body_bytes": 1024})  # type: ignore[operator]
    with r.client("op") as c:
        big = c.post("/v1/stacks", content=b"{" + b" " * 4096 + b"}")
        assert big.status_code == 413 and big.json()["parameter"] == "body"
        assert c.get("/v1/ranks", headers={"X-Big": "a" * 20_000}).status_code in (400, 431)
        many = {f"X-{i}": "y" for i in range(200)}
        assert c.get("/v1/ranks", headers=many).status_code in (400, 431)
        assert c.get("/v1/ranks").status_code == 200


def test_connections_are_capped_per_peer(make: object) -> None:
    r: Running = make(server={"max_connections_per_peer": 3, "idle_timeout_s": 30})  # type: ignore[operator]
    held = [r.raw() for _ in range(3)]
    time.sleep(0.2)
    with r.raw() as extra:
        extra.settimeout(5)
        assert extra.recv(4096).startswith(b"HTTP/1.1 503")
    for s in held:
        s.close()
    deadline = time.monotonic() + 5
    while True:  # the slots come back once the server saw them close
        with r.client("op") as c:
            try:
                if c.get("/v1/ranks").status_code == 200:
                    break
            except httpx.TransportError:
                pass
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_slow_request_does_not_stall_quick_ones(make: object) -> None:
    r: Running = make(delay_s=2.0)  # type: ignore[operator]
    done: list[int] = []

    def slow() -> None:
        with r.client("op") as c:
            done.append(c.post("/v1/stacks", json={"pids": [1]}).status_code)

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.2)
    with r.client("op") as c:
        t0 = time.monotonic()
        assert c.get("/v1/summaries", params={"window_s": "1"}).status_code == 200
        assert time.monotonic() - t0 < 1.0
    t.join()
    assert done == [200]


# -- TLS --------------------------------------------------------------------------------------


def self_signed(
    directory: pathlib.Path, cn: str, *, ip: bool = True
) -> tuple[pathlib.Path, pathlib.Path]:
    """A self-signed certificate for ``cn`` (and 127.0.0.1 with ``ip``) made by the openssl
    command (the ``cryptography`` package is not a dependency), as cert and key files."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    directory.mkdir(parents=True, exist_ok=True)
    crt, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", f"/CN={cn}",
         "-addext", f"subjectAltName=DNS:{cn}" + (",IP:127.0.0.1" if ip else "")],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return crt, key


def served_subject(r: Running) -> str:
    host, port = r.agent.server.address
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((host, port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return ssl.DER_cert_to_PEM_cert(der)


def test_tls_round_trip_and_certificate_reload(make: object, tmp_path: pathlib.Path) -> None:
    crt, key = self_signed(tmp_path / "a", "agent-a.test")
    tls = settings.TLSSettings(cert_file=str(crt), key_file=str(key), reload_interval_s=0.1)
    r: Running = make(tls=tls)  # type: ignore[operator]
    assert r.url.startswith("https://")
    with r.client("op", verify=ssl.create_default_context(cafile=str(crt))) as c:
        assert c.get("/v1/ranks").status_code == 200
    with pytest.raises(httpx.ConnectError), r.client("op") as c:  # not trusted without the CA
        c.get("/v1/ranks")
    first = served_subject(r)
    # cert-manager renews: new files in place (the kubelet swaps a symlink; a rename here).
    new_crt, new_key = self_signed(tmp_path / "b", "agent-a.test")
    new_key.replace(key)
    new_crt.replace(crt)
    deadline = time.monotonic() + 5
    while served_subject(r) == first:
        assert time.monotonic() < deadline, "the new certificate was never served"
        time.sleep(0.1)
    with r.client("op", verify=ssl.create_default_context(cafile=str(crt))) as c:
        assert c.get("/v1/ranks").status_code == 200
    assert r.agent.server.tls is not None and r.agent.server.tls.loads == 2
