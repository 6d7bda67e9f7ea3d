/*
 * plugin.c: the exported profiler tables ncclProfiler_v4, ncclProfiler_v5 and ncclProfiler_v6
 * (NCCL 2.27 through 2.30 pick the newest they know: notes §1) and the per-version adapters
 * that turn each descriptor layout into calls of the version-neutral code in events.c. When
 * COLLSCOPE_NEXT_PROFILER_PLUGIN is set, the constructor points the tables at chain.c, which
 * calls these adapters and the next plugin.
 */
#include <unistd.h>

#include "internal.h"

struct cs_global cs_g = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
};

/* ---- init: the argument order differs between v4 and v5/v6 ------------------------------- */

ncclResult_t cs_init_v4(void **context, int *mask, const char *name, uint64_t hash,
                            int nnodes, int nranks, int rank, ncclDebugLogger_t logfn)
{
    return cs_init_common(context, mask, name, hash, nnodes, nranks, rank, logfn, 4);
}

ncclResult_t cs_init_v5(void **context, uint64_t comm_id, int *mask, const char *name,
                            int nnodes, int nranks, int rank, ncclDebugLogger_t logfn)
{
    return cs_init_common(context, mask, name, comm_id, nnodes, nranks, rank, logfn, 5);
}

ncclResult_t cs_init_v6(void **context, uint64_t comm_id, int *mask, const char *name,
                            int nnodes, int nranks, int rank, ncclDebugLogger_t logfn)
{
    return cs_init_common(context, mask, name, comm_id, nnodes, nranks, rank, logfn, 6);
}

/* ---- startEvent -------------------------------------------------------------------------- */

/* The union members we read have the same names and offsets in v4, v5 and v6 (checked in
 * nccl_profiler_abi.h); only the type width and the set of event types differ. */
#define CS_START_COMMON(ctx, d, handle)                                                       \
    switch ((d)->type) {                                                                      \
    case ncclProfileProxyStep:                                                                \
        *(handle) = cs_proxy_step_start((d)->parentObj, (d)->proxyStep.step);                 \
        return ncclSuccess;                                                                   \
    case ncclProfileProxyOp:                                                                  \
        *(handle) = cs_proxy_op_start((ctx), (d)->parentObj, (d)->proxyOp.pid,                \
                                      (d)->proxyOp.channelId, (d)->proxyOp.peer,              \
                                      (d)->proxyOp.nSteps, (d)->proxyOp.isSend);              \
        return ncclSuccess;                                                                   \
    case ncclProfileKernelCh:                                                                 \
        *(handle) = (ctx) == NULL ? NULL                                                      \
                                  : cs_kernel_ch_start((d)->parentObj, (d)->kernelCh.channelId, \
                                                       (d)->kernelCh.pTimer);                 \
        return ncclSuccess;                                                                   \
    case ncclProfileColl: {                                                                   \
        struct cs_op_descr od = {                                                             \
            .seq = (d)->coll.seqNumber,                                                       \
            .func = (d)->coll.func,                                                           \
            .datatype = (d)->coll.datatype,                                                   \
            .algo = (d)->coll.algo,                                                           \
            .proto = (d)->coll.proto,                                                         \
            .count = (d)->coll.count,                                                         \
            .peer = -1,                                                                       \
            .nchannels = (d)->coll.nChannels,                                                 \
            .p2p = 0,                                                                         \
        };                                                                                    \
        *(handle) = cs_op_start((ctx), &od);                                                  \
        return ncclSuccess;                                                                   \
    }                                                                                         \
    case ncclProfileP2p: {                                                                    \
        struct cs_op_descr od = {                                                             \
            .seq = 0,                                                                         \
            .func = (d)->p2p.func,                                                            \
            .datatype = (d)->p2p.datatype,                                                    \
            .algo = NULL,                                                                     \
            .proto = NULL,                                                                    \
            .count = (d)->p2p.count,                                                          \
            .peer = (d)->p2p.peer,                                                            \
            .nchannels = (d)->p2p.nChannels,                                                  \
            .p2p = 1,                                                                         \
        };                                                                                    \
        *(handle) = cs_op_start((ctx), &od);                                                  \
        return ncclSuccess;                                                                   \
    }                                                                                         \
    default:                                                                                  \
        break;                                                                                \
    }

/* Group and the v5 API events are started by NCCL as ancestors of what we enabled; answer
 * with a static handle (nothing to record). ProxyCtrl, NetPlugin, CE: not enabled, NULL. */
static void *ancestor_handle(void *ctx, uint64_t type)
{
    const uint64_t ancestors = ncclProfileGroup | ncclProfileGroupApi | ncclProfileCollApi |
                               ncclProfileP2pApi | ncclProfileKernelLaunch;
    return (ctx != NULL && (type & ancestors) != 0) ? (void *)&cs_dummy_handle : NULL;
}

ncclResult_t cs_start_v4(void *context, void **handle, ncclProfilerEventDescr_v4_t *d)
{
    if (handle == NULL) {
        return ncclSuccess;
    }
    *handle = NULL;
    if (d == NULL) {
        return ncclSuccess;
    }
    CS_START_COMMON((struct cs_ctx *)context, d, handle)
    *handle = ancestor_handle(context, d->type);
    return ncclSuccess;
}

ncclResult_t cs_start_v5(void *context, void **handle, ncclProfilerEventDescr_v5_t *d)
{
    if (handle == NULL) {
        return ncclSuccess;
    }
    *handle = NULL;
    if (d == NULL) {
        return ncclSuccess;
    }
    CS_START_COMMON((struct cs_ctx *)context, d, handle)
    *handle = ancestor_handle(context, d->type);
    return ncclSuccess;
}

ncclResult_t cs_start_v6(void *context, void **handle, ncclProfilerEventDescr_v6_t *d)
{
    if (handle == NULL) {
        return ncclSuccess;
    }
    *handle = NULL;
    if (d == NULL) {
        return ncclSuccess;
    }
    CS_START_COMMON((struct cs_ctx *)context, d, handle)
    *handle = ancestor_handle(context, d->type);
    return ncclSuccess;
}

/* ---- exported tables ---------------------------------------------------------------------- */

#define CS_EXPORT __attribute__((visibility("default")))

CS_EXPORT ncclProfiler_v4_t ncclProfiler_v4 = {
    .name = "collscope",
    .init = cs_init_v4,
    .startEvent = cs_start_v4,
    .stopEvent = cs_stop_event,
    .recordEventState = cs_record_state,
    .finalize = cs_finalize,
};

CS_EXPORT ncclProfiler_v5_t ncclProfiler_v5 = {
    .name = "collscope",
    .init = cs_init_v5,
    .startEvent = cs_start_v5,
    .stopEvent = cs_stop_event,
    .recordEventState = cs_record_state,
    .finalize = cs_finalize,
};

CS_EXPORT ncclProfiler_v6_t ncclProfiler_v6 = {
    .name = "collscope",
    .init = cs_init_v6,
    .startEvent = cs_start_v6,
    .stopEvent = cs_stop_event,
    .recordEventState = cs_record_state,
    .finalize = cs_finalize,
};

/* NCCL dlcloses the plugin when its last communicator is freed; the same destructor runs at
 * process exit, while NCCL threads may still call us: so stop the heartbeat thread (its code
 * is about to go away) but leave the mapping in place. The ring file stays for the agent.
 * A forked child inherits cs_g but not the thread: only the creating process joins it. */
__attribute__((destructor)) static void cs_unload(void)
{
    pthread_mutex_lock(&cs_g.lock);
    if (cs_g.hb_running && getpid() == cs_g.pid) {
        cs_heartbeat_stop();
    }
    pthread_mutex_unlock(&cs_g.lock);
}

int cs_is_own_table(const void *table)
{
    return table == (const void *)&ncclProfiler_v4 || table == (const void *)&ncclProfiler_v5 ||
           table == (const void *)&ncclProfiler_v6;
}

__attribute__((constructor)) static void cs_load(void)
{
    /* glibc drops the handler again when the library is unloaded */
    pthread_atfork(NULL, NULL, cs_ring_forget_after_fork);
    /* COLLSCOPE_NEXT_PROFILER_PLUGIN set: every table goes through chain.c. Done here, before
     * NCCL's dlsym can read the tables; unset, the tables stay as above (no cost at all). */
    if (cs_chain_setup()) {
        ncclProfiler_v4.init = cs_chain_init_v4;
        ncclProfiler_v4.startEvent = cs_chain_start_v4;
        ncclProfiler_v5.init = cs_chain_init_v5;
        ncclProfiler_v5.startEvent = cs_chain_start_v5;
        ncclProfiler_v6.init = cs_chain_init_v6;
        ncclProfiler_v6.startEvent = cs_chain_start_v6;
        ncclProfiler_v4.stopEvent = ncclProfiler_v5.stopEvent = ncclProfiler_v6.stopEvent =
            cs_chain_stop;
        ncclProfiler_v4.recordEventState = ncclProfiler_v5.recordEventState =
            ncclProfiler_v6.recordEventState = cs_chain_record;
        ncclProfiler_v4.finalize = ncclProfiler_v5.finalize = ncclProfiler_v6.finalize =
            cs_chain_finalize;
    }
}
