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
 */
#ifndef COLLSCOPE_INTERNAL_H
#define COLLSCOPE_INTERNAL_H

#include <pthread.h>
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

enum cs_kind {
    CS_K_DUMMY = 0xd1,
    CS_K_OP = 0xd2,
    CS_K_PROXYOP = 0xd3,
    CS_K_KERNELCH = 0xd4,
    CS_K_STEP = 0xd5,
    CS_K_KCH_EMBEDDED = 0xd6,
};

enum { CS_OPH_ACTIVE = 1, CS_OPH_DONE = 2 };

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
    uint8_t kind;               /* CS_K_OP */
    uint8_t func, algo, proto, nchannels, dtype, p2p;
    _Atomic uint8_t state;      /* CS_OPH_* */
    uint32_t pool_idx;
    int32_t peer;
    struct cs_ctx *ctx;
    struct collscope_op_slot *slot; /* live slot, NULL when all were busy */
    uint64_t serial, seq, bytes;
    int64_t start_ns;
    _Atomic int64_t refs;       /* 1 (Coll) + nChannels (KernelCh) + armed ProxyOps */
    _Atomic uint32_t flags;     /* COLLSCOPE_OPF_* learnt from children */
    _Atomic uint64_t gpu_start; /* min KernelCh start pTimer, UINT64_MAX if none */
    _Atomic uint64_t gpu_stop;  /* max KernelCh stop pTimer, 0 if none */
    struct cs_kch kch[CS_KCH_SLOTS];
} __attribute__((aligned(64)));

struct cs_step {
    uint8_t kind;               /* CS_K_STEP */
    uint8_t reserved[3];
    uint32_t step;
    struct cs_child *child;
};

struct cs_child {
    uint8_t kind;               /* CS_K_PROXYOP or CS_K_KERNELCH */
    uint8_t is_send;
    uint8_t channel;
    uint8_t armed;              /* ProxyOp: has seen a step, so it holds a ref on the op */
    uint8_t owns;               /* ProxyOp: its flow slot currently shows this op */
    uint8_t reserved[3];
    uint32_t nsteps;
    uint32_t pool_idx;
    uint64_t gpu_stop;          /* KernelCh: pTimer given with KernelChStop */
    struct cs_op *op;
    struct collscope_flow_slot *flow; /* NULL: no flow slot (table full) */
    struct cs_step steps[CS_STEP_SLOTS];
} __attribute__((aligned(64)));

/* Fixed-size pool: a claim flag per entry and a roving cursor. An entry is reused only after
 * the cursor has gone round the whole pool, which also keeps a late event on a finished op
 * from landing on a new one in practice. */
struct cs_pool {
    _Atomic uint8_t *busy;
    _Atomic uint32_t cursor;
    uint32_t n;
};

struct cs_ctx {
    uint64_t comm_hash;
    int32_t rank, nranks, nnodes;
    uint32_t api;
    uint8_t slot_index;         /* COLLSCOPE_NO_SLOT when no live slot */
    char name[COLLSCOPE_NAME_LEN];
    struct collscope_comm_slot *slot;
    _Atomic uint64_t next_serial;
    _Atomic uint64_t p2p_count[2]; /* own seq of Send / Recv */
    struct cs_pool op_pool;
    struct cs_pool child_pool;
    struct cs_op *ops;
    struct cs_child *children;
};

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

/* ---- pools ------------------------------------------------------------------------------ */

/* Claim a free entry: O(CS_POOL_PROBES), one CAS when the pool is not crowded. -1: exhausted. */
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
            cs_st(&p->cursor, i + 1);
            return (int64_t)i;
        }
    }
    return -1;
}

static inline void cs_pool_free(struct cs_pool *p, uint32_t i)
{
    atomic_store_explicit(&p->busy[i], 0, memory_order_release);
}

/* ---- clocks ----------------------------------------------------------------------------- */

static inline int64_t cs_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
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

#endif /* COLLSCOPE_INTERNAL_H */
