/*
 * ringread.c: reader side of the ring protocol (include/collscope_ring.h, "READER PROTOCOL").
 * The plugin writes through its own MAP_SHARED mapping; this maps the same file read-only,
 * exactly like the node agent does from another process.
 */
#include "ringread.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define A64(p) ((const _Atomic uint64_t *)(const void *)(p))
#define A32(p) ((const _Atomic uint32_t *)(const void *)(p))

static int is_ring_name(const char *n)
{
    size_t len = strlen(n);
    return strncmp(n, "collscope-", 10) == 0 && len > 5 && strcmp(n + len - 5, ".ring") == 0;
}

int ring_count_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        return 0;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        n += is_ring_name(e->d_name);
    }
    closedir(d);
    return n;
}

int ring_open_dir(struct ring *r, const char *dir, char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    DIR *d = opendir(dir);
    if (d == NULL) {
        snprintf(err, errlen, "cannot open %s", dir);
        return -1;
    }
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (is_ring_name(e->d_name)) {
            found++;
            snprintf(r->path, sizeof(r->path), "%s/%s", dir, e->d_name);
        }
    }
    closedir(d);
    if (found != 1) {
        snprintf(err, errlen, "%d ring files in %s (want 1)", found, dir);
        return -1;
    }
    int fd = open(r->path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, errlen, "cannot open %s", r->path);
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %s", r->path);
        return -1;
    }
    r->hdr = p;
    r->bytes = (size_t)st.st_size;
    const struct collscope_ring_header *h = r->hdr;
    const char *why = NULL;
    if (r->bytes < sizeof(*h)) {
        why = "file smaller than the header";
    } else if (atomic_load_explicit(A64(&h->magic), memory_order_acquire) !=
               COLLSCOPE_RING_MAGIC) {
        why = "bad magic";
    } else if (h->version != COLLSCOPE_RING_VERSION) {
        why = "version";
    } else if (h->header_size != sizeof(*h)) {
        why = "header_size";
    } else if (h->file_size != r->bytes) {
        why = "file_size";
    } else if (h->comm_slot_count != COLLSCOPE_COMM_SLOTS ||
               h->comm_slot_size != sizeof(struct collscope_comm_slot) ||
               h->op_slots_per_comm != COLLSCOPE_OPS_PER_COMM ||
               h->flow_slots_per_comm != COLLSCOPE_FLOWS_PER_COMM ||
               h->op_slot_size != sizeof(struct collscope_op_slot) ||
               h->flow_slot_size != sizeof(struct collscope_flow_slot)) {
        why = "live geometry";
    } else if (h->comm_region_offset + h->comm_region_size > h->file_size ||
               h->comm_region_size != (uint64_t)h->comm_slot_count * h->comm_slot_size) {
        why = "comm region bounds";
    } else if (h->event_record_size != COLLSCOPE_EVENT_BYTES || h->event_slot_count == 0 ||
               h->event_region_size != (uint64_t)h->event_slot_count * h->event_record_size ||
               h->event_region_offset + h->event_region_size > h->file_size) {
        why = "event region bounds";
    }
    if (why != NULL) {
        snprintf(err, errlen, "%s: invalid header: %s", r->path, why);
        ring_close(r);
        return -1;
    }
    return 0;
}

void ring_close(struct ring *r)
{
    if (r->hdr != NULL) {
        munmap((void *)r->hdr, r->bytes);
        r->hdr = NULL;
    }
}

uint64_t ring_counter(const uint64_t *field)
{
    return atomic_load_explicit(A64(field), memory_order_acquire);
}

uint32_t ring_counter32(const uint32_t *field)
{
    return atomic_load_explicit((_Atomic uint32_t *)(void *)(uintptr_t)field,
                                memory_order_acquire);
}

const struct collscope_comm_slot *ring_comm_slot(const struct ring *r, unsigned i)
{
    const char *base = (const char *)r->hdr + r->hdr->comm_region_offset;
    return (const struct collscope_comm_slot *)(base + (size_t)i * r->hdr->comm_slot_size);
}

/* Copy n bytes with 8-byte acquire loads (all slot sizes are multiples of 8): the writer's
 * stores are release stores, so a copy that saw new data also sees the sequence value that
 * announced it, and the re-check after the copy cannot be hoisted above the loads. */
static void copy_words(void *dst, const void *src, size_t n)
{
    const _Atomic uint64_t *s = src;
    uint64_t *d = dst;
    for (size_t i = 0; i < n / 8; i++) {
        d[i] = atomic_load_explicit(&s[i], memory_order_acquire);
    }
}

static int snap(const uint32_t *seqlock, void *dst, const void *src, size_t n)
{
    for (int tries = 0; tries < 1000; tries++) {
        uint32_t s1 = atomic_load_explicit(A32(seqlock), memory_order_acquire);
        if (s1 & 1u) {
            continue;
        }
        copy_words(dst, src, n);
        uint32_t s2 = atomic_load_explicit(A32(seqlock), memory_order_relaxed);
        if (s1 == s2) {
            return 0;
        }
    }
    return -1;
}

int ring_snap_comm(const struct ring *r, unsigned i, struct collscope_comm_slot *out)
{
    const struct collscope_comm_slot *s = ring_comm_slot(r, i);
    /* identity [0, 128) under the seqlock, counters [128, 512) as independent atomics */
    if (snap(&s->seqlock, out, s, 128) != 0) {
        return -1;
    }
    copy_words((char *)out + 128, (const char *)s + 128, 512 - 128);
    return 0;
}

/* The child counts a reader reports are the sums of each plain field and its `_other` twin
 * (reader protocol §2, version 2): the snapshot folds them into the plain fields. */
int ring_snap_op(const struct collscope_op_slot *src, struct collscope_op_slot *out)
{
    int rc = snap(&src->seqlock, out, src, sizeof(*out));
    out->kch_started += out->kch_started_other;
    out->kch_done += out->kch_done_other;
    out->proxy_ops_started += out->proxy_ops_started_other;
    out->proxy_ops_done += out->proxy_ops_done_other;
    return rc;
}

/* A QUEUED flow's step counters read as 0 (reader protocol §2, version 2). */
int ring_snap_flow(const struct collscope_flow_slot *src, struct collscope_flow_slot *out)
{
    int rc = snap(&src->seqlock, out, src, sizeof(*out));
    if (out->state == COLLSCOPE_FLOW_QUEUED) {
        out->started = out->c_ready_posted = out->c_sent_done = 0;
        out->c_done_consumed = out->c_gpu_ready = 0;
    }
    return rc;
}

int ring_find_flow(const struct ring *r, unsigned comm, int channel, int peer, int dir,
                   struct collscope_flow_slot *out)
{
    const struct collscope_comm_slot *s = ring_comm_slot(r, comm);
    for (unsigned i = 0; i < COLLSCOPE_FLOWS_PER_COMM; i++) {
        struct collscope_flow_slot f;
        if (ring_snap_flow(&s->flows[i], &f) != 0) {
            continue;
        }
        if (f.dir == dir && f.channel == channel && f.peer == peer) {
            *out = f;
            return 0;
        }
    }
    return -1;
}

int ring_inflight_op(const struct ring *r, unsigned comm, struct collscope_op_slot *out)
{
    const struct collscope_comm_slot *s = ring_comm_slot(r, comm);
    int found = -1;
    for (unsigned i = 0; i < COLLSCOPE_OPS_PER_COMM; i++) {
        struct collscope_op_slot o;
        if (ring_snap_op(&s->ops[i], &o) != 0 || o.state != COLLSCOPE_OP_ACTIVE) {
            continue;
        }
        if (found < 0 || o.serial < out->serial) {
            *out = o;
            found = 0;
        }
    }
    return found;
}

size_t ring_read_events(const struct ring *r, uint64_t *cursor, union collscope_event *out,
                        size_t max, uint64_t *missed)
{
    const struct collscope_ring_header *h = r->hdr;
    const union collscope_event *ev =
        (const union collscope_event *)((const char *)h + h->event_region_offset);
    uint64_t count = h->event_slot_count;
    uint64_t w = atomic_load_explicit(A64(&h->events_written), memory_order_acquire);
    uint64_t c = *cursor;
    if (w - c > count) {
        *missed += w - count - c;
        c = w - count;
    }
    size_t n = 0;
    for (; c < w && n < max; c++) {
        const union collscope_event *slot = &ev[c % count];
        uint64_t a = atomic_load_explicit(A64(&slot->common.idx), memory_order_acquire);
        if (a == c) {
            union collscope_event copy;
            copy_words(&copy, slot, sizeof(copy));
            uint64_t b = atomic_load_explicit(A64(&slot->common.idx), memory_order_relaxed);
            if (b != c) {
                (*missed)++;
                continue;
            }
            copy.common.idx = c;
            out[n++] = copy;
        } else if (a == COLLSCOPE_EVENT_IDX_BUSY || a < c) {
            break;  /* reserved, not committed yet: retry from here next time */
        } else {
            (*missed)++;  /* overwritten by a later lap */
        }
    }
    *cursor = c;
    return n;
}
