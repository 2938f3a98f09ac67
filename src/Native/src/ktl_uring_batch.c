/*
 * ktl_uring_batch.c - a pass's receives or sends as one io_uring_enter, every op complete
 * (or failed with -EAGAIN) when ktl_ring_batch returns (see ktl.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "ktl_sync.h"
#include "ktl_uring_ring.h"

/* An op submitted and not answered yet; never a result an op can have (a CQE's res is 32 bits). */
#define RESULT_PENDING INT64_MIN

/*
 * The batch gives up with ops outstanding (an io_uring_enter failed). Ops still in the submission
 * queue, which the kernel has not read, become NOPs that post nothing, so that no later enter
 * sends them from buffers the caller is about to release; they get the error, and a zero-copy one
 * loses its tag (no notification will come). An op the kernel took whose completion is missing
 * gets the error too, but a zero-copy one keeps its tag: it may have sent, and its notification
 * is what says the kernel is done with the buffers.
 */
static void abandon(ktl_ring *ring, ktl_op *ops, int32_t count, int error)
{
    struct io_uring_sq *sq = &ring->ring.sq;
    for (unsigned position = io_uring_smp_load_acquire(sq->khead); position != sq->sqe_tail; position++) {
        struct io_uring_sqe *sqe = &sq->sqes[position & sq->ring_mask];
        uint64_t data = sqe->user_data;
        uint32_t index;
        if ((data & KTL_TAG_MASK) == KTL_TAG_OP)
            index = (uint32_t)data;
        else if ((data & KTL_TAG_MASK) == KTL_TAG_SEND_ZC)
            index = (uint32_t)(data >> 32) & KTL_SEND_ZC_MAX_INDEX;
        else
            continue;
        if (index < (uint32_t)count) {
            ops[index].result = error;
            ops[index].tag = 0;
        }
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, KTL_TAG_VOID);
        sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
    }
    for (int32_t i = 0; i < count; i++) {
        if (ops[i].result == RESULT_PENDING)
            ops[i].result = error;
    }
}

/* Nothing was submitted: every op gets the error, and no notification will come for any. */
static int32_t fail_all(ktl_op *ops, int32_t count, int error)
{
    for (int32_t i = 0; i < count; i++) {
        ops[i].result = error;
        ops[i].tag = 0;
    }
    return error;
}

KTL_EXPORT int32_t ktl_ring_batch(ktl_ring *ring, int32_t direction, ktl_op *ops, int32_t count)
{
    int32_t outstanding = 0;

    if (ops == NULL || count < 0)
        return -EINVAL;
    if (ring == NULL || (direction != KTL_OP_RECEIVE && direction != KTL_OP_SEND))
        return fail_all(ops, count, -EINVAL);
    if (count > ring->msg_capacity) {
        struct msghdr *grown = ktl_ring_grow(ring->msgs, &ring->msg_capacity, count, sizeof(*grown));
        if (grown == NULL)
            return fail_all(ops, count, -ENOMEM);
        ring->msgs = grown;
    }

    for (int32_t i = 0; i < count; i++) {
        ktl_op *op = &ops[i];
        struct msghdr *msg = &ring->msgs[i];
        struct io_uring_sqe *sqe;
        int zerocopy;

        if (!ktl_op_is_valid(direction, op)) {
            op->result = -EINVAL;
            op->tag = 0;
            continue;
        }
        zerocopy = (op->flags & KTL_SEND_ZEROCOPY) != 0;
        if (zerocopy && op->tag == 0) {
            /* MSG_ZEROCOPY: the notification arrives on the socket's error queue, as on epoll. */
            ktl_sync_op(direction, op);
            continue;
        }

        sqe = zerocopy && (!(ring->abilities & KTL_RING_SENDS_ZEROCOPY) || i > KTL_SEND_ZC_MAX_INDEX)
            ? NULL : ktl_ring_sqe(ring);
        if (sqe == NULL) {
            /* A numbered send waits for a notification only the ring can bring: refused instead,
             * as MSG_ZEROCOPY is refused without notification memory, and sent again by copying. */
            if (zerocopy) {
                op->result = -ENOBUFS;
                op->tag = 0;
            } else {
                ktl_sync_op(direction, op);
            }
            continue;
        }
        memset(msg, 0, sizeof(*msg));
        msg->msg_iov = (struct iovec *)op->iov;
        msg->msg_iovlen = (size_t)op->iov_count;
        /* MSG_DONTWAIT: a socket with nothing to read or no room completes with -EAGAIN at
         * once instead of arming an internal poll, so no op outlives this call (a zero-copy
         * send's notification does, by design: it says when the buffers are free). */
        if (direction == KTL_OP_RECEIVE) {
            io_uring_prep_recvmsg(sqe, op->fd, msg, MSG_DONTWAIT);
            io_uring_sqe_set_data64(sqe, KTL_TAG_OP | (uint64_t)i);
        } else if (zerocopy) {
            io_uring_prep_sendmsg_zc(sqe, op->fd, msg, MSG_DONTWAIT | MSG_NOSIGNAL);
            sqe->ioprio |= IORING_SEND_ZC_REPORT_USAGE;
            io_uring_sqe_set_data64(sqe, KTL_TAG_SEND_ZC | ((uint64_t)i << 32) | op->tag);
        } else {
            io_uring_prep_sendmsg(sqe, op->fd, msg, MSG_DONTWAIT | MSG_NOSIGNAL);
            io_uring_sqe_set_data64(sqe, KTL_TAG_OP | (uint64_t)i);
        }
        op->result = RESULT_PENDING;
        outstanding++;
    }

    if (outstanding > 0) {
        int ret = ktl_ring_enter(ring, KTL_ENTER_SUBMIT);
        int idle = 0;
        for (;;) {
            int32_t before = outstanding;
            ktl_ring_reap(ring, NULL, 0, ops, &outstanding);
            if (outstanding == 0)
                break;
            if (ret < 0 && (!ktl_ring_retry(ret) || (outstanding == before && ++idle == KTL_ENTER_MAX_IDLE))) {
                abandon(ring, ops, count, ret);
                return ret;
            }
            if (outstanding < before)
                idle = 0;
            /* Not all completed inline: wait (this also runs deferred completion work). */
            ret = ktl_ring_enter(ring, KTL_ENTER_WAIT);
        }
    }
    return count;
}

