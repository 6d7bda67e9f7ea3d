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
 * vDSO coarse clock, O(1). Only the child whose stop completes an op reads the precise clock
 * and appends to the ring.
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
    atomic_init(&op->refs, 1 + (int64_t)d->nchannels);
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

/* Drop one reference; the last one completes the op. `from_coll_stop`: the op's own
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
    op_complete(op, cs_now(), extra);
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

static struct collscope_flow_slot *flow_lookup(struct collscope_comm_slot *cs, int channel,
                                               int peer, int is_send)
{
    uint64_t key = flow_key(channel, peer, is_send);
    uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 40);
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
                cs_seq_begin(&f->seqlock);
                cs_st(CS_A8(&f->dir), is_send ? COLLSCOPE_DIR_SEND : COLLSCOPE_DIR_RECV);
                cs_st(CS_A8(&f->channel), (uint8_t)channel);
                cs_st(CS_AI32(&f->peer), peer);
                cs_st(CS_A8(&f->state), COLLSCOPE_FLOW_FREE);
                cs_seq_end(&f->seqlock);
                return f;
            }
            if (expected == key) {
                return f;
            }
        }
    }
    return NULL;
}

/* Point the flow at this ProxyOp's op and zero its counters. Only the proxy thread that owns
 * the connection writes a flow slot (NCCL progresses a connection on one thread, in FIFO op
 * order: notes §3), so the seqlock has a single writer. */
static void flow_take(struct cs_child *c, uint8_t state, int64_t now)
{
    struct collscope_flow_slot *f = c->flow;
    cs_seq_begin(&f->seqlock);
    cs_st(CS_A64(&f->serial), c->op->serial);
    cs_st(CS_A8(&f->state), state);
    cs_st(CS_A32(&f->total), c->nsteps);
    cs_st(CS_A32(&f->started), 0);
    cs_st(CS_A32(&f->c_ready_posted), 0);
    cs_st(CS_A32(&f->c_sent_done), 0);
    cs_st(CS_A32(&f->c_done_consumed), 0);
    cs_st(CS_A32(&f->c_gpu_ready), 0);
    cs_st(CS_AI64(&f->last_progress_ns), now);
    cs_seq_end(&f->seqlock);
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
        flow_take(c, COLLSCOPE_FLOW_RUNNING, prev > c->op->start_ns ? prev : c->op->start_ns);
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
    cs_seq_begin(&f->seqlock);
    cs_st(CS_A32(counter), v);
    cs_st(CS_AI64(&f->last_progress_ns), cs_now_coarse());
    cs_seq_end(&f->seqlock);
}

/* a ProxyOp state change is not chunk progress: last_progress_ns stays */
static void flow_set_state(struct collscope_flow_slot *f, uint8_t state)
{
    if (cs_ld(CS_A8(&f->state)) == state) {
        return;
    }
    cs_seq_begin(&f->seqlock);
    cs_st(CS_A8(&f->state), state);
    cs_seq_end(&f->seqlock);
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
    int64_t idx = cs_pool_alloc(&ctx->child_pool);
    if (CS_UNLIKELY(idx < 0)) {
        cs_count(&hdr()->handles_exhausted);
        return NULL;
    }
    struct cs_child *c = &ctx->children[idx];
    c->kind = CS_K_PROXYOP;
    c->pool_idx = (uint32_t)idx;
    c->op = op;
    c->is_send = is_send ? 1 : 0;
    c->channel = (uint8_t)channel;
    c->armed = 0;
    c->owns = 0;
    c->nsteps = nsteps > 0 ? (uint32_t)nsteps : 0;
    c->flow = NULL;
    struct collscope_comm_slot *cs = ctx->slot;
    if (cs != NULL) {
        c->flow = flow_lookup(cs, channel, peer, is_send);
        if (c->flow == NULL) {
            cs_count(&hdr()->flow_slots_exhausted);
        } else {
            uint8_t st = cs_ld(CS_A8(&c->flow->state));
            /* a previous op still moving chunks on this connection keeps the slot until
             * this op's first step (ops on a connection run in FIFO order) */
            if (st == COLLSCOPE_FLOW_FREE || st == COLLSCOPE_FLOW_DONE) {
                /* no chunk has moved yet: idle since the op was enqueued */
                flow_take(c, COLLSCOPE_FLOW_QUEUED, op->start_ns);
            }
        }
    }
    struct collscope_op_slot *o = op->slot;
    if (o != NULL) {
        cs_add(CS_A32(&o->proxy_ops_started), 1);
    }
    return c;
}

static void proxy_op_stop(struct cs_child *c)
{
    struct cs_op *op = c->op;
    struct cs_ctx *ctx = op->ctx;
    if (CS_UNLIKELY(atomic_load_explicit(&op->state, memory_order_acquire) != CS_OPH_ACTIVE)) {
        /* the op already completed (NCCL sent more children than it announced) */
        c->kind = 0;
        cs_pool_free(&ctx->child_pool, c->pool_idx);
        return;
    }
    if (c->owns && c->flow != NULL && cs_ld(CS_A64(&c->flow->serial)) == op->serial) {
        flow_set_state(c->flow, COLLSCOPE_FLOW_DONE);
    }
    struct collscope_op_slot *o = op->slot;
    if (o != NULL) {
        cs_add(CS_A32(&o->proxy_ops_done), 1);
    }
    int armed = c->armed;
    c->kind = 0;
    cs_pool_free(&ctx->child_pool, c->pool_idx);
    if (armed) {
        op_release(op, 0);
    }
}

/* ---- ProxyStep ---------------------------------------------------------------------------- */

void *cs_proxy_step_start(void *parent, int step)
{
    struct cs_child *c = parent;
    if (c == NULL || c->kind != CS_K_PROXYOP || step < 0) {
        return NULL;
    }
    if (CS_UNLIKELY(!c->armed)) {
        c->armed = 1;
        atomic_fetch_add_explicit(&c->op->refs, 1, memory_order_relaxed);
        atomic_fetch_or_explicit(&c->op->flags, COLLSCOPE_OPF_PROXY, memory_order_relaxed);
    }
    struct cs_step *s = &c->steps[(uint32_t)step % CS_STEP_SLOTS];
    s->kind = CS_K_STEP;
    s->step = (uint32_t)step;
    s->child = c;
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
    struct cs_child *c = s->child;
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
    struct cs_child *c = s->child;
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

/* NCCL emits every KernelCh event of a communicator from one thread (its proxy progress thread
 * polling the kernel's per-channel counters: notes §3), so the kernel counters of an op slot
 * have a single writer and need no locked instruction (which on x86 also drains the store
 * buffer: most of a KernelCh callback's cost). */
static inline void single_writer_inc(uint32_t *counter)
{
    cs_st(CS_A32(counter), cs_ld(CS_A32(counter)) + 1);
}

void *cs_kernel_ch_start(void *parent, int channel, uint64_t ptimer)
{
    struct cs_op *op = live_op(parent);
    if (op == NULL) {
        return NULL;
    }
    void *handle;
    if (CS_LIKELY((unsigned)channel < CS_KCH_SLOTS)) {
        struct cs_kch *k = &op->kch[channel];
        k->kind = CS_K_KCH_EMBEDDED;
        k->channel = (uint8_t)channel;
        handle = k;
    } else {
        struct cs_ctx *ctx = op->ctx;
        int64_t idx = cs_pool_alloc(&ctx->child_pool);
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
        cs_min_u64(&op->gpu_start, ptimer);
    }
    if (CS_UNLIKELY(!(cs_ld(&op->flags) & COLLSCOPE_OPF_KERNEL))) {
        atomic_fetch_or_explicit(&op->flags, COLLSCOPE_OPF_KERNEL, memory_order_relaxed);
    }
    struct collscope_op_slot *o = op->slot;
    if (o != NULL) {
        single_writer_inc(&o->kch_started);
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
    if (gpu_stop != 0) {
        cs_max_u64(&op->gpu_stop, gpu_stop);
    }
    struct collscope_op_slot *o = op->slot;
    if (o != NULL) {
        single_writer_inc(&o->kch_done);
        /* intra-node ops have no flows: the kernel's channels are their only progress */
        cs_st(CS_AI64(&o->last_progress_ns), cs_now_coarse());
    }
    op_release(op, 0);
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
        c->kind = 0;
        cs_pool_free(&op->ctx->child_pool, c->pool_idx);
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
            cs_max_u64(&kch_op(handle)->gpu_stop, args->kernelCh.pTimer);
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
