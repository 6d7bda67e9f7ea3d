/*
 * plugin_overhead.c: per-callback cost of libnccl-profiler-collscope.so on NCCL's hot path,
 * against an empty plugin built with the same flags.
 *
 *   make -C native bench
 *   (= native/build/bench/plugin_overhead COLLSCOPE_SO EMPTY_SO [quick] [chain])
 * "quick" prints the 1-thread latency table only (a few seconds; for development).
 * "chain" loads collscope with COLLSCOPE_NEXT_PROFILER_PLUGIN=EMPTY_SO (src/chain.c): every
 * callback then also reaches the empty plugin, which answers every event with a handle (the
 * worst case: each event takes a link); chained minus unchained collscope is the cost of
 * chaining, including the empty plugin's own calls.
 *
 * Plays, per iteration and in NCCL's order, one ring all-reduce on a communicator (notes §3):
 * host side Group API -> Coll API -> Group -> Coll start/stop; then per channel (8) a send and a
 * recv ProxyOp (start, InProgress), a KernelCh start, per step (8 per direction) ProxyStep
 * start + its states (send: SendGPUWait, SendPeerWait, SendWait; recv: RecvWait,
 * RecvFlushWait, RecvGPUWait) + stop, KernelCh stop (state + stop), ProxyOp stops. Each plugin
 * call is timed alone (TSC on x86_64, CNTVCT on aarch64, else CLOCK_MONOTONIC); descriptors
 * are built outside the timed region, so the difference to the empty plugin is the plugin's
 * own latency. Samples over 20 us (the thread was preempted) are dropped. A second pass times
 * only whole iterations (thread CPU time of the proxy-side sequence divided by its callbacks):
 * the amortized cost with no timer in the way. Runs 1 thread, then 4 threads each on its own
 * communicator; every configuration 3 times, median reported.
 * Ends with ring bytes of completion records per iteration for a simulated 8-GPU node.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "collscope_ring.h"
#include "nccl_profiler_abi.h"

#if defined(__x86_64__)
#include <x86intrin.h>
static inline uint64_t tick(void)
{
    unsigned aux;
    return __rdtscp(&aux);
}
#elif defined(__aarch64__)
static inline uint64_t tick(void)
{
    uint64_t v;
    __asm__ volatile("isb; mrs %0, cntvct_el0" : "=r"(v)::"memory");
    return v;
}
#else
static inline uint64_t tick(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#endif

enum {
    NCH = 8,
    NSTEPS = 8,
    ITERS_1T = 20000,
    ITERS_4T = 10000,
    WARMUP = 500,
    REPEATS = 3,
};

enum kind {
    K_POP_START, K_POP_REC, K_POP_STOP,
    K_STEP_START, K_STEP_REC, K_STEP_STOP,
    K_KCH_START, K_KCH_REC, K_KCH_STOP,
    K_HOT,          /* all of the above */
    K_COLL_START, K_COLL_STOP,
    NK,
};

static const char *KIND_NAMES[NK] = {
    "ProxyOp start", "ProxyOp state (InProgress)", "ProxyOp stop",
    "ProxyStep start", "ProxyStep state", "ProxyStep stop",
    "KernelCh start", "KernelCh state (KernelChStop)", "KernelCh stop",
    "hot path, all callbacks", "Coll start (host)", "Coll stop (host)",
};

struct acc {
    uint64_t cyc[NK];
    uint64_t n[NK];
};

static const char *g_cs_label = "collscope";
static double g_ticks_per_ns = 1.0;
static uint64_t g_cap_ticks;

static void calibrate(void)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    uint64_t t0 = tick();
    struct timespec d = {0, 200000000L};
    nanosleep(&d, NULL);
    uint64_t t1 = tick();
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    g_ticks_per_ns = (double)(t1 - t0) / ns;
    g_cap_ticks = (uint64_t)(20000.0 * g_ticks_per_ns);
}

/* per_call: time each call alone (its latency, timer cost cancels against the empty
 * plugin); otherwise only count it and time the whole proxy-side sequence at once */
#define TIMED(acc, k, call)                                       \
    do {                                                          \
        if (per_call) {                                           \
            uint64_t t0_ = tick();                                \
            call;                                                 \
            uint64_t d_ = tick() - t0_;                           \
            if (d_ < g_cap_ticks) {                               \
                (acc)->cyc[k] += d_;                              \
                (acc)->n[k]++;                                    \
            }                                                     \
        } else {                                                  \
            call;                                                 \
            (acc)->n[k]++;                                        \
        }                                                         \
    } while (0)

struct plugin {
    const char *label;
    void *lib;
    ncclProfiler_v6_t *t;
    int mask;
};

static int load(struct plugin *p, const char *path, const char *label)
{
    p->label = label;
    p->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (p->lib == NULL) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return -1;
    }
    p->t = dlsym(p->lib, "ncclProfiler_v6");
    if (p->t == NULL) {
        fprintf(stderr, "dlsym ncclProfiler_v6 in %s\n", path);
        return -1;
    }
    return 0;
}

struct worker {
    struct plugin *p;
    void *ctx;
    int iters;
    int per_call;
    uint64_t seq;
    struct acc acc;
    uint64_t proxy_ns;          /* CPU time of whole proxy-side sequences (per_call == 0) */
};

static void one_allreduce(struct worker *w, int timed)
{
    const int per_call = w->per_call;
    ncclProfiler_v6_t *t = w->p->t;
    void *ctx = w->ctx;
    struct acc scratch;
    struct acc *acc = timed ? &w->acc : &scratch;
    ncclProfilerEventDescr_v6_t d;
    ncclProfilerEventStateArgs_t a;
    memset(&a, 0, sizeof(a));

    /* host: Group API, Coll API, Group, Coll (enqueue) */
    void *gapi = NULL, *capi = NULL, *group = NULL, *coll = NULL;
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileGroupApi;
    t->startEvent(ctx, &gapi, &d);
    if (gapi) t->recordEventState(gapi, ncclProfilerGroupStartApiStop, NULL);
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileCollApi;
    d.parentObj = gapi;
    d.collApi.func = "AllReduce";
    t->startEvent(ctx, &capi, &d);
    if (capi) t->stopEvent(capi);
    if (gapi) t->recordEventState(gapi, ncclProfilerGroupEndApiStart, NULL);
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileGroup;
    t->startEvent(ctx, &group, &d);
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileColl;
    d.parentObj = capi;
    d.coll.seqNumber = w->seq++;
    d.coll.func = "AllReduce";
    d.coll.count = 1u << 20;
    d.coll.datatype = "ncclBfloat16";
    d.coll.nChannels = NCH;
    d.coll.algo = "RING";
    d.coll.proto = "SIMPLE";
    TIMED(acc, K_COLL_START, t->startEvent(ctx, &coll, &d));
    if (coll) TIMED(acc, K_COLL_STOP, t->stopEvent(coll));
    if (group) t->stopEvent(group);
    if (gapi) t->stopEvent(gapi);

    /* proxy thread: per channel a send and a recv flow, and the kernel's channel */
    pid_t pid = getpid();
    /* thread CPU time, not wall time: with more threads than cores a thread also waits for
     * a core, which is not the plugin's cost */
    struct timespec cpu0, cpu1;
    if (timed && !per_call) {
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
    }
    for (int ch = 0; ch < NCH; ch++) {
        void *pop[2] = {NULL, NULL};
        for (int dir = 0; dir < 2; dir++) {
            memset(&d, 0, sizeof(d));
            d.type = ncclProfileProxyOp;
            d.parentObj = coll;
            d.proxyOp.pid = pid;
            d.proxyOp.channelId = (uint8_t)ch;
            d.proxyOp.peer = dir == 0 ? 1 : 7;
            d.proxyOp.nSteps = NSTEPS;
            d.proxyOp.chunkSize = 1 << 19;
            d.proxyOp.isSend = dir == 0;
            TIMED(acc, K_POP_START, t->startEvent(ctx, &pop[dir], &d));
        }
        for (int dir = 0; dir < 2; dir++) {
            if (pop[dir]) {
                TIMED(acc, K_POP_REC,
                      t->recordEventState(pop[dir], ncclProfilerProxyOpInProgress_v4, &a));
            }
        }
        void *kch = NULL;
        memset(&d, 0, sizeof(d));
        d.type = ncclProfileKernelCh;
        d.parentObj = coll;
        d.kernelCh.channelId = (uint8_t)ch;
        d.kernelCh.pTimer = 1000;
        TIMED(acc, K_KCH_START, t->startEvent(ctx, &kch, &d));
        static const int send_states[] = {ncclProfilerProxyStepSendGPUWait,
                                          ncclProfilerProxyStepSendPeerWait_v4,
                                          ncclProfilerProxyStepSendWait};
        static const int recv_states[] = {ncclProfilerProxyStepRecvWait,
                                          ncclProfilerProxyStepRecvFlushWait,
                                          ncclProfilerProxyStepRecvGPUWait};
        for (int step = 0; step < NSTEPS; step++) {
            for (int dir = 0; dir < 2; dir++) {
                void *sh = NULL;
                memset(&d, 0, sizeof(d));
                d.type = ncclProfileProxyStep;
                d.parentObj = pop[dir];
                d.proxyStep.step = step;
                TIMED(acc, K_STEP_START, t->startEvent(ctx, &sh, &d));
                if (sh == NULL) {
                    continue;
                }
                const int *states = dir == 0 ? send_states : recv_states;
                a.proxyStep.transSize = 1 << 19;
                for (int s = 0; s < 3; s++) {
                    TIMED(acc, K_STEP_REC, t->recordEventState(sh, states[s], &a));
                }
                TIMED(acc, K_STEP_STOP, t->stopEvent(sh));
            }
        }
        if (kch) {
            a.kernelCh.pTimer = 2000;
            TIMED(acc, K_KCH_REC, t->recordEventState(kch, ncclProfilerKernelChStop, &a));
            TIMED(acc, K_KCH_STOP, t->stopEvent(kch));
        }
        for (int dir = 0; dir < 2; dir++) {
            if (pop[dir]) {
                TIMED(acc, K_POP_STOP, t->stopEvent(pop[dir]));
            }
        }
    }
    if (timed && !per_call) {
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
        w->proxy_ns += (uint64_t)((int64_t)(cpu1.tv_sec - cpu0.tv_sec) * 1000000000 +
                                  (cpu1.tv_nsec - cpu0.tv_nsec));
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    for (int i = 0; i < WARMUP; i++) {
        one_allreduce(w, 0);
    }
    for (int i = 0; i < w->iters; i++) {
        one_allreduce(w, 1);
    }
    return NULL;
}

/* per_call: mean ns per callback kind over all threads of one run (out[NK]);
 * otherwise out[0] = amortized ns per hot-path callback of the whole proxy sequence */
static void run(struct plugin *p, int threads, int iters, int per_call, double out[NK])
{
    struct worker w[4];
    pthread_t th[4];
    for (int i = 0; i < threads; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].p = p;
        w[i].iters = iters;
        w[i].per_call = per_call;
        p->t->init(&w[i].ctx, 0xbe0c0000ull + (uint64_t)i, &p->mask, "bench", 2, 16, i, NULL);
    }
    for (int i = 0; i < threads; i++) {
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    struct acc total;
    memset(&total, 0, sizeof(total));
    uint64_t proxy_ns = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        proxy_ns += w[i].proxy_ns;
        for (int k = 0; k < NK; k++) {
            total.cyc[k] += w[i].acc.cyc[k];
            total.n[k] += w[i].acc.n[k];
        }
        if (w[i].ctx != NULL) {
            p->t->finalize(w[i].ctx);
        }
    }
    for (int k = 0; k < K_HOT; k++) {
        total.cyc[K_HOT] += total.cyc[k];
        total.n[K_HOT] += total.n[k];
    }
    for (int k = 0; k < NK; k++) {
        out[k] = total.n[k] ? (double)total.cyc[k] / (double)total.n[k] / g_ticks_per_ns : 0;
    }
    if (!per_call) {
        memset(out, 0, sizeof(double) * NK);
        out[0] = (double)proxy_ns / (double)total.n[K_HOT];
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void median_run(struct plugin *p, int threads, int iters, int per_call, double out[NK])
{
    double r[REPEATS][NK];
    for (int i = 0; i < REPEATS; i++) {
        run(p, threads, iters, per_call, r[i]);
    }
    for (int k = 0; k < NK; k++) {
        double v[REPEATS];
        for (int i = 0; i < REPEATS; i++) {
            v[i] = r[i][k];
        }
        qsort(v, REPEATS, sizeof(double), cmp_double);
        out[k] = v[REPEATS / 2];
    }
}

static void table(int threads, const double *empty, const double *cs)
{
    printf("\n### %d thread%s%s\n\n", threads, threads > 1 ? "s" : "",
           threads > 1 ? ", each on its own communicator" : "");
    printf("| callback | empty plugin ns | %s ns | overhead ns |\n", g_cs_label);
    printf("|---|---:|---:|---:|\n");
    for (int k = 0; k < NK; k++) {
        printf("| %s%s%s | %.1f | %.1f | %.1f |\n", k == K_HOT ? "**" : "", KIND_NAMES[k],
               k == K_HOT ? "**" : "", empty[k], cs[k], cs[k] - empty[k]);
    }
}

static uint64_t ring_events_written(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        return 0;
    }
    struct dirent *e;
    uint64_t total = 0;
    char path[1024];
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "collscope-", 10) != 0) {
            continue;
        }
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0) {
            continue;
        }
        struct collscope_ring_header h;
        if (read(fd, &h, sizeof(h)) == (ssize_t)sizeof(h) && h.magic == COLLSCOPE_RING_MAGIC) {
            total += h.events_written;
        }
        close(fd);
        unlink(path);
    }
    closedir(d);
    return total;
}

int main(int argc, char **argv)
{
    int quick = 0, chain = 0, bad = argc < 3;
    for (int i = 3; i < argc; i++) {
        quick |= strcmp(argv[i], "quick") == 0;
        chain |= strcmp(argv[i], "chain") == 0;
        bad |= strcmp(argv[i], "quick") != 0 && strcmp(argv[i], "chain") != 0;
    }
    if (bad) {
        fprintf(stderr, "usage: %s COLLSCOPE_SO EMPTY_SO [quick] [chain]\n", argv[0]);
        return 2;
    }
    if (chain) {
        /* collscope's constructor reads it: set before collscope is loaded */
        setenv("COLLSCOPE_NEXT_PROFILER_PLUGIN", argv[2], 1);
        g_cs_label = "collscope + chained empty plugin";
    }
    char dir[] = "/tmp/collscope-bench-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    setenv("COLLSCOPE_TRACE_DIR", dir, 1);
    struct plugin cs, empty;
    if (load(&cs, argv[1], "collscope") != 0 || load(&empty, argv[2], "empty") != 0) {
        return 1;
    }
    calibrate();
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    printf("# collscope profiler plugin: per-callback overhead\n\n");
    printf("reproduce: make -C native bench   (%s %s %s)\n", argv[0], argv[1], argv[2]);
    printf("machine: %ld online CPUs, timer %.3f ticks/ns; ring all-reduce, %d channels x "
           "(send + recv) x %d steps per iteration; %d (1 thread) / %d (4 threads) iterations "
           "per run, median of %d runs\n",
           ncpu, g_ticks_per_ns, NCH, NSTEPS, ITERS_1T, ITERS_4T, REPEATS);

    double e1[NK], c1[NK], e4[NK], c4[NK];
    printf("\n## Latency of each callback (each call timed alone)\n");
    median_run(&empty, 1, ITERS_1T, 1, e1);
    median_run(&cs, 1, ITERS_1T, 1, c1);
    table(1, e1, c1);
    if (quick) {
        /* development aid: the 1-thread latency table only */
        ring_events_written(dir);
        rmdir(dir);
        return 0;
    }
    median_run(&empty, 4, ITERS_4T, 1, e4);
    median_run(&cs, 4, ITERS_4T, 1, c4);
    table(4, e4, c4);
    if (ncpu < 4) {
        printf("\n(only %ld CPUs: the 4 threads time-share cores; preempted samples are "
               "dropped)\n", ncpu);
    }

    printf("\n## Amortized cost per hot-path callback (thread CPU time of the whole proxy-side "
           "sequence of an iteration / its callbacks; no per-call timer)\n\n");
    printf("| threads | empty plugin ns | %s ns | overhead ns |\n|---:|---:|---:|---:|\n",
           g_cs_label);
    median_run(&empty, 1, ITERS_1T, 0, e1);
    median_run(&cs, 1, ITERS_1T, 0, c1);
    printf("| 1 | %.1f | %.1f | %.1f |\n", e1[0], c1[0], c1[0] - e1[0]);
    median_run(&empty, 4, ITERS_4T, 0, e4);
    median_run(&cs, 4, ITERS_4T, 0, c4);
    printf("| 4 | %.1f | %.1f | %.1f |\n", e4[0], c4[0], c4[0] - e4[0]);

    /* completion records actually written: one 64-byte record per op, plus comm records */
    uint64_t ops = 2u * (uint64_t)REPEATS * ((uint64_t)(ITERS_1T + WARMUP) +
                                              4u * (uint64_t)(ITERS_4T + WARMUP));
    uint64_t comms = 2u * (uint64_t)REPEATS * (1u + 4u);
    uint64_t written = ring_events_written(dir);
    rmdir(dir);
    printf("\n### Ring bytes\n\n");
    printf("records written by the runs above: %llu for %llu ops and %llu communicators "
           "(init + finalize) -> %s\n",
           (unsigned long long)written, (unsigned long long)ops, (unsigned long long)comms,
           written == ops + 2 * comms ? "exactly one record per op" : "MISMATCH");
    printf("record size: %u bytes; live state (fixed, not per iteration): %llu bytes\n\n",
           COLLSCOPE_EVENT_BYTES, (unsigned long long)COLLSCOPE_EVENT_REGION_OFFSET);
    printf("| collectives per GPU per iteration | bytes per iteration, 8-GPU node (8 processes) |\n");
    printf("|---:|---:|\n");
    static const int per_iter[] = {16, 32, 40, 64, 128, 320};
    for (size_t i = 0; i < sizeof(per_iter) / sizeof(per_iter[0]); i++) {
        printf("| %d | %d (%.1f KB) |\n", per_iter[i], 8 * per_iter[i] * COLLSCOPE_EVENT_BYTES,
               8.0 * per_iter[i] * COLLSCOPE_EVENT_BYTES / 1000.0);
    }
    return 0;
}
