/*
 * names.c: NCCL's descriptor strings -> the ring's one-byte enums.
 *
 * NCCL passes pointers to static strings (src/collectives.cc: ncclFuncToString,
 * ncclAlgoToString, ncclProtoToString, ncclDatatypeToString). Called at Coll/P2p start on the
 * host thread, never on the proxy hot path. Unknown names map to 0 (or FUNC_OTHER) rather
 * than failing: a newer NCCL may add names.
 */
#include <stdatomic.h>
#include <string.h>

#include "internal.h"

struct cs_name {
    const char *name;
    uint8_t id;
};

static uint8_t lookup(const struct cs_name *table, size_t n, const char *s, uint8_t unknown)
{
    if (s == NULL) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(table[i].name, s) == 0) {
            return table[i].id;
        }
    }
    return unknown;
}

/* NCCL passes the same few static strings again and again: remember the last ids by
 * pointer (4 entries, direct-mapped; an entry packs pointer << 8 | id in one atomic word so
 * concurrent callers never see a torn pair). User-space pointers fit in 56 bits. */
struct cs_name_cache {
    _Atomic uint64_t e[4];
};

static uint8_t cached(struct cs_name_cache *c, const struct cs_name *table, size_t n,
                      const char *s, uint8_t unknown)
{
    uintptr_t p = (uintptr_t)s;
    _Atomic uint64_t *e = &c->e[(p >> 3) & 3u];
    uint64_t v = atomic_load_explicit(e, memory_order_relaxed);
    if (p != 0 && (v >> 8) == (uint64_t)p) {
        return (uint8_t)(v & 0xffu);
    }
    uint8_t id = lookup(table, n, s, unknown);
    if (p != 0 && ((uint64_t)p >> 56) == 0) {
        atomic_store_explicit(e, ((uint64_t)p << 8) | id, memory_order_relaxed);
    }
    return id;
}

#define LOOKUP(table, s, unknown)                                                             \
    do {                                                                                      \
        static struct cs_name_cache cache_;                                                   \
        return cached(&cache_, (table), sizeof(table) / sizeof((table)[0]), (s), (unknown)); \
    } while (0)

uint8_t cs_func_id(const char *s)
{
    static const struct cs_name t[] = {
        {"AllReduce", COLLSCOPE_FUNC_ALLREDUCE},
        {"AllGather", COLLSCOPE_FUNC_ALLGATHER},
        {"ReduceScatter", COLLSCOPE_FUNC_REDUCESCATTER},
        {"Broadcast", COLLSCOPE_FUNC_BROADCAST},
        {"Reduce", COLLSCOPE_FUNC_REDUCE},
        {"Send", COLLSCOPE_FUNC_SEND},
        {"Recv", COLLSCOPE_FUNC_RECV},
        {"AllToAll", COLLSCOPE_FUNC_ALLTOALL},
        {"AlltoAll", COLLSCOPE_FUNC_ALLTOALL},
        {"Gather", COLLSCOPE_FUNC_GATHER},
        {"Scatter", COLLSCOPE_FUNC_SCATTER},
        {"AllGatherV", COLLSCOPE_FUNC_ALLGATHERV},
        {"SendRecv", COLLSCOPE_FUNC_SENDRECV},
    };
    LOOKUP(t, s, COLLSCOPE_FUNC_OTHER);
}

uint8_t cs_algo_id(const char *s)
{
    static const struct cs_name t[] = {
        {"TREE", COLLSCOPE_ALGO_TREE},
        {"RING", COLLSCOPE_ALGO_RING},
        {"COLLNET_DIRECT", COLLSCOPE_ALGO_COLLNET_DIRECT},
        {"COLLNET_CHAIN", COLLSCOPE_ALGO_COLLNET_CHAIN},
        {"NVLS", COLLSCOPE_ALGO_NVLS},
        {"NVLS_TREE", COLLSCOPE_ALGO_NVLS_TREE},
        {"PAT", COLLSCOPE_ALGO_PAT},
    };
    LOOKUP(t, s, COLLSCOPE_ALGO_UNKNOWN);
}

uint8_t cs_proto_id(const char *s)
{
    static const struct cs_name t[] = {
        {"LL", COLLSCOPE_PROTO_LL},
        {"LL128", COLLSCOPE_PROTO_LL128},
        {"SIMPLE", COLLSCOPE_PROTO_SIMPLE},
        {"Simple", COLLSCOPE_PROTO_SIMPLE},
    };
    LOOKUP(t, s, COLLSCOPE_PROTO_UNKNOWN);
}

uint8_t cs_dtype_id(const char *s)
{
    static const struct cs_name t[] = {
        {"ncclInt8", COLLSCOPE_DTYPE_INT8},
        {"ncclUint8", COLLSCOPE_DTYPE_UINT8},
        {"ncclInt32", COLLSCOPE_DTYPE_INT32},
        {"ncclUint32", COLLSCOPE_DTYPE_UINT32},
        {"ncclInt64", COLLSCOPE_DTYPE_INT64},
        {"ncclUint64", COLLSCOPE_DTYPE_UINT64},
        {"ncclFloat16", COLLSCOPE_DTYPE_FLOAT16},
        {"ncclFloat32", COLLSCOPE_DTYPE_FLOAT32},
        {"ncclFloat64", COLLSCOPE_DTYPE_FLOAT64},
        {"ncclBfloat16", COLLSCOPE_DTYPE_BFLOAT16},
        {"ncclFloat8e4m3", COLLSCOPE_DTYPE_FLOAT8E4M3},
        {"ncclFloat8e5m2", COLLSCOPE_DTYPE_FLOAT8E5M2},
    };
    LOOKUP(t, s, COLLSCOPE_DTYPE_UNKNOWN);
}

uint32_t cs_dtype_size(uint8_t dtype)
{
    switch (dtype) {
    case COLLSCOPE_DTYPE_INT8:
    case COLLSCOPE_DTYPE_UINT8:
    case COLLSCOPE_DTYPE_FLOAT8E4M3:
    case COLLSCOPE_DTYPE_FLOAT8E5M2:
        return 1;
    case COLLSCOPE_DTYPE_FLOAT16:
    case COLLSCOPE_DTYPE_BFLOAT16:
        return 2;
    case COLLSCOPE_DTYPE_INT32:
    case COLLSCOPE_DTYPE_UINT32:
    case COLLSCOPE_DTYPE_FLOAT32:
        return 4;
    case COLLSCOPE_DTYPE_INT64:
    case COLLSCOPE_DTYPE_UINT64:
    case COLLSCOPE_DTYPE_FLOAT64:
        return 8;
    default:
        return 0;  /* unknown: bytes reported as 0 rather than a guess */
    }
}
