/*
 * ktl_uring_ring.h - what the io_uring engine's three files share (not exported):
 * ktl_uring.c owns the ring (set-up, wake-up, waiting, completions), ktl_uring_watch.c the
 * long-lived requests (polls, accepts, their removal), ktl_uring_batch.c a pass's batch.
 *
 * Three kinds of request live in a ring, told apart by their user_data:
 *   - the caller's polls and accepts (bit 63 clear, bit 62 set for an accept); their
 *     completions are what ktl_ring_wait reports;
 *   - the wake-up: one pending read of the loop's eventfd (KTL_TAG_WAKE), re-armed each
 *     time it completes, so another thread's eventfd write ends a wait;
 *   - a batch's ops (KTL_TAG_OP | index), which never outlive ktl_ring_batch, and
 *     removals (KTL_TAG_REMOVE, KTL_TAG_REMOVE_QUIET).
 */
#ifndef KTL_URING_RING_H
#define KTL_URING_RING_H

#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <liburing.h>

#include "ktl.h"

#define KTL_TAG_MASK (KTL_RING_INTERNAL | (0x7full << 56))
#define KTL_TAG_WAKE (KTL_RING_INTERNAL | (1ull << 56))
#define KTL_TAG_OP (KTL_RING_INTERNAL | (2ull << 56))
#define KTL_TAG_REMOVE (KTL_RING_INTERNAL | (3ull << 56))
#define KTL_TAG_REMOVE_QUIET (KTL_RING_INTERNAL | (4ull << 56))

struct ktl_ring {
    struct io_uring ring;
    int32_t wake_fd;
    int32_t wake_error;   /* positive errno once the wake-up read failed for good */
    int32_t woken;        /* a wake-up was consumed outside ktl_ring_wait: the next wait must not block */
    pid_t owner;          /* the thread that started the ring (and registered its fd) */
    uint64_t wake_value;  /* the eventfd read's buffer: the kernel writes it */

    /* One msghdr per op of the current batch; the kernel reads them during submission. */
    struct msghdr *msgs;
    int32_t msg_capacity;

    /* ktl_ring_remove_all's bookkeeping, kept between calls (a loop removes on every pass that closes). */
    struct ktl_removal *removals;
    int32_t removal_capacity;

    /* Caller completions reaped while a batch or a removal waited, for the next wait. */
    ktl_cqe *pending;
    int32_t pending_head;
    int32_t pending_count;
    int32_t pending_capacity;
};

/* An SQE, submitting what is queued first when the submission queue is full; NULL if none. */
struct io_uring_sqe *ktl_ring_sqe(ktl_ring *ring);

/* Keeps a caller completion for the next ktl_ring_wait (0, or -ENOMEM). */
int ktl_ring_keep(ktl_ring *ring, const struct io_uring_cqe *cqe);

/* The wake-up read completed with res: re-arms it, or records why it cannot be. */
void ktl_ring_on_wake(ktl_ring *ring, int32_t res);

/* A completion the caller will never see: an accepted socket in it is closed, not leaked. */
void ktl_ring_discard(const struct io_uring_cqe *cqe);

/*
 * Consumes the completions in the CQ ring: caller completions go to out while it has room
 * (and then stop the scan) or, when out is NULL, to the pending list; a batch's ops go to
 * ops. Returns how many were copied to out.
 */
int32_t ktl_ring_reap(ktl_ring *ring, ktl_cqe *out, int32_t capacity, ktl_op *ops, int32_t *outstanding);

#endif /* KTL_URING_RING_H */
