/*
 * chain.c: a second profiler plugin behind collscope (COLLSCOPE_NEXT_PROFILER_PLUGIN).
 *
 * NCCL loads one profiler plugin. When the variable names another one (NCCL Inspector, a
 * vendor's), collscope loads it at its first communicator init and forwards every call, so
 * both see every event:
 *   - the name is resolved as NCCL resolves NCCL_PROFILER_PLUGIN (notes §1): dlopen(X) with
 *     RTLD_NOW|RTLD_LOCAL; if that fails and X has no '/' and is not "lib*.so", then
 *     libnccl-profiler-X.so; STATIC_PLUGIN: the main program; "none" or empty: no chaining;
 *   - its table: the same version NCCL speaks to collscope, else the nearest one the ABI can
 *     feed: v6 <-> v5 (same layout; CE events dropped for v5), v5/v6 -> v4 (API and CE events
 *     dropped, Coll/P2p parent remapped to the Group event, as NCCL's own v4 adapter does).
 *     NCCL speaking v4 to a next plugin with only v5/v6, or a next plugin with none of v4-v6
 *     (v3 and older): not chained, one log line;
 *   - a table that is collscope's own (the same library through another name, or a second
 *     copy: name "collscope") is refused: no recursion, no second ring;
 *   - init: collscope first, then the next plugin. The next plugin writes the mask into a
 *     private int (one per process, like NCCL's); NCCL's mask gets the union of both. A
 *     runtime rewrite of that int by the next plugin takes effect at the next comm init;
 *   - events: the next plugin gets only the types NCCL would have sent it alone (its mask plus
 *     the ancestors NCCL starts for them). An event both plugins hold a handle for is answered
 *     with a link (below); one only collscope holds, with collscope's own handle, unchanged;
 *   - a next plugin that fails to load or init: collscope goes on alone (one log line). Both
 *     contexts NULL: NULL. collscope without a ring still forwards to the next plugin.
 * The next library is never dlclosed: a late call into unmapped code would crash training.
 *
 * Links. struct cs_link holds both handles; its first byte is CS_K_LINK, so stop/record tell
 * a link from collscope's own handles (internal.h). Links come from fixed pools allocated at
 * init (per context: host-side and proxy-side events, so the user thread and the proxy thread
 * do not share a cursor; one process-wide pool for PXN events whose context belongs to another
 * process, which is never dereferenced). A stopped link stays readable until its pool entry is
 * claimed again, because children start after their parent stops (ProxyOp and KernelCh after
 * Coll stop; graph replays under a captured CollApi). Reuse bumps a generation kept in the
 * link and in the top 16 bits of the handle (user addresses are below 2^48 on x86-64 and
 * aarch64 Linux); a parent whose generation no longer matches is treated as NULL for both
 * plugins rather than handing the next plugin someone else's handle. NCCL never dereferences
 * handles; it only passes them back.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "internal.h"

/* links per context: host side (Group, API events, Coll, P2p) and proxy side (ProxyOp,
 * ProxyStep, KernelCh, NetPlugin, ProxyCtrl). Only events the next plugin answers with a
 * handle take one; a pool entry is reused only after the cursor has gone round the pool. */
#define CS_LINK_HOST 1024u
#define CS_LINK_PROXY 4096u
#define CS_LINK_FOREIGN 1024u
#define CS_ADDR_BITS 48u
#define CS_ADDR_MASK ((UINT64_C(1) << CS_ADDR_BITS) - 1u)

#define CS_PROXY_SIDE \
    ((uint64_t)(ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | \
                ncclProfileNetPlugin | ncclProfileProxyCtrl))
#define CS_CE_TYPES ((uint64_t)(ncclProfileCeColl | ncclProfileCeSync | ncclProfileCeBatch))

struct cs_link_pool;

struct cs_link {
    uint8_t kind;               /* CS_K_LINK, written once at pool init */
    uint8_t reserved[3];
    _Atomic uint32_t gen;       /* even: stable; odd: being rewritten by its claimer */
    struct cs_link_pool *home;  /* immutable */
    _Atomic(void *) own;        /* collscope's handle (may be NULL) */
    _Atomic(void *) next;       /* the next plugin's handle */
};
_Static_assert(sizeof(struct cs_link) == 32, "two links per cache line");

struct cs_link_pool {
    struct cs_pool pool;
    struct cs_link *v;
    struct cs_chain_ctx *cc;    /* NULL: the process-wide pool of foreign-context events */
};

struct cs_chain_ctx {
    struct cs_ctx *own;         /* collscope's context, NULL: collscope off for this comm */
    void *next;                 /* the next plugin's context, NULL: not forwarded */
    struct cs_link_pool host;
    struct cs_link_pool proxy;
};

static struct {
    pthread_mutex_t lock;
    char spec[512];             /* COLLSCOPE_NEXT_PROFILER_PLUGIN, read by the constructor */
    int tried;
    _Atomic int on;             /* next plugin loaded and usable: forward */
    int ver;                    /* the next plugin's table version in use: 4, 5 or 6 */
    ncclProfiler_v4_t *t4;
    ncclProfiler_v5_t *t5;
    ncclProfiler_v6_t *t6;
    ncclResult_t (*stop)(void *);
    ncclResult_t (*record)(void *, ncclProfilerEventState_t, ncclProfilerEventStateArgs_t *);
    ncclResult_t (*fin)(void *);
    int next_mask;              /* the next plugin's activation mask (its "NCCL global") */
    int own_mask;               /* collscope's, once a collscope context exists */
    _Atomic uint64_t fwd;       /* event types forwarded to the next plugin */
    _Atomic int init_failed_logged;
    struct cs_link_pool foreign;
    _Atomic uint64_t stale;     /* stale parents seen (diagnostics, tests) */
    _Atomic uint64_t no_link;   /* next handles stopped at once: pool exhausted */
} cs_ch = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* ---- setup and loading ------------------------------------------------------------------- */

int cs_chain_setup(void)
{
    const char *v = getenv("COLLSCOPE_NEXT_PROFILER_PLUGIN");
    if (v == NULL || v[0] == '\0' || strcasecmp(v, "none") == 0 ||
        strlen(v) >= sizeof(cs_ch.spec)) {
        return 0;
    }
    memcpy(cs_ch.spec, v, strlen(v) + 1);
    return 1;
}

static void chain_log(ncclDebugLogger_t logfn, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void chain_log(ncclDebugLogger_t logfn, int level, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (logfn != NULL) {
        logfn(level, CS_NCCL_LOGSUB_INIT | CS_NCCL_LOGSUB_PROFILE, __FILE__, __LINE__, "%s", msg);
    } else {
        fprintf(stderr, "%s\n", msg);
    }
}

/* busy, v: static storage for the process-wide pool (never freed: a PXN event may arrive
 * while the process exits), NULL: allocated here */
static int pool_init(struct cs_link_pool *p, uint32_t n, struct cs_chain_ctx *cc,
                     _Atomic uint8_t *busy, struct cs_link *v)
{
    memset(p, 0, sizeof(*p));
    p->pool.n = n;
    p->cc = cc;
    p->pool.busy = busy != NULL ? busy : aligned_alloc(64, n);
    p->v = v != NULL ? v : aligned_alloc(64, n * sizeof(struct cs_link));
    if (p->pool.busy == NULL || p->v == NULL ||
        ((uintptr_t)(p->v + n) & ~(uintptr_t)CS_ADDR_MASK) != 0) {
        if (busy == NULL) {
            free(p->pool.busy);
        }
        if (v == NULL) {
            free(p->v);
        }
        p->pool.busy = NULL;
        p->v = NULL;
        return -1;
    }
    for (uint32_t i = 0; i < n; i++) {
        atomic_init(&p->pool.busy[i], 0);
        p->v[i].kind = CS_K_LINK;
        atomic_init(&p->v[i].gen, 0);
        p->v[i].home = p;
        atomic_init(&p->v[i].own, NULL);
        atomic_init(&p->v[i].next, NULL);
    }
    return 0;
}

static void pool_free(struct cs_link_pool *p)
{
    free(p->pool.busy);
    free(p->v);
}

/* dlopen as NCCL does for NCCL_PROFILER_PLUGIN (src/plugin/plugin_open.cc) */
static void *open_next(const char *spec, char *err, size_t cap)
{
    if (strcasecmp(spec, "STATIC_PLUGIN") == 0) {
        return dlopen(NULL, RTLD_NOW | RTLD_LOCAL);
    }
    void *lib = dlopen(spec, RTLD_NOW | RTLD_LOCAL);
    if (lib != NULL) {
        return lib;
    }
    const char *e = dlerror();
    snprintf(err, cap, "%s", e != NULL ? e : "dlopen failed");
    size_t n = strlen(spec);
    int full = strncmp(spec, "lib", 3) == 0 && n >= 3 && strcmp(spec + n - 3, ".so") == 0;
    if (strchr(spec, '/') != NULL || full) {
        return NULL;
    }
    char alt[600];
    snprintf(alt, sizeof(alt), "libnccl-profiler-%s.so", spec);
    lib = dlopen(alt, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        e = dlerror();
        snprintf(err, cap, "%s", e != NULL ? e : "dlopen failed");
    }
    return lib;
}

/* a table collscope can call: every function present, and not collscope's own */
#define TABLE_OK(t)                                                                        \
    ((t) != NULL && (t)->init != NULL && (t)->startEvent != NULL && (t)->stopEvent != NULL && \
     (t)->recordEventState != NULL && (t)->finalize != NULL)

/* collscope itself: this library under another name, or a second copy of it */
#define TABLE_SELF(t) \
    ((t) != NULL &&   \
     (cs_is_own_table(t) || ((t)->name != NULL && strcmp((t)->name, "collscope") == 0)))

/* Under cs_ch.lock, once per process. api: the version NCCL speaks to collscope. */
static void load_next(int api, ncclDebugLogger_t logfn)
{
    char err[400] = "";
    void *lib = open_next(cs_ch.spec, err, sizeof(err));
    if (lib == NULL) {
        chain_log(logfn, CS_NCCL_LOG_WARN,
                  "collscope: next profiler plugin %s not loaded (%s); collscope continues "
                  "alone",
                  cs_ch.spec, err);
        return;
    }
    ncclProfiler_v4_t *t4 = dlsym(lib, "ncclProfiler_v4");
    ncclProfiler_v5_t *t5 = dlsym(lib, "ncclProfiler_v5");
    ncclProfiler_v6_t *t6 = dlsym(lib, "ncclProfiler_v6");
    if (TABLE_SELF(t4) || TABLE_SELF(t5) || TABLE_SELF(t6)) {
        chain_log(logfn, CS_NCCL_LOG_WARN,
                  "collscope: COLLSCOPE_NEXT_PROFILER_PLUGIN=%s is collscope itself; not "
                  "chained",
                  cs_ch.spec);
        dlclose(lib);
        return;
    }
    t4 = TABLE_OK(t4) ? t4 : NULL;
    t5 = TABLE_OK(t5) ? t5 : NULL;
    t6 = TABLE_OK(t6) ? t6 : NULL;
    /* the nearest version the ABI can feed from what NCCL gives collscope */
    int ver = 0;
    if (api == 6) {
        ver = t6 != NULL ? 6 : t5 != NULL ? 5 : t4 != NULL ? 4 : 0;
    } else if (api == 5) {
        ver = t5 != NULL ? 5 : t6 != NULL ? 6 : t4 != NULL ? 4 : 0;
    } else {
        ver = t4 != NULL ? 4 : 0;
    }
    if (ver == 0) {
        chain_log(logfn, CS_NCCL_LOG_WARN,
                  "collscope: next profiler plugin %s exports no ncclProfiler_v%s table "
                  "collscope can feed from NCCL's v%d; not chained",
                  cs_ch.spec, api == 4 ? "4" : "4/v5/v6", api);
        dlclose(lib);
        return;
    }
    static _Atomic uint8_t foreign_busy[CS_LINK_FOREIGN] __attribute__((aligned(64)));
    static struct cs_link foreign_links[CS_LINK_FOREIGN] __attribute__((aligned(64)));
    if (pool_init(&cs_ch.foreign, CS_LINK_FOREIGN, NULL, foreign_busy, foreign_links) != 0) {
        chain_log(logfn, CS_NCCL_LOG_WARN,
                  "collscope: no memory to chain %s; collscope continues alone", cs_ch.spec);
        dlclose(lib);
        return;
    }
    cs_ch.ver = ver;
    cs_ch.t4 = t4;
    cs_ch.t5 = t5;
    cs_ch.t6 = t6;
    const char *name = NULL;
    if (ver == 4) {
        cs_ch.stop = t4->stopEvent;
        cs_ch.record = t4->recordEventState;
        cs_ch.fin = t4->finalize;
        name = t4->name;
    } else if (ver == 5) {
        cs_ch.stop = t5->stopEvent;
        cs_ch.record = t5->recordEventState;
        cs_ch.fin = t5->finalize;
        name = t5->name;
    } else {
        cs_ch.stop = t6->stopEvent;
        cs_ch.record = t6->recordEventState;
        cs_ch.fin = t6->finalize;
        name = t6->name;
    }
    chain_log(logfn, CS_NCCL_LOG_INFO,
              "collscope: chained profiler plugin %s (\"%s\", API v%d; NCCL speaks v%d)",
              cs_ch.spec, name != NULL ? name : "?", ver, api);
    atomic_store_explicit(&cs_ch.on, 1, memory_order_release);
}

/* The types NCCL would send the next plugin alone: its mask and the ancestors NCCL starts
 * for them (notes §1 "Enabling a child event enables its ancestors", §3 hierarchy). */
static uint64_t forward_types(uint64_t m, int ver)
{
    uint64_t f = m;
    if (f & ncclProfileNetPlugin) {
        f |= ncclProfileProxyStep;
    }
    if (f & ncclProfileProxyStep) {
        f |= ncclProfileProxyOp;
    }
    if (f & (ncclProfileProxyOp | ncclProfileKernelCh)) {
        f |= ncclProfileColl | ncclProfileP2p;
    }
    if (f & (ncclProfileCeSync | ncclProfileCeBatch)) {
        f |= ncclProfileCeColl;
    }
    if (f & (ncclProfileColl | ncclProfileCeColl)) {
        f |= ncclProfileCollApi;
    }
    if (f & ncclProfileP2p) {
        f |= ncclProfileP2pApi;
    }
    if (f & (ncclProfileColl | ncclProfileP2p)) {
        f |= ncclProfileGroup;
    }
    if (f & (ncclProfileCollApi | ncclProfileP2pApi | ncclProfileKernelLaunch)) {
        f |= ncclProfileGroupApi;
    }
    if (ver == 4) {
        f &= 0xffu;             /* v4 knows Group .. NetPlugin */
    } else if (ver == 5) {
        f &= ~CS_CE_TYPES;
    }
    return f;
}

/* the bits of the activation mask NCCL speaking `api` knows */
static int mask_for_api(int m, int api)
{
    return api == 4 ? (m & 0xff) : api == 5 ? (m & ~(int)CS_CE_TYPES) : m;
}

/* ---- init and finalize ------------------------------------------------------------------- */

static void free_cc(struct cs_chain_ctx *cc)
{
    pool_free(&cc->host);
    pool_free(&cc->proxy);
    free(cc);
}

static ncclResult_t next_init(void **nctx, uint64_t hash, const char *name, int nnodes,
                              int nranks, int rank, ncclDebugLogger_t logfn)
{
    if (cs_ch.ver == 4) {
        return cs_ch.t4->init(nctx, &cs_ch.next_mask, name, hash, nnodes, nranks, rank, logfn);
    }
    if (cs_ch.ver == 5) {
        return cs_ch.t5->init(nctx, hash, &cs_ch.next_mask, name, nnodes, nranks, rank, logfn);
    }
    return cs_ch.t6->init(nctx, hash, &cs_ch.next_mask, name, nnodes, nranks, rank, logfn);
}

static ncclResult_t chain_init(int api, void **context, int *mask, const char *name,
                               uint64_t hash, int nnodes, int nranks, int rank,
                               ncclDebugLogger_t logfn)
{
    if (context == NULL) {
        return ncclSuccess;
    }
    *context = NULL;
    pthread_mutex_lock(&cs_ch.lock);
    if (!cs_ch.tried) {
        cs_ch.tried = 1;
        load_next(api, logfn);
    }
    void *own = NULL;
    int own_mask = 0;
    if (api == 4) {
        cs_init_v4(&own, &own_mask, name, hash, nnodes, nranks, rank, logfn);
    } else if (api == 5) {
        cs_init_v5(&own, hash, &own_mask, name, nnodes, nranks, rank, logfn);
    } else {
        cs_init_v6(&own, hash, &own_mask, name, nnodes, nranks, rank, logfn);
    }
    if (own != NULL) {
        cs_ch.own_mask |= own_mask;
    }
    if (!atomic_load_explicit(&cs_ch.on, memory_order_relaxed)) {
        if (own != NULL && mask != NULL) {
            atomic_store_explicit((_Atomic int *)(void *)mask, own_mask, memory_order_relaxed);
        }
        pthread_mutex_unlock(&cs_ch.lock);
        *context = own;
        return ncclSuccess;
    }
    void *next = NULL;
    ncclResult_t rc = next_init(&next, hash, name, nnodes, nranks, rank, logfn);
    if (rc != ncclSuccess) {
        next = NULL;            /* NCCL alone would drop the plugin for this comm */
        if (atomic_exchange(&cs_ch.init_failed_logged, 1) == 0) {
            chain_log(logfn, CS_NCCL_LOG_WARN,
                      "collscope: next profiler plugin %s failed init (error %d) for comm "
                      "%016llx; collscope continues alone there",
                      cs_ch.spec, (int)rc, (unsigned long long)hash);
        }
    }
    int next_mask = cs_ch.next_mask;
    atomic_store_explicit(&cs_ch.fwd, forward_types((uint64_t)(unsigned)next_mask, cs_ch.ver),
                          memory_order_relaxed);
    if (mask != NULL) {
        atomic_store_explicit((_Atomic int *)(void *)mask,
                              mask_for_api(cs_ch.own_mask | next_mask, api),
                              memory_order_relaxed);
    }
    struct cs_chain_ctx *cc = NULL;
    if (own != NULL || next != NULL) {
        cc = calloc(1, sizeof(*cc));
        if (cc == NULL || pool_init(&cc->host, CS_LINK_HOST, cc, NULL, NULL) != 0 ||
            pool_init(&cc->proxy, CS_LINK_PROXY, cc, NULL, NULL) != 0) {
            chain_log(logfn, CS_NCCL_LOG_WARN,
                      "collscope: out of memory chaining comm %016llx; not profiled",
                      (unsigned long long)hash);
            if (cc != NULL) {
                free_cc(cc);
                cc = NULL;
            }
            if (own != NULL) {
                cs_finalize(own);
            }
            if (next != NULL) {
                cs_ch.fin(next);
            }
        } else {
            cc->own = own;
            cc->next = next;
        }
    }
    pthread_mutex_unlock(&cs_ch.lock);
    *context = cc;
    return ncclSuccess;
}

ncclResult_t cs_chain_init_v4(void **context, int *mask, const char *name, uint64_t hash,
                              int nnodes, int nranks, int rank, ncclDebugLogger_t logfn)
{
    return chain_init(4, context, mask, name, hash, nnodes, nranks, rank, logfn);
}

ncclResult_t cs_chain_init_v5(void **context, uint64_t comm_id, int *mask, const char *name,
                              int nnodes, int nranks, int rank, ncclDebugLogger_t logfn)
{
    return chain_init(5, context, mask, name, comm_id, nnodes, nranks, rank, logfn);
}

ncclResult_t cs_chain_init_v6(void **context, uint64_t comm_id, int *mask, const char *name,
                              int nnodes, int nranks, int rank, ncclDebugLogger_t logfn)
{
    return chain_init(6, context, mask, name, comm_id, nnodes, nranks, rank, logfn);
}

ncclResult_t cs_chain_finalize(void *context)
{
    if (!atomic_load_explicit(&cs_ch.on, memory_order_acquire)) {
        return cs_finalize(context);
    }
    struct cs_chain_ctx *cc = context;
    if (cc == NULL) {
        return ncclSuccess;
    }
    if (cc->own != NULL) {
        cs_finalize(cc->own);
    }
    if (cc->next != NULL) {
        cs_ch.fin(cc->next);
    }
    free_cc(cc);
    return ncclSuccess;
}

/* ---- links ------------------------------------------------------------------------------- */

static inline struct cs_link *link_ptr(void *h)
{
    return (struct cs_link *)((uintptr_t)h & (uintptr_t)CS_ADDR_MASK);
}

static inline uintptr_t gen_tag(uint32_t gen)
{
    return (uintptr_t)((gen >> 1) & 0xffffu) << CS_ADDR_BITS;
}

/* A handle NCCL gave back. Returns 1 and both handles for a live link, 0 for one of
 * collscope's own handles (*own = h, *next = NULL), -1 for a stale link (both NULL). */
static inline int unlink_handle(void *h, void **own, void **next)
{
    *own = NULL;
    *next = NULL;
    if (h == NULL) {
        return 0;
    }
    struct cs_link *l = link_ptr(h);
    if (*(const uint8_t *)l != CS_K_LINK) {
        *own = h;
        return 0;
    }
    uint32_t g = atomic_load_explicit(&l->gen, memory_order_acquire);
    if ((g & 1u) != 0 || gen_tag(g) != ((uintptr_t)h & ~(uintptr_t)CS_ADDR_MASK)) {
        atomic_fetch_add_explicit(&cs_ch.stale, 1, memory_order_relaxed);
        return -1;
    }
    void *o = atomic_load_explicit(&l->own, memory_order_acquire);
    void *n = atomic_load_explicit(&l->next, memory_order_acquire);
    if (atomic_load_explicit(&l->gen, memory_order_relaxed) != g) {
        atomic_fetch_add_explicit(&cs_ch.stale, 1, memory_order_relaxed);
        return -1;
    }
    *own = o;
    *next = n;
    return 1;
}

/* NULL: the pool has no free entry within CS_POOL_PROBES */
static inline void *link_new(struct cs_link_pool *p, void *own, void *next)
{
    int64_t i = cs_pool_alloc(&p->pool);
    if (CS_UNLIKELY(i < 0)) {
        return NULL;
    }
    struct cs_link *l = &p->v[i];
    uint32_t g = atomic_load_explicit(&l->gen, memory_order_relaxed);
    atomic_store_explicit(&l->gen, g + 1u, memory_order_relaxed);
    atomic_store_explicit(&l->own, own, memory_order_release);
    atomic_store_explicit(&l->next, next, memory_order_release);
    atomic_store_explicit(&l->gen, g + 2u, memory_order_release);
    return (void *)((uintptr_t)l | gen_tag(g + 2u));
}

/* ---- startEvent -------------------------------------------------------------------------- */

/* What one event needs from its descriptor, whatever the version. */
struct chain_ev {
    uint64_t type;
    void **parent;              /* &d->parentObj */
    void **group;               /* v5/v6 Coll/P2p: &d->coll.parentGroup / &d->p2p.parentGroup */
    int foreign;                /* ProxyOp of another process (PXN): context not ours */
};

/* Resolves contexts and parents, starts collscope's event (own_start) with its parents in
 * the descriptor, then leaves the next plugin's parents there for the caller. Returns the
 * pool a link would come from, NULL when the event is not forwarded. */
struct chain_call {
    void *own_ctx, *next_ctx;
    void *own_parent, *next_parent, *own_group, *next_group;
    struct cs_link_pool *pool;
};

static inline int chain_prepare(void *context, const struct chain_ev *e, struct chain_call *c)
{
    void *parent = *e->parent;
    c->own_group = c->next_group = NULL;
    if (e->group != NULL) {
        unlink_handle(*e->group, &c->own_group, &c->next_group);
    }
    if (CS_UNLIKELY(e->foreign)) {
        /* PXN: context and parent are pointers of another process; pass them unchanged */
        c->own_ctx = c->next_ctx = context;
        c->own_parent = c->next_parent = parent;
        c->pool = &cs_ch.foreign;
        return 1;
    }
    int linked = unlink_handle(parent, &c->own_parent, &c->next_parent);
    if (e->type & (ncclProfileProxyStep | ncclProfileNetPlugin)) {
        /* the context may be another process's (PXN); the parent link knows ours */
        if (linked <= 0) {
            c->own_ctx = context;
            c->next_ctx = NULL;
            c->pool = NULL;
            return 0;
        }
        struct cs_chain_ctx *cc = link_ptr(parent)->home->cc;
        c->own_ctx = cc != NULL ? (void *)cc->own : context;
        c->next_ctx = cc != NULL ? cc->next : context;
        c->pool = cc != NULL ? &cc->proxy : &cs_ch.foreign;
        return c->next_ctx != NULL;
    }
    struct cs_chain_ctx *cc = context;
    c->own_ctx = cc != NULL ? (void *)cc->own : NULL;
    c->next_ctx = cc != NULL ? cc->next : NULL;
    c->pool = cc == NULL ? NULL : (e->type & CS_PROXY_SIDE) ? &cc->proxy : &cc->host;
    return c->next_ctx != NULL;
}

static inline void *chain_finish(struct chain_call *c, void *own_h, void *next_h)
{
    if (next_h == NULL) {
        return own_h;
    }
    void *h = link_new(c->pool, own_h, next_h);
    if (CS_UNLIKELY(h == NULL)) {
        /* nowhere to keep the next plugin's handle: close its event now, keep collscope's */
        atomic_fetch_add_explicit(&cs_ch.no_link, 1, memory_order_relaxed);
        cs_ch.stop(next_h);
        return own_h;
    }
    return h;
}

/* v5/v6 descriptor -> v4 for a next plugin that only has ncclProfiler_v4 (NCCL's v4 adapter:
 * API and CE events are not sent; a Coll/P2p parent is the Group event) */
#define TO_V4(d4, d, nparent, ngroup)                                                      \
    do {                                                                                   \
        (d4).type = (uint8_t)(d)->type;                                                    \
        (d4).parentObj = ((d)->type & (ncclProfileColl | ncclProfileP2p)) ? (ngroup)        \
                                                                          : (nparent);      \
        (d4).rank = (d)->rank;                                                             \
        memcpy(&(d4).coll, &(d)->coll,                                                     \
               sizeof(d4) - offsetof(ncclProfilerEventDescr_v4_t, coll));                  \
    } while (0)

/* One chained start, NCCL speaking v5 or v6 (d: that version's descriptor). */
#define CHAIN_START_V56(own_start, context, handle, d)                                 \
    do {                                                                                    \
        if (!atomic_load_explicit(&cs_ch.on, memory_order_acquire)) {                       \
            return own_start((context), (handle), (d));                                     \
        }                                                                                   \
        if ((handle) == NULL) {                                                             \
            return ncclSuccess;                                                             \
        }                                                                                   \
        *(handle) = NULL;                                                                   \
        if ((d) == NULL) {                                                                  \
            return ncclSuccess;                                                             \
        }                                                                                   \
        struct chain_ev e = {                                                               \
            .type = (d)->type,                                                              \
            .parent = &(d)->parentObj,                                                      \
            .group = (d)->type == ncclProfileColl  ? &(d)->coll.parentGroup                 \
                     : (d)->type == ncclProfileP2p ? &(d)->p2p.parentGroup                  \
                                                   : NULL,                                  \
            .foreign = (d)->type == ncclProfileProxyOp && (d)->proxyOp.pid != cs_g.pid,     \
        };                                                                                  \
        struct chain_call c;                                                                \
        int fwd = chain_prepare((context), &e, &c) &&                                       \
                  ((d)->type & atomic_load_explicit(&cs_ch.fwd, memory_order_relaxed)) != 0; \
        void *saved_parent = (d)->parentObj;                                                \
        void *saved_group = e.group != NULL ? *e.group : NULL;                              \
        void *own_h = NULL, *next_h = NULL;                                                 \
        (d)->parentObj = c.own_parent;                                                      \
        if (e.group != NULL) {                                                              \
            *e.group = c.own_group;                                                         \
        }                                                                                   \
        own_start(c.own_ctx, &own_h, (d));                                                  \
        if (fwd) {                                                                          \
            if (cs_ch.ver == 4) {                                                           \
                ncclProfilerEventDescr_v4_t d4;                                             \
                TO_V4(d4, (d), c.next_parent, c.next_group);                                \
                cs_ch.t4->startEvent(c.next_ctx, &next_h, &d4);                             \
            } else {                                                                        \
                (d)->parentObj = c.next_parent;                                             \
                if (e.group != NULL) {                                                      \
                    *e.group = c.next_group;                                                \
                }                                                                           \
                if (cs_ch.ver == 5) {                                                       \
                    cs_ch.t5->startEvent(c.next_ctx, &next_h,                               \
                                         (ncclProfilerEventDescr_v5_t *)(void *)(d));       \
                } else {                                                                    \
                    cs_ch.t6->startEvent(c.next_ctx, &next_h,                               \
                                         (ncclProfilerEventDescr_v6_t *)(void *)(d));       \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        (d)->parentObj = saved_parent;                                                      \
        if (e.group != NULL) {                                                              \
            *e.group = saved_group;                                                         \
        }                                                                                   \
        *(handle) = chain_finish(&c, own_h, next_h);                                        \
        return ncclSuccess;                                                                 \
    } while (0)

ncclResult_t cs_chain_start_v5(void *context, void **handle, ncclProfilerEventDescr_v5_t *d)
{
    CHAIN_START_V56(cs_start_v5, context, handle, d);
}

ncclResult_t cs_chain_start_v6(void *context, void **handle, ncclProfilerEventDescr_v6_t *d)
{
    CHAIN_START_V56(cs_start_v6, context, handle, d);
}

/* NCCL speaking v4: the next plugin has ncclProfiler_v4 too (load_next) */
ncclResult_t cs_chain_start_v4(void *context, void **handle, ncclProfilerEventDescr_v4_t *d)
{
    if (!atomic_load_explicit(&cs_ch.on, memory_order_acquire)) {
        return cs_start_v4(context, handle, d);
    }
    if (handle == NULL) {
        return ncclSuccess;
    }
    *handle = NULL;
    if (d == NULL) {
        return ncclSuccess;
    }
    struct chain_ev e = {
        .type = d->type,
        .parent = &d->parentObj,
        .group = NULL,
        .foreign = d->type == ncclProfileProxyOp && d->proxyOp.pid != cs_g.pid,
    };
    struct chain_call c;
    int fwd = chain_prepare(context, &e, &c) &&
              (d->type & atomic_load_explicit(&cs_ch.fwd, memory_order_relaxed)) != 0;
    void *saved_parent = d->parentObj;
    void *own_h = NULL, *next_h = NULL;
    d->parentObj = c.own_parent;
    cs_start_v4(c.own_ctx, &own_h, d);
    if (fwd) {
        d->parentObj = c.next_parent;
        cs_ch.t4->startEvent(c.next_ctx, &next_h, d);
    }
    d->parentObj = saved_parent;
    *handle = chain_finish(&c, own_h, next_h);
    return ncclSuccess;
}

/* ---- stopEvent, recordEventState ----------------------------------------------------------- */

ncclResult_t cs_chain_stop(void *handle)
{
    if (!atomic_load_explicit(&cs_ch.on, memory_order_acquire)) {
        return cs_stop_event(handle);
    }
    void *own, *next;
    if (unlink_handle(handle, &own, &next) > 0) {
        /* the entry may be claimed again from now on; its contents stay for late children */
        struct cs_link *l = link_ptr(handle);
        cs_pool_free(&l->home->pool, (uint32_t)(l - l->home->v));
        cs_ch.stop(next);
    }
    return cs_stop_event(own);
}

ncclResult_t cs_chain_record(void *handle, ncclProfilerEventState_t state,
                             ncclProfilerEventStateArgs_t *args)
{
    if (!atomic_load_explicit(&cs_ch.on, memory_order_acquire)) {
        return cs_record_state(handle, state, args);
    }
    void *own, *next;
    if (unlink_handle(handle, &own, &next) > 0) {
        cs_ch.record(next, state, args);
    }
    return cs_record_state(own, state, args);
}
