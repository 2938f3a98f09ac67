/*
 * ktl_engine.c - engine lifetime, the ABI version, ktl_batch dispatch and the
 * synchronous path (one readv or sendmsg per op).
 *
 * An engine belongs to one event-loop thread; nothing here is thread-safe, which is
 * what lets the scratch arrays and the AIO context be used without locks.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ktl.h"
#include "ktl_aio.h"

#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000 /* Linux 4.14; older C libraries lack the name */
#endif

struct ktl_engine {
    ktl_aio aio;
};

KTL_EXPORT int32_t ktl_abi_version(void)
{
    return KTL_ABI_VERSION;
}

KTL_EXPORT ktl_engine *ktl_engine_create(int32_t aio_capacity, int32_t *aio_error)
{
    int err = 0;
    ktl_engine *engine = calloc(1, sizeof(*engine));
    if (engine == NULL) {
        if (aio_error != NULL)
            *aio_error = ENOMEM;
        return NULL;
    }

    if (aio_capacity < 0)
        err = EINVAL;
    else if (aio_capacity > 0)
        err = ktl_aio_open(&engine->aio, aio_capacity);

    if (aio_error != NULL)
        *aio_error = err;
    return engine;
}

KTL_EXPORT int32_t ktl_engine_has_aio(const ktl_engine *engine)
{
    return engine != NULL && engine->aio.ctx != 0;
}

KTL_EXPORT void ktl_engine_destroy(ktl_engine *engine)
{
    if (engine == NULL)
        return;
    ktl_aio_close(&engine->aio);
    free(engine);
}

/*
 * Checked before the kernel sees an op: readv and PREADV with zero segments return 0,
 * which the caller would take for EOF and close a healthy connection.
 */
int ktl_op_is_valid(int32_t direction, const ktl_op *op)
{
    int32_t allowed = direction == KTL_OP_SEND ? KTL_SEND_ZEROCOPY : 0;
    return op->iov != NULL && op->iov_count >= 1 && op->iov_count <= IOV_MAX
        && (op->flags & ~allowed) == 0 && op->reserved == 0;
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

KTL_EXPORT int32_t ktl_batch(ktl_engine *engine, int32_t direction, int32_t use_aio,
                             ktl_op *ops, int32_t count)
{
    if (engine == NULL || ops == NULL || count < 0)
        return -EINVAL;
    if (direction != KTL_OP_RECEIVE && direction != KTL_OP_SEND)
        return -EINVAL;

    if (use_aio && engine->aio.ctx != 0) {
        ktl_aio_batch(&engine->aio, direction, ops, count);
    } else {
        for (int32_t i = 0; i < count; i++)
            ktl_sync_op(direction, &ops[i]);
    }
    return count;
}
