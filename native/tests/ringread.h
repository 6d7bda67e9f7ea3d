/*
 * ringread.h: a reader of ring files that follows the protocol documented in
 * include/collscope_ring.h, used by the C tests (and a model for other readers).
 */
#ifndef COLLSCOPE_RINGREAD_H
#define COLLSCOPE_RINGREAD_H

#include <stddef.h>
#include <stdint.h>

#include "collscope_ring.h"

struct ring {
    const struct collscope_ring_header *hdr;
    size_t bytes;
    char path[512];
};

/* Finds the single collscope-*.ring in dir, maps it read-only and validates the header.
 * Returns 0, or -1 with a message in err. */
int ring_open_dir(struct ring *r, const char *dir, char *err, size_t errlen);
void ring_close(struct ring *r);
/* number of collscope-*.ring files in dir */
int ring_count_files(const char *dir);

const struct collscope_comm_slot *ring_comm_slot(const struct ring *r, unsigned i);

/* Consistent copies through the slot seqlocks. 0 on success, -1 if torn (odd forever). */
int ring_snap_comm(const struct ring *r, unsigned i, struct collscope_comm_slot *out_ident);
int ring_snap_op(const struct collscope_op_slot *src, struct collscope_op_slot *out);
int ring_snap_flow(const struct collscope_flow_slot *src, struct collscope_flow_slot *out);

/* The live slot of (comm slot i, channel, peer, dir) copied into out; -1 if absent. */
int ring_find_flow(const struct ring *r, unsigned comm, int channel, int peer, int dir,
                   struct collscope_flow_slot *out);
/* The op slot with state ACTIVE and the lowest serial; -1 if none. */
int ring_inflight_op(const struct ring *r, unsigned comm, struct collscope_op_slot *out);

/* Events since *cursor: copies up to max records into out, advances *cursor, adds the number
 * of records lost to overwrite to *missed. Returns the number copied. */
size_t ring_read_events(const struct ring *r, uint64_t *cursor, union collscope_event *out,
                        size_t max, uint64_t *missed);

uint64_t ring_counter(const uint64_t *field);
/* a 32-bit live counter of a slot (op slot child counts), read atomically */
uint32_t ring_counter32(const uint32_t *field);

#endif /* COLLSCOPE_RINGREAD_H */
