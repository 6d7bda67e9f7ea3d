/*
 * internal.h: private state of the collscope profiler plugin.
 *
 * Memory model. The ring file (include/collscope_ring.h) is plain structs shared with another
 * process; the plugin touches every field that can change after creation only through the
 * C11 atomic helpers below (release stores, relaxed or acquire loads), so concurrent callbacks
 * are data-race free and the reader's seqlock protocol holds.
 *
 * Handles. Every handle returned to NCCL points at a struct whose first byte is a kind tag
 * (NCCL's stop/record callbacks do not say which event they are about):
 *   cs_op     - a Coll or P2p event (one operation), from the context's op pool
 *   cs_kch    - a KernelCh event: the slot of its channel inside its cs_op
 *   cs_child  - a ProxyOp event (or a KernelCh of a channel id >= 64), from the child pool
 *   cs_step   - a ProxyStep event: one of the 8 slots embedded in its ProxyOp's cs_child
 *   cs_dummy  - the static handle answered to Group and v5 API events
 * All memory is allocated at init; the hot path only claims and releases pool entries.
 *
 * The proxy thread ("owner"). NCCL emits every KernelCh event of a communicator, and every
 * ProxyOp/ProxyStep event of its own connections, from the communicator's proxy progress
 * thread (notes §3); only PXN ProxyOps of another rank in the same process arrive on another
 * thread. The first thread that starts a KernelCh event of a context becomes its owner
 * (ctx->owner, set once). The owner touches its own state with plain (relaxed load/store)
 * updates, never a locked instruction, which on x86 also drains the store buffer and was most
 * of a hot callback's cost; every other thread uses atomic read-modify-writes on separate
 * fields. What the owner does:
 *   - claims ProxyOp handles from its own half of the child pool (no CAS);
 *   - counts KernelCh / ProxyOp starts and stops in the op slot's plain fields (the others
 *     count in the `_other` twins, collscope_ring.h version 2), and keeps the op's GPU time
 *     bounds (gpu_start / gpu_stop) with plain compare-and-store;
 *   - holds the op's child references in op->local (biased reference counting): op->refs
 *     (atomic) holds 1 for the Coll stop, 1 for the owner's group while op->local > 0, and 1
 *     per ProxyOp armed on another thread. op->local starts at nChannels (the KernelCh events,
 *     which come from the owner) and counts the owner's armed ProxyOps; only its 1 -> 0 and
 *     0 -> 1 transitions touch op->refs. Whoever drops op->refs to 0 completes the op.
 *   Should NCCL ever emit a KernelCh stop on another thread, that thread decrements op->local
 *   with an atomic RMW and counts header.kernel_foreign_events: exact as long as the owner is
 *   not updating the same op at that instant (it cannot be, if NCCL still has one thread per
 *   communicator for KernelCh; the counter says whether that assumption broke).
 */
#ifndef COLLSCOPE_INTERNAL_H
#define COLLSCOPE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "collscope_ring.h"
#include "nccl_profiler_abi.h"

#define CS_HIDDEN __attribute__((visibility("hidden")))
#define CS_LIKELY(x) __builtin_expect(!!(x), 1)
#define CS_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define COLLSCOPE_PLUGIN_VERSION "0.1.0"

/* The events we ask NCCL for. NCCL starts the ancestors (Group, and in v5 GroupApi/CollApi/
 * P2pApi) on its own when a descendant is enabled; ProxyCtrl and NetPlugin stay off. */
#define CS_ACTIVATION_MASK \
    (ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep | \
     ncclProfileKernelCh)

/* NCCL_STEPS: at most 8 ProxySteps of one ProxyOp are in flight (notes §4). */
#define CS_STEP_SLOTS 8u
/* Per-communicator handle pools. Ops in flight per comm are few (the host enqueues a handful
 * ahead of the GPU); children = ProxyOps + KernelCh of those ops: channels x peers x dirs. */
#define CS_OP_POOL 256u
#define CS_CHILD_POOL 2048u
/* KernelCh handles live inside their op, one per channel id below this (NCCL MAXCHANNELS is
 * 64); a higher id falls back to the child pool. */
#define CS_KCH_SLOTS 64u
/* linear probes into a pool or the flow table before giving up (keeps the hot path O(1)) */
#define CS_POOL_PROBES 16u
#define CS_FLOW_PROBES 16u
/* Flow index cache of a context: (channel, direction, peer % 4) -> flow slot, direct-mapped */
#define CS_FLOW_CACHE 512u
/* the owner's half of the child pool: [CS_CHILD_POOL / 2, CS_CHILD_POOL) */
#define CS_OWNER_POOL (CS_CHILD_POOL / 2u)

enum cs_kind {
    CS_K_DUMMY = 0xd1,
    CS_K_OP = 0xd2,
    CS_K_PROXYOP = 0xd3,
    CS_K_KERNELCH = 0xd4,
    CS_K_STEP = 0xd5,
    CS_K_KCH_EMBEDDED = 0xd6,
    CS_K_LINK = 0xd7,           /* chain.c: collscope's and the next plugin's handles */
};

enum { CS_OPH_ACTIVE = 1, CS_OPH_DONE = 2 };

/* cs_child.armed: where a ProxyOp's reference on its op is held */
enum { CS_ARM_NONE = 0, CS_ARM_SHARED = 1, CS_ARM_LOCAL = 2 };

struct cs_ctx;
struct cs_child;

struct cs_dummy {
    uint8_t kind;
};

/* A KernelCh handle embedded in its op: no pool claim on the hot path, and 2 bytes per
 * channel keep an op within a few cache lines. */
struct cs_kch {
    uint8_t kind;               /* CS_K_KCH_EMBEDDED */
    uint8_t channel;            /* index in cs_op.kch: recovers the op from the handle */
};

struct cs_op {
    /* line 0: read by every child event */
    uint8_t kind;               /* CS_K_OP */
    uint8_t func, algo, proto, nchannels, dtype, p2p;
    _Atomic uint8_t state;      /* CS_OPH_* */
    uint32_t pool_idx;
    int32_t peer;
    struct cs_ctx *ctx;
    struct collscope_op_slot *slot; /* live slot, NULL when all were busy */
    _Atomic int64_t refs;       /* shared references (see the top of this file) */
    _Atomic int64_t local;      /* the owner's references: plain updates by the owner */
    _Atomic uint32_t flags;     /* COLLSCOPE_OPF_* learnt from children */
    uint32_t reserved;
    _Atomic uint64_t gpu_start; /* min KernelCh start pTimer, UINT64_MAX if none */
    /* line 1 */
    _Atomic uint64_t gpu_stop;  /* max KernelCh stop pTimer, 0 if none */
    uint64_t serial, seq, bytes;
    int64_t start_ns;
    struct cs_kch kch[CS_KCH_SLOTS];
} __attribute__((aligned(64)));

/* 8 bytes: its ProxyOp is found from its index, like a KernelCh handle's op */
struct cs_step {
    uint8_t kind;               /* CS_K_STEP */
    uint8_t index;              /* in cs_child.steps */
    uint16_t reserved;
    uint32_t step;
};

/* The first 16 bytes of a cs_child, written in one go by a ProxyOp start. */
struct cs_child_head {
    uint8_t kind;               /* CS_K_PROXYOP or CS_K_KERNELCH */
    uint8_t is_send;
    uint8_t channel;
    uint8_t armed;              /* ProxyOp: CS_ARM_*; a stepped ProxyOp holds a ref on its op */
    uint8_t owns;               /* ProxyOp: its flow slot currently shows this op */
    uint8_t reserved[3];
    uint32_t nsteps;
    uint32_t pool_idx;
};

/* Two cache lines: the handle, then its 8 step handles. */
struct cs_child {
    uint8_t kind;               /* CS_K_PROXYOP or CS_K_KERNELCH */
    uint8_t is_send;
    uint8_t channel;
    uint8_t armed;              /* ProxyOp: CS_ARM_*; a stepped ProxyOp holds a ref on its op */
    uint8_t owns;               /* ProxyOp: its flow slot currently shows this op */
    uint8_t reserved[3];
    uint32_t nsteps;
    uint32_t pool_idx;
    uint64_t gpu_stop;          /* KernelCh: pTimer given with KernelChStop */
    struct cs_op *op;
    struct collscope_flow_slot *flow; /* NULL: no flow slot (table full) */
    struct cs_step steps[CS_STEP_SLOTS] __attribute__((aligned(64)));
} __attribute__((aligned(64)));
_Static_assert(sizeof(struct cs_child) == 128, "a ProxyOp handle is two cache lines");
_Static_assert(offsetof(struct cs_child, pool_idx) == offsetof(struct cs_child_head, pool_idx) &&
                   offsetof(struct cs_child, owns) == offsetof(struct cs_child_head, owns),
               "cs_child_head is the start of cs_child");
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "cs_proxy_op_start packs struct cs_child_head little-endian"
#endif
_Static_assert(COLLSCOPE_FLOWS_PER_COMM < 255, "flow cache entries hold index + 1 in a byte");

/* Fixed-size pool: a claim flag per entry and a roving cursor. An entry is reused only after
 * the cursor has gone round the whole pool, which also keeps a late event on a finished op
 * from landing on a new one in practice. */
struct cs_pool {
    _Atomic uint8_t *busy;      /* n flags, entry i of the pool is busy[i] */
    uint32_t base;              /* pool index of busy[0] */
    uint32_t n;                 /* a power of two */
    _Atomic uint32_t cursor __attribute__((aligned(64))); /* its own line: no false sharing */
};

/* Per communicator. Fields written on the hot path by different threads (host: op pool
 * cursor and serials; proxy threads: child pool cursors) sit on separate cache lines. */
struct cs_ctx {
    uint64_t comm_hash;
    int32_t rank, nranks, nnodes;
    uint32_t api;
    uint8_t slot_index;         /* COLLSCOPE_NO_SLOT when no live slot */
    struct collscope_comm_slot *slot;
    struct cs_op *ops;
    struct cs_child *children;
    _Atomic uintptr_t owner;    /* cs_thread_id() of the proxy thread, 0 until known */
    char name[COLLSCOPE_NAME_LEN];
    _Atomic uint64_t next_serial __attribute__((aligned(64)));
    _Atomic uint64_t p2p_count[2]; /* own seq of Send / Recv */
    struct cs_pool op_pool;     /* host thread */
    struct cs_pool child_pool;  /* children of non-owner threads: claimed by CAS */
    struct cs_pool owner_pool;  /* children of the owner: claimed with plain stores */
    /* flow slot index by (channel, direction, peer % 4): (key << 8) | (index + 1), 0 empty.
     * A flow slot's key never changes while the context lives, so an entry whose key matches
     * is right; a miss (or a collision) takes the hashed lookup in the ring and refills. */
    _Atomic uint64_t flow_cache[CS_FLOW_CACHE] __attribute__((aligned(64)));
} __attribute__((aligned(64)));

/* Process-wide state. Set under cs_g.lock at the first successful init, read without the
 * lock by callbacks of contexts created afterwards. */
struct cs_global {
    pthread_mutex_t lock;
    int ring_tried;             /* ring creation attempted (success or not) */
    pid_t pid;
    struct collscope_ring_header *hdr; /* NULL: plugin is a no-op */
    union collscope_event *events;
    uint64_t event_count;
    size_t map_bytes;
    char path[512];
    int comms_open;
    int hb_running;
    int hb_stop;
    pthread_t hb_thread;
    pthread_cond_t hb_cond;
    int max_api;
    /* CLOCK_REALTIME refreshed every CS_TICK_MS by the heartbeat thread, read by the hot path
     * instead of calling the clock (0: thread not running, call the vDSO coarse clock) */
    _Atomic int64_t coarse_now;
    /* CLOCK_REALTIME from the CPU's counter (cs_now), calibrated by the heartbeat thread on
     * every tick: realtime = base_ns + ((counter - base_tick) * mult) >> 32, valid while
     * counter - base_tick < max_delta (100 ms). seq: seqlock, 0 = never published. Only
     * used when the kernel itself keeps time with that counter (tsc / arch_sys_counter). */
    int counter_ok;
    _Atomic uint32_t clk_seq __attribute__((aligned(64)));
    _Atomic uint64_t clk_base_tick;
    _Atomic int64_t clk_base_ns;
    _Atomic uint64_t clk_mult;
    _Atomic uint64_t clk_max_delta;
};

#define CS_TICK_MS 10u
_Static_assert(COLLSCOPE_HEARTBEAT_INTERVAL_MS % CS_TICK_MS == 0, "heartbeat is whole ticks");

CS_HIDDEN extern struct cs_global cs_g;
CS_HIDDEN extern struct cs_dummy cs_dummy_handle;

/* ---- atomics on plain ring fields ------------------------------------------------------- */

_Static_assert(sizeof(_Atomic uint64_t) == 8 && _Alignof(_Atomic uint64_t) == 8, "atomic u64");
_Static_assert(sizeof(_Atomic uint32_t) == 4 && _Alignof(_Atomic uint32_t) == 4, "atomic u32");
_Static_assert(sizeof(_Atomic uint8_t) == 1, "atomic u8");

#define CS_A64(p) ((_Atomic uint64_t *)(void *)(p))
#define CS_AI64(p) ((_Atomic int64_t *)(void *)(p))
#define CS_A32(p) ((_Atomic uint32_t *)(void *)(p))
#define CS_AI32(p) ((_Atomic int32_t *)(void *)(p))
#define CS_A8(p) ((_Atomic uint8_t *)(void *)(p))

/* Every store to a ring field is a release store: the seqlock writer needs its data stores
 * ordered after the odd sequence value, and a release store gives that without a fence
 * (ThreadSanitizer does not model fences). On x86 it is a plain mov either way. */
#define cs_st(a, v) atomic_store_explicit((a), (v), memory_order_release)
#define cs_ld(a) atomic_load_explicit((a), memory_order_relaxed)
#define cs_add(a, v) atomic_fetch_add_explicit((a), (v), memory_order_relaxed)

static inline void cs_count(uint64_t *counter)
{
    cs_add(CS_A64(counter), 1);
}

static inline void cs_max_u64(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = cs_ld(a);
    while (v > cur &&
           !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

static inline void cs_min_u64(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = cs_ld(a);
    while (v < cur &&
           !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

/* seqlock writer (one writer at a time per slot; see the reader protocol in the ring header) */
static inline void cs_seq_begin(uint32_t *seqlock)
{
    uint32_t s = cs_ld(CS_A32(seqlock));
    atomic_store_explicit(CS_A32(seqlock), s + 1, memory_order_relaxed);
    /* the data stores that follow are release stores (cs_st): none can become visible
     * before this odd value */
}

static inline void cs_seq_end(uint32_t *seqlock)
{
    uint32_t s = cs_ld(CS_A32(seqlock));
    atomic_store_explicit(CS_A32(seqlock), s + 1, memory_order_release);
}

/* The same pair for the hot path: the writer knows the value it stored (it is the only
 * writer), so the end needs no second load. */
static inline uint32_t cs_seq_open(uint32_t *seqlock)
{
    uint32_t s = cs_ld(CS_A32(seqlock)) + 1;
    atomic_store_explicit(CS_A32(seqlock), s, memory_order_relaxed);
    return s;
}

static inline void cs_seq_close(uint32_t *seqlock, uint32_t odd)
{
    atomic_store_explicit(CS_A32(seqlock), odd + 1, memory_order_release);
}

/* ---- pools ------------------------------------------------------------------------------ */

/* Claim a free entry: O(CS_POOL_PROBES), one CAS when the pool is not crowded. Returns the
 * pool index (base + i), -1: exhausted. */
static inline int64_t cs_pool_alloc(struct cs_pool *p)
{
    uint32_t c = cs_ld(&p->cursor);
    for (uint32_t k = 0; k < CS_POOL_PROBES; k++) {
        uint32_t i = (c + k) & (p->n - 1);
        uint8_t expected = 0;
        if (cs_ld(&p->busy[i]) == 0 &&
            atomic_compare_exchange_strong_explicit(&p->busy[i], &expected, 1,
                                                    memory_order_acquire,
                                                    memory_order_relaxed)) {
            atomic_store_explicit(&p->cursor, i + 1, memory_order_relaxed);
            return (int64_t)(p->base + i);
        }
    }
    return -1;
}

/* The same for a pool that only one thread claims from (the owner's; n and base are that
 * pool's, given as constants by CS_OWNER_ALLOC): a free entry can only
 * become busy through this thread, so load-then-store claims it. The acquire load pairs with
 * the release store of cs_pool_free (possibly by another thread), ordering the previous
 * user's writes to the entry before ours. */
static inline int64_t cs_pool_alloc_single(struct cs_pool *p, uint32_t n, uint32_t base)
{
    uint32_t c = cs_ld(&p->cursor);
    for (uint32_t k = 0; k < CS_POOL_PROBES; k++) {
        uint32_t i = (c + k) & (n - 1);
        if (atomic_load_explicit(&p->busy[i], memory_order_acquire) == 0) {
            atomic_store_explicit(&p->busy[i], 1, memory_order_relaxed);
            atomic_store_explicit(&p->cursor, i + 1, memory_order_relaxed);
            return (int64_t)(base + i);
        }
    }
    return -1;
}

/* the owner's half of a context's child pool (size and base are constants) */
#define CS_OWNER_ALLOC(ctx) \
    cs_pool_alloc_single(&(ctx)->owner_pool, CS_CHILD_POOL - CS_OWNER_POOL, CS_OWNER_POOL)

/* i: the pool index returned by the alloc */
static inline void cs_pool_free(struct cs_pool *p, uint32_t i)
{
    atomic_store_explicit(&p->busy[i - p->base], 0, memory_order_release);
}

/* ---- threads ---------------------------------------------------------------------------- */

/* A value unique to each live thread, one instruction on x86-64 and aarch64 (%fs base /
 * tpidr_el0: the thread's control block). */
static inline uintptr_t cs_thread_id(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__aarch64__))
    return (uintptr_t)__builtin_thread_pointer();
#else
    return (uintptr_t)pthread_self();
#endif
}

/* ---- clocks ----------------------------------------------------------------------------- */

static inline int64_t cs_now_sys(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#if defined(__x86_64__)
#define CS_HAVE_COUNTER 1
static inline uint64_t cs_counter(void)
{
    return __builtin_ia32_rdtsc();
}
#elif defined(__aarch64__)
#define CS_HAVE_COUNTER 1
static inline uint64_t cs_counter(void)
{
    uint64_t v;
    __asm__ volatile("mrs %0, cntvct_el0" : "=r"(v));
    return v;
}
#else
#define CS_HAVE_COUNTER 0
static inline uint64_t cs_counter(void)
{
    return 0;
}
#endif

/* Precise CLOCK_REALTIME (op start and completion times). The vDSO clock_gettime costs
 * 30-70 ns (it orders the counter read against everything before it); reading the counter
 * and scaling it with the heartbeat thread's calibration costs a few ns and tracks the same
 * clock, NTP slewing included (re-based every 10 ms; error well below a microsecond). Falls
 * back to clock_gettime before the first calibration, when the calibration is older than
 * 100 ms, or when the counter is not the kernel's clocksource. */
static inline int64_t cs_now(void)
{
#if CS_HAVE_COUNTER
    uint32_t s = atomic_load_explicit(&cs_g.clk_seq, memory_order_acquire);
    if (CS_LIKELY(s != 0 && (s & 1u) == 0)) {
        uint64_t bt = atomic_load_explicit(&cs_g.clk_base_tick, memory_order_acquire);
        int64_t bn = atomic_load_explicit(&cs_g.clk_base_ns, memory_order_acquire);
        uint64_t m = atomic_load_explicit(&cs_g.clk_mult, memory_order_acquire);
        uint64_t max = atomic_load_explicit(&cs_g.clk_max_delta, memory_order_acquire);
        uint64_t d = cs_counter() - bt;
        if (CS_LIKELY(atomic_load_explicit(&cs_g.clk_seq, memory_order_relaxed) == s &&
                      d < max)) {
            return bn + (int64_t)(uint64_t)(((unsigned __int128)d * m) >> 32);
        }
    }
#endif
    return cs_now_sys();
}

/* Hot path time for last-progress stamps: one load of the ticking time (resolution
 * CS_TICK_MS, published as header.coarse_res_ns). Even the vDSO coarse clock costs ~7 ns,
 * which is most of a ProxyStep callback's budget. */
static inline int64_t cs_now_coarse(void)
{
    int64_t t = atomic_load_explicit(&cs_g.coarse_now, memory_order_relaxed);
    if (CS_LIKELY(t != 0)) {
        return t;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- ring.c ----------------------------------------------------------------------------- */
CS_HIDDEN int cs_ring_open(ncclDebugLogger_t logfn);
CS_HIDDEN void cs_ring_append(const union collscope_event *ev);
CS_HIDDEN int cs_heartbeat_start(void);
CS_HIDDEN void cs_heartbeat_stop(void);
CS_HIDDEN void cs_ring_forget_after_fork(void);
CS_HIDDEN void cs_log_once(ncclDebugLogger_t logfn, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
CS_HIDDEN void cs_copy_str(char *dst, size_t cap, const char *src);

/* ---- comm.c ----------------------------------------------------------------------------- */
CS_HIDDEN ncclResult_t cs_init_common(void **context, int *mask, const char *name, uint64_t hash,
                                      int nnodes, int nranks, int rank, ncclDebugLogger_t logfn,
                                      int api);
CS_HIDDEN ncclResult_t cs_finalize(void *context);

/* ---- names.c ---------------------------------------------------------------------------- */
CS_HIDDEN uint8_t cs_func_id(const char *s);
CS_HIDDEN uint8_t cs_algo_id(const char *s);
CS_HIDDEN uint8_t cs_proto_id(const char *s);
CS_HIDDEN uint8_t cs_dtype_id(const char *s);
CS_HIDDEN uint32_t cs_dtype_size(uint8_t dtype);

/* ---- events.c: version-neutral event handling ------------------------------------------- */
struct cs_op_descr {
    uint64_t seq;
    const char *func;
    const char *datatype;
    const char *algo;
    const char *proto;
    size_t count;
    int peer;
    uint8_t nchannels;
    uint8_t p2p;
};

CS_HIDDEN void *cs_op_start(struct cs_ctx *ctx, const struct cs_op_descr *d);
CS_HIDDEN void *cs_proxy_op_start(struct cs_ctx *ctx, void *parent, pid_t pid, int channel,
                                  int peer, int nsteps, int is_send);
CS_HIDDEN void *cs_proxy_step_start(void *parent, int step);
CS_HIDDEN void *cs_kernel_ch_start(void *parent, int channel, uint64_t ptimer);
CS_HIDDEN ncclResult_t cs_stop_event(void *handle);
CS_HIDDEN ncclResult_t cs_record_state(void *handle, ncclProfilerEventState_t state,
                                       ncclProfilerEventStateArgs_t *args);

/* ---- plugin.c: the per-version adapters, also called by chain.c ------------------------ */
CS_HIDDEN ncclResult_t cs_init_v4(void **context, int *mask, const char *name, uint64_t hash,
                                  int nnodes, int nranks, int rank, ncclDebugLogger_t logfn);
CS_HIDDEN ncclResult_t cs_init_v5(void **context, uint64_t comm_id, int *mask,
                                  const char *name, int nnodes, int nranks, int rank,
                                  ncclDebugLogger_t logfn);
CS_HIDDEN ncclResult_t cs_init_v6(void **context, uint64_t comm_id, int *mask,
                                  const char *name, int nnodes, int nranks, int rank,
                                  ncclDebugLogger_t logfn);
CS_HIDDEN ncclResult_t cs_start_v4(void *context, void **handle, ncclProfilerEventDescr_v4_t *d);
CS_HIDDEN ncclResult_t cs_start_v5(void *context, void **handle, ncclProfilerEventDescr_v5_t *d);
CS_HIDDEN ncclResult_t cs_start_v6(void *context, void **handle, ncclProfilerEventDescr_v6_t *d);
CS_HIDDEN int cs_is_own_table(const void *table);

/* ---- chain.c: forwarding to COLLSCOPE_NEXT_PROFILER_PLUGIN ------------------------------ */
CS_HIDDEN int cs_chain_setup(void);
CS_HIDDEN ncclResult_t cs_chain_init_v4(void **context, int *mask, const char *name,
                                        uint64_t hash, int nnodes, int nranks, int rank,
                                        ncclDebugLogger_t logfn);
CS_HIDDEN ncclResult_t cs_chain_init_v5(void **context, uint64_t comm_id, int *mask,
                                        const char *name, int nnodes, int nranks, int rank,
                                        ncclDebugLogger_t logfn);
CS_HIDDEN ncclResult_t cs_chain_init_v6(void **context, uint64_t comm_id, int *mask,
                                        const char *name, int nnodes, int nranks, int rank,
                                        ncclDebugLogger_t logfn);
CS_HIDDEN ncclResult_t cs_chain_start_v4(void *context, void **handle,
                                         ncclProfilerEventDescr_v4_t *d);
CS_HIDDEN ncclResult_t cs_chain_start_v5(void *context, void **handle,
                                         ncclProfilerEventDescr_v5_t *d);
CS_HIDDEN ncclResult_t cs_chain_start_v6(void *context, void **handle,
                                         ncclProfilerEventDescr_v6_t *d);
CS_HIDDEN ncclResult_t cs_chain_stop(void *handle);
CS_HIDDEN ncclResult_t cs_chain_record(void *handle, ncclProfilerEventState_t state,
                                       ncclProfilerEventStateArgs_t *args);
CS_HIDDEN ncclResult_t cs_chain_finalize(void *context);

#endif /* COLLSCOPE_INTERNAL_H */
