/*
 * ktl_uring_watch.c - the io_uring engine's long-lived requests: a multishot poll per
 * socket, a multishot accept per listener, and their removal (see ktl.h).
 */
#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "ktl_uring_ring.h"

KTL_EXPORT int32_t ktl_ring_poll(ktl_ring *ring, int32_t fd, uint32_t events, uint64_t user_data)
{
    struct io_uring_sqe *sqe;

    if (ring == NULL || fd < 0 || (user_data & (KTL_RING_INTERNAL | KTL_RING_ACCEPT)) != 0)
        return -EINVAL;
    sqe = ktl_ring_sqe(ring);
    if (sqe == NULL)
        return -EBUSY;
    if (events & EPOLLET)
        io_uring_prep_poll_multishot(sqe, fd, events & ~(uint32_t)EPOLLET);
    else
        io_uring_prep_poll_add(sqe, fd, events); /* one-shot: re-armed, it reports the level again */
    io_uring_sqe_set_data64(sqe, user_data);
    return 0;
}

KTL_EXPORT int32_t ktl_ring_accept(ktl_ring *ring, int32_t fd, uint64_t user_data)
{
    struct io_uring_sqe *sqe;

    if (ring == NULL || fd < 0 || (user_data & (KTL_RING_INTERNAL | KTL_RING_ACCEPT)) != KTL_RING_ACCEPT)
        return -EINVAL;
    sqe = ktl_ring_sqe(ring);
    if (sqe == NULL)
        return -EBUSY;
    /* No address: one buffer would serve every connection of the burst. The caller asks
     * getpeername, which costs what accept4's address did on epoll. */
    io_uring_prep_multishot_accept(sqe, fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    io_uring_sqe_set_data64(sqe, user_data);
    return 0;
}

/* Reaps until the removal (KTL_TAG_REMOVE) has answered and, if it found the request, until
 * its last completion has been seen; keeps every other caller completion for the next wait.
 * *removal_res is the removal's result once it has answered. */
static void reap_removal(ktl_ring *ring, uint64_t user_data, int *removal_res, int *removal_done, int *poll_done)
{
    struct io_uring_cqe *cqe;
    unsigned head;
    unsigned seen = 0;

    io_uring_for_each_cqe(&ring->ring, head, cqe) {
        uint64_t data = cqe->user_data;
        seen++;
        if (data == user_data) {
            if (!(cqe->flags & IORING_CQE_F_MORE))
                *poll_done = 1; /* its last word: -ECANCELED, or an event that ended it */
            ktl_ring_discard(cqe); /* the caller forgets this fd: its events go nowhere */
            continue;
        }
        if (data == KTL_TAG_REMOVE) {
            *removal_done = 1;
            *removal_res = cqe->res;
            if (cqe->res == -ENOENT)
                *poll_done = 1; /* the poll had already ended */
            continue;
        }
        if ((data & KTL_RING_INTERNAL) == 0) {
            (void)ktl_ring_keep(ring, cqe);
        } else if ((data & KTL_TAG_MASK) == KTL_TAG_WAKE) {
            ktl_ring_on_wake(ring, cqe->res);
        }
    }
    io_uring_cq_advance(&ring->ring, seen);
}

/* IORING_OP_ASYNC_CANCEL rather than POLL_REMOVE: a poll whose wake-up is being processed
 * at that moment cannot be disarmed by POLL_REMOVE (-EALREADY, and it stays armed), while
 * a cancel marks it, and whoever holds it completes it with -ECANCELED. */
static int queue_removal(ktl_ring *ring, uint64_t user_data, uint64_t tag)
{
    struct io_uring_sqe *sqe = ktl_ring_sqe(ring);
    if (sqe == NULL)
        return -EBUSY;
    io_uring_prep_cancel64(sqe, user_data, 0);
    io_uring_sqe_set_data64(sqe, tag);
    if (tag == KTL_TAG_REMOVE_QUIET)
        sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
    return 0;
}

KTL_EXPORT int32_t ktl_ring_remove(ktl_ring *ring, uint64_t user_data, int32_t wait)
{
    int removal_done = 0, poll_done = 0, removal_res = 0;
    int ret;

    if (ring == NULL || (user_data & KTL_RING_INTERNAL) != 0)
        return -EINVAL;
    if (!wait)
        return queue_removal(ring, user_data, KTL_TAG_REMOVE_QUIET);

    /* Usually one io_uring_enter: the cancel and the poll's -ECANCELED complete in it. The
     * poll holds a reference to the socket until its last completion, so returning earlier
     * would let the caller close an fd whose socket the kernel still keeps open. */
    ret = queue_removal(ring, user_data, KTL_TAG_REMOVE);
    if (ret < 0)
        return ret;
    ret = io_uring_submit_and_get_events(&ring->ring);
    for (;;) {
        if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY && ret != -ETIME)
            return ret;
        reap_removal(ring, user_data, &removal_res, &removal_done, &poll_done);
        if (poll_done && removal_done)
            return 0;
        if (removal_done && removal_res != 0 && removal_res != -ENOENT) {
            /* -EALREADY (or a transient failure): the poll is still armed; ask again. */
            removal_done = 0;
            ret = queue_removal(ring, user_data, KTL_TAG_REMOVE);
            if (ret < 0)
                return ret;
        }
        ret = io_uring_submit_and_wait(&ring->ring, 1);
    }
}

