"""Hang -> Diagnosed latency and operator CPU / memory while it watches a 1,024-rank job.

    .venv/bin/python bench/operator_scale.py                  # 1,024 ranks, 5 runs, ~5 min
    .venv/bin/python bench/operator_scale.py --ranks 256 --runs 3
    .venv/bin/python bench/operator_scale.py --diagnosis-window 5   # pull 5 s, not 10 s
    .venv/bin/python bench/operator_scale.py --secure both --runs 3  # plain, then TLS + auth

Per run: ``collscope.operator.simulator`` simulates the job (TP8 x PP4 x DP32 at 1,024 ranks,
8 GPUs and one pod per node, a GPU hang at ``--onset`` s; seed = run number) and its records
are shifted so the job starts a few seconds from now. Simulated agents then replay them in real
time: one aiohttp server in this process answers ``/<node>/v1/ranks``, ``/v1/window`` (the
records of the asked ranks with ``since <= ts <= min(until, now)``, negotiated as the agent's
``server.py`` does: encoded by the agent's own ``columnar.encode`` when ``Accept`` names the
columnar form, as the operator's client asks, else formatted by its ``writer.record_blocks``
as JSON lines; ``--json-window`` makes the agents answer JSON lines whatever is asked, as
agents from before the columnar form do), ``/v1/stacks`` (one fake stack) and
``/v1/flightrecorder`` (dumps derived from the records: the last completed and the in-flight
collective per communicator).
The operator runs in a child process, built as ``collscope-operator`` builds it (every handler,
the real trigger loop, ``agents.AgentClient`` over HTTP, the analysis engine, remediation)
against kmock, the Kubernetes emulator of the tests, here in this process (a child-process
mode of this script, ``--operator``: it only adds the resourceVersion kmock does not assign,
as the tests' Harness does). The TrainingJob, nodes and pods are created up front.

``--secure on`` serves the agents as the chart deploys them: HTTPS with a leaf certificate of
a CA made for the run (the ``openssl`` command; the agent's own ``server.Certificate`` context),
every request authorized as ``server.Server`` does it (bearer token, ``auth.attributes`` of the
route, one ``auth.Cache`` over an ``auth.KubeReviewer`` per node, as each node's agent has its
own), the reviews answered by an HTTPS stand-in of the API server's TokenReview and
SubjectAccessReview endpoints in this process (``Reviews``: the operator's audience-bound token
and the chart's grants). The operator verifies the agents against the CA under the chart's
server name and presents its token from a file (``settings.AgentSettings``). ``--secure both``
runs each seed plain and then secure, one after the other, and prints both.

Measured, per run: fault onset (the simulator's ground truth) -> Diagnosis created (trigger)
-> phase Diagnosed -> Flight Recorder summary in its status; the operator process's CPU
(utime + stime from /proc) averaged over the watching phase (job running, before the fault)
and its RSS at the fault and peak (VmHWM) at the end of the run; the operator's own
``collscope_operator_analysis_seconds`` (window pull + analysis, scraped from its metrics) and
the time this process spent encoding that window. Caveat: here one process encodes the window
of all 128 nodes one request after the other, on the same cores as the operator; real agents
do it in parallel, each on its own node, so the latency here errs on the high side.

One file past the usual 400 lines on purpose: the simulated agents, the cluster and the
operator's child mode only make sense together, and a benchmark is run, not imported.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import platform
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import numpy as np
from aiohttp import web

from collscope.nodeagent import api, auth, server, settings
from collscope.nodeagent.bundle import columnar, tables, writer
from collscope.operator.simulator import config, topology, truth
from collscope.operator.simulator import engine as simulator

NS = 1_000_000_000
LEAD_S = 6.0  # job start after the operator process starts: kopf's start and rank discovery
WARMUP_S = 3.0  # first seconds of the job left out of the CPU average (baselines filling)
NAMESPACE = "ml"
JOB = "llama"
# Time this process spent formatting the Diagnosis's window (one process here, where each real
# agent formats its own node's part in parallel) and its size.
SERVED = {"diagnosis_s": 0.0, "diagnosis_mib": 0.0}
Indices = np.ndarray[Any, np.dtype[np.intp]]
COLLECTIVES = {"", "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce"}


# -- the simulated job, replayed -----------------------------------------------------------
@dataclasses.dataclass
class Replay:
    """One simulated run shifted to wall-clock time, indexed per rank for fast windows."""

    bundle: tables.Bundle
    onset_ns: int
    culprit: int
    ops_at: dict[int, tuple[int, int]]  # rank -> row range in bundle.ops (sorted by rank, ts)
    states_at: dict[int, tuple[int, int]]
    comms_at: dict[int, Indices]

    @classmethod
    def simulate(cls, ranks: int, seed: int, duration_s: float, onset_s: float) -> Replay:
        tp, pp, dp = (8, 4, ranks // 32) if ranks >= 64 else config.default_parallelism(ranks)
        cfg = config.SimConfig(ranks=ranks, tp=tp, pp=pp, dp=dp, duration_s=duration_s,
                               onset_s=onset_s, fault=truth.Fault.GPU_HANG, seed=seed)  # fmt: skip
        sim = simulator.simulate(cfg)
        b = sim.bundle
        shift = time.time_ns() + int(LEAD_S * NS) - cfg.start_ns
        comms, ops, states = b.comms.copy(), b.ops.copy(), b.states.copy()
        for table, cols in ((comms, ("ts",)), (ops, ("ts", "start", "end")),
                            (states, ("ts", "start"))):  # fmt: skip
            for c in cols:
                table[c] = np.where(table[c] > 0, table[c] + shift, table[c])
        b = dataclasses.replace(b, comms=comms, ops=ops, states=states, hw=b.hw[:0])
        assert sim.truth.onset is not None  # a GPU hang always has one
        return cls(b, sim.truth.onset + shift, sim.truth.culprit_ranks[0],
                   _ranges(ops), _ranges(states),
                   {r: np.flatnonzero(comms["rank"] == r) for r in range(ranks)})  # fmt: skip

    def window(self, ranks: list[int], since: int, until: int) -> tables.Bundle:
        """The records an agent holding ``ranks`` would cut out of its window."""
        until = min(until, time.time_ns())
        take_ops: list[Indices] = []
        take_states: list[Indices] = []
        take_comms: list[Indices] = []
        for r in ranks:
            for at, table, into in ((self.ops_at, self.bundle.ops, take_ops),
                                    (self.states_at, self.bundle.states, take_states)):  # fmt: skip
                lo, hi = at.get(r, (0, 0))
                ts = table["ts"][lo:hi]
                a, z = np.searchsorted(ts, since), np.searchsorted(ts, until, side="right")
                into.append(np.arange(lo + a, lo + z))
            take_comms.append(self.comms_at.get(r, np.arange(0)))
        b = self.bundle
        return dataclasses.replace(
            b, comms=b.comms[np.concatenate(take_comms)], ops=b.ops[np.concatenate(take_ops)],
            states=b.states[np.concatenate(take_states)],
        )  # fmt: skip

    def flight_recorder(self, ranks: list[int]) -> dict[str, Any]:
        """Dumps as torch would write them now: per communicator the last completed collective
        and the one in flight (the newest state record's), without stacks."""
        b, now = self.bundle, time.time_ns()
        dumps = []
        for r in ranks:
            pgs: dict[int, dict[str, Any]] = {}
            lo, hi = self.ops_at.get(r, (0, 0))
            ops = b.ops[lo:hi][b.ops["ts"][lo:hi] <= now]
            for c, seq, op in zip(ops["comm"].tolist(), ops["seq"].tolist(), ops["op"].tolist(),
                                  strict=True):  # fmt: skip
                pgs[c] = {"done": seq, "enq": seq, "op": b.string(op), "done_op": b.string(op)}
            lo, hi = self.states_at.get(r, (0, 0))
            st = b.states[lo:hi][b.states["ts"][lo:hi] <= now]
            if len(st):
                last = st[-1]
                pg = pgs.setdefault(int(last["comm"]), {"done": -1, "done_op": ""})
                if int(last["seq"]) > pg["done"]:  # no completion of it so far: in flight
                    pg["enq"], pg["op"] = int(last["seq"]), b.string(int(last["op"]))
            # torch's collective counters skip point-to-point ops: PP comms are left out; the
            # desc is the comm name's kind ("dp5" -> "dp"), as DeviceMesh names its groups.
            pgs = {c: p for c, p in pgs.items() if {p["op"], p["done_op"]} <= COLLECTIVES}
            name = {int(c): re.sub(r"[^a-z].*", "", b.string(int(n)))
                    for c, n in b.comms[self.comms_at[r]][["comm", "name"]]}  # fmt: skip
            dumps.append({
                "rank": r, "file": f"/tmp/nccl_trace_rank_{r}", "version": "2.5",
                "pg_config": [{"id": str(c), "name": str(c), "desc": name.get(c, "")}
                              for c in pgs],
                "pg_status": [{"id": str(c), "last_enqueued_collective": p["enq"],
                               "last_completed_collective": p["done"]} for c, p in pgs.items()],
                "entries": [e for c, p in pgs.items() for e in _entries(c, p)],
            })  # fmt: skip
        return {"dumps": dumps, "errors": []}


def _entries(comm: int, pg: dict[str, Any]) -> list[dict[str, Any]]:
    snake = {"AllReduce": "all_reduce", "AllGather": "all_gather", "Broadcast": "broadcast",
             "ReduceScatter": "reduce_scatter", "Send": "send", "Recv": "recv"}  # fmt: skip
    out = []
    for seq, op, state in ((pg["done"], pg["done_op"], "completed"), (pg["enq"], pg["op"], "")):
        if seq >= 0 and op and (state or seq > pg["done"]):
            out.append({"pg_id": comm, "collective_seq_id": seq, "is_p2p": op in ("Send", "Recv"),
                        "profiling_name": f"nccl:{snake.get(op, op.lower())}",
                        "state": state or "scheduled"})  # fmt: skip
    return out


def _ranges(table: tables.Table) -> dict[int, tuple[int, int]]:
    ranks, starts = np.unique(table["rank"], return_index=True)
    ends = [*starts[1:].tolist(), len(table)]
    return {int(r): (int(s), int(e)) for r, s, e in zip(ranks, starts, ends, strict=True)}


def agents_app(
    replay: list[Replay], gpus: int, *, json_only: bool = False, guard: Any = None
) -> web.Application:
    """``/<node>/v1/...`` for every node of the job: the simulated agents; ``guard``: a
    middleware in front of every route (``authorizing``)."""

    def node_ranks(node: str) -> list[int]:
        n = int(node.rsplit("-", 1)[1])
        return list(range(n * gpus, (n + 1) * gpus))

    async def ranks(req: web.Request) -> web.Response:
        node = req.match_info["node"]
        infos = [api.RankInfo(rank=r, local_rank=r % gpus, world_size=len(replay[0].comms_at),
                              pid=100 + r % gpus, pod_name=f"train-{node}", node=node,
                              pod_namespace=NAMESPACE, ring_path=f"/rings/{r}", health="live")
                 for r in node_ranks(node)]  # fmt: skip
        body = api.RanksResponse(node=node, now_ns=time.time_ns(), ranks=infos)
        return web.json_response(text=body.model_dump_json())

    async def window(req: web.Request) -> web.StreamResponse:
        q = req.query
        asked = [int(x) for x in q["ranks"].split(",")]
        since, until = int(q.get("since", 0)), int(q.get("until", 2**62))
        t0 = time.perf_counter()
        cut = replay[0].window(asked, since, until)
        if not json_only and server.accepts(req.headers.getall("Accept", []), columnar.MEDIA_TYPE):
            body, ctype = columnar.encode(cut), columnar.MEDIA_TYPE
        else:
            body, ctype = "".join(writer.record_blocks(cut)).encode(), "application/x-ndjson"
        # The Diagnosis's pull: every rank of the node over a range (a trigger tick asks for
        # the sampled ranks only, discovery for an empty range).
        if len(asked) == gpus and until > since:
            SERVED["diagnosis_s"] += time.perf_counter() - t0
            SERVED["diagnosis_mib"] += len(body) / 2**20
        return web.Response(body=body, headers={"Content-Type": ctype})

    async def stacks(req: web.Request) -> web.Response:
        frames = ["wait (torch/distributed/distributed_c10d.py:1)", "step (train.py:40)"]
        group = {"frames": frames, "pids": [1], "thread_names": ["MainThread"]}
        return web.json_response({"groups": [group]})

    async def flight_recorder(req: web.Request) -> web.Response:
        asked = (await req.json()).get("ranks") or node_ranks(req.match_info["node"])
        return web.json_response(replay[0].flight_recorder([int(r) for r in asked]))

    app = web.Application(client_max_size=1 << 20, middlewares=[guard] if guard else [])
    app.router.add_get("/{node}/v1/ranks", ranks)
    app.router.add_get("/{node}/v1/window", window)
    app.router.add_post("/{node}/v1/stacks", stacks)
    app.router.add_post("/{node}/v1/flightrecorder", flight_recorder)
    return app


# -- TLS and authorization (--secure on) ---------------------------------------------------
SERVER_NAME = "collscope-agent.collscope-system.svc"  # the name the chart's certificate carries
AUDIENCE = "collscope-agent"  # the chart's agent.auth.audience
OPERATOR = "system:serviceaccount:collscope-system:collscope-operator"
OPERATOR_TOKEN = "bench-operator-token"  # made up: the stand-in knows it
AGENT_TOKEN = "bench-agent-token"
# The operator's grants in the chart (agent-clusterrole.yaml, "-client"): (verb, subresource).
GRANTS = {("get", "data"), ("create", "stacks"), ("create", "flightrecorder"),
          ("create", "profile"), ("get", "profile")}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Secure:
    """A CA, the agents' leaf certificate it signed, and the two tokens, as files."""

    ca_file: str
    cert_file: str
    key_file: str
    operator_token_file: str
    agent_token_file: str

    @classmethod
    def make(cls, directory: str) -> Secure:
        openssl = shutil.which("openssl")
        if openssl is None:
            raise SystemExit("--secure needs the openssl command (to make the run's CA)")
        d = directory
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        ext = [f"subjectAltName=DNS:{SERVER_NAME},IP:127.0.0.1", "basicConstraints=CA:FALSE",
               "keyUsage=critical,digitalSignature", "extendedKeyUsage=serverAuth"]  # fmt: skip
        with open(f"{d}/leaf.ext", "w") as f:
            f.write("\n".join(ext) + "\n")
        for cmd in (
            ["req", "-x509", *ec, "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt", "-days", "1",
             "-subj", "/CN=collscope-bench-ca", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign"],
            ["req", *ec, "-keyout", f"{d}/tls.key", "-out", f"{d}/tls.csr",
             "-subj", f"/CN={SERVER_NAME}"],
            ["x509", "-req", "-in", f"{d}/tls.csr", "-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key",
             "-CAcreateserial", "-out", f"{d}/tls.crt", "-days", "1", "-extfile", f"{d}/leaf.ext"],
        ):  # fmt: skip
            subprocess.run([openssl, *cmd], check=True, capture_output=True, timeout=30)
        for name, token in (("operator.token", OPERATOR_TOKEN), ("agent.token", AGENT_TOKEN)):
            with open(f"{d}/{name}", "w") as f:
                f.write(token + "\n")
        return cls(f"{d}/ca.crt", f"{d}/tls.crt", f"{d}/tls.key", f"{d}/operator.token",
                   f"{d}/agent.token")  # fmt: skip


class Reviews:
    """The API server's TokenReview and SubjectAccessReview endpoints as the agents call them
    (authentication.k8s.io/v1, authorization.k8s.io/v1: 201 and the review with its status).
    Only the operator's token with the agents' audience authenticates; RBAC is ``GRANTS``."""

    def __init__(self) -> None:
        self.counts = {"TokenReview": 0, "SubjectAccessReview": 0}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self.tokenreviews)
        app.router.add_post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews", self.subjectaccessreviews
        )
        return app

    async def tokenreviews(self, req: web.Request) -> web.Response:
        body = await self._check(req)
        spec = body["spec"]
        ok = spec.get("token") == OPERATOR_TOKEN and AUDIENCE in spec.get("audiences", [])
        status: dict[str, Any] = {"authenticated": ok}
        if ok:
            groups = ["system:serviceaccounts", "system:authenticated"]
            status["user"] = {"username": OPERATOR, "uid": "uid-operator", "groups": groups}
            status["audiences"] = [AUDIENCE]
        self.counts["TokenReview"] += 1
        return web.json_response({**body, "status": status}, status=201)

    async def subjectaccessreviews(self, req: web.Request) -> web.Response:
        body = await self._check(req)
        spec = body["spec"]
        ra = spec.get("resourceAttributes") or {}
        allowed = (
            spec.get("user") == OPERATOR
            and (ra.get("group"), ra.get("resource")) == (auth.GROUP, auth.RESOURCE)
            and (ra.get("verb"), ra.get("subresource")) in GRANTS
        )
        self.counts["SubjectAccessReview"] += 1
        return web.json_response({**body, "status": {"allowed": allowed}}, status=201)

    async def _check(self, req: web.Request) -> dict[str, Any]:
        if req.headers.get("Authorization") != f"Bearer {AGENT_TOKEN}":
            raise web.HTTPUnauthorized(text='{"kind":"Status","code":401}')
        body: dict[str, Any] = await req.json()
        return body


def authorizing(sec: Secure, api_server: str) -> tuple[Any, list[auth.KubeReviewer]]:
    """Middleware that authorizes each ``/<node>/v1/...`` request as that node's agent does
    (``server.Server._authorize``): its own ``auth.Cache`` over its own ``auth.KubeReviewer``.
    Also the reviewers, to close."""
    a = settings.AuthSettings()
    trust = ssl.create_default_context(cafile=sec.ca_file)
    caches: dict[str, auth.Cache] = {}
    made: list[auth.KubeReviewer] = []

    @web.middleware
    async def authorize(request: web.Request, handler: Any) -> web.StreamResponse:
        node = request.match_info.get("node", "")
        cache = caches.get(node)
        if cache is None:
            r = auth.KubeReviewer(api_server, auth.TokenFile(sec.agent_token_file),
                                  ssl_context=trust, audiences=(AUDIENCE,))  # fmt: skip
            made.append(r)
            cache = caches[node] = auth.Cache(r, ttl_s=a.cache_ttl_s, denied_ttl_s=a.denied_ttl_s)
        token = auth.bearer(request.headers.get("Authorization"))
        user = None if token is None else await cache.authenticate(token)
        if user is None:
            return web.json_response({"error": "the token was not accepted"}, status=401)
        attrs = auth.attributes(request.method, request.path[len(node) + 1 :], node)
        if attrs is None or not await cache.authorize(user, attrs):
            return web.json_response({"error": f"{user.name} may not"}, status=403)
        response: web.StreamResponse = await handler(request)
        return response

    return authorize, made


# -- the cluster: kmock in this process -----------------------------------------------------
def populate(k: Any, nodes: int) -> None:
    """CRD resources, namespaces, the Job, its TrainingJob, nodes and one pod per node."""
    import kmock

    k.resources.load_bundled()
    for plural, kind in (("trainingjobs", "TrainingJob"), ("diagnoses", "Diagnosis")):
        k.resources[f"collscope.dev/v1alpha1/{plural}"] = kmock.ResourceInfo(
            kind=kind, singular=kind.lower(), namespaced=True,
            verbs={"get", "list", "watch", "create", "patch", "delete"}, subresources={"status"},
        )  # fmt: skip
    for ns in (NAMESPACE, "collscope-system"):
        k.objects["v1/namespaces", None, ns] = {"metadata": {"name": ns, "resourceVersion": "1"}}
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": "uid-job",
             "controller": True}  # fmt: skip
    k.objects["batch/v1/jobs", NAMESPACE, JOB] = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": JOB, "namespace": NAMESPACE, "uid": "uid-job", "resourceVersion": "1"},
    }  # fmt: skip
    for n in range(nodes):
        node = topology.node_name(n)
        k.objects["v1/nodes", None, node] = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "uid": f"uid-{node}", "resourceVersion": "1",
                         "labels": {"kubernetes.io/hostname": node}},
            "spec": {},
        }  # fmt: skip
        k.objects["v1/pods", NAMESPACE, f"train-{node}"] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"train-{node}", "namespace": NAMESPACE, "uid": f"uid-{node}",
                         "resourceVersion": "1", "ownerReferences": [owner],
                         "annotations": {"collscope.dev/diagnose": "true"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
            "status": {"hostIP": "127.0.0.1", "phase": "Running"},
        }  # fmt: skip
    k.objects["collscope.dev/v1alpha1/trainingjobs", NAMESPACE, JOB] = {
        "apiVersion": "collscope.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": JOB, "namespace": NAMESPACE, "uid": "uid-tj", "resourceVersion": "1"},
        "spec": {"owner": {"apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": "uid-job"}},
    }  # fmt: skip


def diagnoses(k: Any) -> list[dict[str, Any]]:
    return [dict(o) for key, o in list(k.objects.items())
            if key[0].plural == "diagnoses" and not o.deleted]  # fmt: skip


# -- the operator process -------------------------------------------------------------------
def operator_main(
    kube_url: str, agent_url: str, metrics_port: int, window_s: float, access: list[str]
) -> None:
    """``--operator`` mode: collscope-operator as ``__main__.main`` builds it, against kmock;
    ``access``: the agents' CA file, their server name and the token file, or nothing."""
    import kopf
    import kubernetes
    import prometheus_client

    from collscope.operator import __main__ as main
    from collscope.operator.clients import kube
    from collscope.operator.domain import jobs, metrics, settings

    class Stamping(kube.Cluster):  # kmock assigns no resourceVersion; kopf needs one
        async def create_diagnosis(self, body: Any) -> bool:
            meta = {**body["metadata"], "resourceVersion": "1",
                    "uid": "uid-" + body["metadata"]["name"]}  # fmt: skip
            return await super().create_diagnosis({**body, "metadata": meta})

    ca_file, server_name, token_file = access or ("", "", "")
    agents = settings.AgentSettings(url_template=agent_url + "/{node}", ca_file=ca_file,
                                    server_name=server_name, token_file=token_file)  # fmt: skip
    cfg = settings.Settings(
        agents=agents,
        metrics_port=0, health_port=0, diagnosis_window_s=window_s,
    )  # fmt: skip
    meters = metrics.OperatorMetrics()
    prometheus_client.start_http_server(metrics_port, "127.0.0.1", registry=meters.registry)
    cluster = Stamping(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_url)))
    directory = jobs.template_directory(cfg.agents.url_template)
    registry, memo = main.build(cfg, cluster, directory, meters=meters)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=kube_url)

    opts = kopf.OperatorSettings()
    opts.peering.standalone = True
    opts.posting.enabled = False  # Events: kmock stores them, nobody reads them here
    opts.background.instant_exit_timeout = 2.0
    asyncio.run(kopf.operator(registry=registry, settings=opts, clusterwide=True, memo=memo))


class Proc:
    """CPU seconds and memory of a process, from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.tick = os.sysconf("SC_CLK_TCK")

    def cpu_s(self) -> float:
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime, stime

    def mem_mib(self, key: str) -> float:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
        return float("nan")


# -- one run ---------------------------------------------------------------------------------
async def run_once(args: argparse.Namespace, seed: int, sec: Secure | None) -> dict[str, Any]:
    import kmock

    nodes = args.ranks // 8
    duration = args.onset + args.after
    replay = [Replay.simulate(args.ranks, seed, duration, args.onset)]
    guard, reviews, access = None, Reviews(), []
    reviewers: list[auth.KubeReviewer] = []
    tls: ssl.SSLContext | None = None
    if sec is not None:
        tls = server.Certificate(settings.TLSSettings(sec.cert_file, sec.key_file)).context
        api_runner = web.AppRunner(reviews.app(), access_log=None)
        await api_runner.setup()
        api_site = web.TCPSite(api_runner, "127.0.0.1", 0, ssl_context=tls)
        await api_site.start()
        api_port = api_site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        guard, reviewers = authorizing(sec, f"https://127.0.0.1:{api_port}")
        access = [sec.ca_file, SERVER_NAME, sec.operator_token_file]
    app = agents_app(replay, 8, json_only=args.json_window, guard=guard)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    scheme = "https" if sec else "http"
    out: dict[str, Any] = {"seed": seed, "truth": replay[0].culprit, "secure": sec is not None}
    SERVED.update(diagnosis_s=0.0, diagnosis_mib=0.0)
    metrics_port = _free_port()
    async with kmock.KubernetesEmulator() as k, kmock.Server(k) as kube:
        populate(k, nodes)
        url = str(kube.url).rstrip("/")
        child = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--operator",
                url,
                f"{scheme}://127.0.0.1:{port}",
                str(metrics_port),
                str(args.diagnosis_window),
                *access,
            ],
            stderr=subprocess.DEVNULL if not args.verbose else None,
        )
        proc = Proc(child.pid)
        start_ns = int(replay[0].bundle.comms["ts"].min())
        onset_ns = replay[0].onset_ns
        try:
            await _until(lambda: time.time_ns() >= start_ns + WARMUP_S * NS, child)
            cpu0, t0 = proc.cpu_s(), time.monotonic()
            await _until(lambda: time.time_ns() >= onset_ns, child)
            out["cpu_pct"] = 100 * (proc.cpu_s() - cpu0) / (time.monotonic() - t0)
            out["rss_mib"] = proc.mem_mib("VmRSS")
            seen: dict[str, float] = {}

            def progress() -> bool:
                for d in diagnoses(k):
                    st = d.get("status") or {}
                    now = time.time_ns()
                    seen.setdefault("created", now)
                    spec = d.get("spec") or {}
                    out.setdefault("incident", f"{spec.get('trigger')} {spec.get('incident')}")
                    if st.get("phase") in ("Diagnosed", "Remediated"):
                        seen.setdefault("diagnosed", now)
                        out["category"] = st.get("category")
                        out["culprit"] = st.get("culpritRank")
                    if "flightRecorder" in st:
                        seen.setdefault("evidence", now)
                        out["fr"] = st["flightRecorder"]["summary"]
                        out["fr_notes"] = st["flightRecorder"].get("notes", [])
                        out["fr_asked"] = st["flightRecorder"].get("ranksAsked")
                return "evidence" in seen

            await _until(progress, child, timeout_s=args.after + 30)
            for what, at in seen.items():
                out[f"{what}_s"] = (at - onset_ns) / NS
            out["hwm_mib"] = proc.mem_mib("VmHWM")
            out["analysis_s"] = _analysis_s(metrics_port)
            out.update(SERVED)
            out.update(reviews.counts)
        finally:
            child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            await runner.cleanup()
            for r in reviewers:
                await r.aclose()
            if sec is not None:
                await api_runner.cleanup()
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?"
            )
    except OSError:
        return platform.processor() or "?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _analysis_s(port: int) -> float:
    """The operator's own ``collscope_operator_analysis_seconds`` (window pull + analysis)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line[:1] not in "#")
    n = float(values.get("collscope_operator_analysis_seconds_count", "0"))
    return float(values.get("collscope_operator_analysis_seconds_sum", "nan")) / max(n, 1)


async def _until(check: Any, child: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        if child.poll() is not None:
            raise RuntimeError(f"the operator exited with {child.returncode} (try --verbose)")
        if time.monotonic() > end:
            return
        await asyncio.sleep(0.02)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--ranks", type=int, default=1024, help="a multiple of 64 (default 1024)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--onset", type=float, default=14.0, help="fault onset, s after job start")
    p.add_argument("--after", type=float, default=10.0, help="s simulated after the onset")
    p.add_argument("--verbose", action="store_true", help="show the operator's log")
    p.add_argument(
        "--diagnosis-window",
        type=float,
        default=10.0,
        help="s of records pulled for root cause (the operator's default: 10)",
    )
    p.add_argument(
        "--json-window",
        action="store_true",
        help="agents answer /v1/window in JSON lines only (agents before the columnar form)",
    )
    p.add_argument(
        "--secure",
        choices=("off", "on", "both"),
        default="off",
        help="agents over HTTPS with TokenReview/SubjectAccessReview authorization (on), "
        "without (off, the default), or each seed both ways one after the other",
    )
    # The child process: kube URL, agent URL, metrics port, window [, CA, server name, token].
    p.add_argument("--operator", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.operator:
        kube_url, agent_url, port, window_s, *access = args.operator
        operator_main(kube_url, agent_url, int(port), float(window_s), access)
        return 0
    print(f"# .venv/bin/python bench/operator_scale.py --ranks {args.ranks} --runs {args.runs} "
          f"--onset {args.onset:g} --after {args.after:g} "
          f"--diagnosis-window {args.diagnosis_window:g}"
          f"{' --json-window' if args.json_window else ''} --secure {args.secure}")  # fmt: skip
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs ({_cpu_model()}), "
          f"Python {platform.python_version()}, "
          f"{when}")  # fmt: skip
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.secure]
    rows: dict[bool, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="collscope-bench-") as tmp:
        sec = Secure.make(tmp) if True in modes else None
        for i in range(args.runs):
            for secure in modes:
                r = asyncio.run(run_once(args, seed=i + 1, sec=sec if secure else None))
                rows[secure].append(r)
                _print_run(i, r)
    for secure, got in rows.items():
        _print_summary(args.ranks, got, "TLS + auth" if secure else "plain HTTP, no auth")
    return 0


def _print_run(i: int, r: dict[str, Any]) -> None:
    how = (f"TLS + auth, {r['TokenReview']} TokenReviews, {r['SubjectAccessReview']} SARs"
           if r["secure"] else "plain")  # fmt: skip
    print(f"run {i + 1} ({how}): trigger {r.get('created_s', float('nan')):.2f} s, Diagnosed "
          f"{r.get('diagnosed_s', float('nan')):.2f} s, Flight Recorder "
          f"{r.get('evidence_s', float('nan')):.2f} s after onset (pull + analysis "
          f"{r.get('analysis_s', float('nan')):.2f} s, of which the simulated agents "
          f"encoding {r['diagnosis_mib']:.0f} MiB: {r['diagnosis_s']:.2f} s); "
          f"{r.get('category')} rank "
          f"{r.get('culprit')} (truth {r['truth']}); watching CPU {r['cpu_pct']:.1f} %, "
          f"RSS {r['rss_mib']:.0f} MiB, peak {r.get('hwm_mib', float('nan')):.0f} MiB",
          flush=True)  # fmt: skip
    print(f"  first Diagnosis: {r.get('incident')}")
    print(f"  flightRecorder ({r.get('fr_asked')} ranks asked): {r.get('fr', '-')[:400]}")
    for note in r.get("fr_notes", [])[:3]:
        print(f"  note: {note}")


def _print_summary(ranks: int, rows: list[dict[str, Any]], how: str) -> None:
    lat = [r["diagnosed_s"] for r in rows if "diagnosed_s" in r]
    trig = [r["created_s"] for r in rows if "created_s" in r]
    print(f"\n{ranks} ranks, {how}, {len(rows)} runs: fault -> trigger median "
          f"{statistics.median(trig) if trig else float('nan'):.2f} s; hang -> Diagnosed median "
          f"{statistics.median(lat) if lat else float('nan'):.2f} s, max "
          f"{max(lat) if lat else float('nan'):.2f} s ({len(lat)}/{len(rows)} diagnosed, "
          f"{sum(r.get('culprit') == r['truth'] for r in rows)} with the right rank); operator "
          f"watching CPU median {statistics.median(r['cpu_pct'] for r in rows):.1f} % of one "
          f"core, RSS median {statistics.median(r['rss_mib'] for r in rows):.0f} MiB, peak "
          f"{max(r.get('hwm_mib', 0) for r in rows):.0f} MiB", flush=True)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
