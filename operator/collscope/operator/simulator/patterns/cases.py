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

Two properties of real jobs that every case can be given (issue 17: found on independent
campaigns, both raised alarms on healthy jobs):

- *pipeline roles* (``pp`` > 1): the workers form ``pp`` stages of contiguous ranks (Megatron's
  order tp-cp-ep-dp-pp varies pp slowest). Only the first stage runs the embedding kernels and
  the data loader, only the last the LM head's loss kernels (``STAGE_FUNCTIONS``: those workers
  have rows for them, the others none), and the last stage's GEMMs carry the LM head too
  (β x ``LAST_STAGE_GEMM``);
- *a realistic spread of sigma* (``sigma_cv``): sigma is a standard deviation estimated from a
  window of utilisation samples, so from worker to worker it spreads far more than β or μ; it
  is drawn lognormal with this coefficient of variation (the default keeps the 5 % above).
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
# fn, kind, beta, mu, sigma, stage ("first" or "last"): run by one pipeline stage only
STAGE_FUNCTIONS: tuple[tuple[str, str, float, float, float, str], ...] = (
    (
        "indexSelectLargeIndex<c10::BFloat16, long, unsigned int>",
        "kernel",
        0.03,
        0.85,
        0.06,
        "first",
    ),
    ("embedding_backward_feature_kernel<c10::BFloat16>", "kernel", 0.02, 0.80, 0.08, "first"),
    ("torch/utils/data/dataloader.py(631): __next__", "python", 0.004, 0.50, 0.10, "first"),
    ("cunn_SoftMaxForward<4, c10::BFloat16, float>", "kernel", 0.04, 0.88, 0.05, "last"),
    ("cunn_SoftMaxBackward<4, c10::BFloat16, float>", "kernel", 0.03, 0.86, 0.06, "last"),
)
LAST_STAGE_GEMM = 1.15  # the LM head's GEMMs on the last stage: more GEMM time there

F64 = npt.NDArray[np.float64]
Bool = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Patterns:
    """beta/mu/sigma as (workers, functions) matrices, plus the case's ground truth.

    ``fns`` names the columns (name, kind); ``present[w, f]`` is False where worker w does not
    run f at all (no row in functions.jsonl; its beta/mu/sigma there are 0).
    """

    beta: F64
    mu: F64
    sigma: F64
    culprit_ranks: tuple[int, ...]
    culprit_fns: tuple[str, ...]
    expected_category: str | None
    detail: str
    fns: tuple[tuple[str, str], ...] = tuple((f[0], f[1]) for f in FUNCTIONS)
    present: Bool | None = None  # None: every worker runs every function
    pp: int = 1

    def rows(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], F64, F64, F64]:
        """(rank, fn index, beta, mu, sigma) of every row functions.jsonl has, worker-major."""
        w, f = self.beta.shape
        keep = np.ones((w, f), dtype=bool) if self.present is None else self.present
        r, c = np.nonzero(keep)
        return r, c, self.beta[r, c], self.mu[r, c], self.sigma[r, c]


def stage_of(workers: int, pp: int) -> npt.NDArray[np.int64]:
    """Pipeline stage of each worker: contiguous blocks (pp varies slowest)."""
    return np.arange(workers) * pp // workers


def healthy(
    workers: int, rng: np.random.Generator, sigma_cv: float = NOISE_CV[2]
) -> tuple[F64, F64, F64]:
    base = np.array([f[2:] for f in FUNCTIONS], dtype=np.float64)  # (fns, 3)
    cols = []
    for d in range(3):
        noise = 1.0 + NOISE_CV[d] * rng.standard_normal((workers, len(FUNCTIONS)))
        if d == 2 and sigma_cv != NOISE_CV[2]:
            s = float(np.sqrt(np.log1p(sigma_cv**2)))  # lognormal with this CV, mean 1
            noise = np.exp(s * rng.standard_normal((workers, len(FUNCTIONS))) - s * s / 2)
        cols.append(np.clip(base[:, d] * noise, 0.0, 1.0))
    beta, mu, sigma = cols
    beta[:, SENDRECV] = rng.uniform(0.09, 0.16, workers)  # §6.2: SendRecv β spreads
    return beta, mu, sigma


def generate(
    case: str, workers: int, seed: int, *, pp: int = 1, sigma_cv: float = NOISE_CV[2]
) -> Patterns:
    """The patterns of ``case`` on ``workers`` workers (see module docstring)."""
    if case not in CASES:
        raise ValueError(f"unknown pattern case {case!r}; one of {', '.join(CASES)}")
    if workers < 16:
        raise ValueError(f"a pattern case needs at least 16 workers (got {workers})")
    if pp < 1 or workers < 4 * pp:
        raise ValueError(f"pp must be in [1, workers / 4] (got {pp} for {workers} workers)")
    rng = np.random.default_rng([seed, 7])
    beta, mu, sigma = healthy(workers, rng, sigma_cv)
    work = np.ones(workers)  # load-imbalance: each worker's kernel work, stage kernels too
    if pp > 1:
        last = stage_of(workers, pp) == pp - 1
        beta[last, GEMM] = np.clip(beta[last, GEMM] * LAST_STAGE_GEMM, 0.0, 1.0)
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
        work = factor / 1.23
        for k in kernels:
            beta[:, k] = np.clip(beta[:, k] * work, 0, 1)
        busy = beta[:, kernels].sum(axis=1)  # the most GPU computation
        top = np.argsort(-busy)[: max(1, round(0.05 * workers))]
        ranks = tuple(sorted(int(r) for r in top))
        fns = tuple(FUNCTIONS[k][0] for k in kernels)
        category, detail = "slow.host", "uneven work per worker (β x U[1, 1.46]), same μ"
    if pp == 1:
        return Patterns(beta, mu, sigma, ranks, fns, category, detail)
    return _with_stages(Patterns(beta, mu, sigma, ranks, fns, category, detail), pp, rng, work)


def _with_stages(p: Patterns, pp: int, rng: np.random.Generator, work: F64) -> Patterns:
    """``p`` plus the stage-only functions, present on their stage's workers only.

    ``work``: each worker's kernel-work factor (load-imbalance), applied to stage kernels too.
    """
    workers = p.beta.shape[0]
    stage = stage_of(workers, pp)
    cols: list[list[F64]] = [[p.beta], [p.mu], [p.sigma]]
    present = [np.ones(p.beta.shape, dtype=bool)]
    for _, kind, b, m, s, where in STAGE_FUNCTIONS:
        on = stage == (0 if where == "first" else pp - 1)
        for d, (base, cv) in enumerate(zip((b, m, s), NOISE_CV, strict=True)):
            x: F64 = np.multiply(1.0 + cv * rng.standard_normal(workers), base)
            if d == 0 and kind == "kernel":
                x = x * work
            x = np.clip(x, 0.0, 1.0)
            cols[d].append(np.where(on, x, 0.0)[:, None])
        present.append(on[:, None])
    beta, mu, sigma = (np.hstack(c) for c in cols)
    return Patterns(
        beta,
        mu,
        sigma,
        p.culprit_ranks,
        p.culprit_fns,
        p.expected_category,
        p.detail + f"; {pp} pipeline stages",
        fns=p.fns + tuple((f[0], f[1]) for f in STAGE_FUNCTIONS),
        present=np.hstack(present),
        pp=pp,
    )
