/*
 * collscope_ring.h: the ring-file ABI written by libnccl-profiler-collscope.so and read by
 * collscope.nodeagent.ring. This header is the single source of truth for the format; the
 * Python reader mirrors it and a test compiles against it to compare every offset.
 *
 * One ring file per process, in $COLLSCOPE_TRACE_DIR, named
 *   collscope-<hostname>-pid<pid>-<k>.ring     (k = 0, 1, ... if a name is taken)
 * created O_CREAT|O_EXCL, sized with ftruncate and mapped MAP_SHARED. The file outlives the
 * process: a frozen or dead process leaves its last state readable.
 *
 * Encoding: little-endian, every struct fixed-size and naturally aligned, explicit padding,
 * no pointers. Strings are fixed-size char arrays, always NUL-terminated (truncated to fit).
 * Times are CLOCK_REALTIME nanoseconds since the Unix epoch (int64), the clock of the bundle
 * records (docs/spec/bundle-v1.md). "coarse" times have the same epoch but a resolution of
 * header.coarse_res_ns (10 ms): the plugin's heartbeat thread refreshes a process-wide copy of
 * CLOCK_REALTIME every 10 ms and the hot path reads that copy, a memory load, instead of
 * calling the clock (CLOCK_REALTIME_COARSE when the thread is not running).
 *
 * File layout (offsets and counts are also stored in the header; a reader uses the header's
 * values after checking them against this header's constants and the file size):
 *
 *   [0, 4096)                       struct collscope_ring_header
 *   [comm_region_offset, +size)     struct collscope_comm_slot[comm_slot_count]
 *                                     each: comm identity, per-func counters,
 *                                     struct collscope_op_slot[op_slots_per_comm]   (ops in flight)
 *                                     struct collscope_flow_slot[flow_slots_per_comm] (chunk counters)
 *   [event_region_offset, +size)    union collscope_event[event_slot_count]  (64 B records)
 *
 * ------------------------------------------------------------------------------------------
 * READER PROTOCOL
 *
 * 0. Validate: magic == COLLSCOPE_RING_MAGIC, version == COLLSCOPE_RING_VERSION,
 *    header_size == sizeof(struct collscope_ring_header), file_size <= size of the file,
 *    every region inside file_size, slot sizes equal to the sizeof()s below, counts equal to
 *    the constants below (comm/op/flow) and event_slot_count * event_record_size ==
 *    event_region_size. Anything else: the file is corrupt or from another version; do not guess.
 *    The writer stores magic last (after everything else in the header is written), so a file
 *    whose magic is still 0 is being created: retry later.
 *
 * 1. Sequence counters (seqlock). Comm slots (identity part), op slots and flow slots each start
 *    with a uint32 `seqlock`. The writer makes it odd, writes, then makes it even again (release).
 *    To take a consistent copy of one slot:
 *        s1 = seqlock (acquire); if s1 is odd: retry;
 *        copy the slot;
 *        (acquire fence) s2 = seqlock; if s1 != s2: retry.
 *    Give up after a bounded number of retries (e.g. 100) and report the slot as torn: a process
 *    frozen in the middle of a write leaves the counter odd forever.
 *    The counters after `live_begin` in an op slot and the per-func counters of a comm slot are
 *    NOT covered by the seqlock: each is an independent monotonic atomic value (read them with
 *    aligned loads); they are reset only inside a seqlock write that also changes the slot's
 *    identity (serial / generation), so a copy whose seqlock checked out is still self-consistent
 *    about which op the counters belong to.
 *
 * 2. Live state snapshot. For each comm slot with state ACTIVE (or FINALIZED, for post-mortems):
 *    copy the identity (seqlock), then its op slots and flow slots (seqlock each).
 *      - The operation in flight is the op slot with state ACTIVE and the lowest serial. Several
 *        ops can be in flight (the host enqueues ahead of the GPU); when all op slots are
 *        taken, newer ops get no live slot (header.op_slots_busy counts them) but the oldest,
 *        which is what a hang analysis needs, stay visible.
 *      - Flows belong to the op whose serial they carry (flow.serial == op.serial). A flow
 *        slot keeps the counters of the last op that used that (channel, peer, direction)
 *        until the next op on the same connection starts moving chunks. A flow slot becomes
 *        visible (dir != NONE) in the same seqlock write that gives it its first op's serial
 *        and zero counters (version 2), so a reused comm slot never shows a stale serial.
 *      - A flow in state QUEUED has moved no chunk: take its step counters (started,
 *        c_*) as 0; the slot may still hold the previous op's (version 2).
 *      - An op slot's KernelCh / ProxyOp counts are the sums of the plain field and its
 *        `_other` twin (version 2; see struct collscope_op_slot).
 *      - idle_ns of a flow (bundle-v1 `state` record) = now - flow.last_progress_ns.
 *      - Counter meaning per direction (see struct collscope_flow_slot):
 *            send: total, ready = c_ready_posted, sent = c_sent_done, done = c_done_consumed
 *            recv: total, posted = c_ready_posted, done = c_sent_done, consumed = c_done_consumed
 *    Flow peers and op peers are ranks *inside the communicator*; map them to global ranks
 *    with the comm records of the other processes (same comm_hash, their rank -> header.rank).
 *
 * 3. Events since a cursor. header.events_written is the monotonically increasing write index
 *    (number of records ever reserved). Record number i lives in slot i % event_slot_count and is
 *    valid only when that slot's `idx` field equals i. Slots never written hold
 *    idx == COLLSCOPE_EVENT_IDX_BUSY (the writer initialises them so, so that idx 0 is never
 *    ambiguous). A reader keeps a cursor c (next record
 *    it wants; start at max(0, events_written - event_slot_count) or at 0). To read:
 *        w = events_written (acquire)
 *        if w - c > event_slot_count: missed = w - event_slot_count - c; c = w - event_slot_count
 *        for i in [c, w):
 *            slot = i % event_slot_count
 *            a = slot.idx (acquire)
 *            if a == i: copy the record; (acquire fence) b = slot.idx; if b != i: overwritten
 *                       (count as missed, continue) else deliver the copy
 *            elif a == COLLSCOPE_EVENT_IDX_BUSY or a < i: the writer has reserved i but not
 *                       committed it yet: stop here, keep c = i, try again on the next poll
 *                       (if events_written has moved more than event_slot_count past i since,
 *                       the writer died or lapped: skip it and count it as missed)
 *            else (a > i): already overwritten by a later lap: count as missed, continue
 *        c = i
 *    When the ring is full the writer overwrites the OLDEST records (slot i % count is reused
 *    by record i + count) and counts each overwrite in header.events_overwritten. Live state
 *    (comm/op/flow slots) is never overwritten by events.
 *
 * 4. Liveness. header.heartbeat_ns is refreshed about every COLLSCOPE_HEARTBEAT_INTERVAL_MS by
 *    a plugin thread while at least one communicator is open; header.state says whether
 *    communicators are still open.
 * ------------------------------------------------------------------------------------------
 *
 * Version 2 (from 1): op slot counters split into own-thread and `_other` halves (the hot
 * path then needs no locked instruction on the comm's proxy thread), header counter
 * kernel_foreign_events, comm record fields reordered so that its name holds 23 bytes instead
 * of 15, flow slots claimed and filled in one seqlock write, QUEUED flows' step counters read
 * as 0 (the writer zeroes them when the flow starts running).
 *
 * Algorithms: the split into a completion log (events) and a real-time state log (live
 * per-flow chunk counters: GPU ready / posted to the network / done) is Mycroft's (§4.2, Table 2).
 * The (communicator, operation counter) identity of an op is CCL-D's Trace ID (§5.1).
 */
#ifndef COLLSCOPE_RING_H
#define COLLSCOPE_RING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* "CSCPRING" read as a little-endian uint64: bytes 43 53 43 50 52 49 4e 47 in the file. */
#define COLLSCOPE_RING_MAGIC 0x474E495250435343ULL
#define COLLSCOPE_RING_VERSION 2u

/* Fixed geometry of the live-state region (versions 1 and 2). */
#define COLLSCOPE_COMM_SLOTS 16u      /* communicators per process with live state */
#define COLLSCOPE_OPS_PER_COMM 8u     /* ops in flight per communicator shown live */
#define COLLSCOPE_FLOWS_PER_COMM 128u /* (channel, peer, direction) flows per communicator:
                                         32 channels x (1 send + 1 recv) for ring leaves room
                                         for tree (up to 3 children + 1 parent per channel) */
#define COLLSCOPE_HEADER_BYTES 4096u
#define COLLSCOPE_EVENT_BYTES 64u
#define COLLSCOPE_NAME_LEN 64u        /* communicator name in a comm slot */
#define COLLSCOPE_FUNC_COUNT 16u      /* size of the per-func counter arrays */

/* Ring file size (env COLLSCOPE_RING_BYTES): default, and the clamp applied to the env value.
 * The minimum holds the header, the live region (155,648 B) and at least 1,600 events. */
#define COLLSCOPE_RING_BYTES_DEFAULT (4u * 1024u * 1024u)
#define COLLSCOPE_RING_BYTES_MIN (256u * 1024u)
#define COLLSCOPE_RING_BYTES_MAX (256u * 1024u * 1024u)

#define COLLSCOPE_HEARTBEAT_INTERVAL_MS 100u

/* ---------------------------------------------------------------------------------------- */
/* Enumerations stored as uint8/uint32. 0 always means unknown / not applicable.            */

/* header.state */
#define COLLSCOPE_RING_STATE_INIT 0u      /* being created */
#define COLLSCOPE_RING_STATE_ACTIVE 1u    /* at least one communicator open */
#define COLLSCOPE_RING_STATE_IDLE 2u      /* every communicator finalized (may be reopened) */

/* comm_slot.state */
#define COLLSCOPE_COMM_FREE 0u
#define COLLSCOPE_COMM_ACTIVE 1u
#define COLLSCOPE_COMM_FINALIZED 2u       /* kept for post-mortems until the slot is reused */

/* op_slot.state */
#define COLLSCOPE_OP_EMPTY 0u
#define COLLSCOPE_OP_CLAIMING 1u          /* transient: being (re)filled, ignore */
#define COLLSCOPE_OP_ACTIVE 2u            /* enqueued (Coll/P2p start) and not complete */
#define COLLSCOPE_OP_DONE 3u              /* completed; end_ns valid; slot may be reused */

/* flow_slot.dir */
#define COLLSCOPE_DIR_NONE 0u
#define COLLSCOPE_DIR_SEND 1u
#define COLLSCOPE_DIR_RECV 2u

/* flow_slot.state: the ProxyOp (op x channel x peer x direction) the counters belong to */
#define COLLSCOPE_FLOW_FREE 0u            /* never used */
#define COLLSCOPE_FLOW_QUEUED 1u          /* ProxyOp appended, not yet progressing: no chunk
                                             moved, its step counters read as 0 whatever the
                                             slot holds (version 2) */
#define COLLSCOPE_FLOW_RUNNING 2u         /* ProxyOp in progress (InProgress state or a step seen) */
#define COLLSCOPE_FLOW_DONE 3u            /* ProxyOp stopped */

/* func (op records, op slots, index of the per-func counters) */
#define COLLSCOPE_FUNC_UNKNOWN 0u
#define COLLSCOPE_FUNC_ALLREDUCE 1u
#define COLLSCOPE_FUNC_ALLGATHER 2u
#define COLLSCOPE_FUNC_REDUCESCATTER 3u
#define COLLSCOPE_FUNC_BROADCAST 4u
#define COLLSCOPE_FUNC_REDUCE 5u
#define COLLSCOPE_FUNC_SEND 6u
#define COLLSCOPE_FUNC_RECV 7u
#define COLLSCOPE_FUNC_ALLTOALL 8u
#define COLLSCOPE_FUNC_GATHER 9u
#define COLLSCOPE_FUNC_SCATTER 10u
#define COLLSCOPE_FUNC_ALLGATHERV 11u
#define COLLSCOPE_FUNC_SENDRECV 12u
#define COLLSCOPE_FUNC_OTHER 15u          /* a name NCCL added later; see docs */
/* names (index = value): "", "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce",
 * "Send", "Recv", "AllToAll", "Gather", "Scatter", "AllGatherV", "SendRecv", "", "", "Other" */

/* algo */
#define COLLSCOPE_ALGO_UNKNOWN 0u
#define COLLSCOPE_ALGO_TREE 1u
#define COLLSCOPE_ALGO_RING 2u
#define COLLSCOPE_ALGO_COLLNET_DIRECT 3u
#define COLLSCOPE_ALGO_COLLNET_CHAIN 4u
#define COLLSCOPE_ALGO_NVLS 5u
#define COLLSCOPE_ALGO_NVLS_TREE 6u
#define COLLSCOPE_ALGO_PAT 7u
/* bundle names: "", "Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT" */

/* proto */
#define COLLSCOPE_PROTO_UNKNOWN 0u
#define COLLSCOPE_PROTO_LL 1u
#define COLLSCOPE_PROTO_LL128 2u
#define COLLSCOPE_PROTO_SIMPLE 3u
/* bundle names: "", "LL", "LL128", "Simple" */

/* dtype */
#define COLLSCOPE_DTYPE_UNKNOWN 0u
#define COLLSCOPE_DTYPE_INT8 1u
#define COLLSCOPE_DTYPE_UINT8 2u
#define COLLSCOPE_DTYPE_INT32 3u
#define COLLSCOPE_DTYPE_UINT32 4u
#define COLLSCOPE_DTYPE_INT64 5u
#define COLLSCOPE_DTYPE_UINT64 6u
#define COLLSCOPE_DTYPE_FLOAT16 7u
#define COLLSCOPE_DTYPE_FLOAT32 8u
#define COLLSCOPE_DTYPE_FLOAT64 9u
#define COLLSCOPE_DTYPE_BFLOAT16 10u
#define COLLSCOPE_DTYPE_FLOAT8E4M3 11u
#define COLLSCOPE_DTYPE_FLOAT8E5M2 12u
/* names: "", "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
 * "float64", "bfloat16", "float8e4m3", "float8e5m2" (NCCL's ncclInt8 ... without the prefix) */

/* event.type */
#define COLLSCOPE_EV_NONE 0u              /* slot never written */
#define COLLSCOPE_EV_OP 1u                /* struct collscope_op_record: an op completed */
#define COLLSCOPE_EV_COMM_INIT 2u         /* struct collscope_comm_record */
#define COLLSCOPE_EV_COMM_FINALIZE 3u     /* struct collscope_comm_record */

/* op record / op slot flags */
#define COLLSCOPE_OPF_P2P 0x01u           /* Send/Recv: peer valid, seq is this rank's own count */
#define COLLSCOPE_OPF_KERNEL 0x02u        /* KernelCh events were seen for this op */
#define COLLSCOPE_OPF_PROXY 0x04u         /* network (ProxyOp with steps) events were seen */
#define COLLSCOPE_OPF_GPU_TIMED 0x08u     /* gpu_ns is valid (KernelCh GPU timestamps) */
#define COLLSCOPE_OPF_END_AT_ENQUEUE 0x10u /* every child finished before Coll stop returned:
                                             end_ns is Coll stop, an upper bound of the truth */
#define COLLSCOPE_OPF_NO_CHILDREN 0x20u   /* nChannels was 0 and no network steps: end_ns is
                                             only the enqueue end (Coll stop) */

/* idx value of an event slot while its writer fills it */
#define COLLSCOPE_EVENT_IDX_BUSY UINT64_MAX
/* comm_slot index stored in an event when the comm has no live slot */
#define COLLSCOPE_NO_SLOT 0xFFu

/* ---------------------------------------------------------------------------------------- */
/* File header: one page.                                                                    */

struct collscope_ring_header {
    /* format */
    uint64_t magic;                 /*   0 COLLSCOPE_RING_MAGIC, written last at creation */
    uint32_t version;               /*   8 COLLSCOPE_RING_VERSION */
    uint32_t header_size;           /*  12 sizeof(struct collscope_ring_header) */
    uint64_t file_size;             /*  16 bytes of the mapped file */
    uint32_t state;                 /*  24 COLLSCOPE_RING_STATE_* */
    uint32_t profiler_api;          /*  28 highest profiler API NCCL used (4, 5 or 6) */

    /* regions */
    uint64_t comm_region_offset;    /*  32 */
    uint64_t comm_region_size;      /*  40 comm_slot_count * comm_slot_size */
    uint32_t comm_slot_count;       /*  48 COLLSCOPE_COMM_SLOTS */
    uint32_t comm_slot_size;        /*  52 sizeof(struct collscope_comm_slot) */
    uint32_t op_slots_per_comm;     /*  56 COLLSCOPE_OPS_PER_COMM */
    uint32_t flow_slots_per_comm;   /*  60 COLLSCOPE_FLOWS_PER_COMM */
    uint64_t event_region_offset;   /*  64 */
    uint64_t event_region_size;     /*  72 event_slot_count * event_record_size */
    uint32_t event_slot_count;      /*  80 records in the ring (not a power of two in general) */
    uint32_t event_record_size;     /*  84 COLLSCOPE_EVENT_BYTES */
    uint32_t op_slot_size;          /*  88 sizeof(struct collscope_op_slot) */
    uint32_t flow_slot_size;        /*  92 sizeof(struct collscope_flow_slot) */

    /* process identity (written once at creation) */
    int32_t pid;                    /*  96 */
    int32_t rank;                   /* 100 env RANK, -1 if unset */
    int32_t local_rank;             /* 104 env LOCAL_RANK, -1 if unset */
    int32_t world_size;             /* 108 env WORLD_SIZE, -1 if unset */
    int32_t nccl_version_code;      /* 112 ncclGetVersion() e.g. 22703, 0 if unknown */
    uint32_t activation_mask;       /* 116 the profiler event mask the plugin set */
    int64_t init_realtime_ns;       /* 120 CLOCK_REALTIME at creation */
    int64_t init_monotonic_ns;      /* 128 CLOCK_MONOTONIC at the same instant */
    int64_t coarse_res_ns;          /* 136 resolution of the coarse times (10 ms) */
    uint64_t reserved0[6];          /* 144 */
    char hostname[128];             /* 192 gethostname() */
    char pod_name[128];             /* 320 env POD_NAME */
    char pod_namespace[64];         /* 448 env POD_NAMESPACE */
    char node_name[128];            /* 512 env NODE_NAME */
    char nccl_version[32];          /* 640 "2.27.3", "" if unknown */
    char plugin_version[32];        /* 672 collscope plugin version */
    uint64_t reserved1[8];          /* 704 */

    /* counters (atomic, monotonic unless said otherwise) */
    uint64_t events_written;        /* 768 write index: records ever reserved */
    uint64_t events_overwritten;    /* 776 records overwritten by a later lap (ring full) */
    uint64_t events_dropped;        /* 784 completions not recorded (no handle for the op) */
    uint64_t comm_slots_exhausted;  /* 792 communicators that got no live slot */
    uint64_t flow_slots_exhausted;  /* 800 ProxyOps whose flow found no slot */
    uint64_t op_slots_busy;         /* 808 ops that got no live op slot (all in flight) */
    uint64_t handles_exhausted;     /* 816 events answered with a NULL handle: pool empty */
    uint64_t pxn_foreign_events;    /* 824 ProxyOps from another process (PXN), ignored */
    int64_t heartbeat_ns;           /* 832 CLOCK_REALTIME of the last heartbeat */
    uint64_t heartbeat_count;       /* 840 */
    uint64_t comms_open;            /* 848 communicators open now (not monotonic) */
    uint64_t comms_total;           /* 856 communicator inits seen */
    uint64_t stale_flow_events;     /* 864 step events of an op that no longer owns its flow */
    uint64_t kernel_foreign_events; /* 872 KernelCh stops (and ProxyOp stops of ops armed on
                                           the comm's proxy thread) seen on another thread:
                                           NCCL emits them all from the comm's proxy thread;
                                           nonzero means that no longer holds (version 2) */
    uint64_t reserved2[2];          /* 880 */
    uint8_t pad[COLLSCOPE_HEADER_BYTES - 896]; /* 896 */
};

/* ---------------------------------------------------------------------------------------- */
/* Live state.                                                                               */

/* One operation in flight (or recently completed) on a communicator. */
struct collscope_op_slot {
    uint32_t seqlock;               /*   0 */
    uint32_t state;                 /*   4 COLLSCOPE_OP_* */
    uint64_t serial;                /*   8 plugin's per-comm op counter (Coll + P2p), from 0 */
    uint64_t seq;                   /*  16 NCCL seqNumber (per func); P2p: own per-func count */
    uint64_t bytes;                 /*  24 message size */
    int64_t start_ns;               /*  32 Coll/P2p start (host enqueue) */
    int64_t end_ns;                 /*  40 completion (state DONE only) */
    uint8_t func;                   /*  48 COLLSCOPE_FUNC_* */
    uint8_t algo;                   /*  49 */
    uint8_t proto;                  /*  50 */
    uint8_t nchannels;              /*  51 channels used */
    uint8_t dtype;                  /*  52 */
    uint8_t flags;                  /*  53 COLLSCOPE_OPF_* known at start/end */
    uint16_t reserved0;             /*  54 */
    int32_t peer;                   /*  56 P2p: peer rank in the comm; else -1 */
    uint32_t reserved1;             /*  60 */
    /* live_begin: independent atomics, not covered by the seqlock (see protocol §1) */
    uint32_t kch_started;           /*  64 KernelCh events started */
    uint32_t kch_done;              /*  68 KernelCh events stopped (GPU finished the channel) */
    uint32_t proxy_ops_started;     /*  72 ProxyOps started (flows appended) */
    uint32_t proxy_ops_done;        /*  76 ProxyOps stopped */
    int64_t last_progress_ns;       /*  80 coarse: last KernelCh stop (start_ns before);
                                           network progress is in the flows */
    /* version 2: the four counters above count the events seen on the communicator's own
     * proxy thread (one writer: plain increments); these count the events seen on any other
     * thread (PXN proxies of another rank in the same process: atomic increments). The
     * totals a reader reports are the sums, e.g. kch_started + kch_started_other. */
    uint32_t kch_started_other;     /*  88 */
    uint32_t kch_done_other;        /*  92 */
    uint32_t proxy_ops_started_other; /* 96 */
    uint32_t proxy_ops_done_other;  /* 100 */
    uint32_t reserved2[6];          /* 104 */
};

/* Cumulative chunk (network step) counters of one (channel, peer, direction) for one op.
 * From ProxyStep events (notes §4), each counter = highest step index + 1 that reached:
 *   send: started = SendGPUWait (buffer offered to the GPU)
 *         c_ready_posted  = SendPeerWait (GPU produced the chunk; repeats ignored)
 *         c_sent_done     = SendWait     (posted to the network)
 *         c_done_consumed = step stop    (network completion)
 *   recv: started = step start (about to post a buffer)
 *         c_ready_posted  = RecvWait      (receive posted)
 *         c_sent_done     = RecvFlushWait (data arrived)
 *         c_gpu_ready     = RecvGPUWait   (flushed, visible to the GPU)
 *         c_done_consumed = step stop     (GPU consumed)
 * total = ProxyOp nSteps. Written by one thread (the proxy thread that owns the connection). */
struct collscope_flow_slot {
    uint32_t seqlock;               /*   0 */
    uint8_t dir;                    /*   4 COLLSCOPE_DIR_* (NONE = slot free) */
    uint8_t channel;                /*   5 */
    uint8_t state;                  /*   6 COLLSCOPE_FLOW_* */
    uint8_t reserved0;              /*   7 */
    int32_t peer;                   /*   8 peer rank in the comm */
    uint32_t reserved1;             /*  12 */
    uint64_t key;                   /*  16 writer's claim word, 0 = free; readers use dir/channel/peer */
    uint64_t serial;                /*  24 op_slot.serial of the op these counters belong to */
    uint32_t total;                 /*  32 */
    uint32_t started;               /*  36 */
    uint32_t c_ready_posted;        /*  40 send: ready  | recv: posted */
    uint32_t c_sent_done;           /*  44 send: sent   | recv: done */
    uint32_t c_done_consumed;       /*  48 send: done   | recv: consumed */
    uint32_t c_gpu_ready;           /*  52 recv: handed to the GPU | send: 0 */
    int64_t last_progress_ns;       /*  56 coarse: last time a step counter grew; on claim
                                           for a new op: that op's start (nothing moved yet) */
};

/* One communicator: identity, per-func progress and its live ops and flows. */
struct collscope_comm_slot {
    uint32_t seqlock;               /*    0 covers the identity fields [0, 128) */
    uint32_t state;                 /*    4 COLLSCOPE_COMM_* */
    uint64_t comm_hash;             /*    8 NCCL commHash/commId, same on every member */
    int32_t rank;                   /*   16 rank in the comm */
    int32_t nranks;                 /*   20 */
    int32_t nnodes;                 /*   24 */
    uint32_t profiler_api;          /*   28 API version of this comm's init (4, 5, 6) */
    int64_t init_ns;                /*   32 */
    int64_t finalize_ns;            /*   40 0 while open */
    uint32_t generation;            /*   48 incremented each time the slot is (re)claimed */
    uint32_t reserved0;             /*   52 */
    uint64_t reserved1;             /*   56 */
    char name[COLLSCOPE_NAME_LEN];  /*   64 commName, "" if none */
    /* atomics, not covered by the seqlock */
    uint64_t ops_started;           /*  128 Coll + P2p starts (= next serial) */
    uint64_t ops_completed;         /*  136 completion records emitted for this comm */
    int64_t last_progress_ns;       /*  144 coarse: last event of any kind on this comm */
    int64_t last_completion_ns;     /*  152 end_ns of the last completion */
    uint64_t reserved2[12];         /*  160 */
    uint64_t enqueued[COLLSCOPE_FUNC_COUNT];  /* 256 per func: last started seq + 1 */
    uint64_t completed[COLLSCOPE_FUNC_COUNT]; /* 384 per func: highest completed seq + 1 */
    struct collscope_op_slot ops[COLLSCOPE_OPS_PER_COMM];       /*  512 */
    struct collscope_flow_slot flows[COLLSCOPE_FLOWS_PER_COMM]; /* 1536 */
};

/* ---------------------------------------------------------------------------------------- */
/* Event ring records: 64 bytes each; `idx` and `type` at the same place in every kind.      */

/* An operation completed. end_ns is the true completion: the stop of the op's last child
 * (last KernelCh stop or last network ProxyOp stop), never the enqueue-time Coll stop
 * (notes §3; Coll stop only means "enqueued"); see COLLSCOPE_OPF_END_AT_ENQUEUE. */
struct collscope_op_record {
    uint64_t idx;                   /*   0 commit word: == write index i when valid */
    uint8_t type;                   /*   8 COLLSCOPE_EV_OP */
    uint8_t func;                   /*   9 */
    uint8_t algo;                   /*  10 */
    uint8_t proto;                  /*  11 */
    uint8_t nchannels;              /*  12 */
    uint8_t dtype;                  /*  13 */
    uint8_t flags;                  /*  14 COLLSCOPE_OPF_* */
    uint8_t comm_slot;              /*  15 index of the comm slot, COLLSCOPE_NO_SLOT if none */
    uint64_t comm_hash;             /*  16 */
    uint64_t seq;                   /*  24 NCCL seqNumber; P2p: own per-func count */
    uint64_t bytes;                 /*  32 */
    int64_t start_ns;               /*  40 Coll/P2p start */
    int64_t end_ns;                 /*  48 true completion */
    int32_t peer;                   /*  56 P2p peer (comm rank), -1 otherwise */
    uint32_t gpu_ns;                /*  60 GPU time from KernelCh timestamps (max stop - min
                                           start), saturated at UINT32_MAX; 0 if unknown */
};

/* A communicator was initialised or finalized. The full name is in the comm slot; the
 * record keeps its first COLLSCOPE_COMM_RECORD_NAME_LEN - 1 bytes (version 1: 15). */
#define COLLSCOPE_COMM_RECORD_NAME_LEN 24u
struct collscope_comm_record {
    uint64_t idx;                   /*   0 */
    uint8_t type;                   /*   8 COLLSCOPE_EV_COMM_INIT / _FINALIZE */
    uint8_t profiler_api;           /*   9 */
    uint8_t comm_slot;              /*  10 */
    uint8_t reserved0;              /*  11 */
    int32_t rank;                   /*  12 */
    uint64_t comm_hash;             /*  16 */
    int64_t time_ns;                /*  24 */
    int32_t nranks;                 /*  32 */
    int32_t nnodes;                 /*  36 */
    char name[COLLSCOPE_COMM_RECORD_NAME_LEN]; /* 40 commName truncated */
};

union collscope_event {
    struct {
        uint64_t idx;
        uint8_t type;
    } common;
    struct collscope_op_record op;
    struct collscope_comm_record comm;
    uint8_t raw[COLLSCOPE_EVENT_BYTES];
};

/* ---------------------------------------------------------------------------------------- */
/* Layout checks (LP64 / ILP32 alike: no pointers, explicit padding).                        */

#define COLLSCOPE_CHECK_OFF(t, f, o) _Static_assert(offsetof(t, f) == (o), #t "." #f " offset")

_Static_assert(sizeof(struct collscope_ring_header) == COLLSCOPE_HEADER_BYTES, "header size");
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, magic, 0);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, version, 8);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, header_size, 12);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, file_size, 16);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, state, 24);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, profiler_api, 28);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, comm_region_offset, 32);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, comm_region_size, 40);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, comm_slot_count, 48);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, comm_slot_size, 52);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, op_slots_per_comm, 56);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, flow_slots_per_comm, 60);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, event_region_offset, 64);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, event_region_size, 72);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, event_slot_count, 80);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, event_record_size, 84);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, op_slot_size, 88);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, flow_slot_size, 92);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, pid, 96);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, rank, 100);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, local_rank, 104);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, world_size, 108);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, nccl_version_code, 112);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, activation_mask, 116);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, init_realtime_ns, 120);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, init_monotonic_ns, 128);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, coarse_res_ns, 136);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, reserved0, 144);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, hostname, 192);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, pod_name, 320);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, pod_namespace, 448);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, node_name, 512);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, nccl_version, 640);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, plugin_version, 672);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, reserved1, 704);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, events_written, 768);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, events_overwritten, 776);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, events_dropped, 784);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, comm_slots_exhausted, 792);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, flow_slots_exhausted, 800);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, op_slots_busy, 808);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, handles_exhausted, 816);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, pxn_foreign_events, 824);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, heartbeat_ns, 832);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, heartbeat_count, 840);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, comms_open, 848);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, comms_total, 856);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, stale_flow_events, 864);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, kernel_foreign_events, 872);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, reserved2, 880);
COLLSCOPE_CHECK_OFF(struct collscope_ring_header, pad, 896);

_Static_assert(sizeof(struct collscope_op_slot) == 128, "op slot size");
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, seqlock, 0);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, state, 4);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, serial, 8);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, seq, 16);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, bytes, 24);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, start_ns, 32);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, end_ns, 40);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, func, 48);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, algo, 49);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, proto, 50);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, nchannels, 51);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, dtype, 52);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, flags, 53);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, reserved0, 54);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, peer, 56);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, reserved1, 60);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, kch_started, 64);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, kch_done, 68);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, proxy_ops_started, 72);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, proxy_ops_done, 76);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, last_progress_ns, 80);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, kch_started_other, 88);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, kch_done_other, 92);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, proxy_ops_started_other, 96);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, proxy_ops_done_other, 100);
COLLSCOPE_CHECK_OFF(struct collscope_op_slot, reserved2, 104);

_Static_assert(sizeof(struct collscope_flow_slot) == 64, "flow slot size");
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, seqlock, 0);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, dir, 4);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, channel, 5);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, state, 6);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, reserved0, 7);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, peer, 8);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, reserved1, 12);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, key, 16);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, serial, 24);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, total, 32);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, started, 36);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, c_ready_posted, 40);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, c_sent_done, 44);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, c_done_consumed, 48);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, c_gpu_ready, 52);
COLLSCOPE_CHECK_OFF(struct collscope_flow_slot, last_progress_ns, 56);

_Static_assert(sizeof(struct collscope_comm_slot) ==
                   512 + COLLSCOPE_OPS_PER_COMM * 128 + COLLSCOPE_FLOWS_PER_COMM * 64,
               "comm slot size");
_Static_assert(sizeof(struct collscope_comm_slot) == 9728, "comm slot size");
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, seqlock, 0);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, state, 4);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, comm_hash, 8);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, rank, 16);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, nranks, 20);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, nnodes, 24);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, profiler_api, 28);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, init_ns, 32);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, finalize_ns, 40);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, generation, 48);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, reserved0, 52);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, reserved1, 56);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, name, 64);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, ops_started, 128);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, ops_completed, 136);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, last_progress_ns, 144);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, last_completion_ns, 152);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, reserved2, 160);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, enqueued, 256);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, completed, 384);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, ops, 512);
COLLSCOPE_CHECK_OFF(struct collscope_comm_slot, flows, 1536);

_Static_assert(sizeof(struct collscope_op_record) == COLLSCOPE_EVENT_BYTES, "op record size");
COLLSCOPE_CHECK_OFF(struct collscope_op_record, idx, 0);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, type, 8);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, func, 9);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, algo, 10);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, proto, 11);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, nchannels, 12);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, dtype, 13);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, flags, 14);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, comm_slot, 15);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, comm_hash, 16);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, seq, 24);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, bytes, 32);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, start_ns, 40);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, end_ns, 48);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, peer, 56);
COLLSCOPE_CHECK_OFF(struct collscope_op_record, gpu_ns, 60);

_Static_assert(sizeof(struct collscope_comm_record) == COLLSCOPE_EVENT_BYTES, "comm record size");
COLLSCOPE_CHECK_OFF(struct collscope_comm_record, idx, 0);
COLLSCOPE_CHECK_OFF(struct collscope_comm_record, type, 8);
COLLSCOPE_CHECK_OFF(struct collscope_comm_record, profiler_api, 9);
COLLSCOPE_CHECK_OFF(struct collscope_comm_record, comm_slot, 10);
COLLSCOPE_CHECK_OFF(struct collscope_comm_record, reserved0, 11);
COLLSCOPE_CHECK_OFF(struct collscope_comm_record, rank, 12);
COLLSCOPE_CHECK_OFF(struct collscope_comm_record, comm_hash, 16);
COLLSCOPE_CHECK_OFF(struct collscope_comm_record, time_ns, 24);
COLLSCOPE_CHECK_OFF(struct collscope_comm_record, nranks, 32);
COLLSCOPE_CHECK_OFF(struct collscope_comm_record, nnodes, 36);
COLLSCOPE_CHECK_OFF(struct collscope_comm_record, name, 40);

_Static_assert(sizeof(union collscope_event) == COLLSCOPE_EVENT_BYTES, "event size");

/* Region placement used by the writer (version 1): comm region right after the header,
 * events right after the comm region; event_slot_count = (file_size - event offset) / 64. */
#define COLLSCOPE_COMM_REGION_OFFSET ((uint64_t)COLLSCOPE_HEADER_BYTES)
#define COLLSCOPE_COMM_REGION_BYTES \
    ((uint64_t)COLLSCOPE_COMM_SLOTS * (uint64_t)sizeof(struct collscope_comm_slot))
#define COLLSCOPE_EVENT_REGION_OFFSET (COLLSCOPE_COMM_REGION_OFFSET + COLLSCOPE_COMM_REGION_BYTES)
_Static_assert(COLLSCOPE_COMM_REGION_BYTES == 155648, "comm region size");
_Static_assert(COLLSCOPE_EVENT_REGION_OFFSET % 64 == 0, "event region alignment");
_Static_assert(COLLSCOPE_RING_BYTES_MIN >= COLLSCOPE_EVENT_REGION_OFFSET + 1600 * 64,
               "minimum ring holds at least 1600 events");

#ifdef __cplusplus
}
#endif

#endif /* COLLSCOPE_RING_H */
