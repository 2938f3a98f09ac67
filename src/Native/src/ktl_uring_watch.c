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

/* The call number in a removal's cancel (KTL_TAG_REMOVE | call << 32 | index): a call that gave up
 * leaves cancels behind, whose answers the next call must not take for its own. */
#define REMOVE_CALL_MASK 0xffffffu

/* One request being removed with wait. */
typedef struct ktl_removal {
    uint64_t target;
    uint8_t asking; /* a cancel is queued or in the kernel, not answered yet */
    uint8_t found;  /* a cancel found it (0): its last completion is on its way */
    uint8_t ended;  /* its last completion was seen, or a cancel found nothing (-ENOENT) */
} removal;

/* Takes in what the CQ ring holds: this call's cancels' answers, and its requests' completions,
 * which the caller never sees (their sockets it forgets); every other caller completion is kept
 * for the next wait. Returns how many completions it took. */
static unsigned reap_removals(ktl_ring *ring, removal *removals, int32_t count, uint32_t call)
{
    struct io_uring_cqe *cqe;
    unsigned head;
    unsigned seen = 0;

    io_uring_for_each_cqe(&ring->ring, head, cqe) {
        uint64_t data = cqe->user_data;
        seen++;
        if ((data & KTL_TAG_MASK) == KTL_TAG_REMOVE) {
            uint32_t index = (uint32_t)data;
            if (((data >> 32) & REMOVE_CALL_MASK) != call || index >= (uint32_t)count)
                continue; /* an earlier call's, which gave up */
            removal *r = &removals[index];
            r->asking = 0;
            if (cqe->res == 0)
                r->found = 1;
            else if (cqe->res == -ENOENT)
                r->ended = 1; /* the request had already ended */
            /* else -EALREADY (the request is completing right now) or a transient failure: asked again */
            continue;
        }
        if (ktl_ring_reports(cqe)) {
            int32_t i = 0;
            while (i < count && removals[i].target != data)
                i++;
            if (i == count) {
                ktl_ring_keep(ring, cqe);
                continue;
            }
            if (!(cqe->flags & IORING_CQE_F_MORE))
                removals[i].ended = 1; /* its last word: -ECANCELED, or an event that ended it */
            ktl_ring_discard(cqe);     /* the caller forgets this fd: its events go nowhere */
        } else if ((data & KTL_TAG_MASK) == KTL_TAG_WAKE) {
            ktl_ring_on_wake(ring, cqe->res);
        }
    }
    io_uring_cq_advance(&ring->ring, seen);
    return seen;
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
    uint32_t call;
    int ret = 0;
    int how = KTL_ENTER_EVENTS;
    int idle = 0;

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
    call = ring->removal_call = (ring->removal_call + 1) & REMOVE_CALL_MASK;
    for (int32_t i = 0; i < count; i++)
        removals[i] = (removal){ .target = user_data[i] };

    /* Usually one io_uring_enter: the cancels and the requests' -ECANCELED complete in it. A
     * request holds a reference to its socket until its last completion, so returning earlier
     * would let the caller close an fd whose socket the kernel still keeps open. Each pass asks
     * for the cancels not asked yet (or asked again: -EALREADY); an SQE refused (a full queue
     * whose flush failed) is asked for on the next pass, once the enter has made room. The wait
     * blocks only for an answer that is sure to come, so a refusal that lasts is returned, not
     * waited on. */
    for (;;) {
        int32_t complete = 0;
        int32_t waiting = 0;
        int refused = 0;
        for (int32_t i = 0; i < count; i++) {
            removal *r = &removals[i];
            if (!r->asking && !r->found && !r->ended && refused == 0) {
                refused = queue_removal(ring, r->target, KTL_TAG_REMOVE | (uint64_t)call << 32 | (uint32_t)i);
                r->asking = refused == 0;
            }
            if (r->ended && !r->asking)
                complete++;
            else if (r->asking || r->found)
                waiting++;
        }
        if (complete == count)
            return 0;
        if (waiting == 0)
            return refused;
        ret = ktl_ring_enter(ring, how);
        how = KTL_ENTER_WAIT;
        if (ret < 0 && !ktl_ring_retry(ret))
            return ret;
        if (reap_removals(ring, removals, count, call) > 0)
            idle = 0;
        else if (ret < 0 && ++idle == KTL_ENTER_MAX_IDLE)
            return ret;
    }
}
