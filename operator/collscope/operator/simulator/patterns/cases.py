"""The case studies of EROICA (§6.1, §6.2, Appendix A) as synthetic per-worker patterns.

Every worker runs the same functions (``FUNCTIONS``: GEMM and attention kernels, SendRecv and
AllGather, host-to-device copies, pin_memory, and a few Python functions) with (β, μ, sigma) drawn
around a healthy base with a few percent of noise; a case then changes some workers:

- ``healthy``: nothing (no function may be flagged);
- ``nic-down`` (§6.2 P2, §3): one ring of up to 40 workers spends more time in SendRecv (β
  0.20-0.23 vs 0.09-0.16); its members wait on the slow link, so their utilisation is lower
  and fluctuates (μ 0.62, sigma 0.30), while the worker on the downgraded NIC has low μ with low
  sigma (0.30, 0.04): the culprit;
- ``gc`` (§6.1 P3): asynchronous garbage collection: 4 % random workers (at least 3) spend
  3-10 % of the window in one of two unrelated Python functions;
- ``gpu-throttle`` (Appendix A P1): 12 % of the workers, whole hosts, run every kernel 1.5x
  longer (β) at 0.6x the SM clock (μ);
- ``pin-memory`` (§6.2 P3): three random workers spend 23-33 % in pin_memory;
- ``load-imbalance`` (§6.2 P4): every worker's kernels do a different amount of work (β x U[1,
  1.46]) at the same μ; the culprits are the busiest 5 % (most kernel β in all).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

CASES: tuple[str, ...] = (
    "healthy",
    "nic-down",
    "gc",
    "gpu-throttle",
    "pin-memory",
    "load-imbalance",
)
GPUS_PER_NODE = 8

# fn, kind, beta, mu, sigma of a healthy worker
FUNCTIONS: tuple[tuple[str, str, float, float, float], ...] = (
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "kernel", 0.42, 0.92, 0.04),
    ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "kernel", 0.14, 0.90, 0.05),
    ("chunk_cat_cuda_kernel<float, c10::BFloat16>", "kernel", 0.05, 0.88, 0.05),
    ("ncclDevKernel_SendRecv", "comm", 0.12, 0.85, 0.10),
    ("ncclDevKernel_AllGather_RING_LL", "comm", 0.06, 0.80, 0.12),
    ("Memcpy HtoD (Pinned -> Device)", "memory", 0.012, 0.70, 0.10),
    ("pin_memory", "memory", 0.003, 0.60, 0.10),
    ("socket.py(705): recv_into", "python", 0.003, 0.30, 0.10),
    ("torch/autograd/grad_mode.py(75): __init__", "python", 0.001, 0.90, 0.05),
    (
        "torch/distributed/fsdp/_flat_param.py(1923): _get_unflat_views_unaligned",
        "python",
        0.001,
        0.90,
        0.05,
    ),
    ("train.py(88): train_step;model.py(120): forward", "python", 0.005, 0.95, 0.03),
)
FN = {name: i for i, (name, *_) in enumerate(FUNCTIONS)}
GEMM, SENDRECV, PIN, GRADMODE, FLATPARAM = 0, 3, 6, 8, 9
NOISE_CV = (0.03, 0.03, 0.05)  # relative noise of beta, mu, sigma on healthy workers

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Patterns:
    """beta/mu/sigma as (workers, functions) matrices, plus the case's ground truth."""

    beta: F64
    mu: F64
    sigma: F64
    culprit_ranks: tuple[int, ...]
    culprit_fns: tuple[str, ...]
    expected_category: str | None
    detail: str


def healthy(workers: int, rng: np.random.Generator) -> tuple[F64, F64, F64]:
    base = np.array([f[2:] for f in FUNCTIONS], dtype=np.float64)  # (fns, 3)
    cols = []
    for d in range(3):
        noise = 1.0 + NOISE_CV[d] * rng.standard_normal((workers, len(FUNCTIONS)))
        cols.append(np.clip(base[:, d] * noise, 0.0, 1.0))
    beta, mu, sigma = cols
    beta[:, SENDRECV] = rng.uniform(0.09, 0.16, workers)  # §6.2: SendRecv β spreads
    return beta, mu, sigma


def generate(case: str, workers: int, seed: int) -> Patterns:
    """The patterns of ``case`` on ``workers`` workers (see module docstring)."""
    if case not in CASES:
        raise ValueError(f"unknown pattern case {case!r}; one of {', '.join(CASES)}")
    if workers < 16:
        raise ValueError(f"a pattern case needs at least 16 workers (got {workers})")
    rng = np.random.default_rng([seed, 7])
    beta, mu, sigma = healthy(workers, rng)
    ranks: tuple[int, ...] = ()
    fns: tuple[str, ...] = ()
    category: str | None = None
    detail = "no fault"
    if case == "nic-down":
        size = min(40, max(8, workers // 85))
        ring = rng.choice(workers, size=size, replace=False)
        culprit = int(ring[0])
        beta[ring, SENDRECV] = rng.uniform(0.20, 0.23, size)
        mu[ring, SENDRECV] = 0.62 * (1 + 0.03 * rng.standard_normal(size))
        sigma[ring, SENDRECV] = 0.30 * (1 + 0.05 * rng.standard_normal(size))
        mu[culprit, SENDRECV], sigma[culprit, SENDRECV] = 0.30, 0.04
        ranks, fns, category = (culprit,), (FUNCTIONS[SENDRECV][0],), "slow.network"
        detail = f"NIC of rank {culprit} at half bandwidth; {size - 1} ring peers wait on it"
    elif case == "gc":
        n = max(3, round(0.04 * workers))
        hit = rng.choice(workers, size=n, replace=False)
        which = np.where(rng.random(n) < 0.5, GRADMODE, FLATPARAM)
        beta[hit, which] = rng.uniform(0.03, 0.10, n)
        ranks = tuple(sorted(int(r) for r in hit))
        fns = tuple(sorted({FUNCTIONS[int(w)][0] for w in which}))
        category, detail = "slow.host", f"asynchronous GC on {n} random workers"
    elif case == "gpu-throttle":
        nodes = max(1, workers // GPUS_PER_NODE)
        picked = rng.choice(nodes, size=max(1, round(0.12 * nodes)), replace=False)
        hit = np.concatenate(
            [np.arange(p * GPUS_PER_NODE, (p + 1) * GPUS_PER_NODE) for p in picked]
        )
        hit = hit[hit < workers]
        kernels = [i for i, f in enumerate(FUNCTIONS) if f[1] == "kernel"]
        for k in kernels:
            beta[hit, k] = np.clip(beta[hit, k] * 1.5, 0, 1)
            mu[hit, k] *= 0.6
        ranks = tuple(sorted(int(r) for r in hit))
        fns = tuple(FUNCTIONS[k][0] for k in kernels)
        category, detail = "slow.compute", f"{len(hit)} GPUs on {len(picked)} hosts throttled"
    elif case == "pin-memory":
        hit = rng.choice(workers, size=3, replace=False)
        beta[hit, PIN] = rng.uniform(0.23, 0.33, 3)
        ranks, fns = tuple(sorted(int(r) for r in hit)), (FUNCTIONS[PIN][0],)
        category, detail = "slow.host", "pin_memory in ultra-high frequency on 3 workers"
    elif case == "load-imbalance":
        factor = rng.uniform(1.0, 1.46, workers)
        kernels = [i for i, f in enumerate(FUNCTIONS) if f[1] == "kernel"]
        for k in kernels:
            beta[:, k] = np.clip(beta[:, k] * factor / 1.23, 0, 1)
        busy = beta[:, kernels].sum(axis=1)  # the most GPU computation
        top = np.argsort(-busy)[: max(1, round(0.05 * workers))]
        ranks = tuple(sorted(int(r) for r in top))
        fns = tuple(FUNCTIONS[k][0] for k in kernels)
        category, detail = "slow.host", "uneven work per worker (β x U[1, 1.46]), same μ"
    return Patterns(beta, mu, sigma, ranks, fns, category, detail)
