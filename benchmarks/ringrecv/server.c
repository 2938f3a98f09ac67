/* server.c - the server thread: every io_uring_enter (counted), arming, the pass loop and its
 * wait (with drain, the enters that follow it), the recv and send batches, set-up, teardown. */

#include "ringrecv.h"

static void snapshot(struct server *s, struct counters *out)
{
    *out = s->c;
    out->wall = now_s(CLOCK_MONOTONIC);
    out->cpu = now_s(CLOCK_THREAD_CPUTIME_ID);
}

/* Every io_uring_enter the server makes goes through one of these four, which count it. */
static void submit(struct server *s)
{
    if (io_uring_sq_ready(&s->ring) == 0)
        return; /* liburing makes no syscall then */
    s->c.enters++;
    int r = io_uring_submit(&s->ring);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY)
        die("io_uring_submit: %s", strerror(-r));
}

static void enter_wait(struct server *s, int block)
{
    s->c.enters++;
    int r = block ? io_uring_submit_and_wait(&s->ring, 1) : io_uring_submit_and_get_events(&s->ring);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY && r != -ETIME)
        die("io_uring_enter (wait): %s", strerror(-r));
}

static void enter_drain(struct server *s)
{
    s->c.enters++;
    s->c.drain_enters++;
    int r = io_uring_get_events(&s->ring);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY)
        die("io_uring_enter (drain): %s", strerror(-r));
}

static struct io_uring_sqe *get_sqe(struct server *s)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    if (sqe == NULL) {
        submit(s);
        sqe = io_uring_get_sqe(&s->ring);
        if (sqe == NULL)
            die("submission queue stays full");
    }
    return sqe;
}

/* Consumes every CQE in the ring, then hands the pass's buffers back in one tail update.
 * Returns how many it consumed. */
static unsigned reap(struct server *s)
{
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&s->ring, head, cqe) {
        handle_cqe(s, cqe);
        seen++;
    }
    io_uring_cq_advance(&s->ring, seen);
    s->c.cqes += seen;
    if (s->br_pending > 0) {
        io_uring_buf_ring_advance(s->br, s->br_pending);
        s->br_pending = 0;
    }
    return seen;
}

/* Does the kernel still hold deferred task work after an enter that surfaced `got` CQEs? */
static int work_left(struct server *s, unsigned got)
{
    if (s->drain == DRAIN_FLAG)
        return (IO_URING_READ_ONCE(*s->ring.sq.kflags) & IORING_SQ_TASKRUN) != 0;
    return got >= IO_LOCAL_TW_DEFAULT_MAX;
}

/* The pass's wait: one enter that blocks for readiness, or only collects when work carried
 * over; then, with drain, more collecting enters while the kernel has work left. The CQ is
 * empty before it (every enter is followed by a reap), so each reap counts what its enter
 * surfaced. */
static void wait_and_collect(struct server *s, int block)
{
    enter_wait(s, block);
    unsigned got = reap(s), total = got;
    if (got >= IO_LOCAL_TW_DEFAULT_MAX)
        s->c.capped_waits++;
    for (int extra = 0; s->drain != DRAIN_OFF && extra < DRAIN_MAX_EXTRA && work_left(s, got); extra++) {
        enter_drain(s);
        got = reap(s);
        total += got;
    }
    s->c.wait_cqes += total;
}

static void arm(struct server *s, struct sconn *c)
{
    struct io_uring_sqe *sqe = get_sqe(s);
    int idx = (int)(c - s->conns);
    if (s->kind == V_POLL) {
        io_uring_prep_poll_multishot(sqe, c->fd, POLLIN | POLLOUT | POLLRDHUP);
        io_uring_sqe_set_data64(sqe, UD(T_POLL, idx));
    } else {
        io_uring_prep_recv_multishot(sqe, c->fd, NULL, 0, 0);
        sqe->flags |= IOSQE_BUFFER_SELECT;
        sqe->buf_group = BGID;
        io_uring_sqe_set_data64(sqe, UD(T_RECVMS, idx));
        c->armed = 1;
        s->armed++;
    }
}

static void arm_wake(struct server *s)
{
    struct io_uring_sqe *sqe = get_sqe(s);
    io_uring_prep_read(sqe, s->wake_fd, &s->wake_value, sizeof(s->wake_value), 0);
    io_uring_sqe_set_data64(sqe, UD(T_WAKE, 0));
}

/* Queues the re-arms and POLLOUT polls this reap asked for; the next enter submits them. */
static void flush_arms(struct server *s)
{
    for (int i = 0; i < s->nrearm; i++) {
        struct sconn *c = &s->conns[s->rearmq[i]];
        c->rearm = 0;
        arm(s, c);
    }
    s->nrearm = 0;
    for (int i = 0; i < s->nout; i++) {
        struct sconn *c = &s->conns[s->outq[i]];
        struct io_uring_sqe *sqe = get_sqe(s);
        io_uring_prep_poll_add(sqe, c->fd, POLLOUT);
        io_uring_sqe_set_data64(sqe, UD(T_POLLOUT, s->outq[i]));
    }
    s->nout = 0;
    if (s->wake_rearm) {
        s->wake_rearm = 0;
        arm_wake(s);
    }
}

/* Submits the batched ops and returns once each has its result (they run MSG_DONTWAIT). */
static void run_batch(struct server *s)
{
    submit(s);
    for (;;) {
        reap(s);
        if (s->outstanding == 0)
            break;
        enter_wait(s, 1);
    }
}

/* poll-batch: one RECVMSG per ready connection into its own buffer, one enter. */
static void recv_batch(struct server *s)
{
    int n = s->nready;
    int *batch = s->ready;
    s->ready = s->rbatch;
    s->rbatch = batch;
    s->nready = 0;
    for (int i = 0; i < n; i++) {
        struct sconn *c = &s->conns[batch[i]];
        c->queued = 0;
        struct io_uring_sqe *sqe = get_sqe(s);
        io_uring_prep_recvmsg(sqe, c->fd, &c->rmsg, MSG_DONTWAIT);
        io_uring_sqe_set_data64(sqe, UD(T_RECV, batch[i]));
        s->outstanding++;
        s->c.recv_ops++;
    }
    if (s->outstanding > 0)
        run_batch(s);
}

/* Every variant: one SENDMSG per connection owing responses, one enter. */
static void send_batch(struct server *s)
{
    int n = s->nsend;
    int *batch = s->sendq;
    s->sendq = s->sbatch;
    s->sbatch = batch;
    s->nsend = 0;
    for (int i = 0; i < n; i++) {
        struct sconn *c = &s->conns[batch[i]];
        c->send_state = 0;
        if (c->want_out || c->owed_bytes == 0)
            continue;
        size_t len = c->owed_bytes < resp_send_cap ? (size_t)c->owed_bytes : resp_send_cap;
        c->siov.iov_base = resp_pattern + c->sent_bytes % RESP_LEN;
        c->siov.iov_len = len;
        c->send_len = len;
        c->send_state = 2;
        struct io_uring_sqe *sqe = get_sqe(s);
        io_uring_prep_sendmsg(sqe, c->fd, &c->smsg, MSG_DONTWAIT | MSG_NOSIGNAL);
        io_uring_sqe_set_data64(sqe, UD(T_SEND, batch[i]));
        s->outstanding++;
    }
    if (s->outstanding > 0)
        run_batch(s);
}

static int fail_setup(struct server *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof(s->err), fmt, ap);
    va_end(ap);
    return -1;
}



static int server_setup(struct server *s)
{
    char why[200];
    s->kind = V_KIND(s->variant);
    s->drain = drain_of(s->variant);
    if (ring_setup(&s->ring, s->drain == DRAIN_FLAG, why, sizeof(why)) != 0)
        return fail_setup(s, "%s", why);
    s->ring_up = 1;
    if (s->kind != V_POLL) {
        s->inc = s->kind == V_BUFRING_INC;
        if (bufring_register(&s->ring, opt.bufs, s->inc, &s->br, &s->br_bytes, why, sizeof(why)) != 0)
            return fail_setup(s, "%s", why);
        s->br_mask = (unsigned)io_uring_buf_ring_mask(opt.bufs);
        if (posix_memalign((void **)&s->bufmem, 4096, (size_t)opt.bufs * opt.buf_size) != 0)
            return fail_setup(s, "out of memory for %u buffers", opt.bufs);
        memset(s->bufmem, 0, (size_t)opt.bufs * opt.buf_size);
        s->boff = calloc(opt.bufs, sizeof(uint32_t));
        for (unsigned b = 0; b < opt.bufs; b++)
            return_buffer(s, b);
        io_uring_buf_ring_advance(s->br, s->br_pending);
        s->br_pending = 0;
    }
    for (int i = 0; i < s->nconns; i++)
        arm(s, &s->conns[i]);
    arm_wake(s);
    submit(s);
    return 0;
}

/* On the server thread: the registered ring fd belongs to it. The multishot recvs are
 * cancelled and their final CQEs awaited first, so the kernel is done with the buffers
 * before they are freed. */
static void server_teardown(struct server *s)
{
    if (s->ring_up) {
        s->closing = 1;
        for (int i = 0; i < s->nconns; i++) {
            if (!s->conns[i].armed)
                continue;
            struct io_uring_sqe *sqe = get_sqe(s);
            io_uring_prep_cancel64(sqe, UD(T_RECVMS, i), 0);
            io_uring_sqe_set_data64(sqe, UD(T_CANCEL, i));
        }
        submit(s);
        reap(s);
        while (s->armed > 0) {
            enter_wait(s, 1);
            reap(s);
        }
        io_uring_unregister_ring_fd(&s->ring);
        io_uring_queue_exit(&s->ring);
        s->ring_up = 0;
    }
}

void *server_main(void *arg)
{
    struct server *s = arg;
    pin(SERVER_CPU, "server");
    if (server_setup(s) != 0) {
        server_teardown(s);
        atomic_store(&s->ready_state, -1);
        return NULL;
    }
    atomic_store(&s->ready_state, 1);

    for (;;) {
        int ph = atomic_load_explicit(&phase, memory_order_relaxed);
        if (ph >= PH_MEASURE && !s->measuring) {
            s->measuring = 1;
            snapshot(s, &s->at_measure);
        }
        if (ph >= PH_STOP && !s->stopped) {
            s->stopped = 1;
            snapshot(s, &s->at_stop);
        }
        /* Wait for readiness, or only collect what is there when work carries over. */
        wait_and_collect(s, s->nready == 0 && s->nsend == 0);
        flush_arms(s);
        if (s->kind == V_POLL && s->nready > 0) {
            recv_batch(s);
            flush_arms(s);
        }
        if (s->nsend > 0) {
            send_batch(s);
            flush_arms(s);
        }
        s->c.passes++;
        if (atomic_load(&client_done)) {
            /* Every answer is in and the load generator is idle. */
            if (!s->stopped) {
                s->stopped = 1;
                snapshot(s, &s->at_stop);
            }
            break;
        }
    }
    server_teardown(s);
    return NULL;
}
