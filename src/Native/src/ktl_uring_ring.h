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
 *     removals (KTL_TAG_REMOVE | call << 32 | index, KTL_TAG_REMOVE_QUIET);
 *   - a batch's zero-copy sends (KTL_TAG_SEND_ZC | index << 32 | tag): their result comes
 *     within the batch, their notification (IORING_CQE_F_NOTIF, the same user_data) later,
 *     and is reported to the caller as KTL_RING_SEND_DONE | tag.
 */
#ifndef KTL_URING_RING_H
#define KTL_URING_RING_H

#include <errno.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <liburing.h>

#include "ktl.h"
#include "ktl_fault.h"

#define KTL_TAG_MASK (KTL_RING_INTERNAL | (0x7full << 56))
#define KTL_TAG_WAKE (KTL_RING_INTERNAL | (1ull << 56))
#define KTL_TAG_OP (KTL_RING_INTERNAL | (2ull << 56))
#define KTL_TAG_REMOVE (KTL_RING_INTERNAL | (3ull << 56))
#define KTL_TAG_REMOVE_QUIET (KTL_RING_INTERNAL | (4ull << 56))
#define KTL_TAG_SEND_ZC (KTL_RING_INTERNAL | (5ull << 56))
#define KTL_TAG_PROBE (KTL_RING_INTERNAL | (6ull << 56))
/* A batch's op that never reached the kernel, turned into a NOP that posts nothing. */
#define KTL_TAG_VOID (KTL_RING_INTERNAL | (7ull << 56))

/* The batch index of a KTL_TAG_SEND_ZC user_data (bits 32..55); a larger batch copies. */
#define KTL_SEND_ZC_MAX_INDEX ((1 << 24) - 1)

/* From Linux 6.2's io_uring.h (liburing 2.3's header predates them). */
#ifndef IORING_SEND_ZC_REPORT_USAGE
#define IORING_SEND_ZC_REPORT_USAGE (1U << 3)
#endif
#ifndef IORING_NOTIF_USAGE_ZC_COPIED
#define IORING_NOTIF_USAGE_ZC_COPIED (1U << 31)
#endif

struct ktl_ring {
    struct io_uring ring;
    int32_t wake_fd;
    int32_t wake_error;   /* positive errno once the wake-up read failed for good */
    int32_t woken;        /* a wake-up was consumed outside ktl_ring_wait: the next wait must not block */
    int32_t lost;         /* positive errno once a caller completion was lost: every wait then fails */
    pid_t owner;          /* the thread that started the ring */
    int32_t fd_registered; /* the ring's fd is registered with the owner (io_uring_register_ring_fd) */
    int32_t movable;      /* KTL_RING_MOVABLE: several threads enter it, one at a time */
    uint64_t wake_value;  /* the eventfd read's buffer: the kernel writes it */
    uint32_t abilities;   /* KTL_RING_* ability bits, probed by ktl_ring_start */

    /* One msghdr per op of the current batch; the kernel reads them during submission. */
    struct msghdr *msgs;
    int32_t msg_capacity;

    /* ktl_ring_remove_all's bookkeeping, kept between calls (a loop removes on every pass that
     * closes), and the number of the last call, which its cancels' user_data carry. */
    struct ktl_removal *removals;
    int32_t removal_capacity;
    uint32_t removal_call;

    /* Caller completions reaped while a batch or a removal waited, for the next wait. */
    ktl_cqe *pending;
    int32_t pending_head;
    int32_t pending_count;
    int32_t pending_capacity;
};

/* How ktl_ring_enter enters: submit only; submit and run the completion work; submit and wait for one completion. */
#define KTL_ENTER_SUBMIT 0
#define KTL_ENTER_EVENTS 1
#define KTL_ENTER_WAIT 2

/* A batch or a removal gives up after this many failed enters in a row that brought nothing
 * (errors ktl_ring_retry allows): a refusal that persists must not spin the loop for good. */
#define KTL_ENTER_MAX_IDLE 1000

/* The io_uring_enter of a batch or a removal (the fault site KTL_FAULT_ENTER): submits what is
 * queued and, as `how` says, runs the completion work or waits for a completion. -EBADR (the
 * kernel dropped a completion) marks the ring lost, as ktl_ring_lose does. */
static inline int ktl_ring_enter(ktl_ring *ring, int how)
{
    int ret = KTL_FAULT(KTL_FAULT_ENTER);
    if (ret == 0) {
        if (how == KTL_ENTER_SUBMIT)
            ret = io_uring_submit(&ring->ring);
        else if (how == KTL_ENTER_EVENTS)
            ret = io_uring_submit_and_get_events(&ring->ring);
        else
            ret = io_uring_submit_and_wait(&ring->ring, 1);
    }
    if (ret == -EBADR && ring->lost == 0)
        ring->lost = EBADR;
    return ret;
}

/* True for an enter error worth another try (interrupted, or out of resources for a moment). */
static inline int ktl_ring_retry(int ret)
{
    return ret == -EINTR || ret == -EAGAIN || ret == -EBUSY || ret == -ETIME;
}

/* An SQE, submitting what is queued first when the submission queue is full; NULL if none. */
struct io_uring_sqe *ktl_ring_sqe(ktl_ring *ring);

/* items (of item_size bytes each) grown to hold count > *capacity, keeping what it holds (at
 * least 64; a loop asks on every pass, so the array is kept, never shrunk): the array, with
 * *capacity updated, or NULL when out of memory (items and *capacity unchanged). */
void *ktl_ring_grow(void *items, int32_t *capacity, int32_t count, size_t item_size);

/*
 * Keeps a caller completion (its own polls' and accepts', or a zero-copy notification) for the
 * next ktl_ring_wait. Without memory to keep it (the list already holds a full CQ ring's worth)
 * it is lost: a socket accepted into it is closed, and the ring is marked lost (ENOMEM), so
 * every later wait fails. The caller cannot know which request went quiet (a poll never re-armed,
 * a notification its close waits for), so it must not go on as if nothing happened.
 */
void ktl_ring_keep(ktl_ring *ring, const struct io_uring_cqe *cqe);

/* True for a completion the caller hears of: its own polls' and accepts', and zero-copy notifications. */
int ktl_ring_reports(const struct io_uring_cqe *cqe);

/* How the caller hears of such a completion (a notification becomes KTL_RING_SEND_DONE | tag). */
ktl_cqe ktl_ring_report(const struct io_uring_cqe *cqe);

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
