"""Function-level diagnosis on a live job, end to end (issue 18): the one-box ranks (the real
plugin, real agents, the real operator against kmock) run with the dormant probe injected as
the webhook does (``rank.probe_env``); one rank's data loader is slow on purpose
(``Timing.slow_loader_rank``); ``collscope.dev/profile=now`` on the TrainingJob arms every rank
through the agents, and the Diagnosis written from the profiles names that rank and
``load_batch``. A healthy job profiled the same way has no function culprit.

By itself, the issue's main case: rank 5's loader turns slow mid-run (``LATE_FACTOR``, enough
to more than double every rank's iteration: a loader only a third slower, as above, opens no
verdict, since the trigger counts a slowdown from throughput halved or operation intervals
doubled). Rank 5 arrives late at every AllReduce, so the verdict is ``slow.compute`` naming rank
5; the operator profiles the job by itself, no annotation set by hand, and adds the function
(``functions: ...``) to that Diagnosis: rank 5's ``load_batch``. And proxy-delay's slow.host
verdict (no hardware fault) likewise gets rank 5's stalled proxy function.

Plain Python functions (no torch): the probe samples Python stacks whatever the workload.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("kmock")
pytest.importorskip("pytest_asyncio")

from collscope.operator.controller import profile_handlers, profiling
from collscope.operator.onebox import box, faults, rank

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning"),
]
E2E = Any  # conftest.E2E
# As tests/e2e/conftest.py's LAYOUT (E2E.cluster writes its pods): 2 nodes x 4 ranks.
LAYOUT = box.Layout(nodes=2, ranks_per_node=4, job="onebox")
TJ = "job-onebox"
SLOW = 5  # a rank on node-1, its loader 8x slower (40 ms a batch instead of 5)
# The auto case's loader: 200 ms a batch, against an iteration of ~65 ms (5 ms loader, 30 ms
# compute, the AllReduce), so every rank's operation interval grows about 4x.
LATE_FACTOR = 40.0
# The function the probe names for the loader: its innermost four frames, outermost first (the
# rank runs as ``python -m``, so its module is ``__main__``).
LOADER_FN = "__main__.main;__main__.Rank.train;__main__.Rank.load_batch;__main__.Rank._sleep"
PROXY_FN = ";".join(
    f"__main__.Rank.{f}" for f in ("allreduce", "_advance", "_proxy_stall", "_sleep")
)
# Discovery (1 s ticks), the 10 s window, the probes' 0.5 s poll, one pull: ~15 s on 2 cores.
PROFILED_S = profiling.WINDOW_S + 30.0


@pytest.fixture
def onebox(
    plugin: pathlib.Path, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> Iterator[box.OneBox]:
    """conftest's one-box with ``request.param`` as the slow loader's rank (-1: none) and its
    factor (default 8)."""
    slow, factor = getattr(request, "param", (-1, 8.0))
    # 5 ms a batch; the slow rank's 40 ms adds about a third to its iteration.
    timing = rank.Timing(loader_s=0.005, slow_loader_rank=slow, slow_loader_factor=factor)
    b = box.OneBox(LAYOUT, tmp_path / "box", plugin, seed=7, timing=timing)
    try:
        yield b
    finally:
        b.close()


async def annotate(e2e: E2E, value: str) -> None:
    """``kubectl annotate trainingjob job-onebox collscope.dev/profile=<value>``."""
    h = e2e.harness
    url = f"{h.url}/apis/collscope.dev/v1alpha1/namespaces/{h.NS}/trainingjobs/{TJ}"
    patch = {"metadata": {"annotations": {profile_handlers.ANNOTATION: value}}}
    async with httpx.AsyncClient() as client:
        resp = await client.patch(
            url, json=patch, headers={"Content-Type": "application/merge-patch+json"}
        )
        resp.raise_for_status()


def profiled(e2e: E2E) -> dict[str, Any] | None:
    for d in e2e.diagnoses():
        labels = (d.get("metadata") or {}).get("labels") or {}
        if profile_handlers.LABEL in labels and (d.get("status") or {}).get("phase"):
            return dict(d)
    return None


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "onebox", [(SLOW, 8.0), (-1, 8.0)], indirect=True, ids=["slow-loader", "healthy"]
)
@pytest.mark.timeout(PROFILED_S + 60)
async def test_profile_annotation(e2e: E2E, onebox: box.OneBox) -> None:
    slow = onebox.timing.slow_loader_rank
    onebox.start(None)
    e2e.cluster()
    async with e2e.operator():
        await e2e.harness.until(lambda: e2e.tj_status().get("rankCount") == 8, 30)
        await annotate(e2e, "now")
        d = await e2e.harness.until(lambda: profiled(e2e), PROFILED_S)
        result = d["status"]["result"]
        named = [(c["rank"], c["function"]) for c in result["culprits"] if c.get("function")]
        text = "\n".join(result["evidence"])
        assert "not profiled" not in text, text  # every rank's probe answered
        if slow < 0:
            assert named == [], text
            return
        assert named and named[0] == (slow, LOADER_FN), (named, text)
        line = next(e for e in result["evidence"] if e.startswith(f"rank {slow}: "))
        assert line.startswith(f"rank {slow}: {LOADER_FN} β ") and "median worker" in line, line


# A slowdown's trigger needs healthy ticks first (test_onebox's HEALTHY_S for slowdowns), then
# ~5 s to its Diagnosis (three slow ticks) and the profiling's window after it.
HEALTHY_S = 5.0
AUTO_S = HEALTHY_S + 25.0 + PROFILED_S


def functions_added(e2e: E2E) -> dict[str, Any] | None:
    for d in e2e.diagnoses():
        result = (d.get("status") or {}).get("result") or {}
        if any(e.startswith("functions: ") for e in result.get("evidence", [])):
            return dict(d)
    return None


@pytest.mark.asyncio
@pytest.mark.timeout(AUTO_S + 60)
async def test_a_host_side_slow_verdict_is_profiled_by_itself(e2e: E2E, onebox: box.OneBox) -> None:
    """proxy-delay (Mycroft #7) gives slow.host, no hardware fault: the operator profiles the
    job by itself and adds what it found to that Diagnosis (``functions: ...``)."""
    inj = faults.choose("proxy-delay", seed=7, ranks_by_node=LAYOUT.ranks_by_node(), onset_s=0.0)
    onebox.start(inj)
    onebox.arm(time.time() + HEALTHY_S)
    e2e.cluster()
    async with e2e.operator():
        d = await e2e.harness.until(lambda: functions_added(e2e), AUTO_S)
        tj = e2e.harness.obj(e2e.harness.TJ, TJ) or {}
        asked = tj["metadata"]["annotations"][profile_handlers.ANNOTATION]
        assert asked == profile_handlers.AUTO_PREFIX + d["metadata"]["name"]
        # One: the probe armed on every rank slows the iterations (on 2 loaded cores, to half
        # the throughput); that slowdown is collscope's own and opens no Diagnosis of its own
        # (trigger_loop.slow_incident).
        assert d["spec"]["trigger"] == "slow" and len(e2e.diagnoses()) == 1
        text = "\n".join(d["status"]["result"]["evidence"])
        assert "not profiled" not in text, text
        # The stalled proxy (the fault) is the function named on its rank.
        result = d["status"]["result"]
        named = [(c["rank"], c["function"]) for c in result["culprits"] if c.get("function")]
        assert result["category"] == "slow.host" and named[0] == (5, PROXY_FN), (named, text)
        assert f"functions: rank 5: {PROXY_FN} β " in text, text


def verdicts(e2e: E2E) -> list[dict[str, Any]]:
    """The Diagnoses whose analysis wrote its verdict."""
    return [d for d in e2e.diagnoses() if (d.get("status") or {}).get("result")]


@pytest.mark.asyncio
@pytest.mark.parametrize("onebox", [(SLOW, LATE_FACTOR)], indirect=True, ids=["late-loader"])
@pytest.mark.timeout(AUTO_S + 60)
async def test_a_late_ranks_slow_verdict_is_profiled_by_itself(
    e2e: E2E, onebox: box.OneBox
) -> None:
    """Rank 5's loader turns slow after a healthy start: slow.compute on rank 5, then, with no
    annotation set by hand, the operator profiles the job and names rank 5's loader."""
    onebox.arm(time.time() + 3600)  # the loader is slow from the onset only: none yet
    onebox.start(None)
    onebox.arm(time.time() + HEALTHY_S)
    e2e.cluster()
    async with e2e.operator():
        first = await e2e.harness.until(lambda: verdicts(e2e), AUTO_S)
        verdict_s = time.monotonic()
        d = await e2e.harness.until(lambda: functions_added(e2e), AUTO_S)
        print(f"slow verdict to function culprit: {time.monotonic() - verdict_s:.1f} s")
        assert d["metadata"]["name"] == first[0]["metadata"]["name"]
        tj = e2e.harness.obj(e2e.harness.TJ, TJ) or {}
        asked = tj["metadata"]["annotations"][profile_handlers.ANNOTATION]
        assert asked == profile_handlers.AUTO_PREFIX + d["metadata"]["name"]
        st = d["status"]
        result = st["result"]
        assert (d["spec"]["trigger"], result["category"]) == ("slow", "slow.compute"), result
        assert result["culprits"][0]["rank"] == SLOW, result
        named = [(c["rank"], c["function"]) for c in result["culprits"] if c.get("function")]
        text = "\n".join(result["evidence"])
        print(named, text, sep="\n")
        assert "not profiled" not in text, text
        assert named[0] == (SLOW, LOADER_FN), (named, text)
        assert {r for r, _ in named} == {SLOW}, named
        # The functions are written first, then status.profiling (two patches): wait for the
        # profiling to end, not for any state (it says Running until that second patch).
        profiled = await e2e.harness.until(
            lambda: (p := (e2e.harness.obj(e2e.harness.DIAG, d["metadata"]["name"]) or {})
                     .get("status", {}).get("profiling") or {}).get("state") in ("Done", "Failed")
            and p, 10
        )  # fmt: skip
        assert (profiled["state"], profiled["reason"]) == ("Done", "FunctionFound"), profiled
        assert profiled["ranksProfiled"] == LAYOUT.world
