/*
 * comm.c: communicator init and finalize (not on the hot path; serialised by cs_g.lock).
 *
 * Init never fails (notes §1: a failing init makes NCCL 2.28+ double-decrement its plugin
 * refcount): on any problem it logs once, sets *context = NULL and returns ncclSuccess, and
 * every callback accepts a NULL context or handle. The activation mask is written only when a
 * context is returned, so a process whose ring could not be created profiles nothing.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

_Static_assert((CS_OP_POOL & (CS_OP_POOL - 1)) == 0, "op pool size is a power of two");
_Static_assert((CS_CHILD_POOL & (CS_CHILD_POOL - 1)) == 0, "child pool size is a power of two");

static struct collscope_comm_slot *comm_slots(void)
{
    return (struct collscope_comm_slot *)((char *)cs_g.hdr + COLLSCOPE_COMM_REGION_OFFSET);
}

/* Prefer a never-used slot, then the finalized one that closed first (keeps recent
 * post-mortem state the longest). */
static int claim_comm_slot(void)
{
    struct collscope_comm_slot *slots = comm_slots();
    int best = -1;
    int64_t best_fin = INT64_MAX;
    for (unsigned i = 0; i < COLLSCOPE_COMM_SLOTS; i++) {
        uint32_t st = cs_ld(CS_A32(&slots[i].state));
        if (st == COLLSCOPE_COMM_FREE) {
            return (int)i;
        }
        if (st == COLLSCOPE_COMM_FINALIZED) {
            int64_t fin = cs_ld(CS_AI64(&slots[i].finalize_ns));
            if (fin < best_fin) {
                best_fin = fin;
                best = (int)i;
            }
        }
    }
    return best;
}

static void reset_slot(struct collscope_comm_slot *s, const struct cs_ctx *ctx, int64_t now)
{
    cs_seq_begin(&s->seqlock);
    cs_st(CS_A32(&s->state), COLLSCOPE_COMM_ACTIVE);
    cs_st(CS_A64(&s->comm_hash), ctx->comm_hash);
    cs_st(CS_AI32(&s->rank), ctx->rank);
    cs_st(CS_AI32(&s->nranks), ctx->nranks);
    cs_st(CS_AI32(&s->nnodes), ctx->nnodes);
    cs_st(CS_A32(&s->profiler_api), ctx->api);
    cs_st(CS_AI64(&s->init_ns), now);
    cs_st(CS_AI64(&s->finalize_ns), 0);
    cs_st(CS_A32(&s->generation), cs_ld(CS_A32(&s->generation)) + 1);
    for (size_t i = 0; i < sizeof(s->name); i++) {
        cs_st(CS_A8(&s->name[i]), (uint8_t)ctx->name[i]);
    }
    cs_st(CS_A64(&s->ops_started), 0);
    cs_st(CS_A64(&s->ops_completed), 0);
    cs_st(CS_AI64(&s->last_progress_ns), now);
    cs_st(CS_AI64(&s->last_completion_ns), 0);
    for (unsigned f = 0; f < COLLSCOPE_FUNC_COUNT; f++) {
        cs_st(CS_A64(&s->enqueued[f]), 0);
        cs_st(CS_A64(&s->completed[f]), 0);
    }
    for (unsigned i = 0; i < COLLSCOPE_OPS_PER_COMM; i++) {
        struct collscope_op_slot *o = &s->ops[i];
        cs_seq_begin(&o->seqlock);
        cs_st(CS_A32(&o->state), COLLSCOPE_OP_EMPTY);
        cs_seq_end(&o->seqlock);
    }
    for (unsigned i = 0; i < COLLSCOPE_FLOWS_PER_COMM; i++) {
        struct collscope_flow_slot *f = &s->flows[i];
        cs_seq_begin(&f->seqlock);
        cs_st(CS_A8(&f->dir), COLLSCOPE_DIR_NONE);
        cs_st(CS_A8(&f->state), COLLSCOPE_FLOW_FREE);
        cs_st(CS_A64(&f->key), 0);
        cs_seq_end(&f->seqlock);
    }
    cs_seq_end(&s->seqlock);
}

static void comm_record(const struct cs_ctx *ctx, uint8_t type, int64_t now)
{
    union collscope_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.comm.type = type;
    ev.comm.profiler_api = (uint8_t)ctx->api;
    ev.comm.comm_slot = ctx->slot_index;
    ev.comm.comm_hash = ctx->comm_hash;
    ev.comm.rank = ctx->rank;
    ev.comm.nranks = ctx->nranks;
    ev.comm.nnodes = ctx->nnodes;
    ev.comm.time_ns = now;
    cs_copy_str(ev.comm.name, sizeof(ev.comm.name), ctx->name);
    cs_ring_append(&ev);
}

static void free_ctx(struct cs_ctx *ctx)
{
    free(ctx->op_pool.busy);
    free(ctx->child_pool.busy);  /* the owner pool's flags are the second half */
    free(ctx->ops);
    free(ctx->children);
    free(ctx);
}

static struct cs_ctx *alloc_ctx(void)
{
    /* 64-byte aligned: the fields different threads write sit on lines of their own, and no
     * other allocation shares them (false sharing between communicators' threads) */
    struct cs_ctx *ctx = aligned_alloc(64, sizeof(*ctx));
    if (ctx == NULL) {
        return NULL;
    }
    memset(ctx, 0, sizeof(*ctx));
    ctx->op_pool.n = CS_OP_POOL;
    ctx->child_pool.n = CS_CHILD_POOL - CS_OWNER_POOL;
    ctx->owner_pool.n = CS_CHILD_POOL - CS_OWNER_POOL;
    ctx->owner_pool.base = CS_OWNER_POOL;
    /* busy flags: whole cache lines, so that no other allocation shares them */
    ctx->op_pool.busy = aligned_alloc(64, CS_OP_POOL);
    ctx->child_pool.busy = aligned_alloc(64, CS_CHILD_POOL);
    ctx->ops = aligned_alloc(64, CS_OP_POOL * sizeof(struct cs_op));
    ctx->children = aligned_alloc(64, CS_CHILD_POOL * sizeof(struct cs_child));
    if (ctx->op_pool.busy == NULL || ctx->child_pool.busy == NULL || ctx->ops == NULL ||
        ctx->children == NULL) {
        free_ctx(ctx);
        return NULL;
    }
    for (unsigned i = 0; i < CS_OP_POOL; i++) {
        atomic_init(&ctx->op_pool.busy[i], 0);
    }
    for (unsigned i = 0; i < CS_CHILD_POOL; i++) {
        atomic_init(&ctx->child_pool.busy[i], 0);
    }
    ctx->owner_pool.busy = ctx->child_pool.busy + CS_OWNER_POOL;
    /* pool entries are fully written when claimed; no need to touch (and commit) them now */
    return ctx;
}

ncclResult_t cs_init_common(void **context, int *mask, const char *name, uint64_t hash,
                            int nnodes, int nranks, int rank, ncclDebugLogger_t logfn, int api)
{
    if (context == NULL) {
        return ncclSuccess;
    }
    *context = NULL;
    pthread_mutex_lock(&cs_g.lock);
    if (!cs_g.ring_tried) {
        cs_g.ring_tried = 1;
        cs_g.pid = getpid();
        if (cs_ring_open(logfn) != 0) {
            cs_g.hdr = NULL;
        }
    }
    struct collscope_ring_header *h = cs_g.hdr;
    if (h == NULL) {
        pthread_mutex_unlock(&cs_g.lock);
        return ncclSuccess;
    }
    struct cs_ctx *ctx = alloc_ctx();
    if (ctx == NULL) {
        cs_log_once(logfn, CS_NCCL_LOG_WARN,
                    "collscope: out of memory for communicator %016llx; not profiled",
                    (unsigned long long)hash);
        pthread_mutex_unlock(&cs_g.lock);
        return ncclSuccess;
    }
    int64_t now = cs_now_sys();
    ctx->comm_hash = hash;
    ctx->rank = rank;
    ctx->nranks = nranks;
    ctx->nnodes = nnodes;
    ctx->api = (uint32_t)api;
    cs_copy_str(ctx->name, sizeof(ctx->name), name);
    int si = claim_comm_slot();
    if (si < 0) {
        ctx->slot_index = COLLSCOPE_NO_SLOT;
        ctx->slot = NULL;
        cs_count(&h->comm_slots_exhausted);
    } else {
        ctx->slot_index = (uint8_t)si;
        ctx->slot = &comm_slots()[si];
        reset_slot(ctx->slot, ctx, now);
    }
    if (api > cs_g.max_api) {
        cs_g.max_api = api;
        cs_st(CS_A32(&h->profiler_api), (uint32_t)api);
    }
    cs_g.comms_open++;
    cs_st(CS_A64(&h->comms_open), (uint64_t)cs_g.comms_open);
    cs_count(&h->comms_total);
    cs_st(CS_A32(&h->state), COLLSCOPE_RING_STATE_ACTIVE);
    comm_record(ctx, COLLSCOPE_EV_COMM_INIT, now);
    if (cs_heartbeat_start() != 0) {
        cs_log_once(logfn, CS_NCCL_LOG_INFO, "collscope: no heartbeat thread; continuing");
    }
    if (mask != NULL) {
        /* NCCL reads its process-wide mask with atomic loads */
        atomic_store_explicit((_Atomic int *)(void *)mask, CS_ACTIVATION_MASK,
                              memory_order_relaxed);
    }
    pthread_mutex_unlock(&cs_g.lock);
    *context = ctx;
    return ncclSuccess;
}

ncclResult_t cs_finalize(void *context)
{
    struct cs_ctx *ctx = context;
    if (ctx == NULL) {
        return ncclSuccess;
    }
    pthread_mutex_lock(&cs_g.lock);
    struct collscope_ring_header *h = cs_g.hdr;
    int64_t now = cs_now_sys();
    if (ctx->slot != NULL) {
        struct collscope_comm_slot *s = ctx->slot;
        cs_seq_begin(&s->seqlock);
        cs_st(CS_AI64(&s->finalize_ns), now);
        cs_st(CS_A32(&s->state), COLLSCOPE_COMM_FINALIZED);
        cs_seq_end(&s->seqlock);
    }
    comm_record(ctx, COLLSCOPE_EV_COMM_FINALIZE, now);
    cs_g.comms_open--;
    cs_st(CS_A64(&h->comms_open), (uint64_t)cs_g.comms_open);
    if (cs_g.comms_open == 0) {
        cs_heartbeat_stop();
        cs_st(CS_A32(&h->state), COLLSCOPE_RING_STATE_IDLE);
    }
    pthread_mutex_unlock(&cs_g.lock);
    /* NCCL finalizes after the comm's proxy thread is gone: no handle of ctx is used again */
    free_ctx(ctx);
    return ncclSuccess;
}
