/*
 * ringrecv.c - A/B measurement of two ways an io_uring event loop can receive from many
 * TCP connections:
 *
 *   poll-batch   what src/Native/src/ktl_uring.c does: one multishot POLL_ADD per
 *                connection; each pass collects the ready connections and submits one
 *                RECVMSG (MSG_DONTWAIT) per ready socket straight into that connection's
 *                own buffer, all in one io_uring_enter that returns every result.
 *   bufring      one multishot RECV per connection with IOSQE_BUFFER_SELECT from a
 *                provided buffer ring; each CQE's data is copied into the connection's own
 *                buffer and the ring buffer is handed back at once.
 *   bufring-inc  as bufring, with incremental buffer consumption (IOU_PBUF_RING_INC,
 *                Linux 6.12): a buffer serves several receives until it is full.
 *
 * In all three, the pass's responses go out as one batch of SENDMSG (MSG_DONTWAIT |
 * MSG_NOSIGNAL) in one io_uring_enter whose results are reaped before the pass ends.
 *
 * A server thread (CPU 1) runs the variant; a load generator thread (CPU 0, epoll and
 * plain syscalls) keeps `depth` pipelined HTTP requests in flight on each connection.
 * See README.md next to this file.
 *
 * Build: gcc -O2 -Wall -Wextra -pthread -o ringrecv benchmarks/ringrecv/ringrecv.c -l:liburing.a
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <liburing.h>

/* Linux 6.12 names that liburing 2.3's headers predate. */
#ifndef IOU_PBUF_RING_INC
#define IOU_PBUF_RING_INC 2
#endif
#ifndef IORING_CQE_F_BUF_MORE
#define IORING_CQE_F_BUF_MORE (1U << 4)
#endif

/* ------------------------------------------------------------------------------------- */
/* Wire content                                                                          */

static const char REQUEST[] = "GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n";
static const char RESPONSE[] =
    "HTTP/1.1 200 OK\r\n"
    "Content-Length: 13\r\n"
    "Content-Type: text/plain\r\n"
    "Date: Thu, 01 Jan 2026 00:00:00 GMT\r\n"
    "Server: K\r\n"
    "\r\n"
    "Hello, World!";
#define REQ_LEN (sizeof(REQUEST) - 1)
#define RESP_LEN (sizeof(RESPONSE) - 1)

/* The response stream repeated: the bytes from stream offset o are at resp_pattern + o % RESP_LEN. */
#define RESP_REPEAT 1024
static char *resp_pattern;     /* RESP_REPEAT + 1 copies */
static size_t resp_send_cap;   /* largest single send: RESP_REPEAT copies */
static char *req_pattern;      /* enough copies of REQUEST for one server read plus one */
#define CLIENT_READ 65536      /* client read size; resp_pattern covers it at any offset */

/* ------------------------------------------------------------------------------------- */
/* Options                                                                               */

enum { V_POLL, V_BUFRING, V_BUFRING_INC, V_COUNT };
static const char *const variant_names[V_COUNT] = { "poll-batch", "bufring", "bufring-inc" };

static struct {
    int conns, depth, rounds;
    double seconds, warmup;
    size_t buf_size;
    unsigned bufs;
    int variants[V_COUNT], nvariants;
    int check;      /* compare every received request byte on the server too */
    int sndbuf;     /* server SO_SNDBUF (0: default); small values exercise short sends */
    int verbose;
} opt = {
    .conns = 256, .depth = 16, .rounds = 5, .seconds = 4, .warmup = 1,
    .buf_size = 4096, .bufs = 1024,
};

#define SERVER_CPU 1
#define CLIENT_CPU 0
#define RING_ENTRIES 1024 /* as UringEngine.RingEntries; the CQ is 4x */
#define BGID 0

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ringrecv: FATAL: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static double now_s(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void pin(int cpu, const char *who)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        fprintf(stderr, "ringrecv: warning: cannot pin the %s to CPU %d: %s\n", who, cpu, strerror(errno));
}

/* Run phases, set by the main thread. */
enum { PH_WARMUP, PH_MEASURE, PH_STOP };
static _Atomic int phase;
/* Set by the load generator once every answer is in; it then writes the server's eventfd. */
static _Atomic int client_done;

/* ------------------------------------------------------------------------------------- */
/* Server                                                                                */

/* user_data: kind << 32 | connection index */
enum { T_POLL = 1, T_RECV, T_SEND, T_RECVMS, T_POLLOUT, T_WAKE, T_CANCEL };
#define UD(kind, idx) (((uint64_t)(kind) << 32) | (uint32_t)(idx))

struct sconn {
    int fd;
    uint8_t match;      /* how much of "\r\n\r\n" ends the bytes seen so far */
    uint8_t queued;     /* poll-batch: in the ready list */
    uint8_t hup;        /* poll-batch: the peer hung up (read until EOF) */
    uint8_t want_out;   /* a send came up short: wait for POLLOUT */
    uint8_t send_state; /* 0 idle, 1 in the send list, 2 in flight */
    uint8_t rearm;      /* in the re-arm list */
    uint8_t armed;      /* bufring: the multishot recv is live (no final CQE yet) */
    uint32_t check_off; /* --check: position in the request stream, mod REQ_LEN */
    uint64_t requests, recv_bytes, sent_bytes, owed_bytes;
    size_t send_len;
    uint8_t *rbuf;      /* the connection's own buffer ("pipe memory") */
    struct iovec riov, siov;
    struct msghdr rmsg, smsg;
};

struct counters {
    double wall, cpu;
    uint64_t enters, cqes, requests, passes, enobufs, ms_ended, short_sends, eagain_sends,
        recv_eagain, recv_ops, recv_cqes, bytes, wait_cqes;
};

struct server {
    int variant;
    struct io_uring ring;
    int ring_up;
    struct sconn *conns;
    int nconns;
    int *ready, nready, *rbatch; /* poll-batch: ready connections; the pass's recv batch */
    int *sendq, nsend, *sbatch;  /* connections owing responses; the pass's send batch */
    int *rearmq, nrearm;         /* polls / multishot recvs to arm again */
    int *outq, nout;             /* bufring: one-shot POLLOUT to arm */
    int outstanding;             /* batch ops (RECV/SEND) whose CQE has not arrived */
    int armed;                   /* bufring: live multishot recvs */
    int closing;                 /* tearing down: nothing is re-armed */
    int wake_fd;                 /* blocking eventfd with a read always pending, as in ktl_uring.c */
    int wake_rearm;
    uint64_t wake_value;

    /* provided buffer ring */
    struct io_uring_buf_ring *br;
    size_t br_bytes;
    uint8_t *bufmem;
    uint32_t *boff;   /* incremental mode: bytes of each buffer consumed so far */
    unsigned br_mask;
    int br_pending;   /* buffers added since the last tail update */
    int inc;

    struct counters c;          /* running totals (wall/cpu unused) */
    struct counters at_measure, at_stop;
    int measuring, stopped;

    _Atomic int ready_state;    /* 0 starting, 1 serving, -1 failed (why in err) */
    char err[256];
};

static void snapshot(struct server *s, struct counters *out)
{
    *out = s->c;
    out->wall = now_s(CLOCK_MONOTONIC);
    out->cpu = now_s(CLOCK_THREAD_CPUTIME_ID);
}

/* Every io_uring_enter the server makes goes through one of these three, which count it. */
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

static void queue_ready(struct server *s, struct sconn *c)
{
    if (!c->queued) {
        c->queued = 1;
        s->ready[s->nready++] = (int)(c - s->conns);
    }
}

static void queue_send(struct server *s, struct sconn *c)
{
    if (c->send_state == 0 && !c->want_out && c->owed_bytes > 0) {
        c->send_state = 1;
        s->sendq[s->nsend++] = (int)(c - s->conns);
    }
}

static void queue_rearm(struct server *s, struct sconn *c)
{
    if (!c->rearm && !s->closing) {
        c->rearm = 1;
        s->rearmq[s->nrearm++] = (int)(c - s->conns);
    }
}

static void want_out(struct server *s, struct sconn *c)
{
    c->want_out = 1;
    /* poll-batch: the connection's multishot poll includes POLLOUT, as ours does. */
    if (s->variant != V_POLL)
        s->outq[s->nout++] = (int)(c - s->conns);
}

/* Counts the request terminators in data, one split across reads included. */
static unsigned scan_requests(struct sconn *c, const uint8_t *p, size_t n)
{
    unsigned found = 0;
    unsigned m = c->match;
    for (size_t i = 0; i < n; i++) {
        uint8_t ch = p[i];
        if (ch == '\r')
            m = (m == 2) ? 3 : 1;
        else if (ch == '\n') {
            if (m == 3) {
                found++;
                m = 0;
            } else
                m = (m == 1) ? 2 : 0;
        } else
            m = 0;
    }
    c->match = (uint8_t)m;
    return found;
}

/* The received bytes are in the connection's own buffer: count requests and owe responses. */
static void consume(struct server *s, struct sconn *c, size_t n)
{
    if (opt.check) {
        if (memcmp(c->rbuf, req_pattern + c->check_off, n) != 0)
            die("server: connection %d received bytes that are not the request stream (offset %llu, %zu bytes)",
                (int)(c - s->conns), (unsigned long long)c->recv_bytes, n);
        c->check_off = (uint32_t)((c->check_off + n) % REQ_LEN);
    }
    c->recv_bytes += n;
    s->c.bytes += n;
    unsigned k = scan_requests(c, c->rbuf, n);
    if (k > 0) {
        c->requests += k;
        s->c.requests += k;
        c->owed_bytes += (uint64_t)k * RESP_LEN;
        queue_send(s, c);
    }
}

/* The load generator never closes a connection while the server runs. */
static void on_eof(struct server *s, struct sconn *c)
{
    die("server: connection %d: unexpected end of stream (%llu requests, %llu response bytes unsent)",
        (int)(c - s->conns), (unsigned long long)c->requests, (unsigned long long)c->owed_bytes);
}

static void return_buffer(struct server *s, unsigned bid)
{
    io_uring_buf_ring_add(s->br, s->bufmem + (size_t)bid * opt.buf_size, (unsigned)opt.buf_size,
                          (unsigned short)bid, (int)s->br_mask, s->br_pending);
    s->br_pending++;
}

static void on_recvms(struct server *s, struct sconn *c, int res, unsigned flags)
{
    if (flags & IORING_CQE_F_BUFFER) {
        unsigned bid = flags >> IORING_CQE_BUFFER_SHIFT;
        if (bid >= opt.bufs)
            die("server: CQE names buffer %u of %u", bid, opt.bufs);
        if (res > 0) {
            uint32_t off = s->inc ? s->boff[bid] : 0;
            if ((size_t)off + (size_t)res > opt.buf_size)
                die("server: buffer %u: %u + %d bytes exceed its %zu", bid, off, res, opt.buf_size);
            memcpy(c->rbuf, s->bufmem + (size_t)bid * opt.buf_size + off, (size_t)res);
            if (s->inc && (flags & IORING_CQE_F_BUF_MORE)) {
                s->boff[bid] = off + (uint32_t)res;
            } else {
                if (s->inc)
                    s->boff[bid] = 0;
                return_buffer(s, bid);
            }
            s->c.recv_cqes++;
            consume(s, c, (size_t)res);
        } else if (!(s->inc && (flags & IORING_CQE_F_BUF_MORE))) {
            if (s->inc)
                s->boff[bid] = 0;
            return_buffer(s, bid);
        }
    } else if (res > 0) {
        die("server: multishot recv data without a buffer");
    }

    if (flags & IORING_CQE_F_MORE) {
        if (res <= 0)
            die("server: multishot recv result %d while still armed", res);
        return;
    }
    /* The multishot recv ended. */
    c->armed = 0;
    s->armed--;
    if (res == -ECANCELED && s->closing)
        return;
    if (res == 0)
        on_eof(s, c);
    else if (res == -ENOBUFS) {
        s->c.enobufs++; /* the ring ran dry: re-armed once this reap has returned its buffers */
        queue_rearm(s, c);
    } else if (res > 0) {
        s->c.ms_ended++; /* ended for another reason (e.g. CQ overflow): re-arm */
        queue_rearm(s, c);
    } else {
        die("server: multishot recv on connection %d: %s", (int)(c - s->conns), strerror(-res));
    }
}

static void on_send(struct server *s, struct sconn *c, int res)
{
    c->send_state = 0;
    if (res > 0) {
        c->sent_bytes += (uint64_t)res;
        c->owed_bytes -= (uint64_t)res;
        if ((size_t)res < c->send_len) {
            s->c.short_sends++;
            want_out(s, c); /* the rest goes once the socket has room */
        }
    } else if (res == -EAGAIN) {
        s->c.eagain_sends++;
        want_out(s, c);
    } else {
        die("server: sendmsg on connection %d: %s", (int)(c - s->conns), res == 0 ? "sent 0 bytes" : strerror(-res));
    }
    queue_send(s, c); /* capped send, or responses owed meanwhile */
}

static void handle_cqe(struct server *s, const struct io_uring_cqe *cqe)
{
    unsigned kind = (unsigned)(cqe->user_data >> 32);
    uint32_t idx = (uint32_t)cqe->user_data;
    if (kind == T_WAKE) {
        if (cqe->res >= 0 || cqe->res == -EINTR || cqe->res == -EAGAIN)
            s->wake_rearm = 1;
        else if (cqe->res != -ECANCELED)
            die("server: eventfd read: %s", strerror(-cqe->res));
        return;
    }
    if (kind == T_CANCEL)
        return; /* the cancelled recv's own final CQE is what counts */
    if (idx >= (uint32_t)s->nconns)
        die("server: CQE for unknown connection %u", idx);
    struct sconn *c = &s->conns[idx];
    int res = cqe->res;

    switch (kind) {
    case T_POLL:
        if (res < 0) {
            if (res == -ECANCELED)
                break;
            die("server: poll on connection %u: %s", idx, strerror(-res));
        }
        if (res & (POLLRDHUP | POLLHUP | POLLERR))
            c->hup = 1;
        if (res & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))
            queue_ready(s, c);
        if ((res & (POLLOUT | POLLHUP | POLLERR)) && c->want_out) {
            c->want_out = 0;
            queue_send(s, c);
        }
        if (!(cqe->flags & IORING_CQE_F_MORE))
            queue_rearm(s, c);
        break;
    case T_RECV:
        s->outstanding--;
        if (res > 0) {
            s->c.recv_cqes++;
            consume(s, c, (size_t)res);
            /* a full read may have left more; after a hang-up, read until EOF */
            if ((size_t)res == opt.buf_size || c->hup)
                queue_ready(s, c);
        } else if (res == 0) {
            on_eof(s, c);
        } else if (res == -EAGAIN) {
            s->c.recv_eagain++;
        } else {
            die("server: recvmsg on connection %u: %s", idx, strerror(-res));
        }
        break;
    case T_SEND:
        s->outstanding--;
        on_send(s, c, res);
        break;
    case T_RECVMS:
        on_recvms(s, c, res, cqe->flags);
        break;
    case T_POLLOUT:
        if (res < 0 && res != -ECANCELED)
            die("server: POLLOUT poll on connection %u: %s", idx, strerror(-res));
        c->want_out = 0;
        queue_send(s, c);
        break;
    default:
        die("server: CQE of unknown kind %u", kind);
    }
}

/* Consumes every CQE in the ring, then hands the pass's buffers back in one tail update. */
static void reap(struct server *s)
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
}

static void arm(struct server *s, struct sconn *c)
{
    struct io_uring_sqe *sqe = get_sqe(s);
    int idx = (int)(c - s->conns);
    if (s->variant == V_POLL) {
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

/* The ring as ktl_ring_create/ktl_ring_start make it. */
static int ring_setup(struct io_uring *ring, char *why, size_t whylen)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_SUBMIT_ALL
        | IORING_SETUP_CQSIZE | IORING_SETUP_R_DISABLED;
    p.cq_entries = RING_ENTRIES * 4;
    int r = io_uring_queue_init_params(RING_ENTRIES, ring, &p);
    if (r < 0) {
        snprintf(why, whylen, "io_uring_setup(SINGLE_ISSUER|DEFER_TASKRUN|SUBMIT_ALL|CQSIZE): %s", strerror(-r));
        return -1;
    }
    r = io_uring_enable_rings(ring);
    if (r < 0) {
        snprintf(why, whylen, "IORING_REGISTER_ENABLE_RINGS: %s", strerror(-r));
        io_uring_queue_exit(ring);
        return -1;
    }
    if (io_uring_register_ring_fd(ring) != 1) {
        snprintf(why, whylen, "IORING_REGISTER_RING_FDS failed");
        io_uring_queue_exit(ring);
        return -1;
    }
    return 0;
}

/* Registers buffer group BGID with `entries` entries; the ring memory is page aligned. */
static int bufring_register(struct io_uring *ring, unsigned entries, int inc, struct io_uring_buf_ring **out,
                            size_t *bytes, char *why, size_t whylen)
{
    size_t len = (size_t)entries * sizeof(struct io_uring_buf);
    long page = sysconf(_SC_PAGESIZE);
    len = (len + (size_t)page - 1) & ~((size_t)page - 1);
    void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        snprintf(why, whylen, "mmap of the buffer ring: %s", strerror(errno));
        return -1;
    }
    struct io_uring_buf_ring *br = mem;
    io_uring_buf_ring_init(br);
    struct io_uring_buf_reg reg;
    memset(&reg, 0, sizeof(reg));
    reg.ring_addr = (uint64_t)(uintptr_t)br;
    reg.ring_entries = entries;
    reg.bgid = BGID;
    reg.pad = inc ? IOU_PBUF_RING_INC : 0; /* the kernel's io_uring_buf_reg.flags */
    int r = io_uring_register_buf_ring(ring, &reg, 0);
    if (r < 0) {
        snprintf(why, whylen, "IORING_REGISTER_PBUF_RING%s: %s", inc ? " with IOU_PBUF_RING_INC" : "", strerror(-r));
        munmap(mem, len);
        return -1;
    }
    *out = br;
    *bytes = len;
    return 0;
}

static int server_setup(struct server *s)
{
    char why[200];
    if (ring_setup(&s->ring, why, sizeof(why)) != 0)
        return fail_setup(s, "%s", why);
    s->ring_up = 1;
    if (s->variant != V_POLL) {
        s->inc = s->variant == V_BUFRING_INC;
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

static void *server_main(void *arg)
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
        enter_wait(s, s->nready == 0 && s->nsend == 0);
        uint64_t before = s->c.cqes;
        reap(s);
        s->c.wait_cqes += s->c.cqes - before; /* what one wait surfaced */
        flush_arms(s);
        if (s->variant == V_POLL && s->nready > 0) {
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

/* ------------------------------------------------------------------------------------- */
/* Load generator                                                                        */

struct cconn {
    int fd;
    int state;          /* 0 waiting for answers, 1 idle (stopping) */
    uint64_t sent_requests, recv_bytes;
    uint64_t expect;    /* response bytes still due for the current batch */
    size_t wleft, woff; /* the current batch's request bytes not yet written */
};

struct client {
    struct cconn *conns;
    int nconns;
    int ep;
    char *wbuf;         /* depth requests */
    size_t wlen;
    char *rbuf;
    int wake_fd;        /* the server's eventfd */
};

static void client_write(struct client *cl, struct cconn *c)
{
    while (c->wleft > 0) {
        ssize_t n = write(c->fd, cl->wbuf + c->woff, c->wleft);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT, .data.u32 = (uint32_t)(c - cl->conns) };
                epoll_ctl(cl->ep, EPOLL_CTL_MOD, c->fd, &ev);
                return;
            }
            die("client: write on connection %d: %s", (int)(c - cl->conns), strerror(errno));
        }
        c->woff += (size_t)n;
        c->wleft -= (size_t)n;
        if (c->wleft == 0 && c->woff != cl->wlen)
            die("client: write accounting");
    }
}

static void client_send_batch(struct client *cl, struct cconn *c)
{
    c->expect = (uint64_t)opt.depth * RESP_LEN;
    c->sent_requests += (uint64_t)opt.depth;
    c->woff = 0;
    c->wleft = cl->wlen;
    client_write(cl, c);
}

static void *client_main(void *arg)
{
    struct client *cl = arg;
    pin(CLIENT_CPU, "load generator");
    struct epoll_event evs[512];
    int idle = 0, stopping = 0, quiet = 0;

    for (int i = 0; i < cl->nconns; i++)
        client_send_batch(cl, &cl->conns[i]);

    while (idle < cl->nconns) {
        int n = epoll_wait(cl->ep, evs, 512, 1000);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("client: epoll_wait: %s", strerror(errno));
        }
        if (n == 0) {
            if (++quiet >= 10)
                die("client: no progress for 10 s (%d of %d connections have all their answers)", idle, cl->nconns);
            continue;
        }
        quiet = 0;
        for (int e = 0; e < n; e++) {
            struct cconn *c = &cl->conns[evs[e].data.u32];
            if ((evs[e].events & EPOLLOUT) && c->wleft > 0) {
                client_write(cl, c);
                if (c->wleft == 0) {
                    struct epoll_event ev = { .events = EPOLLIN, .data.u32 = evs[e].data.u32 };
                    epoll_ctl(cl->ep, EPOLL_CTL_MOD, c->fd, &ev);
                }
            }
            if (!(evs[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                continue;
            ssize_t r = read(c->fd, cl->rbuf, CLIENT_READ);
            if (r < 0) {
                if (errno == EAGAIN || errno == EINTR)
                    continue;
                die("client: read on connection %u: %s", evs[e].data.u32, strerror(errno));
            }
            if (r == 0)
                die("client: connection %u: the server closed it with %llu response bytes due", evs[e].data.u32,
                    (unsigned long long)c->expect);
            if ((uint64_t)r > c->expect)
                die("client: connection %u: %zd response bytes arrived, only %llu were due (a request answered twice?)",
                    evs[e].data.u32, r, (unsigned long long)c->expect);
            if (memcmp(cl->rbuf, resp_pattern + c->recv_bytes % RESP_LEN, (size_t)r) != 0)
                die("client: connection %u: response bytes differ from the response stream at offset %llu",
                    evs[e].data.u32, (unsigned long long)c->recv_bytes);
            c->recv_bytes += (uint64_t)r;
            c->expect -= (uint64_t)r;
            if (c->expect == 0) {
                if (!stopping && atomic_load_explicit(&phase, memory_order_relaxed) >= PH_STOP)
                    stopping = 1;
                if (stopping) {
                    if (c->state == 1)
                        die("client: connection %u completed a batch twice", evs[e].data.u32);
                    c->state = 1;
                    idle++;
                } else {
                    client_send_batch(cl, c);
                }
            }
        }
        if (!stopping && atomic_load_explicit(&phase, memory_order_relaxed) >= PH_STOP)
            stopping = 1;
    }
    /* Every answer is in: wake the server, which then stops. */
    atomic_store(&client_done, 1);
    uint64_t one = 1;
    if (write(cl->wake_fd, &one, sizeof(one)) != sizeof(one))
        die("client: eventfd write: %s", strerror(errno));
    return NULL;
}

/* ------------------------------------------------------------------------------------- */
/* One measurement                                                                       */

struct result {
    int valid;
    double rps, cpu_us, enters, cqes, passes_per_s, cqes_per_wait;
    uint64_t requests, enobufs, ms_ended, short_sends, eagain_sends, recv_eagain, recv_ops, recv_cqes;
    double wall;
};

static int listen_fd;
static struct sockaddr_in listen_addr;
static int skipped[V_COUNT];
static char skip_why[V_COUNT][256];

static void join_or_die(pthread_t t, const char *who, double limit_s)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)limit_s;
    int r = pthread_timedjoin_np(t, NULL, &ts);
    if (r != 0)
        die("the %s thread did not finish within %.0f s of the end of the measurement: %s", who, limit_s, strerror(r));
}

static void sleep_s(double sec)
{
    if (sec <= 0)
        return;
    struct timespec ts = { .tv_sec = (time_t)sec, .tv_nsec = (long)((sec - (double)(time_t)sec) * 1e9) };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static struct result run_one(int variant)
{
    struct result res;
    memset(&res, 0, sizeof(res));
    int C = opt.conns;
    int one = 1;

    struct server *s = calloc(1, sizeof(*s));
    struct client *cl = calloc(1, sizeof(*cl));
    s->variant = variant;
    s->nconns = C;
    s->conns = calloc((size_t)C, sizeof(struct sconn));
    s->ready = calloc((size_t)C, sizeof(int));
    s->rbatch = calloc((size_t)C, sizeof(int));
    s->sendq = calloc((size_t)C, sizeof(int));
    s->sbatch = calloc((size_t)C, sizeof(int));
    s->rearmq = calloc((size_t)C, sizeof(int));
    s->outq = calloc((size_t)C, sizeof(int));
    cl->nconns = C;
    cl->conns = calloc((size_t)C, sizeof(struct cconn));
    cl->wlen = (size_t)opt.depth * REQ_LEN;
    cl->wbuf = malloc(cl->wlen);
    for (int d = 0; d < opt.depth; d++)
        memcpy(cl->wbuf + (size_t)d * REQ_LEN, REQUEST, REQ_LEN);
    cl->rbuf = malloc(CLIENT_READ);
    uint8_t *pipe_mem;
    if (posix_memalign((void **)&pipe_mem, 4096, (size_t)C * opt.buf_size) != 0)
        die("out of memory for the connection buffers");
    memset(pipe_mem, 0, (size_t)C * opt.buf_size);

    /* Fresh connections for every measurement, all established before anything runs. */
    for (int i = 0; i < C; i++) {
        int cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (cfd < 0)
            die("socket: %s", strerror(errno));
        if (connect(cfd, (struct sockaddr *)&listen_addr, sizeof(listen_addr)) != 0)
            die("connect %d: %s", i, strerror(errno));
        int sfd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (sfd < 0)
            die("accept4 %d: %s", i, strerror(errno));
        int fl = fcntl(cfd, F_GETFL);
        if (fl < 0 || fcntl(cfd, F_SETFL, fl | O_NONBLOCK) != 0)
            die("fcntl: %s", strerror(errno));
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        setsockopt(sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (opt.sndbuf > 0)
            setsockopt(sfd, SOL_SOCKET, SO_SNDBUF, &opt.sndbuf, sizeof(opt.sndbuf));
        struct sconn *sc = &s->conns[i];
        sc->fd = sfd;
        sc->rbuf = pipe_mem + (size_t)i * opt.buf_size;
        sc->riov.iov_base = sc->rbuf;
        sc->riov.iov_len = opt.buf_size;
        sc->rmsg.msg_iov = &sc->riov;
        sc->rmsg.msg_iovlen = 1;
        sc->smsg.msg_iov = &sc->siov;
        sc->smsg.msg_iovlen = 1;
        cl->conns[i].fd = cfd;
    }
    cl->ep = epoll_create1(EPOLL_CLOEXEC);
    for (int i = 0; i < C; i++) {
        struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)i };
        if (epoll_ctl(cl->ep, EPOLL_CTL_ADD, cl->conns[i].fd, &ev) != 0)
            die("epoll_ctl: %s", strerror(errno));
    }

    s->wake_fd = eventfd(0, EFD_CLOEXEC); /* blocking, as ktl_ring_start requires */
    if (s->wake_fd < 0)
        die("eventfd: %s", strerror(errno));
    cl->wake_fd = s->wake_fd;
    atomic_store(&phase, PH_WARMUP);
    atomic_store(&client_done, 0);
    pthread_t st, ct;
    if (pthread_create(&st, NULL, server_main, s) != 0)
        die("pthread_create");
    while (atomic_load(&s->ready_state) == 0)
        sleep_s(0.001);
    if (atomic_load(&s->ready_state) < 0) {
        pthread_join(st, NULL);
        skipped[variant] = 1;
        snprintf(skip_why[variant], sizeof(skip_why[variant]), "%s", s->err);
        printf("variant %s skipped: %s\n", variant_names[variant], s->err);
        fflush(stdout);
    } else {
        if (pthread_create(&ct, NULL, client_main, cl) != 0)
            die("pthread_create");
        sleep_s(opt.warmup);
        atomic_store(&phase, PH_MEASURE);
        sleep_s(opt.seconds);
        atomic_store(&phase, PH_STOP);
        join_or_die(ct, "load generator", 20);
        join_or_die(st, "server", 20);

        /* Every request answered exactly once, every byte accounted for, nothing more on the way. */
        for (int i = 0; i < C; i++) {
            char extra[64];
            ssize_t r = read(cl->conns[i].fd, extra, sizeof(extra));
            if (r > 0)
                die("%s: connection %d: %zd response bytes arrived after every request had its answer",
                    variant_names[variant], i, r);
            if (r == 0 || errno != EAGAIN)
                die("%s: connection %d: closed or failed at the end: %s", variant_names[variant], i,
                    r == 0 ? "EOF" : strerror(errno));
            struct sconn *sc = &s->conns[i];
            struct cconn *cc = &cl->conns[i];
            if (sc->requests != cc->sent_requests || sc->recv_bytes != cc->sent_requests * REQ_LEN
                || sc->sent_bytes != sc->requests * RESP_LEN || cc->recv_bytes != cc->sent_requests * RESP_LEN
                || sc->owed_bytes != 0)
                die("%s: connection %d: client sent %llu requests and received %llu bytes; server counted %llu requests "
                    "in %llu bytes and sent %llu bytes",
                    variant_names[variant], i, (unsigned long long)cc->sent_requests,
                    (unsigned long long)cc->recv_bytes, (unsigned long long)sc->requests,
                    (unsigned long long)sc->recv_bytes, (unsigned long long)sc->sent_bytes);
        }

        const struct counters *a = &s->at_measure, *b = &s->at_stop;
        double reqs = (double)(b->requests - a->requests);
        res.valid = reqs > 0;
        res.wall = b->wall - a->wall;
        res.requests = b->requests - a->requests;
        res.rps = reqs / res.wall;
        res.cpu_us = (b->cpu - a->cpu) * 1e6 / reqs;
        res.enters = (double)(b->enters - a->enters) / reqs;
        res.cqes = (double)(b->cqes - a->cqes) / reqs;
        res.passes_per_s = (double)(b->passes - a->passes) / res.wall;
        res.cqes_per_wait = (double)(b->wait_cqes - a->wait_cqes) / (double)(b->passes - a->passes);
        res.enobufs = b->enobufs - a->enobufs;
        res.ms_ended = b->ms_ended - a->ms_ended;
        res.short_sends = b->short_sends - a->short_sends;
        res.eagain_sends = b->eagain_sends - a->eagain_sends;
        res.recv_eagain = b->recv_eagain - a->recv_eagain;
        res.recv_ops = b->recv_ops - a->recv_ops;
        res.recv_cqes = b->recv_cqes - a->recv_cqes;
        if (opt.verbose)
            fprintf(stderr,
                    "  [%s] lifetime: %llu io_uring_enter, %llu CQEs, %llu passes, %llu requests, %llu ENOBUFS\n",
                    variant_names[variant], (unsigned long long)s->c.enters, (unsigned long long)s->c.cqes,
                    (unsigned long long)s->c.passes, (unsigned long long)s->c.requests,
                    (unsigned long long)s->c.enobufs);
    }

    struct linger lg = { .l_onoff = 1, .l_linger = 0 }; /* RST: no TIME_WAIT piles up across runs */
    for (int i = 0; i < C; i++) {
        setsockopt(cl->conns[i].fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        setsockopt(s->conns[i].fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        close(cl->conns[i].fd);
        close(s->conns[i].fd);
    }
    close(cl->ep);
    close(s->wake_fd);
    if (s->br != NULL)
        munmap(s->br, s->br_bytes);
    free(s->bufmem);
    free(s->boff);
    free(pipe_mem);
    free(s->conns);
    free(s->ready);
    free(s->rbatch);
    free(s->sendq);
    free(s->sbatch);
    free(s->rearmq);
    free(s->outq);
    free(s);
    free(cl->conns);
    free(cl->wbuf);
    free(cl->rbuf);
    free(cl);
    return res;
}

/* ------------------------------------------------------------------------------------- */
/* Probe: does the kernel take the variant at all? (A refusal is reported, not fatal.)    */

static int probe(int variant, char *why, size_t whylen)
{
    struct io_uring ring;
    struct io_uring_buf_ring *br = NULL;
    size_t br_bytes = 0;
    static char buf[64]; /* outlives the ring's asynchronous teardown */
    int sv[2] = { -1, -1 }, ok = -1;

    if (ring_setup(&ring, why, whylen) != 0)
        return -1;
    if (variant != V_POLL
        && bufring_register(&ring, 8, variant == V_BUFRING_INC, &br, &br_bytes, why, whylen) != 0)
        goto out;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(why, whylen, "socketpair: %s", strerror(errno));
        goto out;
    }
    if (br != NULL) {
        io_uring_buf_ring_add(br, buf, sizeof(buf), 0, io_uring_buf_ring_mask(8), 0);
        io_uring_buf_ring_advance(br, 1);
    }
    if (write(sv[1], "ping", 4) != 4) {
        snprintf(why, whylen, "socketpair write: %s", strerror(errno));
        goto out;
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    if (variant == V_POLL) {
        io_uring_prep_poll_multishot(sqe, sv[0], POLLIN | POLLOUT | POLLRDHUP);
    } else {
        io_uring_prep_recv_multishot(sqe, sv[0], NULL, 0, 0);
        sqe->flags |= IOSQE_BUFFER_SELECT;
        sqe->buf_group = BGID;
    }
    io_uring_sqe_set_data64(sqe, 1);
    struct io_uring_cqe *cqe;
    struct __kernel_timespec ts = { .tv_sec = 2 };
    int r = io_uring_submit_and_wait_timeout(&ring, &cqe, 1, &ts, NULL);
    if (r < 0) {
        snprintf(why, whylen, "no completion for the probe: %s", strerror(-r));
        goto out;
    }
    if (cqe->res < 0)
        snprintf(why, whylen, "%s: %s", variant == V_POLL ? "multishot POLL_ADD" : "multishot RECV", strerror(-cqe->res));
    else if (!(cqe->flags & IORING_CQE_F_MORE))
        snprintf(why, whylen, "the kernel did not keep the request multishot (flags 0x%x)", cqe->flags);
    else if (variant != V_POLL && (cqe->res != 4 || !(cqe->flags & IORING_CQE_F_BUFFER) || memcmp(buf, "ping", 4) != 0))
        snprintf(why, whylen, "the provided buffer did not receive the probe's bytes");
    else if (variant == V_BUFRING_INC && !(cqe->flags & IORING_CQE_F_BUF_MORE))
        snprintf(why, whylen, "incremental consumption not in effect (no IORING_CQE_F_BUF_MORE on a partly used buffer)");
    else
        ok = 0;
    io_uring_cqe_seen(&ring, cqe);
out:
    io_uring_unregister_ring_fd(&ring);
    io_uring_queue_exit(&ring); /* cancels the multishot request */
    if (sv[0] >= 0) {
        close(sv[0]);
        close(sv[1]);
    }
    if (br != NULL)
        munmap(br, br_bytes);
    return ok;
}

/* ------------------------------------------------------------------------------------- */
/* Options, pairing, summary                                                             */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ringrecv [--conns N] [--depth D] [--seconds M] [--warmup W] [--rounds R]\n"
            "                [--variants poll-batch,bufring,bufring-inc] [--buf-size B] [--bufs N]\n"
            "                [--check] [--sndbuf BYTES] [--verbose]\n"
            "  --conns     connections (default 256)\n"
            "  --depth     pipelined requests per connection per batch (default 16)\n"
            "  --seconds   measured seconds per run (default 4)\n"
            "  --warmup    warm-up seconds per run (default 1)\n"
            "  --rounds    rounds; each runs every variant, in rotating order (default 5)\n"
            "  --variants  which variants, comma separated; the first is the ratios' base\n"
            "  --buf-size  bytes per ring buffer and per connection read (default 4096)\n"
            "  --bufs      buffer ring entries, a power of two <= 32768 (default 1024)\n"
            "  --check     the server also compares every request byte (costs CPU; off by default)\n"
            "  --sndbuf    server sockets' SO_SNDBUF (exercises short sends)\n"
            "  --verbose   lifetime counters per run on stderr\n");
}

static int variant_by_name(const char *name, size_t len)
{
    for (int v = 0; v < V_COUNT; v++)
        if (strlen(variant_names[v]) == len && strncmp(variant_names[v], name, len) == 0)
            return v;
    return -1;
}

static void parse_args(int argc, char **argv)
{
    int have_variants = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV()                                                                                            \
    do {                                                                                                   \
        if (v == NULL)                                                                                     \
            die("%s needs a value", a);                                                                    \
        i++;                                                                                               \
    } while (0)
        if (!strcmp(a, "--conns")) {
            NEEDV();
            opt.conns = atoi(v);
        } else if (!strcmp(a, "--depth")) {
            NEEDV();
            opt.depth = atoi(v);
        } else if (!strcmp(a, "--seconds")) {
            NEEDV();
            opt.seconds = atof(v);
        } else if (!strcmp(a, "--warmup")) {
            NEEDV();
            opt.warmup = atof(v);
        } else if (!strcmp(a, "--rounds")) {
            NEEDV();
            opt.rounds = atoi(v);
        } else if (!strcmp(a, "--buf-size")) {
            NEEDV();
            opt.buf_size = (size_t)atol(v);
        } else if (!strcmp(a, "--bufs")) {
            NEEDV();
            opt.bufs = (unsigned)atol(v);
        } else if (!strcmp(a, "--sndbuf")) {
            NEEDV();
            opt.sndbuf = atoi(v);
        } else if (!strcmp(a, "--check")) {
            opt.check = 1;
        } else if (!strcmp(a, "--verbose")) {
            opt.verbose = 1;
        } else if (!strcmp(a, "--variants")) {
            NEEDV();
            have_variants = 1;
            opt.nvariants = 0;
            const char *p = v;
            while (*p) {
                const char *e = strchr(p, ',');
                size_t len = e ? (size_t)(e - p) : strlen(p);
                int id = variant_by_name(p, len);
                if (id < 0)
                    die("unknown variant '%.*s' (poll-batch, bufring, bufring-inc)", (int)len, p);
                for (int k = 0; k < opt.nvariants; k++)
                    if (opt.variants[k] == id)
                        die("variant %s given twice", variant_names[id]);
                opt.variants[opt.nvariants++] = id;
                p += len;
                if (*p == ',')
                    p++;
            }
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else {
            usage(stderr);
            die("unknown option %s", a);
        }
#undef NEEDV
    }
    if (!have_variants) {
        opt.nvariants = V_COUNT;
        for (int v = 0; v < V_COUNT; v++)
            opt.variants[v] = v;
    }
    if (opt.conns < 1 || opt.conns > 65536)
        die("--conns must be 1..65536");
    if (opt.depth < 1 || opt.depth > 4096)
        die("--depth must be 1..4096");
    if (opt.seconds <= 0 || opt.warmup < 0)
        die("--seconds must be > 0 and --warmup >= 0");
    if (opt.rounds < 1)
        die("--rounds must be >= 1");
    if (opt.buf_size < 64 || opt.buf_size > (1u << 20))
        die("--buf-size must be 64..1048576");
    if (opt.bufs < 1 || opt.bufs > 32768 || (opt.bufs & (opt.bufs - 1)) != 0)
        die("--bufs must be a power of two, 1..32768");
    if (opt.nvariants < 1)
        die("no variants");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    if (n == 0)
        return 0;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)opt.conns * 2 + 64)
        die("%d connections need %d descriptors; RLIMIT_NOFILE is %llu", opt.conns, opt.conns * 2 + 64,
            (unsigned long long)rl.rlim_cur);
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    raise_nofile();
    setvbuf(stdout, NULL, _IOLBF, 0);

    resp_pattern = malloc(RESP_LEN * (RESP_REPEAT + 1));
    for (int i = 0; i <= RESP_REPEAT; i++)
        memcpy(resp_pattern + (size_t)i * RESP_LEN, RESPONSE, RESP_LEN);
    resp_send_cap = RESP_LEN * RESP_REPEAT;
    if (RESP_LEN * RESP_REPEAT < CLIENT_READ)
        die("response pattern shorter than a client read");
    size_t req_copies = opt.buf_size / REQ_LEN + 2;
    req_pattern = malloc(REQ_LEN * req_copies);
    for (size_t i = 0; i < req_copies; i++)
        memcpy(req_pattern + i * REQ_LEN, REQUEST, REQ_LEN);

    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&listen_addr, 0, sizeof(listen_addr));
    listen_addr.sin_family = AF_INET;
    listen_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof(listen_addr);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&listen_addr, sizeof(listen_addr)) != 0
        || listen(listen_fd, 4096) != 0 || getsockname(listen_fd, (struct sockaddr *)&listen_addr, &alen) != 0)
        die("listener: %s", strerror(errno));

    printf("ringrecv: conns %d, depth %d, request %zu B, response %zu B, buf-size %zu, bufs %u, "
           "warmup %.2f s, measured %.2f s, rounds %d, server CPU %d, load CPU %d%s\n",
           opt.conns, opt.depth, REQ_LEN, RESP_LEN, opt.buf_size, opt.bufs, opt.warmup, opt.seconds, opt.rounds,
           SERVER_CPU, CLIENT_CPU, opt.check ? ", --check" : "");

    for (int k = 0; k < opt.nvariants; k++) {
        int v = opt.variants[k];
        if (probe(v, skip_why[v], sizeof(skip_why[v])) != 0) {
            skipped[v] = 1;
            printf("variant %s skipped: %s\n", variant_names[v], skip_why[v]);
        }
    }

    int nv = opt.nvariants;
    struct result *results = calloc((size_t)opt.rounds * V_COUNT, sizeof(struct result));
    for (int r = 0; r < opt.rounds; r++) {
        for (int k = 0; k < nv; k++) {
            int v = opt.variants[(r + k) % nv];
            if (skipped[v])
                continue;
            struct result res = run_one(v);
            if (!res.valid)
                continue;
            results[r * V_COUNT + v] = res;
            printf("round %d %-11s %10.0f req/s  %6.3f us/req  %6.4f enters/req  %6.3f cqes/req  %8.0f passes/s  "
                   "%5.1f recvs/pass  %5.1f cqes/wait  ENOBUFS %llu  ms-ended %llu  short-sends %llu  send-EAGAIN %llu  "
                   "recv-EAGAIN %llu  (%.2f s)\n",
                   r + 1, variant_names[v], res.rps, res.cpu_us, res.enters, res.cqes, res.passes_per_s,
                   (double)res.recv_cqes / (res.passes_per_s * res.wall), res.cqes_per_wait, (unsigned long long)res.enobufs,
                   (unsigned long long)res.ms_ended, (unsigned long long)res.short_sends,
                   (unsigned long long)res.eagain_sends, (unsigned long long)res.recv_eagain, res.wall);
        }
    }

    printf("\nsummary (medians over %d rounds)\n", opt.rounds);
    int base = opt.variants[0]; /* ratios are to poll-batch when it runs, else to the first variant */
    for (int k = 0; k < nv; k++)
        if (opt.variants[k] == V_POLL)
            base = V_POLL;
    double *a = calloc((size_t)opt.rounds, sizeof(double));
    double *b = calloc((size_t)opt.rounds, sizeof(double));
    double *c = calloc((size_t)opt.rounds, sizeof(double));
    for (int k = 0; k < nv; k++) {
        int v = opt.variants[k];
        int n = 0;
        for (int r = 0; r < opt.rounds; r++) {
            struct result *x = &results[r * V_COUNT + v];
            if (!x->valid)
                continue;
            a[n] = x->rps;
            b[n] = x->cpu_us;
            c[n] = x->enters;
            n++;
        }
        if (n == 0) {
            printf("%-11s no valid runs%s%s\n", variant_names[v], skipped[v] ? ": " : "", skipped[v] ? skip_why[v] : "");
            continue;
        }
        printf("%-11s median %10.0f req/s  %6.3f us/req  %6.4f enters/req  (%d runs)\n", variant_names[v],
               median(a, n), median(b, n), median(c, n), n);
    }
    for (int k = 0; k < nv; k++) {
        int v = opt.variants[k];
        int n = 0;
        if (v == base)
            continue;
        printf("%s/%s per round:", variant_names[v], variant_names[base]);
        for (int r = 0; r < opt.rounds; r++) {
            struct result *x = &results[r * V_COUNT + v], *y = &results[r * V_COUNT + base];
            if (!x->valid || !y->valid)
                continue;
            a[n] = x->rps / y->rps;
            b[n] = x->cpu_us / y->cpu_us;
            printf("  r%d req/s %.3f cpu/req %.3f", r + 1, a[n], b[n]);
            n++;
        }
        if (n == 0)
            printf("  (no pairs)\n");
        else {
            double mb = median(b, n);
            printf("\n  median ratio: req/s %.3f  cpu us/req %.3f\n", median(a, n), mb);
        }
    }
    free(a);
    free(b);
    free(c);
    free(results);
    close(listen_fd);
    return 0;
}
