/*
 * empty_plugin.c: the baseline of bench/plugin_overhead. The same profiler ABI and build flags
 * as libnccl-profiler-collscope.so, but every callback does nothing: starts return a static
 * non-NULL handle (so the benchmark's NCCL side goes down the same paths), stop/record return.
 */
#include "nccl_profiler_abi.h"

static char empty_handle;
static char empty_context;

static ncclResult_t empty_init_v6(void **context, uint64_t comm_id, int *mask, const char *name,
                                  int nnodes, int nranks, int rank, ncclDebugLogger_t logfn)
{
    (void)comm_id;
    (void)name;
    (void)nnodes;
    (void)nranks;
    (void)rank;
    (void)logfn;
    *context = &empty_context;
    *mask = ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep |
            ncclProfileKernelCh;
    return ncclSuccess;
}

static ncclResult_t empty_start_v6(void *context, void **handle, ncclProfilerEventDescr_v6_t *d)
{
    (void)context;
    (void)d;
    *handle = &empty_handle;
    return ncclSuccess;
}

static ncclResult_t empty_stop(void *handle)
{
    (void)handle;
    return ncclSuccess;
}

static ncclResult_t empty_record(void *handle, ncclProfilerEventState_t state,
                                 ncclProfilerEventStateArgs_t *args)
{
    (void)handle;
    (void)state;
    (void)args;
    return ncclSuccess;
}

static ncclResult_t empty_finalize(void *context)
{
    (void)context;
    return ncclSuccess;
}

__attribute__((visibility("default"))) ncclProfiler_v6_t ncclProfiler_v6 = {
    .name = "empty",
    .init = empty_init_v6,
    .startEvent = empty_start_v6,
    .stopEvent = empty_stop,
    .recordEventState = empty_record,
    .finalize = empty_finalize,
};
