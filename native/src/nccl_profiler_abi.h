/*
 * nccl_profiler_abi.h: the parts of NCCL's profiler plugin ABI (API v4, v5, v6) that collscope
 * implements, declared from the documented layouts (shared/notes/nccl-profiler.md §2; NCCL
 * 2.27 - 2.30). Nothing here is included from NCCL; the _Static_asserts at the end pin every
 * offset the plugin reads, for LP64 (x86_64, aarch64 Linux).
 *
 * Differences that matter between versions:
 *   - descriptor `type` is uint8_t in v4, uint64_t in v5/v6 (the union stays at offset 24);
 *   - init argument order: v4 (ctx, mask, name, hash, ...) vs v5/v6 (ctx, commId, mask, name, ...);
 *   - v5 adds API events (GroupApi, CollApi, P2pApi, KernelLaunch) and a trailing parentGroup in
 *     coll/p2p; v6 adds Copy-Engine events at the end of the union.
 */
#ifndef COLLSCOPE_NCCL_PROFILER_ABI_H
#define COLLSCOPE_NCCL_PROFILER_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

/* ncclDebugLogLevel and subsystem flags used by the plugin's log lines */
enum {
    CS_NCCL_LOG_NONE = 0,
    CS_NCCL_LOG_VERSION = 1,
    CS_NCCL_LOG_WARN = 2,
    CS_NCCL_LOG_INFO = 3,
};
#define CS_NCCL_LOGSUB_INIT 1ul
#define CS_NCCL_LOGSUB_PROFILE 16384ul

/* the real first parameter is an int-sized enum (ncclDebugLogLevel) */
typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char *file, int line,
                                  const char *fmt, ...);

/* event types: bit values, also used in the activation mask */
enum {
    ncclProfileGroup = 1 << 0,
    ncclProfileColl = 1 << 1,
    ncclProfileP2p = 1 << 2,
    ncclProfileProxyOp = 1 << 3,
    ncclProfileProxyStep = 1 << 4,
    ncclProfileProxyCtrl = 1 << 5,
    ncclProfileKernelCh = 1 << 6,
    ncclProfileNetPlugin = 1 << 7,
    ncclProfileGroupApi = 1 << 8,     /* v5+ */
    ncclProfileCollApi = 1 << 9,      /* v5+ */
    ncclProfileP2pApi = 1 << 10,      /* v5+ */
    ncclProfileKernelLaunch = 1 << 11, /* v5+ */
    ncclProfileCeColl = 1 << 12,      /* v6 */
    ncclProfileCeSync = 1 << 13,      /* v6 */
    ncclProfileCeBatch = 1 << 14,     /* v6 */
};

/* event states (one int-sized enum; numbering stable since NCCL 2.26) */
typedef int ncclProfilerEventState_t;
enum {
    ncclProfilerProxyStepSendGPUWait = 8,
    ncclProfilerProxyStepSendWait = 9,
    ncclProfilerProxyStepRecvWait = 10,
    ncclProfilerProxyStepRecvFlushWait = 11,
    ncclProfilerProxyStepRecvGPUWait = 12,
    ncclProfilerProxyOpInProgress_v4 = 19,
    ncclProfilerProxyStepSendPeerWait_v4 = 20,
    ncclProfilerNetPluginUpdate = 21,
    ncclProfilerKernelChStop = 22,
    ncclProfilerGroupStartApiStop = 23,
    ncclProfilerGroupEndApiStart = 24,
};

/* ----------------------------------------------------------------------------------------- */
/* union members shared by v4, v5 and v6 (identical layouts)                                 */

struct cs_nccl_proxy_op {
    pid_t pid;          /* pid of the process that created the op (PXN: another process) */
    uint8_t channelId;
    int peer;
    int nSteps;
    int chunkSize;
    int isSend;
};

struct cs_nccl_proxy_step {
    int step;
};

struct cs_nccl_kernel_ch {
    uint8_t channelId;
    uint64_t pTimer;    /* GPU globaltimer at kernel start on this channel */
};

struct cs_nccl_net_plugin {
    int64_t id;
    void *data;
};

struct cs_nccl_coll_v4 {
    uint64_t seqNumber;
    const char *func;
    const void *sendBuff;
    void *recvBuff;
    size_t count;
    int root;
    const char *datatype;
    uint8_t nChannels;
    uint8_t nWarps;
    const char *algo;
    const char *proto;
};

struct cs_nccl_p2p_v4 {
    const char *func;
    void *buff;
    const char *datatype;
    size_t count;
    int peer;
    uint8_t nChannels;
};

struct cs_nccl_coll_v5 {
    uint64_t seqNumber;
    const char *func;
    const void *sendBuff;
    void *recvBuff;
    size_t count;
    int root;
    const char *datatype;
    uint8_t nChannels;
    uint8_t nWarps;
    const char *algo;
    const char *proto;
    void *parentGroup;
};

struct cs_nccl_p2p_v5 {
    const char *func;
    void *buff;
    const char *datatype;
    size_t count;
    int peer;
    uint8_t nChannels;
    void *parentGroup;
};

/* ----------------------------------------------------------------------------------------- */
/* descriptors                                                                               */

typedef struct {
    uint8_t type;
    void *parentObj;
    int rank;
    union {
        struct cs_nccl_coll_v4 coll;
        struct cs_nccl_p2p_v4 p2p;
        struct cs_nccl_proxy_op proxyOp;
        struct cs_nccl_proxy_step proxyStep;
        struct cs_nccl_kernel_ch kernelCh;
        struct cs_nccl_net_plugin netPlugin;
    };
} ncclProfilerEventDescr_v4_t;

struct cs_nccl_group_api {
    bool graphCaptured;
    int groupDepth;
};

struct cs_nccl_coll_api {
    const char *func;
    size_t count;
    const char *datatype;
    int root;
    void *stream;
    bool graphCaptured;
};

struct cs_nccl_p2p_api {
    const char *func;
    size_t count;
    const char *datatype;
    void *stream;
    bool graphCaptured;
};

struct cs_nccl_kernel_launch {
    void *stream;
};

typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        struct cs_nccl_group_api groupApi;
        struct cs_nccl_coll_api collApi;
        struct cs_nccl_p2p_api p2pApi;
        struct cs_nccl_kernel_launch kernelLaunch;
        struct cs_nccl_coll_v5 coll;
        struct cs_nccl_p2p_v5 p2p;
        struct cs_nccl_proxy_op proxyOp;
        struct cs_nccl_proxy_step proxyStep;
        struct cs_nccl_kernel_ch kernelCh;
        struct cs_nccl_net_plugin netPlugin;
    };
} ncclProfilerEventDescr_v5_t;

struct cs_nccl_ce_coll {
    uint64_t seqNumber;
    const char *func;
    const void *sendBuff;
    void *recvBuff;
    size_t count;
    int root;
    const char *datatype;
    const char *syncStrategy;
    bool intraBatchSync;
    uint32_t batchSize;
    uint32_t numBatches;
    uint32_t ceSeqNum;
    void *stream;
};

struct cs_nccl_ce_sync {
    bool isComplete;
    int nRanks;
};

struct cs_nccl_ce_batch {
    int numOps;
    size_t totalBytes;
    bool useIntraSync;
};

typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        struct cs_nccl_group_api groupApi;
        struct cs_nccl_coll_api collApi;
        struct cs_nccl_p2p_api p2pApi;
        struct cs_nccl_kernel_launch kernelLaunch;
        struct cs_nccl_coll_v5 coll;
        struct cs_nccl_p2p_v5 p2p;
        struct cs_nccl_proxy_op proxyOp;
        struct cs_nccl_proxy_step proxyStep;
        struct cs_nccl_kernel_ch kernelCh;
        struct cs_nccl_net_plugin netPlugin;
        struct cs_nccl_ce_coll ceColl;
        struct cs_nccl_ce_sync ceCollSync;
        struct cs_nccl_ce_batch ceCollBatch;
    };
} ncclProfilerEventDescr_v6_t;

/* state arguments: identical in v4, v5 and v6 */
typedef union {
    struct {
        size_t transSize;
    } proxyStep;
    struct {
        int appendedProxyOps;
    } proxyCtrl;
    struct {
        void *data;
    } netPlugin;
    struct {
        uint64_t pTimer;  /* GPU globaltimer at kernel stop (KernelChStop) */
    } kernelCh;
} ncclProfilerEventStateArgs_t;

/* ----------------------------------------------------------------------------------------- */
/* function tables (the exported data symbols ncclProfiler_v4/_v5/_v6)                       */

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **context, int *eActivationMask, const char *commName,
                         uint64_t commHash, int nNodes, int nranks, int rank,
                         ncclDebugLogger_t logfn);
    ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v4_t *eDescr);
    ncclResult_t (*stopEvent)(void *eHandle);
    ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_t eState,
                                     ncclProfilerEventStateArgs_t *eStateArgs);
    ncclResult_t (*finalize)(void *context);
} ncclProfiler_v4_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **context, uint64_t commId, int *eActivationMask,
                         const char *commName, int nNodes, int nranks, int rank,
                         ncclDebugLogger_t logfn);
    ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v5_t *eDescr);
    ncclResult_t (*stopEvent)(void *eHandle);
    ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_t eState,
                                     ncclProfilerEventStateArgs_t *eStateArgs);
    ncclResult_t (*finalize)(void *context);
} ncclProfiler_v5_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **context, uint64_t commId, int *eActivationMask,
                         const char *commName, int nNodes, int nranks, int rank,
                         ncclDebugLogger_t logfn);
    ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v6_t *eDescr);
    ncclResult_t (*stopEvent)(void *eHandle);
    ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_t eState,
                                     ncclProfilerEventStateArgs_t *eStateArgs);
    ncclResult_t (*finalize)(void *context);
} ncclProfiler_v6_t;

/* ----------------------------------------------------------------------------------------- */
/* LP64 layout checks                                                                        */

#if defined(__LP64__) || defined(_LP64)
#define CS_ABI_OFF(t, f, o) _Static_assert(offsetof(t, f) == (o), #t "." #f)

_Static_assert(sizeof(ncclResult_t) == 4, "ncclResult_t is int-sized");
_Static_assert(sizeof(pid_t) == 4, "pid_t");

CS_ABI_OFF(ncclProfilerEventDescr_v4_t, type, 0);
CS_ABI_OFF(ncclProfilerEventDescr_v4_t, parentObj, 8);
CS_ABI_OFF(ncclProfilerEventDescr_v4_t, rank, 16);
CS_ABI_OFF(ncclProfilerEventDescr_v4_t, coll, 24);
_Static_assert(sizeof(struct cs_nccl_coll_v4) == 80, "v4 coll");
_Static_assert(sizeof(ncclProfilerEventDescr_v4_t) == 104, "v4 descriptor");

CS_ABI_OFF(ncclProfilerEventDescr_v5_t, type, 0);
CS_ABI_OFF(ncclProfilerEventDescr_v5_t, parentObj, 8);
CS_ABI_OFF(ncclProfilerEventDescr_v5_t, rank, 16);
CS_ABI_OFF(ncclProfilerEventDescr_v5_t, coll, 24);
_Static_assert(sizeof(struct cs_nccl_coll_v5) == 88, "v5 coll");
_Static_assert(sizeof(ncclProfilerEventDescr_v5_t) == 112, "v5 descriptor");

CS_ABI_OFF(ncclProfilerEventDescr_v6_t, type, 0);
CS_ABI_OFF(ncclProfilerEventDescr_v6_t, parentObj, 8);
CS_ABI_OFF(ncclProfilerEventDescr_v6_t, rank, 16);
CS_ABI_OFF(ncclProfilerEventDescr_v6_t, coll, 24);
_Static_assert(sizeof(struct cs_nccl_ce_coll) == 88, "v6 ceColl");
_Static_assert(sizeof(ncclProfilerEventDescr_v6_t) == 112, "v6 descriptor");

/* union members (offsets inside the member) */
CS_ABI_OFF(struct cs_nccl_coll_v4, seqNumber, 0);
CS_ABI_OFF(struct cs_nccl_coll_v4, func, 8);
CS_ABI_OFF(struct cs_nccl_coll_v4, count, 32);
CS_ABI_OFF(struct cs_nccl_coll_v4, root, 40);
CS_ABI_OFF(struct cs_nccl_coll_v4, datatype, 48);
CS_ABI_OFF(struct cs_nccl_coll_v4, nChannels, 56);
CS_ABI_OFF(struct cs_nccl_coll_v4, nWarps, 57);
CS_ABI_OFF(struct cs_nccl_coll_v4, algo, 64);
CS_ABI_OFF(struct cs_nccl_coll_v4, proto, 72);
CS_ABI_OFF(struct cs_nccl_coll_v5, algo, 64);
CS_ABI_OFF(struct cs_nccl_coll_v5, proto, 72);
CS_ABI_OFF(struct cs_nccl_coll_v5, parentGroup, 80);
CS_ABI_OFF(struct cs_nccl_p2p_v4, func, 0);
CS_ABI_OFF(struct cs_nccl_p2p_v4, datatype, 16);
CS_ABI_OFF(struct cs_nccl_p2p_v4, count, 24);
CS_ABI_OFF(struct cs_nccl_p2p_v4, peer, 32);
CS_ABI_OFF(struct cs_nccl_p2p_v4, nChannels, 36);
CS_ABI_OFF(struct cs_nccl_p2p_v5, nChannels, 36);
CS_ABI_OFF(struct cs_nccl_p2p_v5, parentGroup, 40);
CS_ABI_OFF(struct cs_nccl_proxy_op, pid, 0);
CS_ABI_OFF(struct cs_nccl_proxy_op, channelId, 4);
CS_ABI_OFF(struct cs_nccl_proxy_op, peer, 8);
CS_ABI_OFF(struct cs_nccl_proxy_op, nSteps, 12);
CS_ABI_OFF(struct cs_nccl_proxy_op, chunkSize, 16);
CS_ABI_OFF(struct cs_nccl_proxy_op, isSend, 20);
CS_ABI_OFF(struct cs_nccl_kernel_ch, channelId, 0);
CS_ABI_OFF(struct cs_nccl_kernel_ch, pTimer, 8);
CS_ABI_OFF(struct cs_nccl_coll_api, datatype, 16);
CS_ABI_OFF(struct cs_nccl_coll_api, graphCaptured, 40);
_Static_assert(sizeof(ncclProfilerEventStateArgs_t) == 8, "state args");

/* function tables: six pointers */
_Static_assert(sizeof(ncclProfiler_v4_t) == 48, "v4 table");
_Static_assert(sizeof(ncclProfiler_v5_t) == 48, "v5 table");
_Static_assert(sizeof(ncclProfiler_v6_t) == 48, "v6 table");
CS_ABI_OFF(ncclProfiler_v5_t, finalize, 40);
#endif

#endif /* COLLSCOPE_NCCL_PROFILER_ABI_H */
