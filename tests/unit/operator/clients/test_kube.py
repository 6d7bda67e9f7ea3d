"""The API adapter against a real HTTP server speaking the Kubernetes API's shapes: answers are
read, 403/404/409 mean what they mean, everything else becomes ``KubeError`` (from the client's
exception), and only readable owner kinds are ever requested."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes
import pytest

from collscope.operator import errors
from collscope.operator.clients import kube
from collscope.operator.domain import ids, owners

NS = ids.Namespace("ml")


class Api(ThreadingHTTPServer):
    """Answers ``routes[(method, path)] = (status, body)``; records ``(method, path, body)``."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}
        self.seen: list[tuple[str, str, Any]] = []


class _Handler(BaseHTTPRequestHandler):
    server: Api

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.seen.append((self.command, self.path, body))
        status, payload = self.server.routes.get(
            (self.command, self.path), (404, {"kind": "Status", "code": 404})
        )
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer  # noqa: N815 - http.server's names

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[Api]:
    server = Api()
    # 10 ms poll: shutdown() waits for one poll interval (0.5 s by default).
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def client(url: str) -> kube.Kube:
    config = kubernetes.client.Configuration(host=url)
    config.retries = 0  # a refused connection fails at once instead of after urllib3's 3 retries
    return kube.Kube(kubernetes.client.ApiClient(config))


def url_of(server: Api) -> str:
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"


JOB = owners.OwnerRef("batch/v1", "Job", "train", "u")
JOB_PATH = "/apis/batch/v1/namespaces/ml/jobs/train"


def test_owner_metadata(api: Api) -> None:
    meta = {"name": "train", "ownerReferences": [{"kind": "JobSet"}]}
    api.routes["GET", JOB_PATH] = (200, {"kind": "Job", "metadata": meta})
    assert asyncio.run(client(url_of(api)).owner_metadata(JOB, NS)) == meta


@pytest.mark.parametrize("code", [403, 404])
def test_unreadable_owner_is_none(api: Api, code: int) -> None:
    api.routes["GET", JOB_PATH] = (code, {"kind": "Status", "code": code})
    assert asyncio.run(client(url_of(api)).owner_metadata(JOB, NS)) is None


def test_server_error_is_a_kube_error(api: Api) -> None:
    api.routes["GET", JOB_PATH] = (500, {"kind": "Status", "code": 500})
    with pytest.raises(errors.KubeError, match="reading Job ml/train") as info:
        asyncio.run(client(url_of(api)).owner_metadata(JOB, NS))
    assert isinstance(info.value.__cause__, kubernetes.client.ApiException)


def test_only_readable_kinds_are_requested(api: Api) -> None:
    top = owners.OwnerRef("jobset.x-k8s.io/v1alpha2", "JobSet", "llama", "u")
    assert asyncio.run(client(url_of(api)).owner_metadata(top, NS)) is None
    assert api.seen == []


def test_create_trainingjob(api: Api) -> None:
    path = "/apis/collscope.dev/v1alpha1/namespaces/ml/trainingjobs"
    body = owners.trainingjob_body(JOB, NS)
    api.routes["POST", path] = (201, body)
    assert asyncio.run(client(url_of(api)).create_trainingjob(body)) is True
    assert api.seen == [("POST", path, body)]
    api.routes["POST", path] = (409, {"kind": "Status", "code": 409, "reason": "AlreadyExists"})
    assert asyncio.run(client(url_of(api)).create_trainingjob(body)) is False
    api.routes["POST", path] = (422, {"kind": "Status", "code": 422})
    with pytest.raises(errors.KubeError, match="creating TrainingJob ml/job-train"):
        asyncio.run(client(url_of(api)).create_trainingjob(body))


def test_unreachable_api_is_a_kube_error() -> None:
    with socket.socket() as s:  # a port nobody listens on: bind, note it, close
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = client(f"http://127.0.0.1:{port}")
    with pytest.raises(errors.KubeError):
        asyncio.run(dead.owner_metadata(JOB, NS))
    with pytest.raises(errors.KubeError):
        asyncio.run(dead.create_trainingjob(owners.trainingjob_body(JOB, NS)))
