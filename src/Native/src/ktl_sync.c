/*
 * ktl_sync.c - the synchronous path: one readv or sendmsg per op.
 */
#include <errno.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ktl_sync.h"

#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000 /* Linux 4.14; older C libraries lack the name */
#endif

/*
 * Checked before the kernel sees an op: readv and PREADV with zero segments return 0,
 * which the caller would take for EOF and close a healthy connection.
 */
int ktl_op_is_valid(int32_t direction, const ktl_op *op)
{
    int32_t allowed = direction == KTL_OP_SEND ? KTL_SEND_ZEROCOPY : 0;
    return op->iov != NULL && op->iov_count >= 1 && op->iov_count <= IOV_MAX
        && (op->flags & ~allowed) == 0 && (op->tag == 0 || (op->flags & KTL_SEND_ZEROCOPY));
}

void ktl_sync_op(int32_t direction, ktl_op *op)
{
    ssize_t n;

    if (!ktl_op_is_valid(direction, op)) {
        op->result = -EINVAL;
        return;
    }

    if (direction == KTL_OP_RECEIVE) {
        do {
            n = readv(op->fd, op->iov, op->iov_count);
        } while (n < 0 && errno == EINTR);
    } else {
        /* sendmsg rather than writev only for MSG_NOSIGNAL: a peer that went away must
         * show up as -EPIPE in the result, not as a process-killing SIGPIPE. */
        struct msghdr msg = { 0 };
        int flags = MSG_NOSIGNAL | ((op->flags & KTL_SEND_ZEROCOPY) ? MSG_ZEROCOPY : 0);
        msg.msg_iov = (struct iovec *)op->iov;
        msg.msg_iovlen = (size_t)op->iov_count;
        do {
            n = sendmsg(op->fd, &msg, flags);
        } while (n < 0 && errno == EINTR);
    }

    op->result = n >= 0 ? (int64_t)n : -(int64_t)errno;
}
