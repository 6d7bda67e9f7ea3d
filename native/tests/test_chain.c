/*
 * test_chain.c: collscope with a second profiler plugin behind it
 * (COLLSCOPE_NEXT_PROFILER_PLUGIN, src/chain.c).
 *
 *   test_chain PLUGIN_SO NEXT_DIR            run every test, each in a fresh process
 *   test_chain PLUGIN_SO NEXT_DIR TEST DIR   run one test (COLLSCOPE_TRACE_DIR=DIR)
 *
 * NEXT_DIR holds the variants of tests/next_plugin.c: libnccl-profiler-nexttest.so (v4, v5,
 * v6), libnext-v4.so, libnext-v3.so (an API too old to chain), libnext-failinit.so. Each test
 * plays NCCL's sequence of ring all-reduces (tests/ncclsim.c) and checks both sides: the
 * completion record and counters in collscope's ring, and every call the next plugin counted,
 * with its own handles, parents and contexts.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ncclsim.h"
#include "ringread.h"

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

#define CS_MASK \
    (ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep | \
     ncclProfileKernelCh)
#define INSPECTOR_MASK (ncclProfileColl | ncclProfileP2p | ncclProfileKernelCh)
#define NTYPES 16

/* tests/next_plugin.c's counters */
struct next_counts {
    _Atomic uint64_t inits, finalizes, bad_ctx;
    _Atomic uint64_t starts[NTYPES];
    _Atomic uint64_t stops[NTYPES];
    _Atomic uint64_t records[NTYPES];
    _Atomic uint64_t bad_handle, parent_ok, parent_null, parent_bad, last_api, foreign;
};

static const char *g_plugin, *g_next_dir, *g_dir;
static char g_next[600];

static atomic_int g_log_calls;

static void test_logger(int level, unsigned long flags, const char *file, int line,
                        const char *fmt, ...)
{
    (void)level, (void)flags, (void)file, (void)line, (void)fmt;
    atomic_fetch_add(&g_log_calls, 1);
}

static void use_next(const char *file)
{
    snprintf(g_next, sizeof(g_next), "%s/%s", g_next_dir, file);
    setenv("COLLSCOPE_NEXT_PROFILER_PLUGIN", g_next, 1);
}

/* the next plugin's counters: dlopen of a loaded library returns that same instance */
static struct next_counts *counts_of(const char *path)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    CHECK(lib != NULL);
    struct next_counts *(*fn)(void) = (struct next_counts * (*)(void)) dlsym(lib, "next_counts");
    CHECK(fn != NULL);
    struct next_counts *c = fn();
    dlclose(lib);
    return c;
}

static unsigned bit(uint64_t type)
{
    return (unsigned)__builtin_ctzll(type);
}

enum { NCH = 2, NSTEPS = 4 };

/* One ring all-reduce in NCCL's order: API events, Group, Coll, per channel a send and a recv
 * ProxyOp (InProgress; steps with their states; stop) and a KernelCh. */
static void play_allreduce(struct ncclsim *s, void *ctx, uint64_t seq)
{
    void *gapi = NULL;
    void *capi = sim_api_enter(s, ctx, "AllReduce", &gapi);
    void *group = sim_group(s, ctx);
    struct sim_descr cd = {
        .type = ncclProfileColl, .parent = s->api >= 5 ? capi : group, .group = group,
        .seq = seq, .func = "AllReduce", .count = 1u << 16, .datatype = "ncclFloat32",
        .nchannels = NCH, .algo = "RING", .proto = "SIMPLE",
    };
    void *coll = sim_start(s, ctx, &cd);
    sim_stop(s, coll);
    sim_stop(s, group);
    sim_api_leave(s, gapi);
    for (int ch = 0; ch < NCH; ch++) {
        void *k = sim_kernel_ch(s, ctx, coll, ch, 100);
        for (int send = 0; send <= 1; send++) {
            void *op = sim_proxy_op(s, ctx, coll, getpid(), ch, send ? 1 : 3, NSTEPS, send);
            sim_record(s, op, ncclProfilerProxyOpInProgress_v4, 0);
            for (int st = 0; st < NSTEPS; st++) {
                void *h = sim_step(s, ctx, op, st);
                if (send) {
                    sim_record(s, h, ncclProfilerProxyStepSendGPUWait, 0);
                    sim_record(s, h, ncclProfilerProxyStepSendPeerWait_v4, 0);
                    sim_record(s, h, ncclProfilerProxyStepSendWait, 4096);
                } else {
                    sim_record(s, h, ncclProfilerProxyStepRecvWait, 0);
                    sim_record(s, h, ncclProfilerProxyStepRecvFlushWait, 4096);
                    sim_record(s, h, ncclProfilerProxyStepRecvGPUWait, 4096);
                }
                sim_stop(s, h);
            }
            sim_stop(s, op);
        }
        sim_kernel_ch_stop(s, k, 200);
    }
}

/* collscope's side: ops completed, with every proxy op and kernel channel counted */
static void check_ring(uint64_t hash, uint64_t ops)
{
    struct ring r;
    char err[600];
    CHECK(ring_open_dir(&r, g_dir, err, sizeof(err)) == 0);
    int found = 0;
    for (unsigned i = 0; i < COLLSCOPE_COMM_SLOTS; i++) {
        struct collscope_comm_slot c;
        CHECK(ring_snap_comm(&r, i, &c) == 0);
        if (c.state != COLLSCOPE_COMM_FREE && c.comm_hash == hash) {
            CHECK_EQ(c.ops_started, ops);
            CHECK_EQ(c.ops_completed, ops);
            found = 1;
        }
    }
    CHECK(found);
    CHECK_EQ(ring_counter(&r.hdr->handles_exhausted), 0);
    CHECK_EQ(ring_counter(&r.hdr->events_dropped), 0);
    CHECK_EQ(ring_counter(&r.hdr->stale_flow_events), 0);
    ring_close(&r);
}

/* the next plugin got exactly the events NCCL would have sent it alone, with its handles */
static void check_next(struct next_counts *n, int api, uint64_t mask, uint64_t ops)
{
    const uint64_t per_op[NTYPES] = {
        [0] = 1,                                     /* Group */
        [1] = 1,                                     /* Coll */
        [3] = 2 * NCH,                               /* ProxyOp */
        [4] = 2 * NCH * NSTEPS,                      /* ProxyStep */
        [6] = NCH,                                   /* KernelCh */
        [8] = api >= 5,                              /* GroupApi */
        [9] = api >= 5,                              /* CollApi */
    };
    const uint64_t rec_per_op[NTYPES] = {
        [3] = 2 * NCH, [4] = 6 * NCH * NSTEPS, [6] = NCH, [8] = 2 * (api >= 5),
    };
    /* what NCCL starts for a plugin asking for `mask` (the mask plus its ancestors) */
    uint64_t want = mask;
    if (want & ncclProfileProxyStep) {
        want |= ncclProfileProxyOp;
    }
    if (want & (ncclProfileProxyOp | ncclProfileKernelCh)) {
        want |= ncclProfileColl | ncclProfileP2p;
    }
    if (want & ncclProfileColl) {
        want |= ncclProfileGroup | (api >= 5 ? ncclProfileCollApi | ncclProfileGroupApi : 0);
    }
    for (unsigned b = 0; b < NTYPES; b++) {
        uint64_t e = (want >> b) & 1u ? per_op[b] * ops : 0;
        if (atomic_load(&n->starts[b]) != e || atomic_load(&n->stops[b]) != e ||
            atomic_load(&n->records[b]) != ((want >> b) & 1u ? rec_per_op[b] * ops : 0)) {
            fprintf(stderr, "type bit %u: starts %llu stops %llu records %llu, want %llu\n", b,
                    (unsigned long long)n->starts[b], (unsigned long long)n->stops[b],
                    (unsigned long long)n->records[b], (unsigned long long)e);
            exit(1);
        }
    }
    CHECK_EQ(atomic_load(&n->bad_handle), 0);
    CHECK_EQ(atomic_load(&n->bad_ctx), 0);
    CHECK_EQ(atomic_load(&n->parent_bad), 0);
    CHECK_EQ(atomic_load(&n->parent_null), 0);
    CHECK(atomic_load(&n->parent_ok) > 0);
}

static void chained(int api, const char *next_file, int next_api, uint64_t next_mask)
{
    use_next(next_file);
    char m[32];
    snprintf(m, sizeof(m), "0x%llx", (unsigned long long)next_mask);
    setenv("NEXT_TEST_MASK", m, 1);
    struct ncclsim s;
    CHECK(sim_open(&s, g_plugin, api) == 0);
    void *ctx = sim_init(&s, 0xc4a1 + (uint64_t)api, "dp", 1, 8, 0, test_logger);
    CHECK(ctx != NULL);
    CHECK_EQ(s.mask, CS_MASK | next_mask);
    CHECK_EQ(atomic_load(&g_log_calls), 1);    /* "chained profiler plugin ..." */
    struct next_counts *n = counts_of(g_next);
    CHECK_EQ(atomic_load(&n->inits), 1);
    for (uint64_t i = 0; i < 3; i++) {
        play_allreduce(&s, ctx, i);
    }
    check_ring(0xc4a1 + (uint64_t)api, 3);
    check_next(n, next_api, next_mask, 3);
    CHECK_EQ(atomic_load(&n->last_api), next_api);
    sim_finalize(&s, ctx);
    CHECK_EQ(atomic_load(&n->finalizes), 1);
    sim_close(&s);
}

static const uint64_t FULL_MASK = CS_MASK | ncclProfileNetPlugin;

static void t_chain_v6(void) { chained(6, "libnccl-profiler-nexttest.so", 6, INSPECTOR_MASK); }
static void t_chain_v5(void) { chained(5, "libnccl-profiler-nexttest.so", 5, INSPECTOR_MASK); }
static void t_chain_v4(void) { chained(4, "libnccl-profiler-nexttest.so", 4, INSPECTOR_MASK); }
static void t_chain_v6_full(void) { chained(6, "libnccl-profiler-nexttest.so", 6, FULL_MASK); }
static void t_chain_v4_full(void) { chained(4, "libnccl-profiler-nexttest.so", 4, FULL_MASK); }
/* NCCL speaks v6/v5 to collscope, the next plugin has only v4: descriptors converted */
static void t_chain_to_v4_from_v6(void) { chained(6, "libnext-v4.so", 4, FULL_MASK); }
static void t_chain_to_v4_from_v5(void) { chained(5, "libnext-v4.so", 4, INSPECTOR_MASK); }

/* resolved like NCCL_PROFILER_PLUGIN: "nexttest" -> libnccl-profiler-nexttest.so on the
 * library path (the runner sets LD_LIBRARY_PATH=NEXT_DIR for this test) */
static void t_chain_by_name(void)
{
    setenv("COLLSCOPE_NEXT_PROFILER_PLUGIN", "nexttest", 1);
    struct ncclsim s;
    CHECK(sim_open(&s, g_plugin, 6) == 0);
    void *ctx = sim_init(&s, 0xb1, "dp", 1, 8, 0, test_logger);
    CHECK(ctx != NULL);
    CHECK_EQ(s.mask, CS_MASK | INSPECTOR_MASK);
    play_allreduce(&s, ctx, 0);
    check_ring(0xb1, 1);
    struct next_counts *n = counts_of("libnccl-profiler-nexttest.so");
    check_next(n, 6, INSPECTOR_MASK, 1);
    sim_finalize(&s, ctx);
    sim_close(&s);
}

/* collscope alone, exactly as without chaining, and one log line saying why */
static void alone(const char *spec, int api, int expect_log)
{
    setenv("COLLSCOPE_NEXT_PROFILER_PLUGIN", spec, 1);
    struct ncclsim s;
    CHECK(sim_open(&s, g_plugin, api) == 0);
    void *ctx = sim_init(&s, 0xa1, "dp", 1, 8, 0, test_logger);
    void *ctx2 = sim_init(&s, 0xa2, "tp", 1, 8, 0, test_logger);
    CHECK(ctx != NULL && ctx2 != NULL);
    CHECK_EQ(s.mask, CS_MASK);
    CHECK_EQ(atomic_load(&g_log_calls), expect_log);
    play_allreduce(&s, ctx, 0);
    play_allreduce(&s, ctx2, 0);
    play_allreduce(&s, ctx, 1);
    check_ring(0xa1, 2);
    check_ring(0xa2, 1);
    sim_finalize(&s, ctx);
    sim_finalize(&s, ctx2);
    sim_close(&s);
}

static void t_missing(void) { alone("/nonexistent/libnccl-profiler-gone.so", 6, 1); }
static void t_missing_name(void) { alone("gone", 5, 1); }
static void t_not_a_library(void)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/not-a-library.so", g_next_dir);
    alone(p, 6, 1);
}
static void t_v3_only(void)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/libnext-v3.so", g_next_dir);
    alone(p, 6, 1);
}
/* NCCL 2.27 speaks v4; a next plugin with only v5/v6 would not load there either */
static void t_v4_nccl_v56_next(void)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/libnext-v56.so", g_next_dir);
    alone(p, 4, 1);
}
static void t_self_path(void) { alone(g_plugin, 6, 1); }
static void t_none(void) { alone("none", 6, 0); }

/* the next plugin's init fails on every comm: collscope goes on, one log line in all */
static void t_next_init_fails(void)
{
    use_next("libnext-failinit.so");
    struct ncclsim s;
    CHECK(sim_open(&s, g_plugin, 6) == 0);
    void *ctx = sim_init(&s, 0xf1, "dp", 1, 8, 0, test_logger);
    void *ctx2 = sim_init(&s, 0xf2, "dp", 1, 8, 0, test_logger);
    CHECK(ctx != NULL && ctx2 != NULL);
    CHECK_EQ(s.mask, CS_MASK);
    CHECK_EQ(atomic_load(&g_log_calls), 2);    /* chained, then init failed (once) */
    play_allreduce(&s, ctx, 0);
    play_allreduce(&s, ctx2, 0);
    check_ring(0xf1, 1);
    check_ring(0xf2, 1);
    struct next_counts *n = counts_of(g_next);
    CHECK_EQ(atomic_load(&n->inits), 2);
    for (unsigned b = 0; b < NTYPES; b++) {
        CHECK_EQ(atomic_load(&n->starts[b]), 0);
    }
    sim_finalize(&s, ctx);
    sim_finalize(&s, ctx2);
    CHECK_EQ(atomic_load(&n->finalizes), 0);
    sim_close(&s);
}

/* collscope has no ring (no trace dir): the next plugin still sees everything */
static void t_collscope_off_next_on(void)
{
    unsetenv("COLLSCOPE_TRACE_DIR");
    use_next("libnccl-profiler-nexttest.so");
    setenv("NEXT_TEST_MASK", "0x5e", 1);
    struct ncclsim s;
    CHECK(sim_open(&s, g_plugin, 5) == 0);
    void *ctx = sim_init(&s, 0xd1, "dp", 1, 8, 0, test_logger);
    CHECK(ctx != NULL);
    CHECK_EQ(s.mask, 0x5e);
    play_allreduce(&s, ctx, 0);
    play_allreduce(&s, ctx, 1);
    struct next_counts *n = counts_of(g_next);
    check_next(n, 5, 0x5e, 2);
    sim_finalize(&s, ctx);
    CHECK_EQ(atomic_load(&n->finalizes), 1);
    sim_close(&s);
}

/* PXN: a ProxyOp of another process (its context and parent are foreign pointers) reaches
 * both plugins without being dereferenced; local ops of the comm are unaffected */
static void t_pxn_foreign(void)
{
    use_next("libnccl-profiler-nexttest.so");
    setenv("NEXT_TEST_MASK", "0x5e", 1);
    struct ncclsim s;
    CHECK(sim_open(&s, g_plugin, 6) == 0);
    void *ctx = sim_init(&s, 0xe1, "dp", 1, 8, 0, test_logger);
    CHECK(ctx != NULL);
    void *bogus_ctx = (void *)(uintptr_t)0x20;
    void *bogus_parent = (void *)(uintptr_t)0x10;
    void *op = sim_proxy_op(&s, bogus_ctx, bogus_parent, getpid() + 1, 0, 3, 2, 1);
    CHECK(op != NULL);                         /* the next plugin's handle, in a link */
    void *st = sim_step(&s, bogus_ctx, op, 0);
    CHECK(st != NULL);
    sim_record(&s, st, ncclProfilerProxyStepSendWait, 1);
    sim_stop(&s, st);
    sim_stop(&s, op);
    struct next_counts *n = counts_of(g_next);
    CHECK_EQ(atomic_load(&n->foreign), 1);
    CHECK_EQ(atomic_load(&n->stops[bit(ncclProfileProxyStep)]), 1);
    CHECK_EQ(atomic_load(&n->parent_ok), 1);   /* the step's parent: its foreign ProxyOp */
    play_allreduce(&s, ctx, 0);
    check_ring(0xe1, 1);
    struct ring r;
    char err[600];
    CHECK(ring_open_dir(&r, g_dir, err, sizeof(err)) == 0);
    CHECK_EQ(ring_counter(&r.hdr->pxn_foreign_events), 1);
    ring_close(&r);
    CHECK_EQ(atomic_load(&n->bad_handle), 0);
    sim_finalize(&s, ctx);
    sim_close(&s);
}

/* 4 threads, each a communicator, many ops: both plugins exact (run under TSan too) */
enum { THREADS = 4, OPS = 200 };
static struct ncclsim g_sim;
static void *g_ctx[THREADS];

static void *thread_main(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (uint64_t i = 0; i < OPS; i++) {
        play_allreduce(&g_sim, g_ctx[t], i);
    }
    return NULL;
}

static void t_threads(void)
{
    use_next("libnccl-profiler-nexttest.so");
    setenv("NEXT_TEST_MASK", "0x5e", 1);
    CHECK(sim_open(&g_sim, g_plugin, 6) == 0);
    for (int t = 0; t < THREADS; t++) {
        g_ctx[t] = sim_init(&g_sim, 0x700 + (uint64_t)t, "dp", 1, 8, 0, test_logger);
        CHECK(g_ctx[t] != NULL);
    }
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        CHECK(pthread_create(&th[t], NULL, thread_main, (void *)(intptr_t)t) == 0);
    }
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
    }
    for (int t = 0; t < THREADS; t++) {
        check_ring(0x700 + (uint64_t)t, OPS);
    }
    check_next(counts_of(g_next), 6, 0x5e, (uint64_t)THREADS * OPS);
    for (int t = 0; t < THREADS; t++) {
        sim_finalize(&g_sim, g_ctx[t]);
    }
    sim_close(&g_sim);
}

struct test {
    const char *name;
    void (*fn)(void);
};

static const struct test TESTS[] = {
    {"chain_v6", t_chain_v6},
    {"chain_v5", t_chain_v5},
    {"chain_v4", t_chain_v4},
    {"chain_v6_full", t_chain_v6_full},
    {"chain_v4_full", t_chain_v4_full},
    {"chain_to_v4_from_v6", t_chain_to_v4_from_v6},
    {"chain_to_v4_from_v5", t_chain_to_v4_from_v5},
    {"chain_by_name", t_chain_by_name},
    {"missing", t_missing},
    {"missing_name", t_missing_name},
    {"not_a_library", t_not_a_library},
    {"v3_only", t_v3_only},
    {"v4_nccl_v56_next", t_v4_nccl_v56_next},
    {"self_path", t_self_path},
    {"none", t_none},
    {"next_init_fails", t_next_init_fails},
    {"collscope_off_next_on", t_collscope_off_next_on},
    {"pxn_foreign", t_pxn_foreign},
    {"threads", t_threads},
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
    if (argc == 5) {
        g_plugin = argv[1];
        g_next_dir = argv[2];
        g_dir = argv[4];
        setenv("COLLSCOPE_TRACE_DIR", g_dir, 1);
        for (size_t i = 0; i < NTESTS; i++) {
            if (strcmp(TESTS[i].name, argv[3]) == 0) {
                TESTS[i].fn();
                return 0;
            }
        }
        fprintf(stderr, "unknown test %s\n", argv[3]);
        return 2;
    }
    if (argc != 3) {
        fprintf(stderr, "usage: %s PLUGIN_SO NEXT_DIR [TEST DIR]\n", argv[0]);
        return 2;
    }
    int failed = 0;
    for (size_t i = 0; i < NTESTS; i++) {
        char dir[] = "/tmp/collscope-chain-XXXXXX";
        if (mkdtemp(dir) == NULL) {
            perror("mkdtemp");
            return 1;
        }
        pid_t pid = fork();
        if (pid == 0) {
            if (strcmp(TESTS[i].name, "chain_by_name") == 0) {
                setenv("LD_LIBRARY_PATH", argv[2], 1);  /* read by the loader at exec */
            }
            execl("/proc/self/exe", argv[0], argv[1], argv[2], TESTS[i].name, dir,
                  (char *)NULL);
            perror("execl");
            _exit(127);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        printf("chain %-22s %s\n", TESTS[i].name, ok ? "ok" : "FAILED");
        fflush(stdout);
        failed += !ok;
        rm_tree(dir);
    }
    printf("%zu chain tests, %d failed\n", NTESTS, failed);
    return failed == 0 ? 0 : 1;
}
