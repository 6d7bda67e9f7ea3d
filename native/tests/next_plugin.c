/*
 * next_plugin.c: a second profiler plugin for the chaining tests (tests/test_chain.c). It
 * counts every call it receives and checks that each handle, parent and context it is given
 * is one of its own (a magic word), so a test sees whether collscope forwarded the right
 * handle to the right plugin. Built in variants by -D flags:
 *   NEXT_V4 / NEXT_V5 / NEXT_V6   export that table (any combination)
 *   NEXT_V3_ONLY                  export only a dummy ncclProfiler_v3 (an API too old to chain)
 *   NEXT_FAIL_INIT                init returns ncclInternalError
 * Its activation mask comes from NEXT_TEST_MASK (hex or decimal; default Coll|P2p|KernelCh,
 * what NCCL Inspector asks for). The counters are read by the test through next_counts().
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_profiler_abi.h"

#define EXPORT __attribute__((visibility("default")))
#define MAYBE_UNUSED __attribute__((unused))
#define EV_MAGIC 0x4e455854u    /* "NEXT" */
#define CTX_MAGIC 0x4e435458u
#define MAX_EV (1u << 16)
#define NTYPES 16

struct next_counts {
    _Atomic uint64_t inits, finalizes, bad_ctx;
    _Atomic uint64_t starts[NTYPES];     /* by bit index of the event type */
    _Atomic uint64_t stops[NTYPES];
    _Atomic uint64_t records[NTYPES];
    _Atomic uint64_t bad_handle;         /* stop/record of a handle that is not ours */
    _Atomic uint64_t parent_ok;          /* parent is our handle of the expected type */
    _Atomic uint64_t parent_null;
    _Atomic uint64_t parent_bad;         /* anything else */
    _Atomic uint64_t last_api;           /* version of the last table called */
    _Atomic uint64_t foreign;            /* ProxyOps of another pid */
};

struct next_ev {
    uint32_t magic;
    uint32_t bit;
    uint64_t type;
};

struct next_ctx {
    uint32_t magic;
    uint64_t hash;
};

static struct next_counts g_counts;
static struct next_ev g_ev[MAX_EV];
static _Atomic uint32_t g_next;

EXPORT struct next_counts *next_counts(void)
{
    return &g_counts;
}

MAYBE_UNUSED static unsigned bit_of(uint64_t type)
{
    for (unsigned b = 0; b < NTYPES; b++) {
        if (type == (UINT64_C(1) << b)) {
            return b;
        }
    }
    return NTYPES - 1;
}

MAYBE_UNUSED static int mask_from_env(void)
{
    const char *v = getenv("NEXT_TEST_MASK");
    if (v == NULL || v[0] == '\0') {
        return ncclProfileColl | ncclProfileP2p | ncclProfileKernelCh;
    }
    return (int)strtol(v, NULL, 0);
}

MAYBE_UNUSED static ncclResult_t do_init(void **context, int *mask, uint64_t hash)
{
    atomic_fetch_add(&g_counts.inits, 1);
#ifdef NEXT_FAIL_INIT
    (void)hash;
    *context = NULL;
    (void)mask;
    return ncclInternalError;
#else
    struct next_ctx *c = malloc(sizeof(*c));
    if (c == NULL) {
        *context = NULL;
        return ncclSuccess;
    }
    c->magic = CTX_MAGIC;
    c->hash = hash;
    *context = c;
    *mask = mask_from_env();
    return ncclSuccess;
#endif
}

MAYBE_UNUSED static struct next_ev *ours(void *h)
{
    struct next_ev *e = h;
    if (e >= g_ev && e < g_ev + MAX_EV && e->magic == EV_MAGIC) {
        return e;
    }
    return NULL;
}

/* the parent NCCL gives each type (notes §3); v4: Coll/P2p under Group */
MAYBE_UNUSED static uint64_t expected_parent(uint64_t type, int api)
{
    switch (type) {
    case ncclProfileColl:
        return api >= 5 ? (uint64_t)ncclProfileCollApi : (uint64_t)ncclProfileGroup;
    case ncclProfileP2p:
        return api >= 5 ? (uint64_t)ncclProfileP2pApi : (uint64_t)ncclProfileGroup;
    case ncclProfileProxyOp:
    case ncclProfileKernelCh:
        return ncclProfileColl | ncclProfileP2p;
    case ncclProfileProxyStep:
        return ncclProfileProxyOp;
    case ncclProfileCollApi:
    case ncclProfileP2pApi:
    case ncclProfileKernelLaunch:
        return ncclProfileGroupApi;
    default:
        return 0;
    }
}

MAYBE_UNUSED static ncclResult_t do_start(int api, void *context, void **handle, uint64_t type, void *parent,
                             pid_t pid)
{
    atomic_store(&g_counts.last_api, (uint64_t)api);
    *handle = NULL;
    int foreign = type == ncclProfileProxyOp && pid != 0 && pid != getpid();
    if (foreign) {
        atomic_fetch_add(&g_counts.foreign, 1);
    } else if (type != ncclProfileProxyStep && type != ncclProfileNetPlugin &&
               (context == NULL || ((struct next_ctx *)context)->magic != CTX_MAGIC)) {
        atomic_fetch_add(&g_counts.bad_ctx, 1);
    }
    unsigned b = bit_of(type);
    atomic_fetch_add(&g_counts.starts[b], 1);
    uint64_t want = expected_parent(type, api);
    if (want != 0 && !foreign) {
        struct next_ev *p = ours(parent);
        if (parent == NULL) {
            atomic_fetch_add(&g_counts.parent_null, 1);
        } else if (p != NULL && (p->type & want) != 0) {
            atomic_fetch_add(&g_counts.parent_ok, 1);
        } else {
            atomic_fetch_add(&g_counts.parent_bad, 1);
        }
    }
    uint32_t i = atomic_fetch_add(&g_next, 1) % MAX_EV;
    g_ev[i].magic = EV_MAGIC;
    g_ev[i].bit = b;
    g_ev[i].type = type;
    *handle = &g_ev[i];
    return ncclSuccess;
}

MAYBE_UNUSED static ncclResult_t next_stop(void *h)
{
    struct next_ev *e = ours(h);
    if (e == NULL) {
        atomic_fetch_add(&g_counts.bad_handle, 1);
        return ncclSuccess;
    }
    atomic_fetch_add(&g_counts.stops[e->bit], 1);
    return ncclSuccess;
}

MAYBE_UNUSED static ncclResult_t next_record(void *h, ncclProfilerEventState_t state,
                                ncclProfilerEventStateArgs_t *args)
{
    (void)state;
    (void)args;
    struct next_ev *e = ours(h);
    if (e == NULL) {
        atomic_fetch_add(&g_counts.bad_handle, 1);
        return ncclSuccess;
    }
    atomic_fetch_add(&g_counts.records[e->bit], 1);
    return ncclSuccess;
}

MAYBE_UNUSED static ncclResult_t next_finalize(void *context)
{
    struct next_ctx *c = context;
    if (c == NULL || c->magic != CTX_MAGIC) {
        atomic_fetch_add(&g_counts.bad_ctx, 1);
        return ncclSuccess;
    }
    atomic_fetch_add(&g_counts.finalizes, 1);
    c->magic = 0;
    free(c);
    return ncclSuccess;
}

#ifdef NEXT_V4
static ncclResult_t init_v4(void **context, int *mask, const char *name, uint64_t hash,
                            int nnodes, int nranks, int rank, ncclDebugLogger_t logfn)
{
    (void)name, (void)nnodes, (void)nranks, (void)rank, (void)logfn;
    return do_init(context, mask, hash);
}

static ncclResult_t start_v4(void *context, void **handle, ncclProfilerEventDescr_v4_t *d)
{
    return do_start(4, context, handle, d->type, d->parentObj,
                    d->type == ncclProfileProxyOp ? d->proxyOp.pid : 0);
}

EXPORT ncclProfiler_v4_t ncclProfiler_v4 = {"nexttest", init_v4, start_v4, next_stop,
                                            next_record, next_finalize};
#endif

#if defined(NEXT_V5) || defined(NEXT_V6)
static ncclResult_t init_v56(void **context, uint64_t hash, int *mask, const char *name,
                             int nnodes, int nranks, int rank, ncclDebugLogger_t logfn)
{
    (void)name, (void)nnodes, (void)nranks, (void)rank, (void)logfn;
    return do_init(context, mask, hash);
}
#endif

#ifdef NEXT_V5
static ncclResult_t start_v5(void *context, void **handle, ncclProfilerEventDescr_v5_t *d)
{
    return do_start(5, context, handle, d->type, d->parentObj,
                    d->type == ncclProfileProxyOp ? d->proxyOp.pid : 0);
}

EXPORT ncclProfiler_v5_t ncclProfiler_v5 = {"nexttest", init_v56, start_v5, next_stop,
                                            next_record, next_finalize};
#endif

#ifdef NEXT_V6
static ncclResult_t start_v6(void *context, void **handle, ncclProfilerEventDescr_v6_t *d)
{
    return do_start(6, context, handle, d->type, d->parentObj,
                    d->type == ncclProfileProxyOp ? d->proxyOp.pid : 0);
}

EXPORT ncclProfiler_v6_t ncclProfiler_v6 = {"nexttest", init_v56, start_v6, next_stop,
                                            next_record, next_finalize};
#endif

#ifdef NEXT_V3_ONLY
/* an API collscope does not speak: only the symbol name matters */
EXPORT struct {
    const char *name;
    void *fns[5];
} ncclProfiler_v3 = {"nexttest-v3", {0}};
#endif
