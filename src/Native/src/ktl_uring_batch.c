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

KTL_EXPORT int32_t ktl_ring_batch(ktl_ring *ring, int32_t direction, ktl_op *ops, int32_t count)
{
    int32_t outstanding = 0;

    if (ring == NULL || ops == NULL || count < 0)
        return -EINVAL;
    if (direction != KTL_OP_RECEIVE && direction != KTL_OP_SEND)
        return -EINVAL;
    if (count > ring->msg_capacity) {
        struct msghdr *grown = ktl_ring_grow(ring->msgs, &ring->msg_capacity, count, sizeof(*grown));
        if (grown == NULL)
            return -ENOMEM;
        ring->msgs = grown;
    }

    for (int32_t i = 0; i < count; i++) {
        ktl_op *op = &ops[i];
        struct msghdr *msg = &ring->msgs[i];
        struct io_uring_sqe *sqe;
        int zerocopy;

        if (!ktl_op_is_valid(direction, op)) {
            op->result = -EINVAL;
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
            if (zerocopy)
                op->result = -ENOBUFS;
            else
                ktl_sync_op(direction, op);
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
        outstanding++;
    }

    if (outstanding > 0) {
        int ret = ktl_ring_enter(ring, KTL_ENTER_SUBMIT);
        while (1) {
            ktl_ring_reap(ring, NULL, 0, ops, &outstanding);
            if (outstanding == 0)
                break;
            /* Not all completed inline: wait (this also runs deferred completion work). */
            ret = ktl_ring_enter(ring, KTL_ENTER_WAIT);
            if (ret < 0 && !ktl_ring_retry(ret))
                break;
        }
        if (outstanding > 0)
            return ret < 0 ? ret : -EIO;
    }
    return count;
}

