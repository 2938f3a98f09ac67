/*
 * ktl_aio.c - a batch as Linux AIO: one io_submit of IOCB_CMD_PREADV/PWRITEV per chunk,
 * completions reaped from the user-space AIO ring.
 *
 * Raw syscalls are used because libaio is not a dependency we want to ship, and glibc
 * has no wrappers for io_setup and friends (io_setup(2), "NOTES").
 *
 * Why this is cheap for sockets: a non-blocking socket's read_iter/write_iter never
 * returns -EIOCBQUEUED, so the kernel completes each iocb inside io_submit and posts
 * its event to the ring before io_submit returns (fs/aio.c, aio_read/aio_write ->
 * aio_rw_done). A whole chunk therefore costs one syscall, and reaping it costs none.
 *
 * Unlike the synchronous path, a PWRITEV goes through sock_write_iter, which cannot
 * pass MSG_NOSIGNAL: a send to a peer that went away raises SIGPIPE. The .NET runtime
 * ignores SIGPIPE process-wide, so inside the transport the op simply gets -EPIPE; a
 * native host that keeps SIGPIPE fatal must not use the AIO path for sends.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ktl_aio.h"
#include "ktl_sync.h"

/*
 * Valgrind learns about the ring from io_setup's argument, but the kernel sizes it for
 * at least twice that (fs/aio.c, ioctx_alloc), and it cannot know that a reaped PREADV
 * filled the caller's buffers. Both would be false reports, so the engine tells it.
 * The client requests are a few no-op instructions when not under Valgrind, and are
 * compiled in only where its headers are installed.
 */
#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define KTL_HAVE_VALGRIND 1
#endif
#endif

/*
 * The ring the kernel maps at the address io_setup returns as the context id. Layout
 * and constants are from fs/aio.c (struct aio_ring, AIO_RING_MAGIC,
 * AIO_RING_INCOMPAT_FEATURES), stable since Linux 2.6; user-space reaping is safe since
 * Linux 3.16 (commit d856f32a86b2, "aio: fix reqs_available handling"), which made
 * io_submit notice slots that user space freed by advancing head.
 */
struct ktl_aio_ring {
    unsigned id;
    unsigned nr;
    unsigned head;
    unsigned tail;
    unsigned magic;
    unsigned compat_features;
    unsigned incompat_features;
    unsigned header_length;
    struct io_event io_events[];
};

#define KTL_AIO_RING_MAGIC 0xa10a10a1u
#define KTL_AIO_RING_INCOMPAT_FEATURES 0u

/* Marks an op that was handed to the kernel and has no result yet. */
#define KTL_RESULT_PENDING INT64_MIN

static int ring_is_usable(aio_context_t ctx)
{
    const struct ktl_aio_ring *ring = (const struct ktl_aio_ring *)(uintptr_t)ctx;

    /* A different magic or an incompat feature bit means the layout above is not what
     * this kernel writes; io_getevents is always correct, only slower. */
    return ring->magic == KTL_AIO_RING_MAGIC &&
           ring->incompat_features == KTL_AIO_RING_INCOMPAT_FEATURES &&
           ring->header_length == sizeof(struct ktl_aio_ring) &&
           ring->nr > 0;
}

int ktl_aio_open(ktl_aio *aio, int32_t capacity)
{
    aio_context_t ctx = 0;
    const char *no_ring;

    if (syscall(SYS_io_setup, (unsigned)capacity, &ctx) < 0)
        return errno;

    aio->ctx = ctx;
    aio->capacity = capacity;
    /* Lets tests (and anyone chasing a suspected ring bug) run the io_getevents path on
     * a kernel whose ring is fine. Read once here, never on the hot path. */
    no_ring = getenv("KTL_AIO_DISABLE_RING");
    aio->use_ring = ring_is_usable(ctx) && !(no_ring != NULL && no_ring[0] == '1');
#ifdef KTL_HAVE_VALGRIND
    aio->under_valgrind = RUNNING_ON_VALGRIND ? 1 : 0;
    if (aio->under_valgrind && aio->use_ring) {
        const struct ktl_aio_ring *ring = (const struct ktl_aio_ring *)(uintptr_t)ctx;
        VALGRIND_MAKE_MEM_DEFINED(ring, sizeof(*ring) + (size_t)ring->nr * sizeof(struct io_event));
    }
#endif
    return 0;
}

void ktl_aio_close(ktl_aio *aio)
{
    if (aio->ctx != 0)
        syscall(SYS_io_destroy, aio->ctx);
    free(aio->iocbs);
    free(aio->iocb_ptrs);
    free(aio->events);
    memset(aio, 0, sizeof(*aio));
}

static int ensure_scratch(ktl_aio *aio, int32_t need)
{
    int32_t len;
    void *p;

    if (need <= aio->scratch_len)
        return 1;

    /* Doubling keeps the number of reallocs logarithmic while a loop's batches grow;
     * capacity is the ceiling because no chunk is ever larger. */
    len = aio->scratch_len > aio->capacity / 2 ? aio->capacity : aio->scratch_len * 2;
    if (len < need)
        len = need;

    /* Each array is swapped in as soon as it is grown, so a failure half-way leaves
     * every pointer valid and scratch_len still true for all three. */
    p = realloc(aio->iocbs, (size_t)len * sizeof(*aio->iocbs));
    if (p == NULL)
        return 0;
    aio->iocbs = p;
    p = realloc(aio->iocb_ptrs, (size_t)len * sizeof(*aio->iocb_ptrs));
    if (p == NULL)
        return 0;
    aio->iocb_ptrs = p;
    p = realloc(aio->events, (size_t)len * sizeof(*aio->events));
    if (p == NULL)
        return 0;
    aio->events = p;

    aio->scratch_len = len;
    return 1;
}

static void mark_received(const ktl_aio *aio, const ktl_op *op)
{
#ifdef KTL_HAVE_VALGRIND
    if (aio->under_valgrind) {
        int64_t left = op->result;
        for (int32_t k = 0; k < op->iov_count && left > 0; k++) {
            size_t n = op->iov[k].iov_len < (uint64_t)left ? op->iov[k].iov_len : (size_t)left;
            VALGRIND_MAKE_MEM_DEFINED(op->iov[k].iov_base, n);
            left -= (int64_t)n;
        }
    }
#else
    (void)aio;
    (void)op;
#endif
}

static void deliver(const ktl_aio *aio, int32_t direction, ktl_op *ops, int32_t count,
                    const struct io_event *ev)
{
    uint64_t index = ev->data;

    /* Every event carries an index this batch put there; the check only keeps a kernel
     * surprise from turning into a stray write. */
    if (index >= (uint64_t)count)
        return;

    /* aio_rw_done turns a restartable interruption into -EINTR rather than restarting;
     * a non-blocking socket should never see it, but the ABI promises EINTR is retried. */
    if (ev->res == -EINTR) {
        ktl_sync_op(direction, &ops[index]);
    } else {
        ops[index].result = ev->res;
        if (direction == KTL_OP_RECEIVE && ev->res > 0)
            mark_received(aio, &ops[index]);
    }
}

static long reap_ring(ktl_aio *aio, int32_t direction, ktl_op *ops, int32_t count, long want)
{
    struct ktl_aio_ring *ring = (struct ktl_aio_ring *)(uintptr_t)aio->ctx;
    unsigned nr = ring->nr;
    /* Only this thread moves head (io_getevents does too, but only when called from here),
     * so a relaxed load sees our own last store. */
    unsigned head = __atomic_load_n(&ring->head, __ATOMIC_RELAXED) % nr;
    /* Acquire pairs with the kernel's smp_wmb between writing an event and publishing
     * tail (aio_complete): every event before tail is fully visible. */
    unsigned tail = __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE) % nr;
    long got = 0;

    while (got < want && head != tail) {
        deliver(aio, direction, ops, count, &ring->io_events[head]);
        head = head + 1 == nr ? 0 : head + 1;
        got++;
    }

    /* Release: the events are read before the kernel may see their slots as free and
     * overwrite them. */
    if (got > 0)
        __atomic_store_n(&ring->head, head, __ATOMIC_RELEASE);
    return got;
}

/* The context is in an unknown state; drop it so the engine carries on synchronously. */
static void abandon_aio(ktl_aio *aio, struct iocb *const *submitted, long n, ktl_op *ops, int err)
{
    /* io_destroy waits for whatever is still in flight and discards its events, so no
     * stale completion can be mistaken for a later batch's. */
    syscall(SYS_io_destroy, aio->ctx);
    aio->ctx = 0;

    /* The I/O may or may not have happened; retrying could duplicate a send, so report
     * the failure and let the connection be torn down. */
    for (long k = 0; k < n; k++) {
        ktl_op *op = &ops[submitted[k]->aio_data];
        if (op->result == KTL_RESULT_PENDING)
            op->result = -(int64_t)err;
    }
}

/* Returns 0 once all `want` events are in, or the errno that made reaping impossible. */
static int reap(ktl_aio *aio, int32_t direction, ktl_op *ops, int32_t count, long want)
{
    long got = aio->use_ring ? reap_ring(aio, direction, ops, count, want) : 0;

    while (got < want) {
        /* min_nr = remaining: these iocbs were accepted, so their events are certain to
         * come; blocking for exactly them avoids spinning on the ring. */
        long n = syscall(SYS_io_getevents, aio->ctx, want - got, want - got, aio->events, NULL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        for (long k = 0; k < n; k++)
            deliver(aio, direction, ops, count, &aio->events[k]);
        got += n;
    }
    return 0;
}

static void submit_chunk(ktl_aio *aio, int32_t direction, ktl_op *ops, int32_t count, long n)
{
    long submitted;
    int err;

    do {
        submitted = syscall(SYS_io_submit, aio->ctx, n, aio->iocb_ptrs);
    } while (submitted < 0 && errno == EINTR);

    /* io_submit stops at the first iocb it cannot accept (EAGAIN when the context is
     * full, EBADF/EINVAL for that op's own arguments) and fails outright only when that
     * is the first one (io_submit(2), "RETURN VALUE"). A refused iocb was never started,
     * so running it and everything after it synchronously cannot duplicate I/O, and the
     * synchronous path reports the op's own error. */
    if (submitted < 0)
        submitted = 0;

    if (submitted > 0) {
        err = reap(aio, direction, ops, count, submitted);
        if (err != 0) {
            abandon_aio(aio, aio->iocb_ptrs, submitted, ops, err);
            /* The unsubmitted tail still gets done below. */
        }
    }

    for (long k = submitted; k < n; k++)
        ktl_sync_op(direction, &ops[aio->iocbs[k].aio_data]);
}

void ktl_aio_batch(ktl_aio *aio, int32_t direction, ktl_op *ops, int32_t count)
{
    const uint16_t opcode = direction == KTL_OP_RECEIVE ? IOCB_CMD_PREADV : IOCB_CMD_PWRITEV;
    int32_t i = 0;

    while (i < count) {
        int32_t left = count - i;
        int32_t chunk = left < aio->capacity ? left : aio->capacity;
        long n = 0;

        /* After a failed reap the context is gone; finish the batch synchronously. */
        if (aio->ctx == 0 || !ensure_scratch(aio, chunk)) {
            for (; i < count; i++)
                ktl_sync_op(direction, &ops[i]);
            return;
        }

        /* Never more than capacity in flight: the context was sized for that many, and
         * every chunk is fully reaped before the next is submitted. */
        for (; i < count && n < aio->capacity; i++) {
            ktl_op *op = &ops[i];
            struct iocb *cb;

            if (!ktl_op_is_valid(direction, op)) {
                op->result = -EINVAL;
                continue;
            }

            /* PWRITEV takes no send flags: a zero-copy send is a sendmsg of its own. */
            if (op->flags != 0) {
                ktl_sync_op(direction, op);
                continue;
            }

            cb = &aio->iocbs[n];
            memset(cb, 0, sizeof(*cb));
            cb->aio_data = (uint64_t)i;
            cb->aio_lio_opcode = opcode;
            cb->aio_fildes = (uint32_t)op->fd;
            /* For the vectored opcodes aio_buf is the iovec array and aio_nbytes its
             * length (fs/aio.c, aio_setup_rw). Offset 0: sockets ignore it. */
            cb->aio_buf = (uint64_t)(uintptr_t)op->iov;
            cb->aio_nbytes = (uint64_t)op->iov_count;
            aio->iocb_ptrs[n] = cb;
            op->result = KTL_RESULT_PENDING;
            n++;
        }

        if (n > 0)
            submit_chunk(aio, direction, ops, count, n);
    }
}
