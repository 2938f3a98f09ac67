/*
 * ringrecv - A/B measurement of two ways an io_uring event loop can receive from many
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
 * Each also runs as <name>+drain (or all of them with --drain): after the pass's wait the
 * server keeps calling io_uring_get_events while the kernel still holds deferred task work,
 * so that one pass serves more than the 20 items a DEFER_TASKRUN enter runs.
 *
 * A server thread (CPU 1) runs the variant; a load generator thread (CPU 0, epoll and
 * plain syscalls) keeps `depth` pipelined HTTP requests in flight on each connection.
 * See README.md next to this file.
 *
 * The files:
 *   ringrecv.h     this: shared types, options, counters, and what each file offers
 *   util.c         fatal errors, clocks, CPU pinning, the wire content, the run phase
 *   ring.c         the ring as our engine sets it up, the provided buffer ring, the probes
 *   server.c       the server thread: counted enters, arming, the pass loop, batches
 *   completions.c  what each server CQE means: bytes consumed, requests owed, buffers back
 *   client.c       the load generator thread
 *   run.c          one measurement: connections, threads, end-of-run checks, the result
 *   main.c         options, probing, interleaved rounds, medians and ratios
 *
 * Build: every .c file here, linked with -l:liburing.a; the command line is in README.md.
 */
#ifndef RINGRECV_H
#define RINGRECV_H

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
/* Linux 5.19 names (liburing 2.3 has them). IORING_SQ_TASKRUN is bit 2: bit 1 is CQ_OVERFLOW. */
#ifndef IORING_SETUP_TASKRUN_FLAG
#define IORING_SETUP_TASKRUN_FLAG (1U << 9)
#endif
#ifndef IORING_SQ_TASKRUN
#define IORING_SQ_TASKRUN (1U << 2)
#endif

/* Linux 6.13+: the deferred task-work items one io_uring_enter runs unless the wait asks for
 * more (io_uring/io_uring.h); a wait that surfaced this many may have left work behind. */
#define IO_LOCAL_TW_DEFAULT_MAX 20
/* --drain: at most this many io_uring_get_events after a pass's wait */
#define DRAIN_MAX_EXTRA 16

/* ------------------------------------------------------------------------------------- */
/* Wire content (util.c)                                                                 */

#define REQUEST_TEXT "GET /plaintext HTTP/1.1\r\nHost: localhost\r\n\r\n"
#define RESPONSE_TEXT                                                                      \
    "HTTP/1.1 200 OK\r\n"                                                                  \
    "Content-Length: 13\r\n"                                                               \
    "Content-Type: text/plain\r\n"                                                         \
    "Date: Thu, 01 Jan 2026 00:00:00 GMT\r\n"                                              \
    "Server: K\r\n"                                                                        \
    "\r\n"                                                                                 \
    "Hello, World!"
#define REQ_LEN (sizeof(REQUEST_TEXT) - 1)
#define RESP_LEN (sizeof(RESPONSE_TEXT) - 1)

/* The response stream repeated: the bytes from stream offset o are at resp_pattern + o % RESP_LEN. */
#define RESP_REPEAT 1024
extern char *resp_pattern;     /* RESP_REPEAT + 1 copies */
extern size_t resp_send_cap;   /* largest single send: RESP_REPEAT copies */
extern char *req_pattern;      /* enough copies of REQUEST for one server read plus one */
#define CLIENT_READ 65536      /* client read size; resp_pattern covers it at any offset */

/* Fills the patterns above (needs opt.buf_size). */
void wire_init(void);

/* ------------------------------------------------------------------------------------- */
/* Options (main.c)                                                                      */

/* A variant is a way to receive (its kind), with or without drain: kind, or kind + V_KINDS. */
enum { V_POLL, V_BUFRING, V_BUFRING_INC, V_KINDS };
#define V_COUNT (2 * V_KINDS)
#define V_KIND(v) ((v) % V_KINDS)
#define V_DRAINS(v) ((v) >= V_KINDS)
extern const char *const variant_names[V_COUNT];

/* How a drain variant tells that the kernel still holds deferred task work after an enter:
 * IORING_SQ_TASKRUN in the SQ ring flags (ring set up with IORING_SETUP_TASKRUN_FLAG), or,
 * where the kernel does not set it, the enter having surfaced IO_LOCAL_TW_DEFAULT_MAX CQEs. */
enum { DRAIN_OFF, DRAIN_FLAG, DRAIN_COUNT };
extern const char *const drain_names[3];

struct options {
    int conns, depth, rounds;
    double seconds, warmup;
    size_t buf_size;
    unsigned bufs;
    int variants[V_COUNT], nvariants;
    int check;      /* compare every received request byte on the server too */
    int sndbuf;     /* server SO_SNDBUF (0: default); small values exercise short sends */
    int verbose;
    int drain;      /* --drain: every variant given runs as its +drain form */
    int drain_by;   /* DRAIN_FLAG or DRAIN_COUNT: --drain-by, or what probe_drain found */
};
extern struct options opt;

/* DRAIN_OFF, or how the variant drains. */
static inline int drain_of(int variant)
{
    return V_DRAINS(variant) ? opt.drain_by : DRAIN_OFF;
}

#define SERVER_CPU 1
#define CLIENT_CPU 0
#define RING_ENTRIES 1024 /* as UringEngine.RingEntries; the CQ is 4x */
#define BGID 0

/* ------------------------------------------------------------------------------------- */
/* Helpers (util.c)                                                                      */

void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
double now_s(clockid_t clock);
void pin(int cpu, const char *who);
void sleep_s(double sec);

/* Run phases, set by the main thread. */
enum { PH_WARMUP, PH_MEASURE, PH_STOP };
extern _Atomic int phase;
/* Set by the load generator once every answer is in; it then writes the server's eventfd. */
extern _Atomic int client_done;

/* ------------------------------------------------------------------------------------- */
/* Ring set-up and the probe (ring.c)                                                    */

int ring_setup(struct io_uring *ring, int taskrun_flag, char *why, size_t whylen);
int bufring_register(struct io_uring *ring, unsigned entries, int inc, struct io_uring_buf_ring **out,
                     size_t *bytes, char *why, size_t whylen);
/* Does the kernel take the variant at all? 0 if so, else -1 with the reason in why. */
int probe(int variant, char *why, size_t whylen);
/* Does IORING_SQ_TASKRUN show deferred task work left after an enter? DRAIN_FLAG if so, else
 * DRAIN_COUNT; what was seen goes in evidence. */
int probe_drain(char *evidence, size_t len);

/* ------------------------------------------------------------------------------------- */
/* Server (server.c, completions.c)                                                      */

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
        recv_eagain, recv_ops, recv_cqes, bytes,
        wait_cqes,     /* CQEs surfaced by the passes' waits, drain enters included */
        capped_waits,  /* waits whose own enter surfaced >= IO_LOCAL_TW_DEFAULT_MAX CQEs */
        drain_enters;  /* io_uring_get_events calls after a wait (also in enters) */
};

struct server {
    int variant;
    int kind;                    /* V_KIND(variant) */
    int drain;                   /* drain_of(variant) */
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

/* The server thread; arg is a struct server whose conns, wake_fd and variant are set. */
void *server_main(void *arg);
/* completions.c: acts on one CQE; queues a buffer for the next tail update. */
void handle_cqe(struct server *s, const struct io_uring_cqe *cqe);
void return_buffer(struct server *s, unsigned bid);

/* ------------------------------------------------------------------------------------- */
/* Load generator (client.c)                                                             */

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

/* The load generator thread; arg is a struct client with its connections and epoll set. */
void *client_main(void *arg);

/* ------------------------------------------------------------------------------------- */
/* One measurement (run.c)                                                               */

struct result {
    int valid;
    double rps, cpu_us, enters, cqes, passes_per_s, cqes_per_wait, drains_per_pass, capped_share;
    uint64_t requests, enobufs, ms_ended, short_sends, eagain_sends, recv_eagain, recv_ops, recv_cqes;
    double wall;
};

extern int listen_fd;                  /* loopback listener, set up by main */
extern struct sockaddr_in listen_addr;
extern int skipped[V_COUNT];           /* refused by the kernel: why in skip_why */
extern char skip_why[V_COUNT][256];

/* Runs the variant once on fresh connections; aborts on any accounting mismatch. */
struct result run_one(int variant);

#endif
