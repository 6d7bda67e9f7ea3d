"""Hardware in the live path (issue 14 items 1-2), end to end on the one-box: the agents
sample the simulated GPUs and HCAs (``onebox.hardware``) and map each rank to its own, the
operator's live window carries those samples with the rank of the device's user, and the live
Diagnosis names the culprit's GPU (index and UUID) and NIC, with the NIC's link-down sample as
evidence. The operator's trigger loop and analysis run without Kubernetes (``onebox.watch``).
"""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from collscope.nodeagent import api
from collscope.operator.controller import trigger_loop
from collscope.operator.domain import settings
from collscope.operator.onebox import box, faults, watch

pytestmark = [pytest.mark.slow]
SEED = 7  # puts nic-down on rank 5 of node-1 (faults.choose): GPU 1 and mlx5_1 of node-1
HEALTHY_S = 3.0  # the hang trigger's 1.5 s floor plus a discovery tick (test_onebox.py)
# The operator as in tests/e2e/conftest.py's FAST: a 1 s tick, rediscovery every second.
CONFIG = settings.Settings(
    trigger=settings.TriggerLoopSettings(interval_s=1.0, window_s=5.0, rediscover_s=1.0),
    agents=settings.AgentSettings(timeout_s=1.0, retries=0),
)


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_live_diagnosis_names_gpu_and_nic_from_the_hardware_in_the_window(
    onebox: box.OneBox,
) -> None:
    lay = onebox.layout
    inj = faults.choose("nic-down", seed=SEED, ranks_by_node=lay.ranks_by_node(), onset_s=0.0)
    (culprit,) = inj.ranks
    local = culprit % lay.ranks_per_node
    onebox.start(inj)
    onebox.arm(time.time() + HEALTHY_S)

    # The device map on the node: every rank on its own GPU (NVML's process list) and the HCA
    # beside it (PCI topology).
    async with httpx.AsyncClient(timeout=2.0) as client:
        got = await client.get(f"{onebox.agent_url(inj.node)}/v1/ranks")
    ranks = {x.rank: x for x in api.RanksResponse.model_validate_json(got.content).ranks}
    for r in lay.ranks_by_node()[inj.node]:
        x = ranks[r]
        i = r % lay.ranks_per_node
        assert (x.gpu_index, x.gpu_source, x.nic, x.nic_source, x.unresolved) == (
            i, "nvml", f"mlx5_{i}", "pci", "",
        ), x  # fmt: skip
        assert x.gpu_uuid and x.gpu_pci_bus_id == f"0000:{2 * i + 1:02x}:00.0"

    urls = {n: onebox.agent_url(n) for n in lay.node_names()}
    state = watch.operator_state(lay, urls, onebox.uids, CONFIG)
    try:
        out = await watch.watch(state, lay, duration_s=HEALTHY_S + 25)
    finally:
        await trigger_loop.close_clients(state)
    assert out.result is not None and out.bundle is not None, out
    d = out.result
    assert d.category == "hang.network", d
    top = d.culprits[0]
    assert (top.rank, top.node, top.pod, top.gpu, top.nic) == (
        culprit, inj.node, lay.pod_of(culprit), local, f"mlx5_{local}",
    ), d  # fmt: skip
    assert top.gpu_uuid == ranks[culprit].gpu_uuid
    assert any("link down" in e for e in d.evidence), d.evidence

    # The window the Diagnosis was made from: every node's hardware records, each device's
    # with the rank that uses it; the culprit's port reports its link down.
    b = out.bundle
    hw = b.hw
    dev, metric = b.string_index(f"mlx5_{local}/1"), b.string_index("nic_link_up")
    node = b.string_index(inj.node)
    mine = hw[(hw["device"] == dev) & (hw["metric"] == metric) & (hw["node"] == node)]
    assert len(mine) > 0 and set(mine["rank"].tolist()) == {culprit}
    assert float(mine["value"][np.argmax(mine["ts"])]) == 0.0
    for n, node_ranks in lay.ranks_by_node().items():
        on_node = hw[hw["node"] == b.string_index(n)]
        assert set(on_node["rank"].tolist()) == set(node_ranks), n
