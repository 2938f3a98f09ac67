/*
 * ktl_uring.c - the io_uring engine: a ring per event-loop thread (see ktl.h).
 *
 * Three kinds of request live in a ring, told apart by their user_data:
 *   - the loop's polls: multishot POLL_ADD per socket, user_data chosen by the caller
 *     (bit 63 clear); their completions are what ktl_ring_wait reports;
 *   - the wake-up: one pending read of the loop's eventfd (KTL_TAG_WAKE), re-armed each
 *     time it completes, so another thread's eventfd write ends a wait;
 *   - a batch's ops (KTL_TAG_OP | index), which never outlive ktl_ring_batch.
 * A removal either waits, inside ktl_ring_remove, for the poll's last completion (an fd
 * about to be closed), or is queued quietly (IOSQE_CQE_SKIP_SUCCESS) and the poll's
 * -ECANCELED arrives through ktl_ring_wait like any completion.
 *
 * Built only where liburing was found; otherwise ktl_uring_none.c stands in.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ktl.h"
#include "ktl_sync.h"

#include <liburing.h>

#define KTL_TAG_MASK (KTL_RING_INTERNAL | (0x7full << 56))
#define KTL_TAG_WAKE (KTL_RING_INTERNAL | (1ull << 56))
#define KTL_TAG_OP (KTL_RING_INTERNAL | (2ull << 56))
#define KTL_TAG_REMOVE (KTL_RING_INTERNAL | (3ull << 56))
#define KTL_TAG_REMOVE_QUIET (KTL_RING_INTERNAL | (4ull << 56))

struct ktl_ring {
    struct io_uring ring;
    int32_t wake_fd;
    int32_t wake_error;   /* positive errno once the wake-up read failed for good */
    pid_t owner;          /* the thread that started the ring (and registered its fd) */
    uint64_t wake_value;  /* the eventfd read's buffer: the kernel writes it */

    /* One msghdr per op of the current batch; the kernel reads them during submission. */
    struct msghdr *msgs;
    int32_t msg_capacity;

    /* Poll completions reaped while a batch waited for its ops, for the next wait. */
    ktl_cqe *pending;
    int32_t pending_head;
    int32_t pending_count;
    int32_t pending_capacity;
};

KTL_EXPORT int32_t ktl_ring_supported(void)
{
    return 1;
}

/* An SQE, submitting what is queued first when the submission queue is full. */
static struct io_uring_sqe *next_sqe(ktl_ring *ring)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring->ring);
    if (sqe == NULL) {
        io_uring_submit(&ring->ring);
        sqe = io_uring_get_sqe(&ring->ring);
    }
    return sqe;
}

static int arm_wake(ktl_ring *ring)
{
    struct io_uring_sqe *sqe = next_sqe(ring);
    if (sqe == NULL)
        return -EBUSY;
    io_uring_prep_read(sqe, ring->wake_fd, &ring->wake_value, sizeof(ring->wake_value), 0);
    io_uring_sqe_set_data64(sqe, KTL_TAG_WAKE);
    return 0;
}

/* The eventfd read completed: arm the next one, or remember why it cannot be. */
static void on_wake(ktl_ring *ring, int32_t res)
{
    if (res >= 0 || res == -EINTR || res == -EAGAIN) {
        if (arm_wake(ring) != 0)
            ring->wake_error = EBUSY;
    } else if (res != -ECANCELED) {
        ring->wake_error = -res;
    }
}

static int keep_pending(ktl_ring *ring, const struct io_uring_cqe *cqe)
{
    if (ring->pending_head + ring->pending_count == ring->pending_capacity) {
        if (ring->pending_head > 0) {
            memmove(ring->pending, ring->pending + ring->pending_head,
                    (size_t)ring->pending_count * sizeof(ktl_cqe));
            ring->pending_head = 0;
        } else {
            int32_t capacity = ring->pending_capacity == 0 ? 256 : ring->pending_capacity * 2;
            ktl_cqe *grown = realloc(ring->pending, (size_t)capacity * sizeof(ktl_cqe));
            if (grown == NULL)
                return -ENOMEM;
            ring->pending = grown;
            ring->pending_capacity = capacity;
        }
    }
    ktl_cqe *slot = &ring->pending[ring->pending_head + ring->pending_count++];
    slot->user_data = cqe->user_data;
    slot->res = cqe->res;
    slot->flags = cqe->flags;
    return 0;
}

/*
 * Consumes the completions in the CQ ring. Polls go to out while it has room (and then stop
 * the scan) or, when out is NULL, to the pending list; a batch's ops go to ops. Returns how
 * many polls were copied to out.
 */
static int32_t reap(ktl_ring *ring, ktl_cqe *out, int32_t capacity, ktl_op *ops, int32_t *outstanding)
{
    struct io_uring_cqe *cqe;
    unsigned head;
    unsigned seen = 0;
    int32_t copied = 0;

    io_uring_for_each_cqe(&ring->ring, head, cqe) {
        uint64_t data = cqe->user_data;
        if ((data & KTL_RING_INTERNAL) == 0) {
            if (out != NULL) {
                if (copied == capacity)
                    break;
                out[copied].user_data = data;
                out[copied].res = cqe->res;
                out[copied].flags = cqe->flags;
                copied++;
            } else {
                /* Out of memory drops the event: the socket's next one still arrives. */
                (void)keep_pending(ring, cqe);
            }
        } else if ((data & KTL_TAG_MASK) == KTL_TAG_OP) {
            if (ops != NULL) {
                ops[data & 0xffffffffu].result = cqe->res;
                (*outstanding)--;
            }
        } else if ((data & KTL_TAG_MASK) == KTL_TAG_WAKE) {
            on_wake(ring, cqe->res);
        }
        /* KTL_TAG_REMOVE_QUIET: a removal whose poll had already ended; nothing to do. */
        seen++;
    }
    io_uring_cq_advance(&ring->ring, seen);
    return copied;
}

KTL_EXPORT ktl_ring *ktl_ring_create(int32_t entries, ktl_ring_info *info, int32_t *error)
{
    struct io_uring_params params;
    int ret;
    ktl_ring *ring;

    if (entries < 1 || entries > 32768 || (entries & (entries - 1)) != 0) {
        if (error != NULL)
            *error = EINVAL;
        return NULL;
    }

    ring = calloc(1, sizeof(*ring));
    if (ring == NULL) {
        if (error != NULL)
            *error = ENOMEM;
        return NULL;
    }

    /* Completions can outnumber submissions (a multishot poll posts many), hence the larger CQ. */
    memset(&params, 0, sizeof(params));
    params.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_SUBMIT_ALL
        | IORING_SETUP_CQSIZE | IORING_SETUP_R_DISABLED;
    params.cq_entries = (unsigned)entries * 4;
    ret = io_uring_queue_init_params((unsigned)entries, &ring->ring, &params);
    if (ret == -EINVAL) {
        memset(&params, 0, sizeof(params));
        params.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_CQSIZE
            | IORING_SETUP_R_DISABLED;
        params.cq_entries = (unsigned)entries * 4;
        ret = io_uring_queue_init_params((unsigned)entries, &ring->ring, &params);
    }
    if (ret < 0) {
        free(ring);
        if (error != NULL)
            *error = -ret;
        return NULL;
    }

    ring->wake_fd = -1;
    if (info != NULL) {
        info->setup = params.flags & ~IORING_SETUP_R_DISABLED;
        info->features = params.features;
        info->sq_entries = params.sq_entries;
        info->cq_entries = params.cq_entries;
    }
    if (error != NULL)
        *error = 0;
    return ring;
}

KTL_EXPORT int32_t ktl_ring_start(ktl_ring *ring, int32_t wake_fd)
{
    int ret;

    if (ring == NULL || wake_fd < 0)
        return -EINVAL;
    /* A non-blocking eventfd would complete the read with -EAGAIN at once, again and again. */
    ret = fcntl(wake_fd, F_GETFL);
    if (ret < 0)
        return -errno;
    if (ret & O_NONBLOCK)
        return -EINVAL;
    ret = io_uring_enable_rings(&ring->ring);
    if (ret < 0)
        return ret;

    /* Saves the fd lookup on every io_uring_enter (Linux 5.18); per thread, so done here. */
    if (io_uring_register_ring_fd(&ring->ring) == 1)
        ring->owner = (pid_t)syscall(SYS_gettid);

    ring->wake_fd = wake_fd;
    return arm_wake(ring);
}

KTL_EXPORT int32_t ktl_ring_poll(ktl_ring *ring, int32_t fd, uint32_t events, uint64_t user_data)
{
    struct io_uring_sqe *sqe;

    if (ring == NULL || fd < 0 || (user_data & KTL_RING_INTERNAL) != 0)
        return -EINVAL;
    sqe = next_sqe(ring);
    if (sqe == NULL)
        return -EBUSY;
    if (events & EPOLLET)
        io_uring_prep_poll_multishot(sqe, fd, events & ~(uint32_t)EPOLLET);
    else
        io_uring_prep_poll_add(sqe, fd, events); /* one-shot: re-armed, it reports the level again */
    io_uring_sqe_set_data64(sqe, user_data);
    return 0;
}

/* Reaps until the removal (KTL_TAG_REMOVE) has answered and, if it found the poll, until the
 * poll's last completion has been seen; keeps every other poll completion for the next wait.
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
            continue;           /* the caller forgets this fd: its events go nowhere */
        }
        if (data == KTL_TAG_REMOVE) {
            *removal_done = 1;
            *removal_res = cqe->res;
            if (cqe->res == -ENOENT)
                *poll_done = 1; /* the poll had already ended */
            continue;
        }
        if ((data & KTL_RING_INTERNAL) == 0) {
            (void)keep_pending(ring, cqe);
        } else if ((data & KTL_TAG_MASK) == KTL_TAG_WAKE) {
            on_wake(ring, cqe->res);
        }
    }
    io_uring_cq_advance(&ring->ring, seen);
}

/* IORING_OP_ASYNC_CANCEL rather than POLL_REMOVE: a poll whose wake-up is being processed
 * at that moment cannot be disarmed by POLL_REMOVE (-EALREADY, and it stays armed), while
 * a cancel marks it, and whoever holds it completes it with -ECANCELED. */
static int queue_removal(ktl_ring *ring, uint64_t user_data, uint64_t tag)
{
    struct io_uring_sqe *sqe = next_sqe(ring);
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

KTL_EXPORT int32_t ktl_ring_wait(ktl_ring *ring, int32_t timeout_ms, ktl_cqe *out, int32_t capacity)
{
    int32_t count = 0;
    int ret;

    if (ring == NULL || out == NULL || capacity <= 0)
        return -EINVAL;
    if (ring->wake_error != 0)
        return -ring->wake_error;

    while (ring->pending_count > 0 && count < capacity) {
        out[count++] = ring->pending[ring->pending_head++];
        ring->pending_count--;
    }
    if (ring->pending_count == 0)
        ring->pending_head = 0;

    if (count > 0 || timeout_ms == 0) {
        /* Submits and runs the deferred completion work without blocking. */
        ret = io_uring_submit_and_get_events(&ring->ring);
    } else if (timeout_ms < 0) {
        ret = io_uring_submit_and_wait(&ring->ring, 1);
    } else {
        struct io_uring_cqe *cqe;
        struct __kernel_timespec ts = {
            .tv_sec = timeout_ms / 1000,
            .tv_nsec = (long long)(timeout_ms % 1000) * 1000000,
        };
        ret = io_uring_submit_and_wait_timeout(&ring->ring, &cqe, 1, &ts, NULL);
    }
    if (ret < 0 && ret != -ETIME && ret != -EINTR && ret != -EBUSY && ret != -EAGAIN)
        return ret;

    return count + reap(ring, out + count, capacity - count, NULL, NULL);
}

KTL_EXPORT int32_t ktl_ring_batch(ktl_ring *ring, int32_t direction, ktl_op *ops, int32_t count)
{
    int32_t outstanding = 0;

    if (ring == NULL || ops == NULL || count < 0)
        return -EINVAL;
    if (direction != KTL_OP_RECEIVE && direction != KTL_OP_SEND)
        return -EINVAL;
    if (count > ring->msg_capacity) {
        int32_t capacity = count < 64 ? 64 : count;
        struct msghdr *grown = realloc(ring->msgs, (size_t)capacity * sizeof(struct msghdr));
        if (grown == NULL)
            return -ENOMEM;
        ring->msgs = grown;
        ring->msg_capacity = capacity;
    }

    for (int32_t i = 0; i < count; i++) {
        ktl_op *op = &ops[i];
        struct msghdr *msg = &ring->msgs[i];
        struct io_uring_sqe *sqe;

        if (!ktl_op_is_valid(direction, op)) {
            op->result = -EINVAL;
            continue;
        }
        if (op->flags & KTL_SEND_ZEROCOPY) {
            /* MSG_ZEROCOPY's notifications arrive on the error queue, as the epoll engine expects. */
            ktl_sync_op(direction, op);
            continue;
        }

        sqe = next_sqe(ring);
        if (sqe == NULL) {
            ktl_sync_op(direction, op);
            continue;
        }
        memset(msg, 0, sizeof(*msg));
        msg->msg_iov = (struct iovec *)op->iov;
        msg->msg_iovlen = (size_t)op->iov_count;
        /* MSG_DONTWAIT: a socket with nothing to read or no room completes with -EAGAIN at
         * once instead of arming an internal poll, so no op outlives this call. */
        if (direction == KTL_OP_RECEIVE)
            io_uring_prep_recvmsg(sqe, op->fd, msg, MSG_DONTWAIT);
        else
            io_uring_prep_sendmsg(sqe, op->fd, msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        io_uring_sqe_set_data64(sqe, KTL_TAG_OP | (uint64_t)i);
        outstanding++;
    }

    if (outstanding > 0) {
        int ret = io_uring_submit(&ring->ring);
        while (1) {
            reap(ring, NULL, 0, ops, &outstanding);
            if (outstanding == 0)
                break;
            /* Not all completed inline: wait (this also runs deferred completion work). */
            ret = io_uring_submit_and_wait(&ring->ring, 1);
            if (ret < 0 && ret != -EINTR && ret != -ETIME && ret != -EAGAIN && ret != -EBUSY)
                break;
        }
        if (outstanding > 0)
            return ret < 0 ? ret : -EIO;
    }
    return count;
}

KTL_EXPORT void ktl_ring_destroy(ktl_ring *ring)
{
    if (ring == NULL)
        return;
    /* A registered ring fd belongs to the thread that registered it; from any other thread
     * the unregistration would hit that thread's table, so it is left to the thread's exit. */
    if (ring->owner != 0 && ring->owner == (pid_t)syscall(SYS_gettid))
        io_uring_unregister_ring_fd(&ring->ring);
    else
        ring->ring.int_flags = 0;
    io_uring_queue_exit(&ring->ring);
    free(ring->msgs);
    free(ring->pending);
    free(ring);
}
