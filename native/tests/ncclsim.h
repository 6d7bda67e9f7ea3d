/*
 * ncclsim.h: plays NCCL's side of the profiler plugin ABI for tests and the benchmark.
 *
 * Loads a plugin the way NCCL does (dlopen RTLD_NOW|RTLD_LOCAL, dlsym of the data symbol
 * ncclProfiler_vN), builds the version's descriptor layout for each event (v4: uint8 type, no
 * API events; v5/v6: uint64 type, API events) and, like NCCL, never calls stop/record on a
 * NULL handle. There is one activation mask per sim: NCCL's process-wide int.
 */
#ifndef COLLSCOPE_NCCLSIM_H
#define COLLSCOPE_NCCLSIM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "nccl_profiler_abi.h"

struct ncclsim {
    int api;                    /* 4, 5 or 6 */
    void *lib;
    ncclProfiler_v4_t *v4;
    ncclProfiler_v5_t *v5;
    ncclProfiler_v6_t *v6;
    int mask;                   /* NCCL's global ncclProfilerEventMask */
};

/* fields of every descriptor kind; sim_start copies what the event type uses */
struct sim_descr {
    uint64_t type;
    void *parent;
    int rank;
    uint64_t seq;
    const char *func, *datatype, *algo, *proto;
    size_t count;
    uint8_t nchannels;
    int peer;
    pid_t pid;
    int channel, nsteps, chunk, is_send, step;
    uint64_t ptimer;
    void *group;                /* v5+: Coll/P2p parentGroup, the legacy Group event */
};

/* 0 on success; on failure prints why and returns -1 */
int sim_open(struct ncclsim *s, const char *path, int api);
void sim_close(struct ncclsim *s);

void *sim_init(struct ncclsim *s, uint64_t hash, const char *name, int nnodes, int nranks,
               int rank, ncclDebugLogger_t logfn);
void sim_finalize(struct ncclsim *s, void *ctx);

void *sim_start(struct ncclsim *s, void *ctx, const struct sim_descr *d);
void sim_stop(struct ncclsim *s, void *handle);
void sim_record(struct ncclsim *s, void *handle, int state, uint64_t arg);

/* shorthands for the events of NCCL's sequences */
void *sim_group_api(struct ncclsim *s, void *ctx);          /* v5+: NULL on v4 */
void *sim_coll_api(struct ncclsim *s, void *ctx, void *group_api, const char *func);
void *sim_group(struct ncclsim *s, void *ctx);
void *sim_coll(struct ncclsim *s, void *ctx, void *parent, uint64_t seq, const char *func,
               size_t count, const char *dtype, int nchannels, const char *algo,
               const char *proto);
void *sim_p2p(struct ncclsim *s, void *ctx, void *parent, const char *func, size_t count,
              const char *dtype, int peer, int nchannels);
void *sim_proxy_op(struct ncclsim *s, void *ctx, void *coll, pid_t pid, int channel, int peer,
                   int nsteps, int is_send);
void *sim_step(struct ncclsim *s, void *ctx, void *proxy_op, int step);
void *sim_kernel_ch(struct ncclsim *s, void *ctx, void *coll, int channel, uint64_t ptimer);
void sim_kernel_ch_stop(struct ncclsim *s, void *kch, uint64_t ptimer);

/* NCCL's implicit group around one API call, API side (v5+ API events; no-ops on v4):
 * GroupApi start, GroupStartApiStop, CollApi start/stop, GroupEndApiStart. Returns the
 * CollApi handle (Coll's parent in v5+); *group_api receives the GroupApi handle. */
void *sim_api_enter(struct ncclsim *s, void *ctx, const char *func, void **group_api);
void sim_api_leave(struct ncclsim *s, void *group_api);

#endif /* COLLSCOPE_NCCLSIM_H */
