/*
 * ncclsim.c: NCCL's side of the profiler ABI (see ncclsim.h). Descriptor contents follow
 * NCCL's src/plugin/profiler.cc as summarised in shared/notes/nccl-profiler.md §2-§3.
 */
#include "ncclsim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int sim_open(struct ncclsim *s, const char *path, int api)
{
    memset(s, 0, sizeof(*s));
    s->api = api;
    s->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (s->lib == NULL) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return -1;
    }
    char sym[32];
    snprintf(sym, sizeof(sym), "ncclProfiler_v%d", api);
    void *p = dlsym(s->lib, sym);
    if (p == NULL) {
        fprintf(stderr, "dlsym %s: %s\n", sym, dlerror());
        dlclose(s->lib);
        return -1;
    }
    if (api == 4) {
        s->v4 = p;
    } else if (api == 5) {
        s->v5 = p;
    } else {
        s->v6 = p;
    }
    return 0;
}

void sim_close(struct ncclsim *s)
{
    if (s->lib != NULL) {
        dlclose(s->lib);
        s->lib = NULL;
    }
}

void *sim_init(struct ncclsim *s, uint64_t hash, const char *name, int nnodes, int nranks,
               int rank, ncclDebugLogger_t logfn)
{
    void *ctx = NULL;
    ncclResult_t rc;
    if (s->api == 4) {
        rc = s->v4->init(&ctx, &s->mask, name, hash, nnodes, nranks, rank, logfn);
    } else if (s->api == 5) {
        rc = s->v5->init(&ctx, hash, &s->mask, name, nnodes, nranks, rank, logfn);
    } else {
        rc = s->v6->init(&ctx, hash, &s->mask, name, nnodes, nranks, rank, logfn);
    }
    if (rc != ncclSuccess) {
        fprintf(stderr, "init returned %d (must never fail)\n", (int)rc);
    }
    return ctx;
}

void sim_finalize(struct ncclsim *s, void *ctx)
{
    if (ctx == NULL) {
        return;  /* NCCL calls finalize only for a non-NULL context */
    }
    if (s->api == 4) {
        s->v4->finalize(ctx);
    } else if (s->api == 5) {
        s->v5->finalize(ctx);
    } else {
        s->v6->finalize(ctx);
    }
}

#define FILL_UNION(e, d)                                                                  \
    do {                                                                                  \
        switch ((d)->type) {                                                              \
        case ncclProfileColl:                                                             \
            (e).coll.seqNumber = (d)->seq;                                                \
            (e).coll.func = (d)->func;                                                    \
            (e).coll.count = (d)->count;                                                  \
            (e).coll.datatype = (d)->datatype;                                            \
            (e).coll.nChannels = (d)->nchannels;                                          \
            (e).coll.nWarps = 16;                                                         \
            (e).coll.algo = (d)->algo;                                                    \
            (e).coll.proto = (d)->proto;                                                  \
            break;                                                                        \
        case ncclProfileP2p:                                                              \
            (e).p2p.func = (d)->func;                                                     \
            (e).p2p.count = (d)->count;                                                   \
            (e).p2p.datatype = (d)->datatype;                                             \
            (e).p2p.peer = (d)->peer;                                                     \
            (e).p2p.nChannels = (d)->nchannels;                                           \
            break;                                                                        \
        case ncclProfileProxyOp:                                                          \
            (e).proxyOp.pid = (d)->pid;                                                   \
            (e).proxyOp.channelId = (uint8_t)(d)->channel;                                \
            (e).proxyOp.peer = (d)->peer;                                                 \
            (e).proxyOp.nSteps = (d)->nsteps;                                             \
            (e).proxyOp.chunkSize = (d)->chunk;                                           \
            (e).proxyOp.isSend = (d)->is_send;                                            \
            break;                                                                        \
        case ncclProfileProxyStep:                                                        \
            (e).proxyStep.step = (d)->step;                                               \
            break;                                                                        \
        case ncclProfileKernelCh:                                                         \
            (e).kernelCh.channelId = (uint8_t)(d)->channel;                               \
            (e).kernelCh.pTimer = (d)->ptimer;                                            \
            break;                                                                        \
        default:                                                                          \
            break;                                                                        \
        }                                                                                 \
    } while (0)

void *sim_start(struct ncclsim *s, void *ctx, const struct sim_descr *d)
{
    void *h = NULL;
    if (s->api == 4) {
        if (d->type > 0xff) {
            return NULL;  /* no such event before v5 */
        }
        ncclProfilerEventDescr_v4_t e;
        memset(&e, 0, sizeof(e));
        e.type = (uint8_t)d->type;
        e.parentObj = d->parent;
        e.rank = d->rank;
        FILL_UNION(e, d);
        s->v4->startEvent(ctx, &h, &e);
    } else if (s->api == 5) {
        ncclProfilerEventDescr_v5_t e;
        memset(&e, 0, sizeof(e));
        e.type = d->type;
        e.parentObj = d->parent;
        e.rank = d->rank;
        FILL_UNION(e, d);
        if (d->type == ncclProfileCollApi) {
            e.collApi.func = d->func;
        } else if (d->type == ncclProfileColl) {
            e.coll.parentGroup = d->group;
        } else if (d->type == ncclProfileP2p) {
            e.p2p.parentGroup = d->group;
        }
        s->v5->startEvent(ctx, &h, &e);
    } else {
        ncclProfilerEventDescr_v6_t e;
        memset(&e, 0, sizeof(e));
        e.type = d->type;
        e.parentObj = d->parent;
        e.rank = d->rank;
        FILL_UNION(e, d);
        if (d->type == ncclProfileCollApi) {
            e.collApi.func = d->func;
        } else if (d->type == ncclProfileColl) {
            e.coll.parentGroup = d->group;
        } else if (d->type == ncclProfileP2p) {
            e.p2p.parentGroup = d->group;
        }
        s->v6->startEvent(ctx, &h, &e);
    }
    return h;
}

void sim_stop(struct ncclsim *s, void *handle)
{
    if (handle == NULL) {
        return;
    }
    if (s->api == 4) {
        s->v4->stopEvent(handle);
    } else if (s->api == 5) {
        s->v5->stopEvent(handle);
    } else {
        s->v6->stopEvent(handle);
    }
}

void sim_record(struct ncclsim *s, void *handle, int state, uint64_t arg)
{
    if (handle == NULL) {
        return;
    }
    ncclProfilerEventStateArgs_t a;
    memset(&a, 0, sizeof(a));
    if (state == ncclProfilerKernelChStop) {
        a.kernelCh.pTimer = arg;
    } else {
        a.proxyStep.transSize = (size_t)arg;
    }
    ncclProfilerEventStateArgs_t *pa = state == ncclProfilerGroupStartApiStop ||
                                               state == ncclProfilerGroupEndApiStart
                                           ? NULL
                                           : &a;
    if (s->api == 4) {
        s->v4->recordEventState(handle, state, pa);
    } else if (s->api == 5) {
        s->v5->recordEventState(handle, state, pa);
    } else {
        s->v6->recordEventState(handle, state, pa);
    }
}

void *sim_group_api(struct ncclsim *s, void *ctx)
{
    struct sim_descr d = {.type = ncclProfileGroupApi};
    return s->api >= 5 ? sim_start(s, ctx, &d) : NULL;
}

void *sim_coll_api(struct ncclsim *s, void *ctx, void *group_api, const char *func)
{
    struct sim_descr d = {.type = ncclProfileCollApi, .parent = group_api, .func = func};
    return s->api >= 5 ? sim_start(s, ctx, &d) : NULL;
}

void *sim_group(struct ncclsim *s, void *ctx)
{
    struct sim_descr d = {.type = ncclProfileGroup};
    return sim_start(s, ctx, &d);
}

void *sim_coll(struct ncclsim *s, void *ctx, void *parent, uint64_t seq, const char *func,
               size_t count, const char *dtype, int nchannels, const char *algo,
               const char *proto)
{
    struct sim_descr d = {
        .type = ncclProfileColl, .parent = parent, .seq = seq, .func = func, .count = count,
        .datatype = dtype, .nchannels = (uint8_t)nchannels, .algo = algo, .proto = proto,
    };
    return sim_start(s, ctx, &d);
}

void *sim_p2p(struct ncclsim *s, void *ctx, void *parent, const char *func, size_t count,
              const char *dtype, int peer, int nchannels)
{
    struct sim_descr d = {
        .type = ncclProfileP2p, .parent = parent, .func = func, .count = count,
        .datatype = dtype, .peer = peer, .nchannels = (uint8_t)nchannels,
    };
    return sim_start(s, ctx, &d);
}

void *sim_proxy_op(struct ncclsim *s, void *ctx, void *coll, pid_t pid, int channel, int peer,
                   int nsteps, int is_send)
{
    struct sim_descr d = {
        .type = ncclProfileProxyOp, .parent = coll, .pid = pid, .channel = channel,
        .peer = peer, .nsteps = nsteps, .chunk = 524288, .is_send = is_send,
    };
    return sim_start(s, ctx, &d);
}

void *sim_step(struct ncclsim *s, void *ctx, void *proxy_op, int step)
{
    struct sim_descr d = {.type = ncclProfileProxyStep, .parent = proxy_op, .step = step};
    return sim_start(s, ctx, &d);
}

void *sim_kernel_ch(struct ncclsim *s, void *ctx, void *coll, int channel, uint64_t ptimer)
{
    struct sim_descr d = {
        .type = ncclProfileKernelCh, .parent = coll, .channel = channel, .ptimer = ptimer,
    };
    return sim_start(s, ctx, &d);
}

void sim_kernel_ch_stop(struct ncclsim *s, void *kch, uint64_t ptimer)
{
    sim_record(s, kch, ncclProfilerKernelChStop, ptimer);
    sim_stop(s, kch);
}

void *sim_api_enter(struct ncclsim *s, void *ctx, const char *func, void **group_api)
{
    *group_api = sim_group_api(s, ctx);
    sim_record(s, *group_api, ncclProfilerGroupStartApiStop, 0);
    void *coll_api = sim_coll_api(s, ctx, *group_api, func);
    sim_stop(s, coll_api);  /* CollApi stops inside the API call; the handle stays a parent */
    sim_record(s, *group_api, ncclProfilerGroupEndApiStart, 0);
    return coll_api;
}

void sim_api_leave(struct ncclsim *s, void *group_api)
{
    sim_stop(s, group_api);
}
