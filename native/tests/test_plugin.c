/*
 * test_plugin.c: C test driver of libnccl-profiler-collscope.so.
 *
 *   test_plugin PLUGIN_SO            run every test, each in a fresh process (fork + exec)
 *   test_plugin PLUGIN_SO TEST DIR   run one test with COLLSCOPE_TRACE_DIR=DIR
 *
 * Each test loads the plugin like NCCL (dlopen RTLD_NOW|RTLD_LOCAL, dlsym ncclProfiler_vN),
 * plays NCCL's call sequence for the version (tests/ncclsim.c), reads the ring file back
 * through include/collscope_ring.h (tests/ringread.c) and checks exact values.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ncclsim.h"
#include "ringread.h"

static const char *g_plugin;
static const char *g_dir;

#define CHECK(c)                                                                         \
    do {                                                                                 \
        if (!(c)) {                                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);        \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#define CHECK_EQ(a, b)                                                                   \
    do {                                                                                 \
        long long va_ = (long long)(a), vb_ = (long long)(b);                            \
        if (va_ != vb_) {                                                                \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s (%lld) != %s (%lld)\n", __FILE__, \
                    __LINE__, #a, va_, #b, vb_);                                         \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#define MASK_WANTED \
    (ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep | \
     ncclProfileKernelCh)

/* ---- helpers ------------------------------------------------------------------------------- */

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static atomic_int g_log_calls;
static atomic_int g_log_level;

static void test_logger(int level, unsigned long flags, const char *file, int line,
                        const char *fmt, ...)
{
    (void)flags;
    (void)file;
    (void)line;
    (void)fmt;
    atomic_fetch_add(&g_log_calls, 1);
    atomic_store(&g_log_level, level);
}

static void open_sim(struct ncclsim *s, int api)
{
    CHECK(sim_open(s, g_plugin, api) == 0);
}

static void open_ring(struct ring *r)
{
    char err[600];
    if (ring_open_dir(r, g_dir, err, sizeof(err)) != 0) {
        fprintf(stderr, "ring_open_dir: %s\n", err);
        exit(1);
    }
}

static int comm_slot_of(const struct ring *r, uint64_t hash)
{
    for (unsigned i = 0; i < COLLSCOPE_COMM_SLOTS; i++) {
        struct collscope_comm_slot c;
        CHECK(ring_snap_comm(r, i, &c) == 0);
        if (c.state != COLLSCOPE_COMM_FREE && c.comm_hash == hash) {
            return (int)i;
        }
    }
    return -1;
}

#define MAX_EVENTS 8192
static union collscope_event g_events[MAX_EVENTS];

/* all records from cursor 0; returns the count, *missed = records lost to overwrite */
static size_t read_all(const struct ring *r, uint64_t *missed)
{
    uint64_t cursor = 0;
    uint64_t m = 0;
    size_t n = ring_read_events(r, &cursor, g_events, MAX_EVENTS, &m);
    if (missed != NULL) {
        *missed = m;
    }
    return n;
}

static size_t count_type(size_t n, uint8_t type)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        k += g_events[i].common.type == type;
    }
    return k;
}

static const struct collscope_op_record *find_op(size_t n, uint64_t hash, uint8_t func,
                                                 uint64_t seq)
{
    for (size_t i = 0; i < n; i++) {
        const struct collscope_op_record *o = &g_events[i].op;
        if (o->type == COLLSCOPE_EV_OP && o->comm_hash == hash && o->func == func &&
            o->seq == seq) {
            return o;
        }
    }
    return NULL;
}

/* ---- a proxy flow played step by step in NCCL's order (notes §4) ---------------------------- */

struct simflow {
    struct ncclsim *s;
    void *ctx;
    void *op;                   /* ProxyOp handle */
    int is_send, nsteps, channel, peer;
    int nph;                    /* send: start, PeerWait, SendWait, stop; recv: 5 phases */
    int c[5];                   /* steps that passed each phase */
    void *steps[8];
};

static void flow_begin(struct simflow *f, struct ncclsim *s, void *ctx, void *coll, int channel,
                       int peer, int nsteps, int is_send)
{
    memset(f, 0, sizeof(*f));
    f->s = s;
    f->ctx = ctx;
    f->is_send = is_send;
    f->nsteps = nsteps;
    f->channel = channel;
    f->peer = peer;
    f->nph = is_send ? 4 : 5;
    f->op = sim_proxy_op(s, ctx, coll, getpid(), channel, peer, nsteps, is_send);
}

static void flow_in_progress(struct simflow *f)
{
    sim_record(f->s, f->op, ncclProfilerProxyOpInProgress_v4, 0);
}

static void flow_phase(struct simflow *f, int step, int ph)
{
    void **h = &f->steps[step % 8];
    if (ph == 0) {
        *h = sim_step(f->s, f->ctx, f->op, step);
        if (f->is_send) {
            sim_record(f->s, *h, ncclProfilerProxyStepSendGPUWait, 0);
        }
        return;
    }
    if (ph == f->nph - 1) {
        sim_stop(f->s, *h);
        *h = NULL;
        return;
    }
    if (f->is_send) {
        if (ph == 1) {
            /* recorded again on every isend retry: must count once */
            sim_record(f->s, *h, ncclProfilerProxyStepSendPeerWait_v4, 0);
            sim_record(f->s, *h, ncclProfilerProxyStepSendPeerWait_v4, 0);
            sim_record(f->s, *h, ncclProfilerProxyStepSendPeerWait_v4, 0);
        } else {
            sim_record(f->s, *h, ncclProfilerProxyStepSendWait, 65536);
        }
    } else {
        static const int st[] = {0, ncclProfilerProxyStepRecvWait,
                                 ncclProfilerProxyStepRecvFlushWait,
                                 ncclProfilerProxyStepRecvGPUWait};
        sim_record(f->s, *h, st[ph], 65536);
    }
}

/* Advance until the phase counts reach target (clipped to what ordering allows: a step passes
 * phase p only after phase p-1; at most 8 steps in flight). Returns 1 if anything moved. */
static int flow_drive(struct simflow *f, const int *target)
{
    int moved = 0, progress = 1;
    while (progress) {
        progress = 0;
        for (int p = f->nph - 1; p >= 0; p--) {
            int limit = p == 0 ? (f->c[f->nph - 1] + 8 < f->nsteps ? f->c[f->nph - 1] + 8
                                                                    : f->nsteps)
                               : f->c[p - 1];
            if (f->c[p] < target[p] && f->c[p] < limit) {
                flow_phase(f, f->c[p], p);
                f->c[p]++;
                progress = moved = 1;
            }
        }
    }
    return moved;
}

static void flow_finish(struct simflow *f)
{
    int all[5] = {f->nsteps, f->nsteps, f->nsteps, f->nsteps, f->nsteps};
    flow_drive(f, all);
}

static void flow_end(struct simflow *f)
{
    sim_stop(f->s, f->op);
    f->op = NULL;
}

/* expected ring counters of a flow from its phase counts */
static void check_flow(const struct ring *r, int comm, const struct simflow *f, uint64_t serial,
                       uint8_t state)
{
    struct collscope_flow_slot fl;
    CHECK(ring_find_flow(r, (unsigned)comm, f->channel, f->peer,
                         f->is_send ? COLLSCOPE_DIR_SEND : COLLSCOPE_DIR_RECV, &fl) == 0);
    CHECK_EQ(fl.serial, serial);
    CHECK_EQ(fl.state, state);
    CHECK_EQ(fl.total, f->nsteps);
    CHECK_EQ(fl.started, f->c[0]);
    CHECK_EQ(fl.c_ready_posted, f->c[1]);
    CHECK_EQ(fl.c_sent_done, f->c[2]);
    if (f->is_send) {
        CHECK_EQ(fl.c_done_consumed, f->c[3]);
        CHECK_EQ(fl.c_gpu_ready, 0);
        CHECK(fl.c_ready_posted >= fl.c_sent_done && fl.c_sent_done >= fl.c_done_consumed);
    } else {
        CHECK_EQ(fl.c_gpu_ready, f->c[3]);
        CHECK_EQ(fl.c_done_consumed, f->c[4]);
        CHECK(fl.c_ready_posted >= fl.c_sent_done && fl.c_sent_done >= fl.c_done_consumed);
    }
}

/* Host side of one collective in NCCL's order (notes §3): API events (v5+), Group start,
 * Coll start, Coll stop (= enqueued), Group stop, GroupApi stop. Returns the Coll handle. */
static void *enqueue_coll(struct ncclsim *s, void *ctx, uint64_t seq, const char *func,
                          size_t count, const char *dtype, int nch, const char *algo,
                          const char *proto)
{
    void *gapi = NULL;
    void *capi = sim_api_enter(s, ctx, func, &gapi);
    if (s->api >= 5 && ctx != NULL) {
        CHECK(gapi != NULL && capi != NULL);  /* ancestors answered with a handle */
    }
    void *group = sim_group(s, ctx);
    void *coll = sim_coll(s, ctx, s->api >= 5 ? capi : group, seq, func, count, dtype, nch,
                          algo, proto);
    sim_stop(s, coll);
    sim_stop(s, group);
    sim_api_leave(s, gapi);
    return coll;
}

static void set_identity_env(void)
{
    setenv("RANK", "19", 1);
    setenv("LOCAL_RANK", "3", 1);
    setenv("WORLD_SIZE", "32", 1);
    setenv("POD_NAME", "llama-19", 1);
    setenv("POD_NAMESPACE", "training", 1);
    setenv("NODE_NAME", "gpu-node-02", 1);
}

/* ---- tests --------------------------------------------------------------------------------- */

/* Ring all-reduce over 4 channels, sends to rank+1 and receives from rank-1, on each API. */
static void allreduce(int api)
{
    set_identity_env();
    struct ncclsim s;
    open_sim(&s, api);
    const uint64_t hash = 0x1f3a5c7e9b2d4f60ull + (uint64_t)api;
    void *ctx = sim_init(&s, hash, "dp-group-0", 2, 16, 3, test_logger);
    CHECK(ctx != NULL);
    CHECK_EQ(s.mask, MASK_WANTED);
    CHECK_EQ(s.mask & (ncclProfileProxyCtrl | ncclProfileNetPlugin), 0);

    struct ring r;
    open_ring(&r);
    const struct collscope_ring_header *h = r.hdr;
    CHECK_EQ(h->pid, getpid());
    CHECK_EQ(h->rank, 19);
    CHECK_EQ(h->local_rank, 3);
    CHECK_EQ(h->world_size, 32);
    CHECK(strcmp(h->pod_name, "llama-19") == 0);
    CHECK(strcmp(h->pod_namespace, "training") == 0);
    CHECK(strcmp(h->node_name, "gpu-node-02") == 0);
    char host[128];
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = '\0';
    CHECK(strcmp(h->hostname, host) == 0);
    CHECK(strcmp(h->plugin_version, "0.1.0") == 0);
    CHECK_EQ(h->profiler_api, api);
    CHECK_EQ(h->state, COLLSCOPE_RING_STATE_ACTIVE);
    CHECK_EQ(h->activation_mask, MASK_WANTED);
    CHECK_EQ(ring_counter(&h->comms_open), 1);
    CHECK(h->init_realtime_ns > 0 && h->init_monotonic_ns > 0 && h->coarse_res_ns > 0);
    char name[64];
    snprintf(name, sizeof(name), "collscope-");
    CHECK(strstr(r.path, "-pid") != NULL && strstr(r.path, ".ring") != NULL);

    /* init arguments landed in the right fields (v4 and v5/v6 orders differ) */
    int cs = comm_slot_of(&r, hash);
    CHECK(cs == 0);
    struct collscope_comm_slot c;
    CHECK(ring_snap_comm(&r, 0, &c) == 0);
    CHECK_EQ(c.state, COLLSCOPE_COMM_ACTIVE);
    CHECK_EQ(c.rank, 3);
    CHECK_EQ(c.nranks, 16);
    CHECK_EQ(c.nnodes, 2);
    CHECK_EQ(c.profiler_api, api);
    CHECK(strcmp(c.name, "dp-group-0") == 0);
    size_t n = read_all(&r, NULL);
    CHECK_EQ(n, 1);
    CHECK_EQ(g_events[0].comm.type, COLLSCOPE_EV_COMM_INIT);
    CHECK_EQ(g_events[0].comm.comm_hash, hash);
    CHECK_EQ(g_events[0].comm.rank, 3);
    CHECK_EQ(g_events[0].comm.nranks, 16);
    CHECK_EQ(g_events[0].comm.nnodes, 2);
    CHECK(strcmp(g_events[0].comm.name, "dp-group-0") == 0);

    int64_t t0 = now_ns();
    void *coll = enqueue_coll(&s, ctx, 41, "AllReduce", 1u << 20, "ncclFloat32", 4, "RING",
                              "SIMPLE");
    int64_t t_enq = now_ns();
    CHECK(coll != NULL);

    enum { NCH = 4, NSTEPS = 8 };
    struct simflow snd[NCH], rcv[NCH];
    void *kch[NCH];
    for (int ch = 0; ch < NCH; ch++) {
        flow_begin(&snd[ch], &s, ctx, coll, ch, 4, NSTEPS, 1);
        flow_begin(&rcv[ch], &s, ctx, coll, ch, 2, NSTEPS, 0);
        CHECK(snd[ch].op != NULL && rcv[ch].op != NULL);
        flow_in_progress(&snd[ch]);
        flow_in_progress(&rcv[ch]);
        kch[ch] = sim_kernel_ch(&s, ctx, coll, ch, 1000 + (uint64_t)ch);
        CHECK(kch[ch] != NULL);
    }
    /* half-way snapshot: state log shows exactly where every flow is */
    const int half_s[4] = {6, 5, 4, 3}, half_r[5] = {6, 5, 4, 3, 2};
    for (int ch = 0; ch < NCH; ch++) {
        flow_drive(&snd[ch], half_s);
        flow_drive(&rcv[ch], half_r);
    }
    for (int ch = 0; ch < NCH; ch++) {
        check_flow(&r, cs, &snd[ch], 0, COLLSCOPE_FLOW_RUNNING);
        check_flow(&r, cs, &rcv[ch], 0, COLLSCOPE_FLOW_RUNNING);
    }
    struct collscope_op_slot op;
    CHECK(ring_inflight_op(&r, (unsigned)cs, &op) == 0);
    CHECK_EQ(op.serial, 0);
    CHECK_EQ(op.seq, 41);
    CHECK_EQ(op.func, COLLSCOPE_FUNC_ALLREDUCE);
    CHECK_EQ(op.bytes, 4u << 20);
    CHECK_EQ(op.algo, COLLSCOPE_ALGO_RING);
    CHECK_EQ(op.proto, COLLSCOPE_PROTO_SIMPLE);
    CHECK_EQ(op.dtype, COLLSCOPE_DTYPE_FLOAT32);
    CHECK_EQ(op.nchannels, 4);
    CHECK_EQ(op.peer, -1);
    CHECK(op.start_ns >= t0 && op.start_ns <= t_enq);
    CHECK_EQ(op.kch_started, 4);
    CHECK_EQ(op.kch_done, 0);
    CHECK_EQ(op.proxy_ops_started, 8);
    CHECK_EQ(op.proxy_ops_done, 0);
    CHECK_EQ(read_all(&r, NULL), 1);  /* Coll stop happened long ago: no completion yet */

    /* kernels finish; the network has not: still no completion */
    for (int ch = 0; ch < NCH; ch++) {
        sim_kernel_ch_stop(&s, kch[ch], 5000 + (uint64_t)ch);
    }
    CHECK(ring_inflight_op(&r, (unsigned)cs, &op) == 0);
    CHECK_EQ(op.kch_done, 4);
    CHECK_EQ(read_all(&r, NULL), 1);
    for (int ch = 0; ch < NCH; ch++) {
        flow_finish(&snd[ch]);
        flow_finish(&rcv[ch]);
        flow_end(&snd[ch]);
        if (ch < NCH - 1) {
            flow_end(&rcv[ch]);
        }
    }
    CHECK_EQ(read_all(&r, NULL), 1);
    int64_t t_last = now_ns();
    flow_end(&rcv[NCH - 1]);  /* the true completion signal */
    int64_t t_after = now_ns();

    n = read_all(&r, NULL);
    CHECK_EQ(n, 2);
    const struct collscope_op_record *rec = &g_events[1].op;
    CHECK_EQ(rec->type, COLLSCOPE_EV_OP);
    CHECK_EQ(rec->comm_hash, hash);
    CHECK_EQ(rec->comm_slot, cs);
    CHECK_EQ(rec->seq, 41);
    CHECK_EQ(rec->func, COLLSCOPE_FUNC_ALLREDUCE);
    CHECK_EQ(rec->bytes, 4u << 20);
    CHECK_EQ(rec->algo, COLLSCOPE_ALGO_RING);
    CHECK_EQ(rec->proto, COLLSCOPE_PROTO_SIMPLE);
    CHECK_EQ(rec->dtype, COLLSCOPE_DTYPE_FLOAT32);
    CHECK_EQ(rec->nchannels, 4);
    CHECK_EQ(rec->peer, -1);
    CHECK_EQ(rec->flags,
             COLLSCOPE_OPF_KERNEL | COLLSCOPE_OPF_PROXY | COLLSCOPE_OPF_GPU_TIMED);
    CHECK_EQ(rec->gpu_ns, 5003 - 1000);
    CHECK(rec->start_ns >= t0 && rec->start_ns <= t_enq);
    CHECK(rec->end_ns >= t_last && rec->end_ns <= t_after);  /* not the Coll stop time */

    for (int ch = 0; ch < NCH; ch++) {
        check_flow(&r, cs, &snd[ch], 0, COLLSCOPE_FLOW_DONE);
        check_flow(&r, cs, &rcv[ch], 0, COLLSCOPE_FLOW_DONE);
    }
    CHECK(ring_inflight_op(&r, (unsigned)cs, &op) != 0);
    CHECK(ring_snap_op(&ring_comm_slot(&r, 0)->ops[0], &op) == 0);
    CHECK_EQ(op.state, COLLSCOPE_OP_DONE);
    CHECK_EQ(op.end_ns, rec->end_ns);
    CHECK_EQ(op.proxy_ops_done, 8);
    CHECK(ring_snap_comm(&r, 0, &c) == 0);
    CHECK_EQ(c.ops_started, 1);
    CHECK_EQ(c.ops_completed, 1);
    CHECK_EQ(c.enqueued[COLLSCOPE_FUNC_ALLREDUCE], 42);
    CHECK_EQ(c.completed[COLLSCOPE_FUNC_ALLREDUCE], 42);
    CHECK_EQ(c.last_completion_ns, rec->end_ns);

    sim_finalize(&s, ctx);
    n = read_all(&r, NULL);
    CHECK_EQ(n, 3);
    CHECK_EQ(g_events[2].comm.type, COLLSCOPE_EV_COMM_FINALIZE);
    CHECK_EQ(g_events[2].comm.comm_hash, hash);
    CHECK(ring_snap_comm(&r, 0, &c) == 0);
    CHECK_EQ(c.state, COLLSCOPE_COMM_FINALIZED);
    CHECK(c.finalize_ns >= c.init_ns);
    CHECK_EQ(h->state, COLLSCOPE_RING_STATE_IDLE);
    CHECK_EQ(ring_counter(&h->comms_open), 0);
    CHECK_EQ(ring_counter(&h->comms_total), 1);
    CHECK_EQ(ring_counter(&h->events_dropped), 0);
    CHECK_EQ(ring_counter(&h->stale_flow_events), 0);
    ring_close(&r);
    sim_close(&s);
}

static void t_allreduce_v4(void) { allreduce(4); }
static void t_allreduce_v5(void) { allreduce(5); }
static void t_allreduce_v6(void) { allreduce(6); }

/* Send and Recv in one group; own per-function sequence numbers; peer recorded. */
static void t_p2p(void)
{
    struct ncclsim s;
    open_sim(&s, 5);
    const uint64_t hash = 0x77;
    void *ctx = sim_init(&s, hash, "pp", 4, 8, 2, test_logger);
    CHECK(ctx != NULL);
    struct ring r;
    open_ring(&r);
    for (int round = 0; round < 2; round++) {
        void *gapi = sim_group_api(&s, ctx);
        struct sim_descr pa = {.type = ncclProfileP2pApi, .parent = gapi, .func = "Send"};
        void *papi = sim_start(&s, ctx, &pa);
        sim_stop(&s, papi);
        void *group = sim_group(&s, ctx);
        void *snd = sim_p2p(&s, ctx, papi, "Send", 1000, "ncclInt32", 7, 2);
        void *rcv = sim_p2p(&s, ctx, papi, "Recv", 500, "ncclBfloat16", 1, 2);
        CHECK(snd != NULL && rcv != NULL);
        sim_stop(&s, snd);
        sim_stop(&s, rcv);
        sim_stop(&s, group);
        sim_stop(&s, gapi);
        struct simflow fs, fr;
        flow_begin(&fs, &s, ctx, snd, 0, 7, 2, 1);
        flow_begin(&fr, &s, ctx, rcv, 1, 1, 3, 0);
        void *k[4];
        for (int ch = 0; ch < 2; ch++) {
            k[ch] = sim_kernel_ch(&s, ctx, snd, ch, 100);
            k[2 + ch] = sim_kernel_ch(&s, ctx, rcv, ch, 100);
        }
        flow_finish(&fs);
        flow_finish(&fr);
        for (int i = 0; i < 4; i++) {
            sim_kernel_ch_stop(&s, k[i], 300);
        }
        flow_end(&fs);
        flow_end(&fr);
        check_flow(&r, 0, &fs, (uint64_t)(2 * round), COLLSCOPE_FLOW_DONE);
        check_flow(&r, 0, &fr, (uint64_t)(2 * round + 1), COLLSCOPE_FLOW_DONE);
    }
    size_t n = read_all(&r, NULL);
    CHECK_EQ(n, 5);
    for (uint64_t seq = 0; seq < 2; seq++) {
        const struct collscope_op_record *o = find_op(n, hash, COLLSCOPE_FUNC_SEND, seq);
        CHECK(o != NULL);
        CHECK_EQ(o->peer, 7);
        CHECK_EQ(o->bytes, 4000);
        CHECK_EQ(o->nchannels, 2);
        CHECK_EQ(o->algo, 0);
        CHECK_EQ(o->flags, COLLSCOPE_OPF_P2P | COLLSCOPE_OPF_KERNEL | COLLSCOPE_OPF_PROXY |
                               COLLSCOPE_OPF_GPU_TIMED);
        CHECK_EQ(o->gpu_ns, 200);
        o = find_op(n, hash, COLLSCOPE_FUNC_RECV, seq);
        CHECK(o != NULL);
        CHECK_EQ(o->peer, 1);
        CHECK_EQ(o->bytes, 1000);
        CHECK_EQ(o->dtype, COLLSCOPE_DTYPE_BFLOAT16);
    }
    struct collscope_comm_slot c;
    CHECK(ring_snap_comm(&r, 0, &c) == 0);
    CHECK_EQ(c.enqueued[COLLSCOPE_FUNC_SEND], 2);
    CHECK_EQ(c.completed[COLLSCOPE_FUNC_RECV], 2);
    sim_finalize(&s, ctx);
    ring_close(&r);
    sim_close(&s);
}

/* A receive from a stalled peer: counters freeze mid-op, the live state shows where, no
 * completion record appears; once the peer resumes the op completes. */
static void t_stalled_peer(void)
{
    struct ncclsim s;
    open_sim(&s, 6);
    const uint64_t hash = 0xdead;
    void *ctx = sim_init(&s, hash, "dp", 2, 16, 8, test_logger);
    CHECK(ctx != NULL);
    struct ring r;
    open_ring(&r);
    const struct collscope_ring_header *h = r.hdr;

    /* a first op completes normally */
    void *c0 = enqueue_coll(&s, ctx, 0, "AllReduce", 1024, "ncclFloat16", 1, "TREE", "LL");
    void *k0 = sim_kernel_ch(&s, ctx, c0, 0, 0);
    sim_kernel_ch_stop(&s, k0, 0);
    CHECK_EQ(count_type(read_all(&r, NULL), COLLSCOPE_EV_OP), 1);
    CHECK_EQ(g_events[1].op.flags, COLLSCOPE_OPF_KERNEL);  /* pTimer 0: not GPU-timed */

    void *coll = enqueue_coll(&s, ctx, 1, "AllReduce", 1u << 22, "ncclFloat16", 2, "RING",
                              "SIMPLE");
    struct simflow snd[2], rcv[2];
    void *kch[2];
    for (int ch = 0; ch < 2; ch++) {
        flow_begin(&snd[ch], &s, ctx, coll, ch, 9, 16, 1);
        flow_begin(&rcv[ch], &s, ctx, coll, ch, 7, 16, 0);
        flow_in_progress(&snd[ch]);
        flow_in_progress(&rcv[ch]);
        kch[ch] = sim_kernel_ch(&s, ctx, coll, ch, 10);
    }
    /* channel 0 completes; channel 1: rank 7 stops sending after 3 chunks, and our sends
     * wait for rank 9's receive buffers after 4 */
    flow_finish(&snd[0]);
    flow_finish(&rcv[0]);
    flow_end(&snd[0]);
    flow_end(&rcv[0]);
    sim_kernel_ch_stop(&s, kch[0], 20);
    const int stall_r[5] = {5, 5, 3, 3, 3}, stall_s[4] = {8, 6, 4, 4};
    flow_drive(&rcv[1], stall_r);
    flow_drive(&snd[1], stall_s);
    int64_t t_stall = now_ns();
    uint64_t hb0 = ring_counter(&h->heartbeat_count);
    sleep_ms(300);
    /* the heartbeat thread may be starved on a loaded machine (or slowed by TSan): give it a
     * bounded while to beat twice rather than assuming 300 ms is enough */
    for (int waited = 0; ring_counter(&h->heartbeat_count) < hb0 + 2 && waited < 5000; waited += 10)
        sleep_ms(10);
    /* nothing moves while stalled, however often the proxy retries */
    for (int i = 0; i < 50; i++) {
        flow_drive(&rcv[1], stall_r);
        flow_drive(&snd[1], stall_s);
        sim_record(&s, snd[1].steps[4], ncclProfilerProxyStepSendPeerWait_v4, 0);
    }
    int64_t t_snap = now_ns();

    CHECK_EQ(count_type(read_all(&r, NULL), COLLSCOPE_EV_OP), 1);
    struct collscope_op_slot op;
    CHECK(ring_inflight_op(&r, 0, &op) == 0);
    CHECK_EQ(op.seq, 1);
    CHECK_EQ(op.serial, 1);
    CHECK_EQ(op.kch_started, 2);
    CHECK_EQ(op.kch_done, 1);
    CHECK_EQ(op.proxy_ops_done, 2);
    check_flow(&r, 0, &rcv[1], 1, COLLSCOPE_FLOW_RUNNING);
    check_flow(&r, 0, &snd[1], 1, COLLSCOPE_FLOW_RUNNING);
    check_flow(&r, 0, &snd[0], 1, COLLSCOPE_FLOW_DONE);
    struct collscope_flow_slot fl;
    CHECK(ring_find_flow(&r, 0, 1, 7, COLLSCOPE_DIR_RECV, &fl) == 0);
    CHECK_EQ(fl.c_ready_posted, 5);   /* posted */
    CHECK_EQ(fl.c_sent_done, 3);      /* arrived */
    CHECK_EQ(fl.c_done_consumed, 3);  /* consumed */
    int64_t idle = t_snap - fl.last_progress_ns;
    CHECK(idle >= 250000000LL);       /* idle_ns of the state record: >= the 300 ms stall */
    CHECK(fl.last_progress_ns <= t_stall);
    CHECK(ring_find_flow(&r, 0, 1, 9, COLLSCOPE_DIR_SEND, &fl) == 0);
    CHECK_EQ(fl.c_ready_posted, 6);
    CHECK_EQ(fl.c_sent_done, 4);
    CHECK(t_snap - fl.last_progress_ns >= 250000000LL);
    /* liveness: the heartbeat kept beating while NCCL was stuck */
    CHECK(ring_counter(&h->heartbeat_count) >= hb0 + 2);
    CHECK((int64_t)ring_counter((const uint64_t *)&h->heartbeat_ns) > t_stall);

    /* the peer recovers */
    flow_finish(&rcv[1]);
    flow_finish(&snd[1]);
    flow_end(&rcv[1]);
    flow_end(&snd[1]);
    CHECK_EQ(count_type(read_all(&r, NULL), COLLSCOPE_EV_OP), 1);  /* kernel ch 1 pending */
    sim_kernel_ch_stop(&s, kch[1], 30);
    size_t n = read_all(&r, NULL);
    const struct collscope_op_record *o = find_op(n, hash, COLLSCOPE_FUNC_ALLREDUCE, 1);
    CHECK(o != NULL);
    CHECK(o->end_ns - o->start_ns >= 300000000LL);
    CHECK_EQ(o->gpu_ns, 20);
    sim_finalize(&s, ctx);
    ring_close(&r);
    sim_close(&s);
}

/* ---- concurrency --------------------------------------------------------------------------- */

enum { CONC_OPS = 300 };
static struct ncclsim g_conc_sim;
static pthread_barrier_t g_barrier;

static void play_small_allreduce(struct ncclsim *s, void *ctx, uint64_t seq, int first_ch,
                                 int nch)
{
    void *coll = enqueue_coll(s, ctx, seq, "AllReduce", 4096, "ncclFloat32", nch, "RING",
                              "LL128");
    for (int ch = first_ch; ch < first_ch + nch; ch++) {
        struct simflow fs, fr;
        flow_begin(&fs, s, ctx, coll, ch, 1, 4, 1);
        flow_begin(&fr, s, ctx, coll, ch, 3, 4, 0);
        void *k = sim_kernel_ch(s, ctx, coll, ch, 1);
        flow_in_progress(&fs);
        flow_in_progress(&fr);
        flow_finish(&fs);
        flow_finish(&fr);
        sim_kernel_ch_stop(s, k, 2);
        flow_end(&fs);
        flow_end(&fr);
    }
}

static void *conc_comm_thread(void *arg)
{
    int t = (int)(intptr_t)arg;
    void *ctx = sim_init(&g_conc_sim, 0x1000 + (uint64_t)t, "tp", 1, 4, t, test_logger);
    CHECK(ctx != NULL);
    pthread_barrier_wait(&g_barrier);
    for (int i = 0; i < CONC_OPS; i++) {
        play_small_allreduce(&g_conc_sim, ctx, (uint64_t)i, 0, 2);
    }
    pthread_barrier_wait(&g_barrier);  /* main thread checks the ring here */
    pthread_barrier_wait(&g_barrier);
    sim_finalize(&g_conc_sim, ctx);
    return NULL;
}

/* Four communicators, each driven by its own thread (init concurrently too). */
static void t_concurrent_comms(void)
{
    open_sim(&g_conc_sim, 5);
    pthread_barrier_init(&g_barrier, NULL, 5);
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
        CHECK(pthread_create(&th[t], NULL, conc_comm_thread, (void *)(intptr_t)t) == 0);
    }
    pthread_barrier_wait(&g_barrier);
    pthread_barrier_wait(&g_barrier);
    struct ring r;
    open_ring(&r);
    size_t n = read_all(&r, NULL);
    CHECK_EQ(n, 4 + 4 * CONC_OPS);
    CHECK_EQ(count_type(n, COLLSCOPE_EV_COMM_INIT), 4);
    for (int t = 0; t < 4; t++) {
        uint64_t hash = 0x1000 + (uint64_t)t;
        for (uint64_t seq = 0; seq < CONC_OPS; seq++) {
            const struct collscope_op_record *o =
                find_op(n, hash, COLLSCOPE_FUNC_ALLREDUCE, seq);
            CHECK(o != NULL);
            CHECK_EQ(o->nchannels, 2);
            CHECK_EQ(o->proto, COLLSCOPE_PROTO_LL128);
            CHECK(o->end_ns >= o->start_ns);
        }
        int cs = comm_slot_of(&r, hash);
        CHECK(cs >= 0);
        struct collscope_comm_slot c;
        CHECK(ring_snap_comm(&r, (unsigned)cs, &c) == 0);
        CHECK_EQ(c.ops_completed, CONC_OPS);
        CHECK_EQ(c.completed[COLLSCOPE_FUNC_ALLREDUCE], CONC_OPS);
    }
    pthread_barrier_wait(&g_barrier);
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
    }
    CHECK_EQ(count_type(read_all(&r, NULL), COLLSCOPE_EV_COMM_FINALIZE), 4);
    CHECK_EQ(ring_counter(&r.hdr->events_dropped), 0);
    CHECK_EQ(ring_counter(&r.hdr->handles_exhausted), 0);
    ring_close(&r);
    pthread_barrier_destroy(&g_barrier);
    sim_close(&g_conc_sim);
}

enum { SAME_OPS = 1500, SAME_THREADS = 4 }; /* > pool sizes: entries get reused across threads */
static void *g_same_ctx;
static _Atomic(void *) g_same_colls[SAME_OPS];
static atomic_int g_same_done[SAME_THREADS];  /* ops each proxy thread has finished */
static atomic_int g_same_moved[SAME_OPS];     /* channels whose chunks of op i have moved */

static void *same_comm_proxy(void *arg)
{
    int ch = (int)(intptr_t)arg;  /* one proxy thread per channel: its connections */
    for (int i = 0; i < SAME_OPS; i++) {
        void *coll;
        while ((coll = atomic_load_explicit(&g_same_colls[i], memory_order_acquire)) == NULL) {
            sched_yield();
        }
        struct simflow fs, fr;
        flow_begin(&fs, &g_conc_sim, g_same_ctx, coll, ch, 5, 3, 1);
        flow_begin(&fr, &g_conc_sim, g_same_ctx, coll, ch, 6, 3, 0);
        /* KernelCh events of a comm all come from one thread (notes §3): thread 0 */
        void *k[SAME_THREADS] = {NULL};
        if (ch == 0) {
            for (int c = 0; c < SAME_THREADS; c++) {
                k[c] = sim_kernel_ch(&g_conc_sim, g_same_ctx, coll, c, (uint64_t)(100 + c));
            }
        }
        flow_in_progress(&fs);
        flow_in_progress(&fr);
        flow_finish(&fs);
        flow_finish(&fr);
        atomic_fetch_add_explicit(&g_same_moved[i], 1, memory_order_release);
        if (ch == 0) {
            /* a channel's kernel cannot finish before its network chunks moved (the GPU
             * waits on the proxy's buffers and data): keep that causality */
            while (atomic_load_explicit(&g_same_moved[i], memory_order_acquire) < SAME_THREADS) {
                sched_yield();
            }
            for (int c = 0; c < SAME_THREADS; c++) {
                sim_kernel_ch_stop(&g_conc_sim, k[c], (uint64_t)(200 + c));
            }
        }
        flow_end(&fs);
        flow_end(&fr);
        atomic_store_explicit(&g_same_done[ch], i + 1, memory_order_release);
    }
    return NULL;
}

/* One communicator: the host thread enqueues while four proxy threads progress channels;
 * Coll stop races with the children's stops. */
static void t_concurrent_same_comm(void)
{
    open_sim(&g_conc_sim, 4);
    g_same_ctx = sim_init(&g_conc_sim, 0xabcdef, "world", 2, 16, 5, test_logger);
    CHECK(g_same_ctx != NULL);
    pthread_t th[SAME_THREADS];
    for (int t = 0; t < SAME_THREADS; t++) {
        CHECK(pthread_create(&th[t], NULL, same_comm_proxy, (void *)(intptr_t)t) == 0);
    }
    for (int i = 0; i < SAME_OPS; i++) {
        /* like a stream, the host runs ahead of the GPU by a bounded number of ops */
        for (int t = 0; t < SAME_THREADS; t++) {
            while (atomic_load_explicit(&g_same_done[t], memory_order_acquire) < i - 32) {
                sched_yield();
            }
        }
        void *group = sim_group(&g_conc_sim, g_same_ctx);
        void *coll = sim_coll(&g_conc_sim, g_same_ctx, group, (uint64_t)i, "ReduceScatter",
                              1u << 16, "ncclFloat32", SAME_THREADS, "RING", "SIMPLE");
        CHECK(coll != NULL);
        /* NCCL uploads proxy ops before Coll stop: children may start (and end) first */
        atomic_store_explicit(&g_same_colls[i], coll, memory_order_release);
        sim_stop(&g_conc_sim, coll);
        sim_stop(&g_conc_sim, group);
    }
    for (int t = 0; t < SAME_THREADS; t++) {
        pthread_join(th[t], NULL);
    }
    struct ring r;
    open_ring(&r);
    size_t n = read_all(&r, NULL);
    CHECK_EQ(n, 1 + SAME_OPS);
    for (uint64_t seq = 0; seq < SAME_OPS; seq++) {
        const struct collscope_op_record *o =
            find_op(n, 0xabcdef, COLLSCOPE_FUNC_REDUCESCATTER, seq);
        CHECK(o != NULL);
        CHECK((o->flags & (COLLSCOPE_OPF_KERNEL | COLLSCOPE_OPF_PROXY |
                           COLLSCOPE_OPF_GPU_TIMED)) ==
              (COLLSCOPE_OPF_KERNEL | COLLSCOPE_OPF_PROXY | COLLSCOPE_OPF_GPU_TIMED));
        CHECK_EQ(o->gpu_ns, 203 - 100);
        CHECK_EQ(o->bytes, 1u << 18);
    }
    for (int ch = 0; ch < SAME_THREADS; ch++) {
        struct collscope_flow_slot fl;
        CHECK(ring_find_flow(&r, 0, ch, 5, COLLSCOPE_DIR_SEND, &fl) == 0);
        CHECK_EQ(fl.serial, SAME_OPS - 1);
        CHECK_EQ(fl.c_done_consumed, 3);
        CHECK_EQ(fl.state, COLLSCOPE_FLOW_DONE);
        CHECK(ring_find_flow(&r, 0, ch, 6, COLLSCOPE_DIR_RECV, &fl) == 0);
        CHECK_EQ(fl.c_done_consumed, 3);
    }
    struct collscope_comm_slot c;
    CHECK(ring_snap_comm(&r, 0, &c) == 0);
    CHECK_EQ(c.ops_completed, SAME_OPS);
    CHECK_EQ(ring_counter(&r.hdr->stale_flow_events), 0);
    for (unsigned i = 0; i < COLLSCOPE_OPS_PER_COMM; i++) {
        struct collscope_op_slot op;
        CHECK(ring_snap_op(&ring_comm_slot(&r, 0)->ops[i], &op) == 0);
        if (op.state == COLLSCOPE_OP_EMPTY) {
            continue;
        }
        CHECK_EQ(op.state, COLLSCOPE_OP_DONE);
        CHECK_EQ(op.kch_started, SAME_THREADS);
        CHECK_EQ(op.kch_done, SAME_THREADS);
        CHECK_EQ(op.proxy_ops_started, 2 * SAME_THREADS);
        CHECK_EQ(op.proxy_ops_done, 2 * SAME_THREADS);
    }
    sim_finalize(&g_conc_sim, g_same_ctx);
    ring_close(&r);
    sim_close(&g_conc_sim);
}

/* ---- PXN, wrap-around, failures, limits --------------------------------------------------- */

/* ProxyOps appended by another process (PXN) carry that process's context and parent
 * pointers: they must be left alone. Bogus pointers make any dereference crash. */
static void t_pxn_foreign(void)
{
    struct ncclsim s;
    open_sim(&s, 5);
    void *ctx = sim_init(&s, 0x5, "dp", 2, 16, 1, test_logger);
    CHECK(ctx != NULL);
    void *bogus_ctx = (void *)(uintptr_t)0x20;
    void *bogus_parent = (void *)(uintptr_t)0x10;
    pid_t other = getpid() + 1;
    void *h = sim_proxy_op(&s, bogus_ctx, bogus_parent, other, 0, 3, 8, 1);
    CHECK(h == NULL);
    h = sim_proxy_op(&s, ctx, bogus_parent, other, 1, 3, 8, 0);
    CHECK(h == NULL);
    CHECK(sim_step(&s, bogus_ctx, h, 0) == NULL);  /* its steps then have a NULL parent */
    struct ring r;
    open_ring(&r);
    CHECK_EQ(ring_counter(&r.hdr->pxn_foreign_events), 2);
    /* and a local op of the same comm still works */
    void *coll = enqueue_coll(&s, ctx, 0, "AllGather", 8192, "ncclInt8", 1, "RING", "LL");
    struct simflow f;
    flow_begin(&f, &s, ctx, coll, 0, 2, 2, 1);
    CHECK(f.op != NULL);
    void *k = sim_kernel_ch(&s, ctx, coll, 0, 5);
    flow_finish(&f);
    sim_kernel_ch_stop(&s, k, 6);
    flow_end(&f);
    size_t n = read_all(&r, NULL);
    const struct collscope_op_record *o = find_op(n, 0x5, COLLSCOPE_FUNC_ALLGATHER, 0);
    CHECK(o != NULL);
    CHECK_EQ(o->bytes, 8192);
    sim_finalize(&s, ctx);
    ring_close(&r);
    sim_close(&s);
}

/* Tiny ring: completion records wrap; readers count what they missed. */
static void t_wrap(void)
{
    setenv("COLLSCOPE_RING_BYTES", "256k", 1);
    struct ncclsim s;
    open_sim(&s, 5);
    void *ctx = sim_init(&s, 0x9, "x", 1, 2, 0, test_logger);
    CHECK(ctx != NULL);
    struct ring r;
    open_ring(&r);
    const struct collscope_ring_header *h = r.hdr;
    CHECK_EQ(h->file_size, 256 * 1024);
    CHECK_EQ(h->event_slot_count, 1600);
    uint64_t cursor = 0, missed = 0;
    for (int i = 0; i < 1000; i++) {
        void *coll = sim_coll(&s, ctx, NULL, (uint64_t)i, "Broadcast", 64, "ncclInt8", 1,
                              "RING", "LL");
        void *k = sim_kernel_ch(&s, ctx, coll, 0, 1);
        sim_stop(&s, coll);
        sim_kernel_ch_stop(&s, k, 2);
    }
    size_t n = ring_read_events(&r, &cursor, g_events, MAX_EVENTS, &missed);
    CHECK_EQ(n, 1001);
    CHECK_EQ(missed, 0);
    CHECK_EQ(cursor, 1001);
    for (int i = 1000; i < 2000; i++) {
        void *coll = sim_coll(&s, ctx, NULL, (uint64_t)i, "Broadcast", 64, "ncclInt8", 1,
                              "RING", "LL");
        void *k = sim_kernel_ch(&s, ctx, coll, 0, 1);
        sim_stop(&s, coll);
        sim_kernel_ch_stop(&s, k, 2);
    }
    CHECK_EQ(ring_counter(&h->events_written), 2001);
    CHECK_EQ(ring_counter(&h->events_overwritten), 2001 - 1600);
    /* a reader that kept up misses nothing */
    n = ring_read_events(&r, &cursor, g_events, MAX_EVENTS, &missed);
    CHECK_EQ(n, 1000);
    CHECK_EQ(missed, 0);
    CHECK_EQ(g_events[0].op.seq, 1000);
    CHECK_EQ(g_events[999].op.seq, 1999);
    /* a reader starting from 0 lost the oldest 401 (the comm record and seqs 0..399) */
    uint64_t c0 = 0, m0 = 0;
    n = ring_read_events(&r, &c0, g_events, MAX_EVENTS, &m0);
    CHECK_EQ(n, 1600);
    CHECK_EQ(m0, 401);
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ(g_events[i].op.type, COLLSCOPE_EV_OP);
        CHECK_EQ(g_events[i].op.seq, 400 + i);
        CHECK_EQ(g_events[i].op.idx, 401 + i);
    }
    sim_finalize(&s, ctx);
    ring_close(&r);
    sim_close(&s);
}

static void check_ring_size(const char *env, uint64_t want_bytes)
{
    setenv("COLLSCOPE_RING_BYTES", env, 1);
    struct ncclsim s;
    open_sim(&s, 6);
    void *ctx = sim_init(&s, 0x1, "x", 1, 1, 0, test_logger);
    CHECK(ctx != NULL);
    struct ring r;
    open_ring(&r);
    CHECK_EQ(r.hdr->file_size, want_bytes);
    CHECK_EQ(r.bytes, want_bytes);
    CHECK_EQ(r.hdr->event_slot_count,
             (want_bytes - COLLSCOPE_EVENT_REGION_OFFSET) / COLLSCOPE_EVENT_BYTES);
    sim_finalize(&s, ctx);
    ring_close(&r);
    sim_close(&s);
}

static void t_ring_size_clamp(void) { check_ring_size("1000", COLLSCOPE_RING_BYTES_MIN); }
static void t_ring_size_suffix(void)
{
    uint64_t nev = (300 * 1024 - COLLSCOPE_EVENT_REGION_OFFSET) / 64;
    check_ring_size("300K", COLLSCOPE_EVENT_REGION_OFFSET + nev * 64);
}
static void t_ring_size_garbage(void) { check_ring_size("lots", COLLSCOPE_RING_BYTES_DEFAULT); }

static void play_everything_on_null(struct ncclsim *s, void *ctx)
{
    void *coll = enqueue_coll(s, ctx, 0, "AllReduce", 1, "ncclFloat32", 1, "RING", "LL");
    CHECK(coll == NULL);
    CHECK(sim_group_api(s, ctx) == NULL);
    CHECK(sim_proxy_op(s, ctx, NULL, getpid(), 0, 1, 1, 1) == NULL);
    CHECK(sim_step(s, ctx, NULL, 0) == NULL);
    CHECK(sim_kernel_ch(s, ctx, NULL, 0, 1) == NULL);
    /* NCCL never does these, but a plugin must not care */
    if (s->api == 4) {
        CHECK(s->v4->stopEvent(NULL) == ncclSuccess);
        CHECK(s->v4->recordEventState(NULL, ncclProfilerKernelChStop, NULL) == ncclSuccess);
        CHECK(s->v4->finalize(NULL) == ncclSuccess);
    } else {
        CHECK(s->v5->stopEvent(NULL) == ncclSuccess);
        CHECK(s->v5->recordEventState(NULL, ncclProfilerProxyStepSendWait, NULL) ==
              ncclSuccess);
        CHECK(s->v5->finalize(NULL) == ncclSuccess);
    }
}

/* COLLSCOPE_TRACE_DIR not writable: init succeeds with a NULL context, logs once, sets no
 * mask; every callback is a harmless no-op. */
static void t_unwritable_dir(void)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/plainfile", g_dir);
    FILE *fp = fopen(path, "w");
    CHECK(fp != NULL);
    fclose(fp);
    snprintf(path, sizeof(path), "%s/plainfile/sub", g_dir);  /* ENOTDIR, even for root */
    setenv("COLLSCOPE_TRACE_DIR", path, 1);
    struct ncclsim s;
    open_sim(&s, 4);
    void *ctx = sim_init(&s, 0x2, "x", 1, 2, 0, test_logger);
    CHECK(ctx == NULL);
    CHECK_EQ(s.mask, 0);
    CHECK_EQ(atomic_load(&g_log_calls), 1);
    CHECK_EQ(atomic_load(&g_log_level), CS_NCCL_LOG_WARN);
    void *ctx2 = sim_init(&s, 0x3, "y", 1, 2, 1, test_logger);
    CHECK(ctx2 == NULL);
    CHECK_EQ(atomic_load(&g_log_calls), 1);  /* once per process */
    play_everything_on_null(&s, ctx);
    CHECK_EQ(ring_count_files(g_dir), 0);
    sim_close(&s);
}

static void t_no_trace_dir(void)
{
    unsetenv("COLLSCOPE_TRACE_DIR");
    struct ncclsim s;
    open_sim(&s, 5);
    void *ctx = sim_init(&s, 0x2, NULL, 1, 2, 0, test_logger);
    CHECK(ctx == NULL);
    CHECK_EQ(s.mask, 0);
    CHECK_EQ(atomic_load(&g_log_calls), 1);
    CHECK_EQ(atomic_load(&g_log_level), CS_NCCL_LOG_INFO);
    play_everything_on_null(&s, ctx);
    sim_close(&s);
}

/* Fixed tables run out: comm slots, flow slots, op slots; counted, completions still flow. */
static void t_exhaustion(void)
{
    struct ncclsim s;
    open_sim(&s, 5);
    void *ctx[COLLSCOPE_COMM_SLOTS + 1];
    for (unsigned i = 0; i <= COLLSCOPE_COMM_SLOTS; i++) {
        ctx[i] = sim_init(&s, 0x100 + i, "c", 1, 256, 0, test_logger);
        CHECK(ctx[i] != NULL);
    }
    struct ring r;
    open_ring(&r);
    CHECK_EQ(ring_counter(&r.hdr->comm_slots_exhausted), 1);
    CHECK_EQ(comm_slot_of(&r, 0x100 + COLLSCOPE_COMM_SLOTS), -1);

    /* the slot-less comm still logs completions */
    void *coll = enqueue_coll(&s, ctx[COLLSCOPE_COMM_SLOTS], 3, "AllReduce", 2, "ncclInt64", 1,
                              "NVLS", "SIMPLE");
    void *k = sim_kernel_ch(&s, ctx[COLLSCOPE_COMM_SLOTS], coll, 0, 0);
    sim_kernel_ch_stop(&s, k, 0);
    size_t n = read_all(&r, NULL);
    const struct collscope_op_record *o =
        find_op(n, 0x100 + COLLSCOPE_COMM_SLOTS, COLLSCOPE_FUNC_ALLREDUCE, 3);
    CHECK(o != NULL);
    CHECK_EQ(o->comm_slot, COLLSCOPE_NO_SLOT);
    CHECK_EQ(o->algo, COLLSCOPE_ALGO_NVLS);
    CHECK_EQ(o->bytes, 16);

    /* more flows than flow slots: 2 channels x 70 peers x send */
    coll = enqueue_coll(&s, ctx[0], 0, "AllToAll", 1u << 20, "ncclUint8", 2, "", "");
    void *ops[140];
    int got = 0;
    for (int i = 0; i < 140; i++) {
        ops[i] = sim_proxy_op(&s, ctx[0], coll, getpid(), i % 2, i / 2, 1, 1);
        CHECK(ops[i] != NULL);  /* the op is still tracked for completion */
    }
    int cs = comm_slot_of(&r, 0x100);
    for (int i = 0; i < 140; i++) {
        struct collscope_flow_slot fl;
        got += ring_find_flow(&r, (unsigned)cs, i % 2, i / 2, COLLSCOPE_DIR_SEND, &fl) == 0;
    }
    uint64_t exhausted = ring_counter(&r.hdr->flow_slots_exhausted);
    CHECK(got <= (int)COLLSCOPE_FLOWS_PER_COMM);
    CHECK(exhausted >= 140 - COLLSCOPE_FLOWS_PER_COMM);
    CHECK_EQ((uint64_t)got + exhausted, 140);
    for (int i = 0; i < 140; i++) {
        void *st = sim_step(&s, ctx[0], ops[i], 0);
        sim_record(&s, st, ncclProfilerProxyStepSendPeerWait_v4, 0);
        sim_record(&s, st, ncclProfilerProxyStepSendWait, 1);
        sim_stop(&s, st);
    }
    void *k0 = sim_kernel_ch(&s, ctx[0], coll, 0, 0);
    void *k1 = sim_kernel_ch(&s, ctx[0], coll, 1, 0);
    sim_kernel_ch_stop(&s, k0, 0);
    sim_kernel_ch_stop(&s, k1, 0);
    for (int i = 0; i < 139; i++) {
        sim_stop(&s, ops[i]);
    }
    CHECK(find_op(read_all(&r, NULL), 0x100, COLLSCOPE_FUNC_ALLTOALL, 0) == NULL);
    sim_stop(&s, ops[139]);
    n = read_all(&r, NULL);
    o = find_op(n, 0x100, COLLSCOPE_FUNC_ALLTOALL, 0);
    CHECK(o != NULL);
    CHECK_EQ(o->algo, 0);

    /* more ops in flight than op slots: the oldest stay visible */
    void *colls[COLLSCOPE_OPS_PER_COMM + 1];
    for (unsigned i = 0; i <= COLLSCOPE_OPS_PER_COMM; i++) {
        colls[i] = enqueue_coll(&s, ctx[1], i, "AllGather", 4, "ncclInt8", 1, "RING", "LL");
    }
    CHECK_EQ(ring_counter(&r.hdr->op_slots_busy), 1);
    struct collscope_op_slot op;
    cs = comm_slot_of(&r, 0x101);
    CHECK(ring_inflight_op(&r, (unsigned)cs, &op) == 0);
    CHECK_EQ(op.seq, 0);
    for (unsigned i = 0; i <= COLLSCOPE_OPS_PER_COMM; i++) {
        void *kk = sim_kernel_ch(&s, ctx[1], colls[i], 0, 0);
        sim_kernel_ch_stop(&s, kk, 0);
    }
    CHECK(ring_inflight_op(&r, (unsigned)cs, &op) != 0);
    n = read_all(&r, NULL);
    for (unsigned i = 0; i <= COLLSCOPE_OPS_PER_COMM; i++) {
        CHECK(find_op(n, 0x101, COLLSCOPE_FUNC_ALLGATHER, i) != NULL);
    }
    for (unsigned i = 0; i <= COLLSCOPE_COMM_SLOTS; i++) {
        sim_finalize(&s, ctx[i]);
    }
    CHECK_EQ(r.hdr->state, COLLSCOPE_RING_STATE_IDLE);
    /* a new comm reuses the slot finalized first */
    void *again = sim_init(&s, 0x999, "again", 1, 2, 0, test_logger);
    CHECK_EQ(comm_slot_of(&r, 0x999), 0);
    struct collscope_comm_slot c;
    CHECK(ring_snap_comm(&r, 0, &c) == 0);
    CHECK_EQ(c.generation, 2);
    CHECK_EQ(c.ops_completed, 0);
    struct collscope_flow_slot fl;
    CHECK(ring_find_flow(&r, 0, 0, 0, COLLSCOPE_DIR_SEND, &fl) != 0);  /* flows were reset */
    sim_finalize(&s, again);
    ring_close(&r);
    sim_close(&s);
}

/* Completion corner cases of notes §3/§8. */
static void t_completion_edges(void)
{
    struct ncclsim s;
    open_sim(&s, 6);
    const uint64_t hash = 0xe;
    void *ctx = sim_init(&s, hash, "e", 1, 8, 0, test_logger);
    CHECK(ctx != NULL);
    struct ring r;
    open_ring(&r);

    /* (a) the kernel finishes before Coll stop returns: end is only an upper bound */
    void *group = sim_group(&s, ctx);
    void *coll = sim_coll(&s, ctx, group, 0, "AllReduce", 8, "ncclFloat32", 1, "RING", "LL");
    void *k = sim_kernel_ch(&s, ctx, coll, 0, 10);
    sim_kernel_ch_stop(&s, k, 11);
    CHECK_EQ(count_type(read_all(&r, NULL), COLLSCOPE_EV_OP), 0);
    sim_stop(&s, coll);
    sim_stop(&s, group);
    size_t n = read_all(&r, NULL);
    const struct collscope_op_record *o = find_op(n, hash, COLLSCOPE_FUNC_ALLREDUCE, 0);
    CHECK(o != NULL);
    CHECK_EQ(o->flags, COLLSCOPE_OPF_KERNEL | COLLSCOPE_OPF_END_AT_ENQUEUE |
                           COLLSCOPE_OPF_GPU_TIMED);

    /* (b) nChannels 0 and no children: closed at Coll stop; late children are ignored */
    coll = enqueue_coll(&s, ctx, 1, "AllReduce", 8, "ncclFloat32", 0, "NVLS", "SIMPLE");
    n = read_all(&r, NULL);
    o = find_op(n, hash, COLLSCOPE_FUNC_ALLREDUCE, 1);
    CHECK(o != NULL);
    CHECK_EQ(o->flags, COLLSCOPE_OPF_NO_CHILDREN);
    CHECK(sim_kernel_ch(&s, ctx, coll, 0, 1) == NULL);

    /* (c) a non-network proxy op (started, never stepped nor stopped) does not hold the op */
    coll = enqueue_coll(&s, ctx, 2, "AllReduce", 8, "ncclFloat32", 2, "COLLNET_DIRECT",
                        "SIMPLE");
    void *pop = sim_proxy_op(&s, ctx, coll, getpid(), 0, 1, 4, 1);
    CHECK(pop != NULL);
    void *k0 = sim_kernel_ch(&s, ctx, coll, 0, 0);
    void *k1 = sim_kernel_ch(&s, ctx, coll, 1, 0);
    sim_kernel_ch_stop(&s, k0, 0);
    CHECK(find_op(read_all(&r, NULL), hash, COLLSCOPE_FUNC_ALLREDUCE, 2) == NULL);
    sim_kernel_ch_stop(&s, k1, 0);
    n = read_all(&r, NULL);
    o = find_op(n, hash, COLLSCOPE_FUNC_ALLREDUCE, 2);
    CHECK(o != NULL);
    CHECK_EQ(o->flags, COLLSCOPE_OPF_KERNEL);
    CHECK_EQ(o->algo, COLLSCOPE_ALGO_COLLNET_DIRECT);

    /* (d) a recv step started twice (irecv returned no request): counted once */
    coll = enqueue_coll(&s, ctx, 3, "AllReduce", 8, "ncclFloat32", 1, "RING", "SIMPLE");
    struct simflow fr;
    flow_begin(&fr, &s, ctx, coll, 0, 7, 2, 0);
    void *st0 = sim_step(&s, ctx, fr.op, 0);
    (void)st0;  /* orphaned by NCCL: never stopped */
    fr.steps[0] = sim_step(&s, ctx, fr.op, 0);
    fr.c[0] = 1;
    flow_finish(&fr);
    check_flow(&r, 0, &fr, 3, COLLSCOPE_FLOW_RUNNING);
    k = sim_kernel_ch(&s, ctx, coll, 0, 0);
    sim_kernel_ch_stop(&s, k, 0);
    flow_end(&fr);
    n = read_all(&r, NULL);
    o = find_op(n, hash, COLLSCOPE_FUNC_ALLREDUCE, 3);
    CHECK(o != NULL);
    CHECK_EQ(o->flags, COLLSCOPE_OPF_KERNEL | COLLSCOPE_OPF_PROXY);
    sim_finalize(&s, ctx);
    ring_close(&r);
    sim_close(&s);
}

/* The next op's ProxyOp is appended while the previous op still moves chunks on the same
 * connection: the flow keeps showing the previous op until the next one's first step. */
static void t_flow_takeover(void)
{
    struct ncclsim s;
    open_sim(&s, 5);
    void *ctx = sim_init(&s, 0xf, "f", 2, 4, 0, test_logger);
    struct ring r;
    open_ring(&r);
    void *a = enqueue_coll(&s, ctx, 0, "AllReduce", 64, "ncclFloat32", 1, "RING", "SIMPLE");
    struct simflow fa, fb;
    flow_begin(&fa, &s, ctx, a, 0, 1, 4, 1);
    flow_in_progress(&fa);
    const int two[4] = {4, 3, 2, 2};
    flow_drive(&fa, two);
    void *b = enqueue_coll(&s, ctx, 1, "AllReduce", 64, "ncclFloat32", 1, "RING", "SIMPLE");
    flow_begin(&fb, &s, ctx, b, 0, 1, 4, 1);  /* queued behind a */
    check_flow(&r, 0, &fa, 0, COLLSCOPE_FLOW_RUNNING);
    flow_finish(&fa);
    flow_end(&fa);
    check_flow(&r, 0, &fa, 0, COLLSCOPE_FLOW_DONE);
    const int one[4] = {1, 0, 0, 0};
    flow_drive(&fb, one);
    check_flow(&r, 0, &fb, 1, COLLSCOPE_FLOW_RUNNING);
    flow_finish(&fb);
    flow_end(&fb);
    check_flow(&r, 0, &fb, 1, COLLSCOPE_FLOW_DONE);
    void *ka = sim_kernel_ch(&s, ctx, a, 0, 0);
    sim_kernel_ch_stop(&s, ka, 0);
    void *kb = sim_kernel_ch(&s, ctx, b, 0, 0);
    sim_kernel_ch_stop(&s, kb, 0);
    CHECK_EQ(count_type(read_all(&r, NULL), COLLSCOPE_EV_OP), 2);
    CHECK_EQ(ring_counter(&r.hdr->stale_flow_events), 0);
    sim_finalize(&s, ctx);
    ring_close(&r);
    sim_close(&s);
}

/* A process forked after init (data loader workers) must not write into its parent's ring:
 * a communicator created in the child gets the child's own ring file. */
static void t_fork_child(void)
{
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    /* Neither sanitizer's runtime survives a child that creates threads after a multi-threaded
     * fork: TSan cannot follow it, and ASan's allocator keeps a region lock that the parent's
     * heartbeat thread held at the fork, so the child's own heartbeat thread (which allocates in
     * pthread_getattr_np) waits on it forever: it hung `make test` in one of four clean-clone
     * runs on 2026-11-25. glibc's malloc resets its locks in the child; the plain run covers
     * this test. */
    fprintf(stderr, "fork_child: skipped under a sanitizer\n");
    return;
#endif
    struct ncclsim s;
    open_sim(&s, 5);
    void *ctx = sim_init(&s, 0xf0, "parent", 1, 2, 0, test_logger);
    CHECK(ctx != NULL);
    pid_t child = fork();
    if (child == 0) {
        void *cctx = sim_init(&s, 0xc1, "child", 1, 2, 1, test_logger);
        if (cctx == NULL) {
            _exit(3);
        }
        sim_finalize(&s, cctx);
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_EQ(ring_count_files(g_dir), 2);
    /* the parent's ring: its own comm only */
    char path[600];
    snprintf(path, sizeof(path), "%s/sub", g_dir);
    CHECK(mkdir(path, 0755) == 0);
    DIR *d = opendir(g_dir);
    CHECK(d != NULL);
    struct dirent *e;
    char mine[64], from[1024], to[1024];
    snprintf(mine, sizeof(mine), "-pid%d-", (int)getpid());
    while ((e = readdir(d)) != NULL) {
        if (strstr(e->d_name, mine) != NULL) {
            snprintf(from, sizeof(from), "%s/%s", g_dir, e->d_name);
            snprintf(to, sizeof(to), "%s/%s", path, e->d_name);
            CHECK(rename(from, to) == 0);
        }
    }
    closedir(d);
    const char *saved = g_dir;
    g_dir = path;
    struct ring r;
    open_ring(&r);
    g_dir = saved;
    CHECK_EQ(r.hdr->pid, getpid());
    CHECK_EQ(ring_counter(&r.hdr->comms_total), 1);
    CHECK_EQ(comm_slot_of(&r, 0xc1), -1);
    sim_finalize(&s, ctx);
    CHECK_EQ(count_type(read_all(&r, NULL), COLLSCOPE_EV_COMM_FINALIZE), 1);
    ring_close(&r);
    rename(to, from);
    rmdir(path);
    sim_close(&s);
}

/* ---- runner --------------------------------------------------------------------------------- */

struct test {
    const char *name;
    void (*fn)(void);
};


/* ---- version 2: owner thread, names, clock ------------------------------------------------- */

struct foreign_job {
    struct ncclsim *s;
    void *ctx, *coll;
};

/* channel 1 of the op, played on a second thread: its ProxyOp (PXN-like, in-process) and,
 * against NCCL's one-thread rule, its KernelCh */
static void *foreign_channel(void *arg)
{
    struct foreign_job *j = arg;
    void *pop = sim_proxy_op(j->s, j->ctx, j->coll, getpid(), 1, 3, 1, 1);
    CHECK(pop != NULL);
    void *st = sim_step(j->s, j->ctx, pop, 0);
    CHECK(st != NULL);
    sim_stop(j->s, st);
    void *k = sim_kernel_ch(j->s, j->ctx, j->coll, 1, 150);
    CHECK(k != NULL);
    sim_kernel_ch_stop(j->s, k, 250);
    sim_stop(j->s, pop);
    return NULL;
}

/* The proxy thread (the first to start a KernelCh) counts in the plain fields, another thread
 * in the `_other` ones; a KernelCh stop off the proxy thread is counted, and the op still
 * completes exactly once, when its last child stops. */
static void t_owner_thread(void)
{
    struct ncclsim s;
    open_sim(&s, 6);
    void *ctx = sim_init(&s, 0x0e, "owner", 1, 4, 0, test_logger);
    struct ring r;
    open_ring(&r);
    void *coll = enqueue_coll(&s, ctx, 0, "AllReduce", 256, "ncclFloat32", 2, "RING", "LL");
    void *k0 = sim_kernel_ch(&s, ctx, coll, 0, 100);  /* this thread becomes the owner */
    void *pop = sim_proxy_op(&s, ctx, coll, getpid(), 0, 1, 1, 1);
    void *st = sim_step(&s, ctx, pop, 0);
    sim_stop(&s, st);
    struct foreign_job j = {&s, ctx, coll};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, foreign_channel, &j) == 0);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK_EQ(count_type(read_all(&r, NULL), COLLSCOPE_EV_OP), 0);  /* channel 0 is running */
    const struct collscope_op_slot *raw = &ring_comm_slot(&r, 0)->ops[0];
    CHECK_EQ(ring_counter32(&raw->kch_started), 1);
    CHECK_EQ(ring_counter32(&raw->kch_started_other), 1);
    CHECK_EQ(ring_counter32(&raw->proxy_ops_started), 1);
    CHECK_EQ(ring_counter32(&raw->proxy_ops_started_other), 1);
    CHECK_EQ(ring_counter32(&raw->proxy_ops_done_other), 1);
    CHECK_EQ(ring_counter(&r.hdr->kernel_foreign_events), 1);
    sim_kernel_ch_stop(&s, k0, 200);
    CHECK_EQ(count_type(read_all(&r, NULL), COLLSCOPE_EV_OP), 0);  /* its ProxyOp holds it */
    sim_stop(&s, pop);
    size_t n = read_all(&r, NULL);
    CHECK_EQ(count_type(n, COLLSCOPE_EV_OP), 1);
    const struct collscope_op_record *o = find_op(n, 0x0e, COLLSCOPE_FUNC_ALLREDUCE, 0);
    CHECK(o != NULL);
    CHECK_EQ(o->gpu_ns, 250 - 100);
    struct collscope_op_slot op;
    CHECK(ring_snap_op(raw, &op) == 0);
    CHECK_EQ(op.state, COLLSCOPE_OP_DONE);
    CHECK_EQ(op.kch_started, 2);
    CHECK_EQ(op.kch_done, 2);
    CHECK_EQ(op.proxy_ops_started, 2);
    CHECK_EQ(op.proxy_ops_done, 2);
    sim_finalize(&s, ctx);
    ring_close(&r);
    sim_close(&s);
}

/* Comm records keep 23 bytes of the name (version 2; 15 before), the slot all 63. */
static void t_long_name(void)
{
    struct ncclsim s;
    open_sim(&s, 5);
    const char *name = "tensor-parallel-group-07-of-16";
    void *ctx = sim_init(&s, 0x1a, name, 1, 2, 1, test_logger);
    struct ring r;
    open_ring(&r);
    size_t n = read_all(&r, NULL);
    CHECK_EQ(n, 1);
    CHECK_EQ(g_events[0].comm.type, COLLSCOPE_EV_COMM_INIT);
    CHECK(strcmp(g_events[0].comm.name, "tensor-parallel-group-0") == 0);
    CHECK_EQ(g_events[0].comm.rank, 1);
    CHECK_EQ(g_events[0].comm.nranks, 2);
    CHECK_EQ(g_events[0].comm.comm_hash, 0x1a);
    struct collscope_comm_slot c;
    CHECK(ring_snap_comm(&r, 0, &c) == 0);
    CHECK(strcmp(c.name, name) == 0);
    sim_finalize(&s, ctx);
    ring_close(&r);
    sim_close(&s);
}

/* Op times come from the CPU counter scaled by the heartbeat's calibration (when the kernel's
 * clocksource is that counter): they must agree with clock_gettime. */
static void t_clock(void)
{
    struct ncclsim s;
    open_sim(&s, 6);
    void *ctx = sim_init(&s, 0xc1, "clock", 1, 2, 0, test_logger);
    struct ring r;
    open_ring(&r);
    sleep_ms(35);  /* a few heartbeat ticks: calibrated */
    for (int i = 0; i < 20; i++) {
        int64_t t0 = now_ns();
        void *coll = enqueue_coll(&s, ctx, (uint64_t)i, "Broadcast", 8, "ncclInt8", 1, "RING",
                                  "LL");
        void *k = sim_kernel_ch(&s, ctx, coll, 0, 0);
        sim_kernel_ch_stop(&s, k, 0);
        int64_t t1 = now_ns();
        size_t n = read_all(&r, NULL);
        const struct collscope_op_record *o = find_op(n, 0xc1, COLLSCOPE_FUNC_BROADCAST, (uint64_t)i);
        CHECK(o != NULL);
        /* 200 us of slack: the calibration error is far below a microsecond */
        CHECK(o->start_ns >= t0 - 200000 && o->start_ns <= t1 + 200000);
        CHECK(o->end_ns >= o->start_ns && o->end_ns <= t1 + 200000);
        sleep_ms(3);
    }
    sim_finalize(&s, ctx);
    ring_close(&r);
    sim_close(&s);
}

static const struct test TESTS[] = {
    {"allreduce_v4", t_allreduce_v4},
    {"allreduce_v5", t_allreduce_v5},
    {"allreduce_v6", t_allreduce_v6},
    {"p2p", t_p2p},
    {"stalled_peer", t_stalled_peer},
    {"concurrent_comms", t_concurrent_comms},
    {"concurrent_same_comm", t_concurrent_same_comm},
    {"pxn_foreign", t_pxn_foreign},
    {"wrap", t_wrap},
    {"ring_size_clamp", t_ring_size_clamp},
    {"ring_size_suffix", t_ring_size_suffix},
    {"ring_size_garbage", t_ring_size_garbage},
    {"unwritable_dir", t_unwritable_dir},
    {"no_trace_dir", t_no_trace_dir},
    {"exhaustion", t_exhaustion},
    {"completion_edges", t_completion_edges},
    {"flow_takeover", t_flow_takeover},
    {"fork_child", t_fork_child},
    {"owner_thread", t_owner_thread},
    {"long_name", t_long_name},
    {"clock", t_clock},
};
#define NTESTS (sizeof(TESTS) / sizeof(TESTS[0]))

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        return;
    }
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
    }
    closedir(d);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc == 4) {
        g_plugin = argv[1];
        g_dir = argv[3];
        setenv("COLLSCOPE_TRACE_DIR", g_dir, 1);
        for (size_t i = 0; i < NTESTS; i++) {
            if (strcmp(TESTS[i].name, argv[2]) == 0) {
                TESTS[i].fn();
                return 0;
            }
        }
        fprintf(stderr, "unknown test %s\n", argv[2]);
        return 2;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: %s PLUGIN_SO [TEST DIR]\n", argv[0]);
        return 2;
    }
    int failed = 0;
    for (size_t i = 0; i < NTESTS; i++) {
        char dir[] = "/tmp/collscope-test-XXXXXX";
        if (mkdtemp(dir) == NULL) {
            perror("mkdtemp");
            return 1;
        }
        int64_t t0 = now_ns();
        pid_t pid = fork();
        if (pid == 0) {
            execl("/proc/self/exe", argv[0], argv[1], TESTS[i].name, dir, (char *)NULL);
            perror("execl");
            _exit(127);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        printf("%-24s %s (%.0f ms)\n", TESTS[i].name, ok ? "ok" : "FAILED",
               (double)(now_ns() - t0) / 1e6);
        fflush(stdout);
        failed += !ok;
        rm_tree(dir);
    }
    printf("%zu tests, %d failed\n", NTESTS, failed);
    return failed == 0 ? 0 : 1;
}
