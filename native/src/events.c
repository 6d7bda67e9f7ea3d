/*
 * events.c: version-neutral handling of Coll/P2p, ProxyOp, ProxyStep and KernelCh events.
 *
 * Completion (notes §3): Coll/P2p stop only means "enqueued". An op is complete when all of
 * its children are: the op holds 1 reference for its own Coll stop, 1 per channel for the
 * KernelCh events NCCL will emit (nChannels), and 1 per ProxyOp once that ProxyOp has seen
 * its first step ("armed"). ProxyOps of non-network proxies are started but never stepped nor
 * stopped, so arming on the first step keeps them from holding the op forever; a network
 * ProxyOp always steps before the GPU can finish the channel (the GPU waits on the proxy's
 * buffer credits / received data), so it is armed before the last KernelCh stops. The child
 * whose release drops the count to zero stamps the end time and writes the completion record
 * (Mycroft §4.2 completion log).
 *
 * Live counters (Mycroft §4.2 real-time state log; CCL-D §5.1 per-channel send/recv counts):
 * per (channel, peer, direction) flow slot, each counter = highest step index + 1 that reached
 * the state (notes §4). Steps move through the states in order, so this equals counting each
 * state once per step, and repeats (SendPeerWait is recorded on every isend retry; a recv step
 * can be started twice) cost nothing: the value does not grow, nothing is written.
 *
 * Hot path (ProxyOp, ProxyStep, KernelCh): no locks, no allocation, no syscall besides the
 * vDSO clock, O(1). Only the child whose stop completes an op reads the precise clock and
 * appends to the ring. On the communicator's proxy thread (the owner, internal.h) the hot
 * callbacks execute no locked instruction except a few per op (the owner's group reference
 * drop, the op's KERNEL / PROXY flags, the completion); other threads (PXN) use atomic
 * read-modify-writes.
 *
 * Memory ordering. Ring fields are written with release stores (a plain mov on x86) so that
 * the seqlock writes are ordered; op->refs uses acq_rel so that the thread completing an op
 * sees every write of the threads that dropped their references before it. The owner's plain
 * updates of op->local and of the op slot's own-thread counters need no ordering of their
 * own: they have one writer, and they reach the completer through the owner's acq_rel drop of
 * its group reference. Counters only read by the ring reader (op slot counts, header
 * counters) are relaxed: each is an independent monotonic value (reader protocol §1).
 */
#include <stddef.h>
#include <string.h>

#include "internal.h"

struct cs_dummy cs_dummy_handle = {CS_K_DUMMY};

static struct collscope_ring_header *hdr(void)
{
    return cs_g.hdr;
}

/* ---- live op slots ------------------------------------------------------------------------ */

static struct collscope_op_slot *claim_op_slot(struct collscope_comm_slot *cs, uint64_t serial)
{
    for (unsigned k = 0; k < COLLSCOPE_OPS_PER_COMM; k++) {
        struct collscope_op_slot *o = &cs->ops[(serial + k) % COLLSCOPE_OPS_PER_COMM];
        uint32_t st = cs_ld(CS_A32(&o->state));
        if (st != COLLSCOPE_OP_EMPTY && st != COLLSCOPE_OP_DONE) {
            continue;
        }
        if (atomic_compare_exchange_strong_explicit(CS_A32(&o->state), &st,
                                                    COLLSCOPE_OP_CLAIMING,
                                                    memory_order_acquire,
                                                    memory_order_relaxed)) {
            return o;
        }
    }
    return NULL;
}

static void publish_op_slot(struct collscope_op_slot *o, const struct cs_op *op)
{
    cs_seq_begin(&o->seqlock);
    cs_st(CS_A64(&o->serial), op->serial);
    cs_st(CS_A64(&o->seq), op->seq);
    cs_st(CS_A64(&o->bytes), op->bytes);
    cs_st(CS_AI64(&o->start_ns), op->start_ns);
    cs_st(CS_AI64(&o->end_ns), 0);
    cs_st(CS_A8(&o->func), op->func);
    cs_st(CS_A8(&o->algo), op->algo);
    cs_st(CS_A8(&o->proto), op->proto);
    cs_st(CS_A8(&o->nchannels), op->nchannels);
    cs_st(CS_A8(&o->dtype), op->dtype);
    cs_st(CS_A8(&o->flags), op->p2p ? COLLSCOPE_OPF_P2P : 0);
    cs_st(CS_AI32(&o->peer), op->peer);
    cs_st(CS_A32(&o->kch_started), 0);
    cs_st(CS_A32(&o->kch_done), 0);
    cs_st(CS_A32(&o->proxy_ops_started), 0);
    cs_st(CS_A32(&o->proxy_ops_done), 0);
    cs_st(CS_A32(&o->kch_started_other), 0);
    cs_st(CS_A32(&o->kch_done_other), 0);
    cs_st(CS_A32(&o->proxy_ops_started_other), 0);
    cs_st(CS_A32(&o->proxy_ops_done_other), 0);
    cs_st(CS_AI64(&o->last_progress_ns), op->start_ns);
    cs_seq_end(&o->seqlock);
    atomic_store_explicit(CS_A32(&o->state), COLLSCOPE_OP_ACTIVE, memory_order_release);
}

/* ---- Coll / P2p ---------------------------------------------------------------------------- */

void *cs_op_start(struct cs_ctx *ctx, const struct cs_op_descr *d)
{
    if (ctx == NULL) {
        return NULL;
    }
    int64_t idx = cs_pool_alloc(&ctx->op_pool);
    if (idx < 0) {
        cs_count(&hdr()->handles_exhausted);
        cs_count(&hdr()->events_dropped);
        return NULL;
    }
    struct cs_op *op = &ctx->ops[idx];
    op->kind = CS_K_OP;
    op->pool_idx = (uint32_t)idx;
    op->ctx = ctx;
    op->func = cs_func_id(d->func);
    op->algo = cs_algo_id(d->algo);
    op->proto = cs_proto_id(d->proto);
    op->dtype = cs_dtype_id(d->datatype);
    op->nchannels = d->nchannels;
    op->p2p = d->p2p;
    op->peer = d->p2p ? d->peer : -1;
    op->bytes = (uint64_t)d->count * cs_dtype_size(op->dtype);
    op->serial = cs_add(&ctx->next_serial, 1);
    if (d->p2p) {
        /* NCCL gives P2p no sequence number: count this rank's own Sends / Recvs */
        op->seq = cs_add(&ctx->p2p_count[op->func == COLLSCOPE_FUNC_RECV ? 1 : 0], 1);
    } else {
        op->seq = d->seq;
    }
    op->start_ns = cs_now();
    /* the owner holds the KernelCh references; the shared count holds the Coll stop's and,
     * while the owner holds any, one for the owner's group */
    atomic_init(&op->local, (int64_t)d->nchannels);
    atomic_init(&op->refs, 1 + (d->nchannels > 0 ? 1 : 0));
    atomic_init(&op->flags, d->p2p ? COLLSCOPE_OPF_P2P : 0u);
    atomic_init(&op->gpu_start, UINT64_MAX);
    atomic_init(&op->gpu_stop, 0);
    op->slot = NULL;

    struct collscope_comm_slot *cs = ctx->slot;
    if (cs != NULL) {
        cs_add(CS_A64(&cs->ops_started), 1);
        cs_max_u64(CS_A64(&cs->enqueued[op->func & (COLLSCOPE_FUNC_COUNT - 1)]), op->seq + 1);
        cs_st(CS_AI64(&cs->last_progress_ns), op->start_ns);
        op->slot = claim_op_slot(cs, op->serial);
        if (op->slot != NULL) {
            publish_op_slot(op->slot, op);
        } else {
            cs_count(&hdr()->op_slots_busy);
        }
    }
    atomic_store_explicit(&op->state, CS_OPH_ACTIVE, memory_order_release);
    return op;
}

static void op_complete(struct cs_op *op, int64_t end, uint32_t extra)
{
    struct cs_ctx *ctx = op->ctx;
    uint32_t flags = cs_ld(&op->flags) | extra;
    uint64_t g0 = cs_ld(&op->gpu_start), g1 = cs_ld(&op->gpu_stop);
    uint32_t gpu_ns = 0;
    if (g0 != UINT64_MAX && g1 != 0 && g1 >= g0) {
        uint64_t d = g1 - g0;
        gpu_ns = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
        flags |= COLLSCOPE_OPF_GPU_TIMED;
    }

    union collscope_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.op.type = COLLSCOPE_EV_OP;
    ev.op.func = op->func;
    ev.op.algo = op->algo;
    ev.op.proto = op->proto;
    ev.op.nchannels = op->nchannels;
    ev.op.dtype = op->dtype;
    ev.op.flags = (uint8_t)flags;
    ev.op.comm_slot = ctx->slot_index;
    ev.op.comm_hash = ctx->comm_hash;
    ev.op.seq = op->seq;
    ev.op.bytes = op->bytes;
    ev.op.start_ns = op->start_ns;
    ev.op.end_ns = end;
    ev.op.peer = op->peer;
    ev.op.gpu_ns = gpu_ns;
    cs_ring_append(&ev);

    struct collscope_comm_slot *cs = ctx->slot;
    if (cs != NULL) {
        cs_add(CS_A64(&cs->ops_completed), 1);
        cs_st(CS_AI64(&cs->last_completion_ns), end);
        cs_max_u64(CS_A64(&cs->completed[op->func & (COLLSCOPE_FUNC_COUNT - 1)]), op->seq + 1);
    }
    struct collscope_op_slot *o = op->slot;
    if (o != NULL) {
        cs_seq_begin(&o->seqlock);
        cs_st(CS_AI64(&o->end_ns), end);
        cs_st(CS_A8(&o->flags), (uint8_t)flags);
        cs_seq_end(&o->seqlock);
        atomic_store_explicit(CS_A32(&o->state), COLLSCOPE_OP_DONE, memory_order_release);
    }
    atomic_store_explicit(&op->state, CS_OPH_DONE, memory_order_relaxed);
    cs_pool_free(&ctx->op_pool, op->pool_idx);
}

/* Drop one shared reference; the last one completes the op. `from_coll_stop`: the op's own
 * Coll/P2p stop, which is only the enqueue end (its time is not the completion). */
static void op_release(struct cs_op *op, int from_coll_stop)
{
    int64_t left = atomic_fetch_sub_explicit(&op->refs, 1, memory_order_acq_rel) - 1;
    if (left != 0) {
        return;
    }
    uint32_t extra = 0;
    if (from_coll_stop) {
        uint32_t f = cs_ld(&op->flags);
        extra = (f & (COLLSCOPE_OPF_KERNEL | COLLSCOPE_OPF_PROXY)) ? COLLSCOPE_OPF_END_AT_ENQUEUE
                                                                   : COLLSCOPE_OPF_NO_CHILDREN;
    }
    int64_t end = cs_now();
    /* cs_now is re-based every tick: never let that show as an end before the start */
    op_complete(op, end > op->start_ns ? end : op->start_ns, extra);
}

/* Take a shared reference unless the op has already completed (refs reached 0). */
static int op_acquire(struct cs_op *op)
{
    int64_t cur = cs_ld(&op->refs);
    while (cur > 0) {
        if (atomic_compare_exchange_weak_explicit(&op->refs, &cur, cur + 1,
                                                  memory_order_relaxed, memory_order_relaxed)) {
            return 1;
        }
    }
    return 0;
}

/* ---- the owner's references (biased reference counting, internal.h) ------------------------ */

static inline int is_owner(const struct cs_ctx *ctx)
{
    return atomic_load_explicit(&ctx->owner, memory_order_relaxed) == cs_thread_id();
}

/* The owner takes a reference: a plain increment, unless its group holds no shared reference
 * (op->local is 0: all its children were done) and must take one first. 0: op completed. */
static int local_acquire(struct cs_op *op)
{
    int64_t l = cs_ld(&op->local);
    if (CS_UNLIKELY(l <= 0)) {
        if (!op_acquire(op)) {
            return 0;
        }
        l = 0;
    }
    atomic_store_explicit(&op->local, l + 1, memory_order_relaxed);
    return 1;
}

/* The owner drops a reference; its last one drops the group's shared reference. */
static void local_release(struct cs_op *op)
{
    int64_t l = cs_ld(&op->local) - 1;
    atomic_store_explicit(&op->local, l, memory_order_relaxed);
    if (l == 0) {
        op_release(op, 0);
    }
}

/* Another thread drops one of the owner's references (a KernelCh stop off the proxy thread):
 * an atomic decrement, counted because NCCL is not expected to do this (internal.h). */
static void local_release_foreign(struct cs_op *op)
{
    cs_count(&hdr()->kernel_foreign_events);
    if (atomic_fetch_sub_explicit(&op->local, 1, memory_order_relaxed) == 1) {
        op_release(op, 0);
    }
}

/* GPU time bounds of an op: the owner (every KernelCh of a communicator, notes §3) keeps
 * them with plain compare-and-store, other threads with a CAS loop */
static inline void gpu_min(struct cs_op *op, uint64_t v, int own)
{
    if (CS_LIKELY(own)) {
        if (v < cs_ld(&op->gpu_start)) {
            atomic_store_explicit(&op->gpu_start, v, memory_order_relaxed);
        }
    } else {
        cs_min_u64(&op->gpu_start, v);
    }
}

static inline void gpu_max(struct cs_op *op, uint64_t v, int own)
{
    if (CS_LIKELY(own)) {
        if (v > cs_ld(&op->gpu_stop)) {
            atomic_store_explicit(&op->gpu_stop, v, memory_order_relaxed);
        }
    } else {
        cs_max_u64(&op->gpu_stop, v);
    }
}

/* op slot counters: the owner's plain field or the atomic `_other` twin */
static inline void count_child(uint32_t *own_field, uint32_t *other_field, int own)
{
    if (CS_LIKELY(own)) {
        cs_st(CS_A32(own_field), cs_ld(CS_A32(own_field)) + 1);
    } else {
        cs_add(CS_A32(other_field), 1);
    }
}

static inline void child_free(struct cs_ctx *ctx, struct cs_child *c)
{
    c->kind = 0;
    cs_pool_free(c->pool_idx >= CS_OWNER_POOL ? &ctx->owner_pool : &ctx->child_pool,
                 c->pool_idx);
}

/* a child event whose parent is not a live op of ours: answered with NULL */
static struct cs_op *live_op(void *parent)
{
    struct cs_op *op = parent;
    if (op == NULL || op->kind != CS_K_OP ||
        atomic_load_explicit(&op->state, memory_order_acquire) != CS_OPH_ACTIVE) {
        return NULL;
    }
    return op;
}

/* ---- flows ------------------------------------------------------------------------------- */

static uint64_t flow_key(int channel, int peer, int is_send)
{
    return ((uint64_t)(uint32_t)peer << 16) | ((uint64_t)(uint8_t)channel << 8) |
           (is_send ? COLLSCOPE_DIR_SEND : COLLSCOPE_DIR_RECV);
}

/* The flow slot of (channel, peer, direction): an open-addressed table keyed by the slot's
 * `key` word, usually found at the first probe. *fresh: the slot was claimed just now and is
 * still invisible to readers (dir NONE) until flow_claim fills it. */
static struct collscope_flow_slot *flow_lookup(struct collscope_comm_slot *cs, int channel,
                                               int peer, int is_send, int *fresh)
{
    uint64_t key = flow_key(channel, peer, is_send);
    uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 40);
    *fresh = 0;
    for (unsigned k = 0; k < CS_FLOW_PROBES; k++) {
        struct collscope_flow_slot *f = &cs->flows[(h + k) % COLLSCOPE_FLOWS_PER_COMM];
        uint64_t cur = atomic_load_explicit(CS_A64(&f->key), memory_order_acquire);
        if (cur == key) {
            return f;
        }
        if (cur == 0) {
            uint64_t expected = 0;
            if (atomic_compare_exchange_strong_explicit(CS_A64(&f->key), &expected, key,
                                                        memory_order_acq_rel,
                                                        memory_order_acquire)) {
                *fresh = 1;
                return f;
            }
            if (expected == key) {
                return f;
            }
        }
    }
    return NULL;
}

/* The flow slot of ProxyOp (channel, peer, direction) for context ctx: one load of the
 * context's direct-mapped index in the common case, the hashed table on a miss. */
static inline struct collscope_flow_slot *flow_find(struct cs_ctx *ctx,
                                                    struct collscope_comm_slot *cs, int channel,
                                                    int peer, int is_send, int *fresh)
{
    uint64_t key = flow_key(channel, peer, is_send);
    _Atomic uint64_t *e = &ctx->flow_cache[(((uint32_t)channel & 63u) << 3) |
                                           ((uint32_t)(is_send != 0) << 2) |
                                           ((uint32_t)peer & 3u)];
    uint64_t v = atomic_load_explicit(e, memory_order_relaxed);
    if (CS_LIKELY((v >> 8) == key && (v & 0xffu) != 0)) {
        *fresh = 0;
        return &cs->flows[(v & 0xffu) - 1];
    }
    struct collscope_flow_slot *f = flow_lookup(cs, channel, peer, is_send, fresh);
    if (f != NULL) {
        atomic_store_explicit(e, (key << 8) | (uint64_t)(f - cs->flows + 1),
                              memory_order_relaxed);
    }
    return f;
}

/* the step counters, inside the caller's seqlock write */
static inline void flow_zero(struct collscope_flow_slot *f)
{
    cs_st(CS_A32(&f->started), 0);
    cs_st(CS_A32(&f->c_ready_posted), 0);
    cs_st(CS_A32(&f->c_sent_done), 0);
    cs_st(CS_A32(&f->c_done_consumed), 0);
    cs_st(CS_A32(&f->c_gpu_ready), 0);
}

/* The op-dependent part of a flow slot, inside the caller's seqlock write. A QUEUED flow's
 * step counters are not written: no chunk of its op has moved, and readers take them as 0
 * (reader protocol §2, version 2); they are zeroed when the flow leaves QUEUED. That keeps
 * a ProxyOp start, which queues the flow for its op, to 4 stores into the slot. */
static inline void flow_fill(struct collscope_flow_slot *f, const struct cs_child *c,
                             uint64_t serial, uint8_t state, int64_t now)
{
    cs_st(CS_A64(&f->serial), serial);
    cs_st(CS_A8(&f->state), state);
    cs_st(CS_A32(&f->total), c->nsteps);
    if (state != COLLSCOPE_FLOW_QUEUED) {
        flow_zero(f);
    }
    cs_st(CS_AI64(&f->last_progress_ns), now);
}

/* A freshly claimed flow slot: identity and first op in one seqlock write, so a reader never
 * sees the slot with the serial of a previous communicator (collscope_ring.h, version 2). */
static void flow_claim(struct cs_child *c, int peer, const struct cs_op *op)
{
    struct collscope_flow_slot *f = c->flow;
    uint32_t sq = cs_seq_open(&f->seqlock);
    cs_st(CS_A8(&f->dir), c->is_send ? COLLSCOPE_DIR_SEND : COLLSCOPE_DIR_RECV);
    cs_st(CS_A8(&f->channel), c->channel);
    cs_st(CS_AI32(&f->peer), peer);
    flow_zero(f);  /* whatever a previous communicator left */
    flow_fill(f, c, op->serial, COLLSCOPE_FLOW_QUEUED, op->start_ns);
    cs_seq_close(&f->seqlock, sq);
    c->owns = 1;
}

/* Point the flow at this ProxyOp's op and zero its counters. Only the proxy thread that owns
 * the connection writes a flow slot (NCCL progresses a connection on one thread, in FIFO op
 * order: notes §3), so the seqlock has a single writer. */
static void flow_take(struct cs_child *c, uint64_t serial, uint8_t state, int64_t now)
{
    struct collscope_flow_slot *f = c->flow;
    uint32_t sq = cs_seq_open(&f->seqlock);
    flow_fill(f, c, serial, state, now);
    cs_seq_close(&f->seqlock, sq);
    c->owns = 1;
}

/* The flow slot to update for an event of ProxyOp c, or NULL. A newer op takes the slot over
 * from an older one when it starts moving chunks; events of an op that has been superseded
 * are counted and dropped. */
static struct collscope_flow_slot *flow_for(struct cs_child *c)
{
    struct collscope_flow_slot *f = c->flow;
    if (CS_UNLIKELY(f == NULL)) {
        return NULL;
    }
    uint64_t cur = cs_ld(CS_A64(&f->serial));
    if (CS_LIKELY(c->owns)) {
        if (CS_LIKELY(cur == c->op->serial)) {
            return f;
        }
        c->owns = 0;
    } else if (cs_ld(CS_A8(&f->state)) == COLLSCOPE_FLOW_FREE || cur < c->op->serial) {
        /* no chunk of this op has moved yet: idle since the later of the previous op's last
         * progress on this connection and this op's start (a step then stamps the time) */
        int64_t prev = cs_ld(CS_AI64(&f->last_progress_ns));
        flow_take(c, c->op->serial, COLLSCOPE_FLOW_RUNNING,
                  prev > c->op->start_ns ? prev : c->op->start_ns);
        return f;
    }
    cs_count(&hdr()->stale_flow_events);
    return NULL;
}

static inline void flow_bump(struct collscope_flow_slot *f, uint32_t *counter, uint32_t v)
{
    if (v <= cs_ld(CS_A32(counter))) {
        return;  /* repeat or out-of-order state: nothing new */
    }
    uint32_t sq = cs_seq_open(&f->seqlock);
    cs_st(CS_A32(counter), v);
    cs_st(CS_AI64(&f->last_progress_ns), cs_now_coarse());
    cs_seq_close(&f->seqlock, sq);
}

/* A ProxyOp state change is not chunk progress: last_progress_ns stays. Leaving QUEUED
 * zeroes the step counters the queued flow did not write (flow_fill). */
static void flow_set_state(struct collscope_flow_slot *f, uint8_t state)
{
    uint8_t cur = cs_ld(CS_A8(&f->state));
    if (cur == state) {
        return;
    }
    uint32_t sq = cs_seq_open(&f->seqlock);
    if (cur == COLLSCOPE_FLOW_QUEUED) {
        flow_zero(f);
    }
    cs_st(CS_A8(&f->state), state);
    cs_seq_close(&f->seqlock, sq);
}

/* ---- ProxyOp ------------------------------------------------------------------------------ */

void *cs_proxy_op_start(struct cs_ctx *ctx, void *parent, pid_t pid, int channel, int peer,
                        int nsteps, int is_send)
{
    /* PXN (notes §3): the op was created by another process; its context and parent are
     * pointers into that process. Look at nothing but the pid. */
    if (CS_UNLIKELY(pid != cs_g.pid)) {
        if (cs_g.hdr != NULL) {
            cs_count(&cs_g.hdr->pxn_foreign_events);
        }
        return NULL;
    }
    if (ctx == NULL) {
        return NULL;
    }
    struct cs_op *op = live_op(parent);
    if (op == NULL) {
        return NULL;
    }
    int own = is_owner(ctx);
    int64_t idx = -1;
    if (CS_LIKELY(own)) {
        idx = CS_OWNER_ALLOC(ctx);
    }
    if (CS_UNLIKELY(idx < 0)) {
        idx = cs_pool_alloc(&ctx->child_pool);
        if (CS_UNLIKELY(idx < 0)) {
            cs_count(&hdr()->handles_exhausted);
            return NULL;
        }
    }
    struct cs_child *c = &ctx->children[idx];
    /* the byte fields and the two counts as two 8-byte stores instead of seven (a ProxyOp
     * start is mostly stores: the handle's, then the flow slot's); little-endian order of
     * struct cs_child_head: kind, is_send, channel, armed, owns | nsteps, pool_idx */
    uint64_t w0 = (uint64_t)CS_K_PROXYOP | ((uint64_t)(is_send ? 1 : 0) << 8) |
                  ((uint64_t)(uint8_t)channel << 16) | ((uint64_t)CS_ARM_NONE << 24);
    uint64_t w1 = (uint64_t)(nsteps > 0 ? (uint32_t)nsteps : 0u) | ((uint64_t)idx << 32);
    memcpy((char *)c, &w0, 8);
    memcpy((char *)c + 8, &w1, 8);
    c->op = op;
    struct collscope_comm_slot *cs = ctx->slot;
    int fresh = 0;
    c->flow = cs != NULL ? flow_find(ctx, cs, channel, peer, is_send, &fresh) : NULL;
    if (cs != NULL) {
        if (CS_UNLIKELY(c->flow == NULL)) {
            cs_count(&hdr()->flow_slots_exhausted);
        } else if (CS_UNLIKELY(fresh)) {
            flow_claim(c, peer, op);
        } else {
            uint8_t st = cs_ld(CS_A8(&c->flow->state));
            /* a previous op still moving chunks on this connection keeps the slot until
             * this op's first step (ops on a connection run in FIFO order) */
            if (st == COLLSCOPE_FLOW_FREE || st == COLLSCOPE_FLOW_DONE) {
                /* no chunk has moved yet: idle since the op was enqueued */
                flow_take(c, op->serial, COLLSCOPE_FLOW_QUEUED, op->start_ns);
            }
        }
    }
    struct collscope_op_slot *o = op->slot;
    if (o != NULL) {
        count_child(&o->proxy_ops_started, &o->proxy_ops_started_other, own);
    }
    return c;
}

static void proxy_op_stop(struct cs_child *c)
{
    struct cs_op *op = c->op;
    struct cs_ctx *ctx = op->ctx;
    if (CS_UNLIKELY(atomic_load_explicit(&op->state, memory_order_acquire) != CS_OPH_ACTIVE)) {
        /* the op already completed (NCCL sent more children than it announced) */
        child_free(ctx, c);
        return;
    }
    int own = is_owner(ctx);
    if (c->owns && c->flow != NULL && cs_ld(CS_A64(&c->flow->serial)) == op->serial) {
        flow_set_state(c->flow, COLLSCOPE_FLOW_DONE);
    }
    struct collscope_op_slot *o = op->slot;
    if (o != NULL) {
        count_child(&o->proxy_ops_done, &o->proxy_ops_done_other, own);
    }
    uint8_t armed = c->armed;
    child_free(ctx, c);
    if (armed == CS_ARM_LOCAL) {
        if (CS_LIKELY(own)) {
            local_release(op);
        } else {
            local_release_foreign(op);
        }
    } else if (armed == CS_ARM_SHARED) {
        op_release(op, 0);
    }
}

/* ---- ProxyStep ---------------------------------------------------------------------------- */

static struct cs_child *step_child(struct cs_step *s)
{
    return (struct cs_child *)(void *)((char *)(s - s->index) - offsetof(struct cs_child, steps));
}

/* A ProxyOp's first step: from now on it holds a reference on its op until its stop (on the
 * owner in op->local, elsewhere in op->refs). */
static void proxy_op_arm(struct cs_child *c)
{
    struct cs_op *op = c->op;
    if (CS_LIKELY(is_owner(op->ctx))) {
        if (local_acquire(op)) {
            c->armed = CS_ARM_LOCAL;
        }
    } else if (op_acquire(op)) {
        c->armed = CS_ARM_SHARED;
    }
    if (c->armed != CS_ARM_NONE && !(cs_ld(&op->flags) & COLLSCOPE_OPF_PROXY)) {
        atomic_fetch_or_explicit(&op->flags, COLLSCOPE_OPF_PROXY, memory_order_relaxed);
    }
}

void *cs_proxy_step_start(void *parent, int step)
{
    struct cs_child *c = parent;
    if (c == NULL || c->kind != CS_K_PROXYOP || step < 0) {
        return NULL;
    }
    if (CS_UNLIKELY(c->armed == CS_ARM_NONE)) {
        proxy_op_arm(c);
    }
    uint32_t k = (uint32_t)step % CS_STEP_SLOTS;
    struct cs_step *s = &c->steps[k];
    s->kind = CS_K_STEP;
    s->index = (uint8_t)k;
    s->step = (uint32_t)step;
    struct collscope_flow_slot *f = flow_for(c);
    if (f != NULL) {
        if (cs_ld(CS_A8(&f->state)) == COLLSCOPE_FLOW_QUEUED) {
            flow_set_state(f, COLLSCOPE_FLOW_RUNNING);
        }
        flow_bump(f, &f->started, (uint32_t)step + 1);
    }
    return s;
}

static void proxy_step_state(struct cs_step *s, ncclProfilerEventState_t state)
{
    struct cs_child *c = step_child(s);
    if (CS_UNLIKELY(c->kind != CS_K_PROXYOP)) {
        return;
    }
    struct collscope_flow_slot *f = flow_for(c);
    if (f == NULL) {
        return;
    }
    uint32_t v = s->step + 1;
    switch (state) {
    case ncclProfilerProxyStepSendPeerWait_v4:  /* GPU data ready, waiting for the peer */
        flow_bump(f, &f->c_ready_posted, v);
        break;
    case ncclProfilerProxyStepSendWait:         /* isend accepted: on the network */
        flow_bump(f, &f->c_sent_done, v);
        break;
    case ncclProfilerProxyStepRecvWait:         /* irecv posted */
        flow_bump(f, &f->c_ready_posted, v);
        break;
    case ncclProfilerProxyStepRecvFlushWait:    /* data arrived */
        flow_bump(f, &f->c_sent_done, v);
        break;
    case ncclProfilerProxyStepRecvGPUWait:      /* flushed, handed to the GPU */
        flow_bump(f, &f->c_gpu_ready, v);
        break;
    default:                                    /* SendGPUWait: counted at start */
        break;
    }
}

static void proxy_step_stop(struct cs_step *s)
{
    struct cs_child *c = step_child(s);
    if (CS_UNLIKELY(c->kind != CS_K_PROXYOP)) {
        return;
    }
    struct collscope_flow_slot *f = flow_for(c);
    if (f != NULL) {
        /* send: network completion; recv: the GPU consumed the chunk */
        flow_bump(f, &f->c_done_consumed, s->step + 1);
    }
}

/* ---- KernelCh ----------------------------------------------------------------------------- */

/* NCCL emits every KernelCh event of a communicator from its proxy progress thread (notes §3):
 * the first thread to start one becomes the context's owner (internal.h). */
static int claim_owner(struct cs_ctx *ctx)
{
    uintptr_t me = cs_thread_id();
    uintptr_t cur = atomic_load_explicit(&ctx->owner, memory_order_relaxed);
    if (CS_UNLIKELY(cur == 0)) {
        if (atomic_compare_exchange_strong_explicit(&ctx->owner, &cur, me,
                                                    memory_order_relaxed,
                                                    memory_order_relaxed)) {
            return 1;
        }
    }
    return cur == me;
}

void *cs_kernel_ch_start(void *parent, int channel, uint64_t ptimer)
{
    struct cs_op *op = live_op(parent);
    if (op == NULL) {
        return NULL;
    }
    struct cs_ctx *ctx = op->ctx;
    int own = claim_owner(ctx);
    void *handle;
    if (CS_LIKELY((unsigned)channel < CS_KCH_SLOTS)) {
        struct cs_kch *k = &op->kch[channel];
        k->kind = CS_K_KCH_EMBEDDED;
        k->channel = (uint8_t)channel;
        handle = k;
    } else {
        int64_t idx = own ? CS_OWNER_ALLOC(ctx) : -1;
        if (idx < 0) {
            idx = cs_pool_alloc(&ctx->child_pool);
        }
        if (CS_UNLIKELY(idx < 0)) {
            cs_count(&hdr()->handles_exhausted);
            return NULL;
        }
        struct cs_child *c = &ctx->children[idx];
        c->kind = CS_K_KERNELCH;
        c->pool_idx = (uint32_t)idx;
        c->op = op;
        c->channel = (uint8_t)channel;
        c->gpu_stop = 0;
        handle = c;
    }
    if (ptimer != 0) {
        gpu_min(op, ptimer, own);
    }
    if (CS_UNLIKELY(!(cs_ld(&op->flags) & COLLSCOPE_OPF_KERNEL))) {
        atomic_fetch_or_explicit(&op->flags, COLLSCOPE_OPF_KERNEL, memory_order_relaxed);
    }
    struct collscope_op_slot *o = op->slot;
    if (o != NULL) {
        count_child(&o->kch_started, &o->kch_started_other, own);
    }
    return handle;
}

static struct cs_op *kch_op(struct cs_kch *k)
{
    return (struct cs_op *)(void *)((char *)(k - k->channel) - offsetof(struct cs_op, kch));
}

static void kernel_ch_stop(struct cs_op *op, uint64_t gpu_stop)
{
    if (CS_UNLIKELY(atomic_load_explicit(&op->state, memory_order_acquire) != CS_OPH_ACTIVE)) {
        return;  /* the op already completed (NCCL sent more channels than it announced) */
    }
    int own = is_owner(op->ctx);
    if (gpu_stop != 0) {
        gpu_max(op, gpu_stop, own);
    }
    struct collscope_op_slot *o = op->slot;
    if (o != NULL) {
        count_child(&o->kch_done, &o->kch_done_other, own);
        /* intra-node ops have no flows: the kernel's channels are their only progress */
        cs_st(CS_AI64(&o->last_progress_ns), cs_now_coarse());
    }
    if (CS_LIKELY(own)) {
        local_release(op);
    } else {
        local_release_foreign(op);
    }
}

/* ---- dispatch ----------------------------------------------------------------------------- */

ncclResult_t cs_stop_event(void *handle)
{
    if (handle == NULL) {
        return ncclSuccess;
    }
    switch (*(const uint8_t *)handle) {
    case CS_K_STEP:
        proxy_step_stop(handle);
        break;
    case CS_K_PROXYOP:
        proxy_op_stop(handle);
        break;
    case CS_K_KCH_EMBEDDED: {
        struct cs_kch *k = handle;
        k->kind = 0;
        kernel_ch_stop(kch_op(k), 0);  /* its stop pTimer went to the op at KernelChStop */
        break;
    }
    case CS_K_KERNELCH: {
        struct cs_child *c = handle;
        struct cs_op *op = c->op;
        uint64_t gpu_stop = c->gpu_stop;
        child_free(op->ctx, c);
        kernel_ch_stop(op, gpu_stop);
        break;
    }
    case CS_K_OP: {
        struct cs_op *op = handle;
        if (atomic_load_explicit(&op->state, memory_order_acquire) == CS_OPH_ACTIVE) {
            op_release(op, 1);
        }
        break;
    }
    default:
        break;
    }
    return ncclSuccess;
}

ncclResult_t cs_record_state(void *handle, ncclProfilerEventState_t state,
                             ncclProfilerEventStateArgs_t *args)
{
    if (handle == NULL) {
        return ncclSuccess;
    }
    switch (*(const uint8_t *)handle) {
    case CS_K_STEP:
        proxy_step_state(handle, state);
        break;
    case CS_K_PROXYOP:
        if (state == ncclProfilerProxyOpInProgress_v4) {
            struct cs_child *c = handle;
            struct collscope_flow_slot *f = flow_for(c);
            if (f != NULL) {
                flow_set_state(f, COLLSCOPE_FLOW_RUNNING);
            }
        }
        break;
    case CS_K_KCH_EMBEDDED:
        if (state == ncclProfilerKernelChStop && args != NULL && args->kernelCh.pTimer != 0) {
            struct cs_op *op = kch_op(handle);
            gpu_max(op, args->kernelCh.pTimer, is_owner(op->ctx));
        }
        break;
    case CS_K_KERNELCH:
        if (state == ncclProfilerKernelChStop && args != NULL) {
            ((struct cs_child *)handle)->gpu_stop = args->kernelCh.pTimer;
        }
        break;
    default:
        break;
    }
    return ncclSuccess;
}
