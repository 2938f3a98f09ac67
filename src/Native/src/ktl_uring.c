/*
 * ktl_uring.c - the io_uring engine's ring: set-up on any thread, start on the loop thread,
 * the eventfd wake-up, waiting for completions and handing them out (see ktl.h for the
 * ABI, ktl_uring_ring.h for how the engine's files divide the work).
 *
 * Built only where liburing was found; otherwise ktl_uring_none.c stands in.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ktl_uring_ring.h"

KTL_EXPORT int32_t ktl_ring_supported(void)
{
    return 1;
}

struct io_uring_sqe *ktl_ring_sqe(ktl_ring *ring)
{
    struct io_uring_sqe *sqe;

    if (KTL_FAULT(KTL_FAULT_SQE) != 0)
        return NULL;
    sqe = io_uring_get_sqe(&ring->ring);
    if (sqe == NULL) {
        io_uring_submit(&ring->ring);
        sqe = io_uring_get_sqe(&ring->ring);
    }
    return sqe;
}

static int arm_wake(ktl_ring *ring)
{
    struct io_uring_sqe *sqe = ktl_ring_sqe(ring);
    if (sqe == NULL)
        return -EBUSY;
    io_uring_prep_read(sqe, ring->wake_fd, &ring->wake_value, sizeof(ring->wake_value), 0);
    io_uring_sqe_set_data64(sqe, KTL_TAG_WAKE);
    return 0;
}

void ktl_ring_on_wake(ktl_ring *ring, int32_t res)
{
    ring->woken = 1;
    if (res >= 0 || res == -EINTR || res == -EAGAIN) {
        if (arm_wake(ring) != 0)
            ring->wake_error = EBUSY;
    } else if (res != -ECANCELED) {
        ring->wake_error = -res;
    }
}

void *ktl_ring_grow(void *items, int32_t *capacity, int32_t count, size_t item_size)
{
    int32_t grown_capacity = count < 64 ? 64 : count;
    void *grown = realloc(items, (size_t)grown_capacity * item_size);
    if (grown != NULL)
        *capacity = grown_capacity;
    return grown;
}

int ktl_ring_reports(const struct io_uring_cqe *cqe)
{
    return (cqe->user_data & KTL_RING_INTERNAL) == 0
        || ((cqe->user_data & KTL_TAG_MASK) == KTL_TAG_SEND_ZC && (cqe->flags & IORING_CQE_F_NOTIF));
}

ktl_cqe ktl_ring_report(const struct io_uring_cqe *cqe)
{
    if ((cqe->user_data & KTL_RING_INTERNAL) == 0)
        return (ktl_cqe){ .user_data = cqe->user_data, .res = cqe->res, .flags = cqe->flags };
    return (ktl_cqe){
        .user_data = KTL_RING_SEND_DONE | (cqe->user_data & 0xffffffffu),
        .res = ((uint32_t)cqe->res & IORING_NOTIF_USAGE_ZC_COPIED) ? 1 : 0,
    };
}

/* Room in the kept list for one more, moving what it holds to the front or growing it (0, or -ENOMEM). */
static int make_room(ktl_ring *ring)
{
    if (KTL_FAULT(KTL_FAULT_KEEP) != 0)
        return -ENOMEM;
    if (ring->pending_head + ring->pending_count < ring->pending_capacity)
        return 0;
    if (ring->pending_head > 0) {
        memmove(ring->pending, ring->pending + ring->pending_head, (size_t)ring->pending_count * sizeof(ktl_cqe));
        ring->pending_head = 0;
        return 0;
    }
    int32_t capacity = ring->pending_capacity * 2;
    ktl_cqe *grown = realloc(ring->pending, (size_t)capacity * sizeof(ktl_cqe));
    if (grown == NULL)
        return -ENOMEM;
    ring->pending = grown;
    ring->pending_capacity = capacity;
    return 0;
}

void ktl_ring_keep(ktl_ring *ring, const struct io_uring_cqe *cqe)
{
    if (make_room(ring) != 0) {
        ktl_ring_discard(cqe);
        if (ring->lost == 0)
            ring->lost = ENOMEM;
        return;
    }
    ring->pending[ring->pending_head + ring->pending_count++] = ktl_ring_report(cqe);
}

void ktl_ring_discard(const struct io_uring_cqe *cqe)
{
    if ((cqe->user_data & (KTL_RING_INTERNAL | KTL_RING_ACCEPT)) == KTL_RING_ACCEPT && cqe->res >= 0)
        close(cqe->res);
}

int32_t ktl_ring_reap(ktl_ring *ring, ktl_cqe *out, int32_t capacity, ktl_op *ops, int32_t *outstanding)
{
    struct io_uring_cqe *cqe;
    unsigned head;
    unsigned seen = 0;
    int32_t copied = 0;

    io_uring_for_each_cqe(&ring->ring, head, cqe) {
        uint64_t data = cqe->user_data;
        if (ktl_ring_reports(cqe)) {
            if (out != NULL) {
                if (copied == capacity)
                    break;
                out[copied++] = ktl_ring_report(cqe);
            } else {
                ktl_ring_keep(ring, cqe);
            }
        } else if ((data & KTL_TAG_MASK) == KTL_TAG_OP) {
            if (ops != NULL) {
                ops[data & 0xffffffffu].result = cqe->res;
                (*outstanding)--;
            }
        } else if ((data & KTL_TAG_MASK) == KTL_TAG_SEND_ZC) {
            /* The send's result (its notification was handled above); F_MORE: one will follow,
             * else the op's tag is cleared (ktl.h: no notification comes for it). */
            if (ops != NULL) {
                ktl_op *op = &ops[(data >> 32) & KTL_SEND_ZC_MAX_INDEX];
                op->result = cqe->res;
                if (!(cqe->flags & IORING_CQE_F_MORE))
                    op->tag = 0;
                (*outstanding)--;
            }
        } else if ((data & KTL_TAG_MASK) == KTL_TAG_WAKE) {
            ktl_ring_on_wake(ring, cqe->res);
        }
        /* KTL_TAG_REMOVE_QUIET: a removal whose request had already ended; nothing to do. */
        seen++;
    }
    io_uring_cq_advance(&ring->ring, seen);
    return copied;
}

KTL_EXPORT ktl_ring *ktl_ring_create(int32_t entries, uint32_t flags, ktl_ring_info *info, int32_t *error)
{
    struct io_uring_params params;
    int ret = -EINVAL;
    ktl_ring *ring;

    if (entries < 1 || entries > 32768 || (entries & (entries - 1)) != 0 || (flags & ~KTL_RING_MOVABLE) != 0) {
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
    if (!(flags & KTL_RING_MOVABLE)) {
        memset(&params, 0, sizeof(params));
        params.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_SUBMIT_ALL
            | IORING_SETUP_CQSIZE | IORING_SETUP_R_DISABLED;
        params.cq_entries = (unsigned)entries * 4;
        ret = io_uring_queue_init_params((unsigned)entries, &ring->ring, &params);
    }
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

    /* The kept list holds a full CQ ring's worth from the start, so that keeping completions
     * (ktl_ring_keep) needs no allocation in all but extreme passes. */
    ring->pending_capacity = (int32_t)params.cq_entries;
    ring->pending = malloc((size_t)ring->pending_capacity * sizeof(ktl_cqe));
    if (ring->pending == NULL) {
        io_uring_queue_exit(&ring->ring);
        free(ring);
        if (error != NULL)
            *error = ENOMEM;
        return NULL;
    }

    ring->wake_fd = -1;
    ring->movable = (flags & KTL_RING_MOVABLE) != 0;
    if (info != NULL) {
        info->setup = params.flags & ~IORING_SETUP_R_DISABLED;
        info->features = params.features;
        info->sq_entries = params.sq_entries;
        info->cq_entries = params.cq_entries;
        info->abilities = 0;
        info->reserved = 0;
    }
    if (error != NULL)
        *error = 0;
    return ring;
}

/*
 * Whether SENDMSG_ZC with IORING_SEND_ZC_REPORT_USAGE is there (6.2): a kernel without the
 * opcode, or without the flag, fails the request's preparation with -EINVAL, before the fd
 * is looked at, so a send on fd -1 tells the two apart from -EBADF. Its notification, if
 * any, is reaped later and ignored (KTL_TAG_PROBE).
 */
static uint32_t probe_abilities(ktl_ring *ring)
{
    static const char byte = 0;
    struct iovec iov = { .iov_base = (void *)&byte, .iov_len = 1 };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
    struct io_uring_probe *probe = io_uring_get_probe_ring(&ring->ring);
    struct io_uring_sqe *sqe;
    struct io_uring_cqe *cqe;
    int supported = probe != NULL && io_uring_opcode_supported(probe, IORING_OP_SENDMSG_ZC);
    int res;

    io_uring_free_probe(probe);
    if (!supported || (sqe = ktl_ring_sqe(ring)) == NULL)
        return 0;
    io_uring_prep_sendmsg_zc(sqe, -1, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    sqe->ioprio |= IORING_SEND_ZC_REPORT_USAGE;
    io_uring_sqe_set_data64(sqe, KTL_TAG_PROBE);
    if (io_uring_submit_and_wait(&ring->ring, 1) < 0)
        return 0;
    for (;;) {
        if (io_uring_peek_cqe(&ring->ring, &cqe) != 0)
            return 0;
        if (cqe->user_data == KTL_TAG_PROBE && !(cqe->flags & IORING_CQE_F_NOTIF))
            break;
        io_uring_cqe_seen(&ring->ring, cqe); /* nothing else is in flight yet */
    }
    res = cqe->res;
    io_uring_cqe_seen(&ring->ring, cqe);
    return res == -EINVAL ? 0 : KTL_RING_SENDS_ZEROCOPY;
}

KTL_EXPORT int32_t ktl_ring_start(ktl_ring *ring, int32_t wake_fd, ktl_ring_info *info)
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

    /* Saves the fd lookup on every io_uring_enter (Linux 5.18); per thread, so done here, and
     * not for a ring other threads will enter. */
    ring->owner = (pid_t)syscall(SYS_gettid);
    ring->fd_registered = !ring->movable && io_uring_register_ring_fd(&ring->ring) == 1;

    ring->abilities = probe_abilities(ring);
    if (info != NULL)
        info->abilities = ring->abilities;
    ring->wake_fd = wake_fd;
    return arm_wake(ring);
}

KTL_EXPORT int32_t ktl_ring_wait(ktl_ring *ring, int32_t timeout_ms, ktl_cqe *out, int32_t capacity)
{
    int32_t count = 0;
    int ret;

    if (ring == NULL || out == NULL || capacity <= 0)
        return -EINVAL;
    if (ring->lost != 0)
        return -ring->lost;
    if (ring->wake_error != 0)
        return -ring->wake_error;

    while (ring->pending_count > 0 && count < capacity) {
        out[count++] = ring->pending[ring->pending_head++];
        ring->pending_count--;
    }
    if (ring->pending_count == 0)
        ring->pending_head = 0;

    /* A wake-up that a batch or a removal consumed was meant to end this wait. */
    if (count > 0 || timeout_ms == 0 || ring->woken) {
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
    if (ret < 0 && !ktl_ring_retry(ret))
        return ret;

    count += ktl_ring_reap(ring, out + count, capacity - count, NULL, NULL);
    ring->woken = 0;
    return count;
}

/* Closes the sockets accepted into the completions of the CQ ring, which nobody will read. */
static void discard_all(ktl_ring *ring)
{
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring->ring, head, cqe) {
        ktl_ring_discard(cqe);
        seen++;
    }
    io_uring_cq_advance(&ring->ring, seen);
}

KTL_EXPORT void ktl_ring_destroy(ktl_ring *ring)
{
    if (ring == NULL)
        return;
    int on_owner = ring->owner != 0 && ring->owner == (pid_t)syscall(SYS_gettid);
    int may_enter = on_owner || ring->movable;

    /* Sockets accepted into completions nobody will read are closed, not leaked: those kept,
     * those in the CQ ring, and those the kernel holds in its overflow list while the ring is
     * full, which io_uring_get_events moves into the ring. Only the owner can (a DEFER_TASKRUN
     * ring refuses any other thread's io_uring_enter), or any thread for a movable ring. */
    for (int32_t i = 0; i < ring->pending_count; i++) {
        const ktl_cqe *kept = &ring->pending[ring->pending_head + i];
        struct io_uring_cqe cqe = { .user_data = kept->user_data, .res = kept->res };
        ktl_ring_discard(&cqe);
    }
    discard_all(ring);
    for (int round = 0; may_enter && round < 64 && io_uring_cq_has_overflow(&ring->ring); round++) {
        if (io_uring_get_events(&ring->ring) < 0)
            break;
        discard_all(ring);
    }

    /* A registered ring fd belongs to the thread that registered it; from any other thread
     * the unregistration would hit that thread's table, so it is left to the thread's exit. */
    if (on_owner && ring->fd_registered)
        io_uring_unregister_ring_fd(&ring->ring);
    else
        ring->ring.int_flags = 0;
    io_uring_queue_exit(&ring->ring);
    free(ring->msgs);
    free(ring->removals);
    free(ring->pending);
    free(ring);
}
