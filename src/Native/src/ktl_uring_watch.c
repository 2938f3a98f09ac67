/*
 * ktl_uring_watch.c - the io_uring engine's long-lived requests: a multishot poll per
 * socket, a multishot accept per listener, and their removal (see ktl.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "ktl_uring_ring.h"

KTL_EXPORT int32_t ktl_ring_poll(ktl_ring *ring, int32_t fd, uint32_t events, uint64_t user_data)
{
    struct io_uring_sqe *sqe;

    if (ring == NULL || fd < 0 || (user_data & (KTL_RING_INTERNAL | KTL_RING_ACCEPT | KTL_RING_SEND_DONE)) != 0)
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

    if (ring == NULL || fd < 0 || (user_data & (KTL_RING_INTERNAL | KTL_RING_ACCEPT | KTL_RING_SEND_DONE)) != KTL_RING_ACCEPT)
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

/* One request being removed with wait: whether its cancel has answered (and how), and
 * whether its last completion has been seen. */
typedef struct ktl_removal {
    uint64_t target;
    int32_t cancel_res;
    uint8_t cancel_done;
    uint8_t done;
} removal;

/* Reaps until every removal's cancel (KTL_TAG_REMOVE | index) has answered and, where it found
 * its request, until that request's last completion has been seen; keeps every other caller
 * completion for the next wait. Returns how many removals are complete. */
static int32_t reap_removals(ktl_ring *ring, removal *removals, int32_t count)
{
    struct io_uring_cqe *cqe;
    unsigned head;
    unsigned seen = 0;
    int32_t complete = 0;

    io_uring_for_each_cqe(&ring->ring, head, cqe) {
        uint64_t data = cqe->user_data;
        seen++;
        if ((data & KTL_TAG_MASK) == KTL_TAG_REMOVE) {
            removal *r = &removals[data & 0xffffffffu];
            r->cancel_done = 1;
            r->cancel_res = cqe->res;
            if (cqe->res == -ENOENT)
                r->done = 1; /* the request had already ended */
            continue;
        }
        if (ktl_ring_reports(cqe)) {
            int32_t i = 0;
            while (i < count && removals[i].target != data)
                i++;
            if (i == count) {
                (void)ktl_ring_keep(ring, ktl_ring_report(cqe));
                continue;
            }
            if (!(cqe->flags & IORING_CQE_F_MORE))
                removals[i].done = 1; /* its last word: -ECANCELED, or an event that ended it */
            ktl_ring_discard(cqe);    /* the caller forgets this fd: its events go nowhere */
        } else if ((data & KTL_TAG_MASK) == KTL_TAG_WAKE) {
            ktl_ring_on_wake(ring, cqe->res);
        }
    }
    io_uring_cq_advance(&ring->ring, seen);
    for (int32_t i = 0; i < count; i++)
        complete += removals[i].done && removals[i].cancel_done;
    return complete;
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
    if (ring == NULL || (user_data & KTL_RING_INTERNAL) != 0)
        return -EINVAL;
    if (!wait)
        return queue_removal(ring, user_data, KTL_TAG_REMOVE_QUIET);
    return ktl_ring_remove_all(ring, &user_data, 1);
}

KTL_EXPORT int32_t ktl_ring_remove_all(ktl_ring *ring, const uint64_t *user_data, int32_t count)
{
    removal *removals;
    int ret = 0;

    if (ring == NULL || count < 0 || (count > 0 && user_data == NULL))
        return -EINVAL;
    if (count == 0)
        return 0;
    for (int32_t i = 0; i < count; i++) {
        if ((user_data[i] & KTL_RING_INTERNAL) != 0)
            return -EINVAL;
    }
    if (count > ring->removal_capacity) {
        removal *grown = ktl_ring_grow(ring->removals, &ring->removal_capacity, count, sizeof(*grown));
        if (grown == NULL)
            return -ENOMEM;
        ring->removals = grown;
    }
    removals = ring->removals;

    /* Usually one io_uring_enter: the cancels and the requests' -ECANCELED complete in it. A
     * request holds a reference to its socket until its last completion, so returning earlier
     * would let the caller close an fd whose socket the kernel still keeps open. */
    for (int32_t i = 0; i < count && ret == 0; i++) {
        removals[i] = (removal){ .target = user_data[i] };
        ret = queue_removal(ring, user_data[i], KTL_TAG_REMOVE | (uint64_t)i);
    }
    if (ret == 0)
        ret = io_uring_submit_and_get_events(&ring->ring);
    for (;;) {
        if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY && ret != -ETIME)
            break;
        if (reap_removals(ring, removals, count) == count) {
            ret = 0;
            break;
        }
        for (int32_t i = 0; i < count; i++) {
            removal *r = &removals[i];
            if (r->cancel_done && !r->done && r->cancel_res != 0) {
                /* -EALREADY (or a transient failure): the request is still armed; ask again. */
                r->cancel_done = 0;
                if ((ret = queue_removal(ring, r->target, KTL_TAG_REMOVE | (uint64_t)i)) < 0)
                    return ret;
            }
        }
        ret = io_uring_submit_and_wait(&ring->ring, 1);
    }
    return ret;
}
