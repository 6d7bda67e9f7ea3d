"""The one-box job with its ranks' state over TCP (``onebox.fabric``), as on a cluster.

On a cluster the ranks are in pods on different nodes and share no memory: they exchange their
chunk counters through pod 0's fabric (``onebox.workload``). This runs that same fabric under
the real operator on this machine, with one fault: the ring's data dependencies still carry
it, and the Diagnosis still names the injected rank, its node and category, with the node
cordoned exactly as the policy says (``test_onebox.py`` runs every family over shared memory).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

pytest.importorskip("kmock")
pytest.importorskip("pytest_asyncio")

from collscope.operator.domain import policy
from collscope.operator.onebox import faults

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning"),
]
E2E = Any  # conftest.E2E: conftest modules cannot be imported under --import-mode=importlib

# As test_onebox.py: seed 7 puts the fault on rank 5 of node-1; 3 s of healthy training first
# (the stall threshold's floor and the operator's discovery tick), then 25 s to remediated.
SEED = 7
HEALTHY_S = 3.0
DIAGNOSED_S = 25.0


@pytest.mark.asyncio
@pytest.mark.parametrize("onebox", ["tcp"], indirect=True)
@pytest.mark.timeout(90)
async def test_nic_down_over_the_fabric_is_diagnosed(e2e: E2E) -> None:
    inj = faults.choose(
        "nic-down", seed=SEED, ranks_by_node=e2e.box.layout.ranks_by_node(), onset_s=0.0
    )
    e2e.box.start(inj)
    fabric = e2e.box.fabric
    assert fabric is not None and fabric.joined == set(range(8))  # every rank on TCP
    assert not (e2e.box.root / "shared.bin").exists()  # and none on shared memory
    e2e.box.arm(time.time() + HEALTHY_S)  # an ARM round trip through the fabric
    e2e.cluster()
    async with e2e.operator():
        done = await e2e.harness.until(e2e.finished, timeout_s=HEALTHY_S + DIAGNOSED_S)
        st = done["status"]
        assert st.get("category") == "hang.network", st
        assert st["culpritRank"] in inj.ranks and st["culpritNode"] == inj.node, st["result"]
        threshold = policy.RemediationPolicy().confidence_threshold
        expected = float(st["result"]["confidence"]) >= threshold  # hardware: policy decides
        assert bool(e2e.node(inj.node)["spec"].get("unschedulable")) is expected, st["actions"]
        other = "node-0" if inj.node == "node-1" else "node-1"
        assert not e2e.node(other)["spec"].get("unschedulable")
        assert len(e2e.diagnoses()) == 1
