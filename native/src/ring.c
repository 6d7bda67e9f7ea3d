/*
 * ring.c: the per-process ring file (create, identity, event append) and its heartbeat.
 *
 * Creation runs once per process under cs_g.lock at the first communicator init. Any failure
 * (no COLLSCOPE_TRACE_DIR, unwritable directory, no space) is logged once through NCCL's
 * logger and leaves cs_g.hdr NULL: the plugin then answers every callback with a no-op.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

static atomic_int cs_logged;

void cs_log_once(ncclDebugLogger_t logfn, int level, const char *fmt, ...)
{
    if (atomic_exchange(&cs_logged, 1) != 0) {
        return;
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (logfn != NULL) {
        logfn(level, CS_NCCL_LOGSUB_INIT | CS_NCCL_LOGSUB_PROFILE, __FILE__, __LINE__, "%s", msg);
    } else {
        fprintf(stderr, "collscope: %s\n", msg);
    }
}

void cs_copy_str(char *dst, size_t cap, const char *src)
{
    if (cap == 0) {
        return;
    }
    size_t n = 0;
    if (src != NULL) {
        while (n + 1 < cap && src[n] != '\0') {
            n++;
        }
        memcpy(dst, src, n);
    }
    dst[n] = '\0';
}

static int32_t env_int(const char *name)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') {
        return -1;
    }
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || x < 0 || x > INT32_MAX) {
        return -1;
    }
    return (int32_t)x;
}

/* COLLSCOPE_RING_BYTES: decimal bytes, optional k/m/g suffix (powers of 1024); clamped. */
static uint64_t ring_bytes_from_env(void)
{
    const char *v = getenv("COLLSCOPE_RING_BYTES");
    uint64_t bytes = COLLSCOPE_RING_BYTES_DEFAULT;
    if (v != NULL && *v != '\0') {
        char *end = NULL;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (errno == 0 && end != v && v[0] != '-') {
            unsigned shift = 0;
            switch (*end) {
            case 'k': case 'K': shift = 10; end++; break;
            case 'm': case 'M': shift = 20; end++; break;
            case 'g': case 'G': shift = 30; end++; break;
            default: break;
            }
            if (*end == '\0') {
                bytes = (x > (UINT64_MAX >> 30)) ? UINT64_MAX : (uint64_t)x << shift;
            }
        }
    }
    if (bytes < COLLSCOPE_RING_BYTES_MIN) {
        bytes = COLLSCOPE_RING_BYTES_MIN;
    }
    if (bytes > COLLSCOPE_RING_BYTES_MAX) {
        bytes = COLLSCOPE_RING_BYTES_MAX;
    }
    return bytes;
}

/* keep [A-Za-z0-9._-] so the hostname is safe inside a file name */
static void sanitize(char *s)
{
    for (; *s != '\0'; s++) {
        char c = *s;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        if (!ok) {
            *s = '_';
        }
    }
}

static void nccl_version(struct collscope_ring_header *h)
{
    /* libnccl is already loaded when it loads us; ncclGetVersion(int*) is a plain getter. */
    typedef int (*get_version_fn)(int *);
    void *sym = dlsym(RTLD_DEFAULT, "ncclGetVersion");
    if (sym == NULL) {
        return;
    }
    get_version_fn fn;
    memcpy(&fn, &sym, sizeof(fn));
    int code = 0;
    if (fn(&code) != 0 || code <= 0) {
        return;
    }
    h->nccl_version_code = code;
    int major = code >= 10000 ? code / 10000 : code / 1000;
    int minor = code >= 10000 ? (code % 10000) / 100 : (code % 1000) / 100;
    int patch = code >= 10000 ? code % 100 : code % 100;
    snprintf(h->nccl_version, sizeof(h->nccl_version), "%d.%d.%d", major, minor, patch);
}

static void fill_identity(struct collscope_ring_header *h, uint64_t file_bytes, uint64_t nev)
{
    h->version = COLLSCOPE_RING_VERSION;
    h->header_size = (uint32_t)sizeof(*h);
    h->file_size = file_bytes;
    h->state = COLLSCOPE_RING_STATE_INIT;
    h->comm_region_offset = COLLSCOPE_COMM_REGION_OFFSET;
    h->comm_region_size = COLLSCOPE_COMM_REGION_BYTES;
    h->comm_slot_count = COLLSCOPE_COMM_SLOTS;
    h->comm_slot_size = (uint32_t)sizeof(struct collscope_comm_slot);
    h->op_slots_per_comm = COLLSCOPE_OPS_PER_COMM;
    h->flow_slots_per_comm = COLLSCOPE_FLOWS_PER_COMM;
    h->event_region_offset = COLLSCOPE_EVENT_REGION_OFFSET;
    h->event_region_size = nev * COLLSCOPE_EVENT_BYTES;
    h->event_slot_count = (uint32_t)nev;
    h->event_record_size = COLLSCOPE_EVENT_BYTES;
    h->op_slot_size = (uint32_t)sizeof(struct collscope_op_slot);
    h->flow_slot_size = (uint32_t)sizeof(struct collscope_flow_slot);

    h->pid = (int32_t)cs_g.pid;
    h->rank = env_int("RANK");
    h->local_rank = env_int("LOCAL_RANK");
    h->world_size = env_int("WORLD_SIZE");
    h->activation_mask = CS_ACTIVATION_MASK;

    struct timespec rt, mono, res;
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_MONOTONIC, &mono);
    h->init_realtime_ns = (int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec;
    h->init_monotonic_ns = (int64_t)mono.tv_sec * 1000000000 + mono.tv_nsec;
    /* coarse times tick with the heartbeat thread, or fall back to CLOCK_REALTIME_COARSE */
    h->coarse_res_ns = (int64_t)CS_TICK_MS * 1000000;
    if (clock_getres(CLOCK_REALTIME_COARSE, &res) == 0) {
        int64_t r = (int64_t)res.tv_sec * 1000000000 + res.tv_nsec;
        if (r > h->coarse_res_ns) {
            h->coarse_res_ns = r;
        }
    }
    h->heartbeat_ns = h->init_realtime_ns;

    char host[sizeof(h->hostname)];
    if (gethostname(host, sizeof(host)) != 0) {
        host[0] = '\0';
    }
    host[sizeof(host) - 1] = '\0';
    cs_copy_str(h->hostname, sizeof(h->hostname), host);
    cs_copy_str(h->pod_name, sizeof(h->pod_name), getenv("POD_NAME"));
    cs_copy_str(h->pod_namespace, sizeof(h->pod_namespace), getenv("POD_NAMESPACE"));
    cs_copy_str(h->node_name, sizeof(h->node_name), getenv("NODE_NAME"));
    cs_copy_str(h->plugin_version, sizeof(h->plugin_version), COLLSCOPE_PLUGIN_VERSION);
    nccl_version(h);
}

/* cs_now may scale the CPU counter only if the kernel keeps time with it too: then the
 * counter is invariant and synchronised across CPUs (the kernel checked). */
static int counter_is_clocksource(void)
{
#if CS_HAVE_COUNTER
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "re");
    if (f == NULL) {
        return 0;
    }
    char name[64] = "";
    int ok = fgets(name, sizeof(name), f) != NULL;
    fclose(f);
#if defined(__x86_64__)
    const char *want = "tsc\n";
#else
    const char *want = "arch_sys_counter\n";
#endif
    return ok && strcmp(name, want) == 0;
#else
    return 0;
#endif
}

int cs_ring_open(ncclDebugLogger_t logfn)
{
    const char *dir = getenv("COLLSCOPE_TRACE_DIR");
    if (dir == NULL || *dir == '\0') {
        cs_log_once(logfn, CS_NCCL_LOG_INFO,
                    "collscope: COLLSCOPE_TRACE_DIR is not set; profiler plugin inactive");
        return -1;
    }
    uint64_t want = ring_bytes_from_env();
    uint64_t nev = (want - COLLSCOPE_EVENT_REGION_OFFSET) / COLLSCOPE_EVENT_BYTES;
    uint64_t bytes = COLLSCOPE_EVENT_REGION_OFFSET + nev * COLLSCOPE_EVENT_BYTES;

    char host[128];
    if (gethostname(host, sizeof(host)) != 0) {
        cs_copy_str(host, sizeof(host), "unknown");
    }
    host[sizeof(host) - 1] = '\0';
    sanitize(host);

    int fd = -1;
    for (int k = 0; k < 64 && fd < 0; k++) {
        int n = snprintf(cs_g.path, sizeof(cs_g.path), "%s/collscope-%s-pid%d-%d.ring", dir,
                         host, (int)cs_g.pid, k);
        if (n < 0 || (size_t)n >= sizeof(cs_g.path)) {
            cs_log_once(logfn, CS_NCCL_LOG_WARN,
                        "collscope: ring path too long in %s; profiler plugin inactive", dir);
            return -1;
        }
        fd = open(cs_g.path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) {
            break;
        }
    }
    if (fd < 0) {
        cs_log_once(logfn, CS_NCCL_LOG_WARN,
                    "collscope: cannot create ring file %s: %s; profiler plugin inactive",
                    cs_g.path, strerror(errno));
        return -1;
    }
    /* Reserve every page now: on a size-limited tmpfs a sparse file would SIGBUS the training
     * process at the first write past the limit. */
    int err = posix_fallocate(fd, 0, (off_t)bytes);
    if (err == EOPNOTSUPP || err == EINVAL) {
        err = ftruncate(fd, (off_t)bytes) == 0 ? 0 : errno;
    }
    if (err != 0) {
        cs_log_once(logfn, CS_NCCL_LOG_WARN,
                    "collscope: cannot size ring file %s to %llu bytes: %s; profiler plugin "
                    "inactive", cs_g.path, (unsigned long long)bytes, strerror(err));
        close(fd);
        unlink(cs_g.path);
        return -1;
    }
    void *map = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        cs_log_once(logfn, CS_NCCL_LOG_WARN,
                    "collscope: cannot map ring file %s: %s; profiler plugin inactive",
                    cs_g.path, strerror(errno));
        unlink(cs_g.path);
        return -1;
    }
    memset(map, 0, (size_t)bytes);  /* a reused tmpfs page is zero already; be explicit */
    cs_g.counter_ok = counter_is_clocksource();
    struct collscope_ring_header *h = map;
    fill_identity(h, bytes, nev);
    union collscope_event *events =
        (union collscope_event *)((char *)map + COLLSCOPE_EVENT_REGION_OFFSET);
    for (uint64_t i = 0; i < nev; i++) {
        events[i].common.idx = COLLSCOPE_EVENT_IDX_BUSY;  /* never written (reader §3) */
    }
    cs_g.hdr = h;
    cs_g.events = events;
    cs_g.event_count = nev;
    cs_g.map_bytes = (size_t)bytes;
    /* magic last: a reader that sees it sees a complete header */
    atomic_store_explicit(CS_A64(&h->magic), COLLSCOPE_RING_MAGIC, memory_order_release);
    return 0;
}

/* Multi-producer append: reserve an index, mark the slot busy, fill it, commit the index
 * (ring header, reader protocol §3). Overwrites the oldest record when full. */
void cs_ring_append(const union collscope_event *ev)
{
    struct collscope_ring_header *h = cs_g.hdr;
    uint64_t i = cs_add(CS_A64(&h->events_written), 1);
    if (i >= cs_g.event_count) {
        cs_count(&h->events_overwritten);
    }
    uint64_t k = i % cs_g.event_count;
    union collscope_event *slot = &cs_g.events[k];
    uint64_t words[COLLSCOPE_EVENT_BYTES / 8];
    memcpy(words, ev, sizeof(words));
    uint64_t *dst = (uint64_t *)(void *)slot;
    atomic_store_explicit(CS_A64(&dst[0]), COLLSCOPE_EVENT_IDX_BUSY, memory_order_relaxed);
    for (size_t w = 1; w < COLLSCOPE_EVENT_BYTES / 8; w++) {
        cs_st(CS_A64(&dst[w]), words[w]);
    }
    atomic_store_explicit(CS_A64(&dst[0]), i, memory_order_release);
    /* The next record's slot was last written a whole lap ago and is cold; fetch it for
     * writing now, so that the next completion does not wait for it. */
    __builtin_prefetch(&cs_g.events[k + 1 == cs_g.event_count ? 0 : k + 1], 1, 3);
}

/* ---- heartbeat ------------------------------------------------------------------------- */

/* The heartbeat thread has its own lock so that cs_heartbeat_stop can join it while the
 * caller keeps holding cs_g.lock (no init can start a second thread meanwhile). */
static pthread_mutex_t hb_lock = PTHREAD_MUTEX_INITIALIZER;

/* Every CS_TICK_MS: refresh the hot path's time; every COLLSCOPE_HEARTBEAT_INTERVAL_MS:
 * the ring's heartbeat. About 100 wakeups a second while communicators are open. */
/* Calibrate cs_now's counter against CLOCK_REALTIME (called every tick). The slope comes from
 * the last two samples, so clock slewing by NTP is followed within a tick. */
struct clk_sample {
    uint64_t tick;
    int64_t ns;
};

static int64_t clock_calibrate(struct clk_sample *prev)
{
    uint64_t t0 = cs_counter();
    int64_t ns = cs_now_sys();
    uint64_t t1 = cs_counter();
    if (!cs_g.counter_ok) {
        return ns;
    }
    struct clk_sample cur = {t0 + (t1 - t0) / 2, ns};
    if (prev->tick != 0 && t1 - t0 > (cur.tick - prev->tick) / 4096) {
        return ns;  /* preempted between the reads (over ~2 us of a 10 ms tick): skip it */
    }
    if (prev->tick != 0 && cur.tick > prev->tick && cur.ns > prev->ns) {
        uint64_t dt = cur.tick - prev->tick;
        uint64_t mult = (uint64_t)(((unsigned __int128)(uint64_t)(cur.ns - prev->ns) << 32) / dt);
        uint64_t max_delta = mult == 0 ? 0 : (uint64_t)((100000000ull << 32) / mult);
        uint32_t s = atomic_load_explicit(&cs_g.clk_seq, memory_order_relaxed);
        atomic_store_explicit(&cs_g.clk_seq, s + 1, memory_order_relaxed);
        atomic_store_explicit(&cs_g.clk_base_tick, cur.tick, memory_order_release);
        atomic_store_explicit(&cs_g.clk_base_ns, cur.ns, memory_order_release);
        atomic_store_explicit(&cs_g.clk_mult, mult, memory_order_release);
        atomic_store_explicit(&cs_g.clk_max_delta, max_delta, memory_order_release);
        atomic_store_explicit(&cs_g.clk_seq, s + 2, memory_order_release);
    }
    *prev = cur;
    return ns;
}

static void *heartbeat_main(void *arg)
{
    struct collscope_ring_header *h = arg;
    unsigned ticks = 0;
    struct clk_sample prev = {0, 0};
    pthread_mutex_lock(&hb_lock);
    while (!cs_g.hb_stop) {
        int64_t now = clock_calibrate(&prev);
        atomic_store_explicit(&cs_g.coarse_now, now, memory_order_relaxed);
        if (ticks++ % (COLLSCOPE_HEARTBEAT_INTERVAL_MS / CS_TICK_MS) == 0) {
            cs_st(CS_AI64(&h->heartbeat_ns), now);
            cs_count(&h->heartbeat_count);
        }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)CS_TICK_MS * 1000000L;
        while (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!cs_g.hb_stop) {
            if (pthread_cond_timedwait(&cs_g.hb_cond, &hb_lock, &until) == ETIMEDOUT) {
                break;
            }
        }
    }
    pthread_mutex_unlock(&hb_lock);
    return NULL;
}

/* called with cs_g.lock held */
int cs_heartbeat_start(void)
{
    if (cs_g.hb_running) {
        return 0;
    }
    static int cond_ready;
    if (!cond_ready) {
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        int rc = pthread_cond_init(&cs_g.hb_cond, &attr);
        pthread_condattr_destroy(&attr);
        if (rc != 0) {
            return -1;
        }
        cond_ready = 1;
    }
    pthread_mutex_lock(&hb_lock);
    cs_g.hb_stop = 0;
    pthread_mutex_unlock(&hb_lock);
    atomic_store_explicit(&cs_g.coarse_now, cs_now_sys(), memory_order_relaxed);
    /* the thread must not take signals meant for the application */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&cs_g.hb_thread, NULL, heartbeat_main, cs_g.hdr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        return -1;
    }
    cs_g.hb_running = 1;
    return 0;
}

/* called with cs_g.lock held */
void cs_heartbeat_stop(void)
{
    if (!cs_g.hb_running) {
        return;
    }
    pthread_mutex_lock(&hb_lock);
    cs_g.hb_stop = 1;
    pthread_cond_broadcast(&cs_g.hb_cond);
    pthread_mutex_unlock(&hb_lock);
    pthread_join(cs_g.hb_thread, NULL);
    cs_g.hb_running = 0;
    atomic_store_explicit(&cs_g.coarse_now, 0, memory_order_relaxed);  /* stale from now on */
}

/* In a child forked by a profiled process (data loader workers and the like) the parent's
 * mapping, locks and heartbeat thread do not carry over: forget them, so that a child which
 * creates communicators gets a ring file of its own instead of writing into the parent's. */
void cs_ring_forget_after_fork(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    hb_lock = fresh;
    if (cs_g.hdr != NULL) {
        munmap(cs_g.hdr, cs_g.map_bytes);
    }
    cs_g.lock = fresh;
    cs_g.ring_tried = 0;
    cs_g.hdr = NULL;
    cs_g.events = NULL;
    cs_g.event_count = 0;
    cs_g.map_bytes = 0;
    cs_g.comms_open = 0;
    cs_g.hb_running = 0;
    cs_g.hb_stop = 0;
    cs_g.max_api = 0;
    atomic_store_explicit(&cs_g.coarse_now, 0, memory_order_relaxed);
    /* no calibrating thread here: stale after 100 ms anyway, but disable it now (the seqlock
     * value restarts from 0, which readers treat as "never published") */
    atomic_store_explicit(&cs_g.clk_seq, 0, memory_order_relaxed);
    atomic_store(&cs_logged, 0);
}
