// loadgen: an open-loop HTTP/1.1 load generator for latency measurements.
//
// A closed-loop client (wrk) sends the next request only after the previous answer, so a server
// stall also stalls the client and the requests it would have sent are never timed: the stall is
// hidden ("coordinated omission"). loadgen instead sends on a fixed schedule: request n of the
// whole run is due at t0 + n / RATE on connection n % CONNECTIONS, whether or not earlier answers
// have arrived (they then queue, pipelined, on that connection). Each latency is measured from the
// request's intended send time, not from when it was actually written, so a stall is charged to
// every request it delayed.
//
// Latencies go into a log-bucketed histogram with 128 linear sub-buckets per power of two (at
// most 1/128 = 0.78% relative error); percentiles are reported as the upper edge of their bucket.
// The same histogram also records how late loadgen itself was in sending (its own lag), so a run
// where the generator could not keep its schedule is visible.
//
// With -m, loadgen writes "loadgen: window start NS" and "loadgen: window end NS" to stderr (flushed)
// as the measured window opens and closes, so a caller can read a server's CPU time over exactly
// that window; "window_completed" counts the answers that arrived within it, to divide that CPU by.
//
// With -S it speaks HTTPS: TLS (OpenSSL, ALPN http/1.1, the server's certificate not verified: benchmark servers
// make theirs at start), and never resumes a session, so every connection it opens costs the server a full
// handshake; "handshakes" and "resumed" in the JSON count them. With -k every request goes on a new connection: it
// asks for "Connection: close", takes the server's close after the answer as expected, and connects again (with
// -S, a full handshake per request). With -C it runs closed loop instead of on a schedule: every connection sends
// its next request as soon as its last is answered (-r is then not used), for a saturated run.
//
// Output: one JSON object on stdout. With -s FILE, also every measured request as a text line
// "INTENDED_NS LATENCY_NS LAG_NS" (intended send time on CLOCK_MONOTONIC, the clock .NET's EventPipe
// timestamps use on Linux; LAG_NS is how late loadgen itself was in sending it), so a trace of the
// server can be lined up with the slow requests, and the generator's own stalls told apart.
//
// Build: gcc -O2 -Wall -Wextra -o loadgen loadgen.c -lssl -lcrypto     (Debian: libssl-dev)
// Run:   loadgen -p PORT -r RATE [-a 127.0.0.1] [-P /json] [-c 256] [-d 5] [-w 1] [-H 'Name: value']
//               [-s FILE] [-m] [-S] [-k] [-C]

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "target.h"
#include "tls.h"

// ---- histogram -------------------------------------------------------------------------------

enum {
    SUB_BITS = 7,                       // 128 sub-buckets per power of two
    SUB_COUNT = 1 << SUB_BITS,
    LINEAR = 2 * SUB_COUNT,             // values below 256 ns are counted exactly
    BUCKETS = LINEAR + (64 - (SUB_BITS + 1)) * SUB_COUNT,
};

struct histogram {
    uint64_t counts[BUCKETS];
    uint64_t total, min, max;
    long double sum;
};

static unsigned bucket_of(uint64_t v)
{
    if (v < LINEAR)
        return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);   // >= SUB_BITS + 1
    unsigned shift = msb - SUB_BITS;
    unsigned top = (unsigned)(v >> shift);               // in [SUB_COUNT, 2 * SUB_COUNT)
    return LINEAR + (msb - (SUB_BITS + 1)) * SUB_COUNT + (top - SUB_COUNT);
}

// The largest value that falls in bucket b.
static uint64_t bucket_upper(unsigned b)
{
    if (b < LINEAR)
        return b;
    unsigned k = b - LINEAR;
    unsigned msb = k / SUB_COUNT + SUB_BITS + 1;
    unsigned shift = msb - SUB_BITS;
    uint64_t top = SUB_COUNT + k % SUB_COUNT;
    return ((top + 1) << shift) - 1;
}

static void hist_record(struct histogram *h, uint64_t v)
{
    h->counts[bucket_of(v)]++;
    if (h->total == 0 || v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
    h->total++;
    h->sum += (long double)v;
}

static uint64_t hist_percentile(const struct histogram *h, double p)
{
    if (h->total == 0)
        return 0;
    uint64_t rank = (uint64_t)((p / 100.0) * (double)h->total + 0.9999999);
    if (rank < 1)
        rank = 1;
    uint64_t seen = 0;
    for (unsigned b = 0; b < BUCKETS; b++) {
        seen += h->counts[b];
        if (seen >= rank) {
            uint64_t v = bucket_upper(b);
            return v > h->max ? h->max : v;
        }
    }
    return h->max;
}

// ---- connections -----------------------------------------------------------------------------

struct conn {
    int fd;
    int connecting;
    SSL *ssl;                  // -S: the connection's TLS session, NULL until TCP is connected
    int handshaking;           // -S: the TLS handshake is under way
    int requests_written;      // -k: requests written on this connection (one, then the server closes it)
    int want_out;              // EPOLLOUT registered
    uint64_t *intended;        // ring of intended send times (ns) of requests not yet answered
    uint64_t *lag;             // and, in the same slots, how late loadgen was to queue each one
    size_t head, count, cap;
    size_t unsent;             // how many of the last `count` requests are not fully written
    size_t written;            // bytes of the first unsent request already written
    char *rbuf;
    size_t rlen, rcap;
};

struct stats {
    uint64_t sent, completed, recorded;
    uint64_t window_completed;   // answers that arrived inside the measured window, whatever their send time
    uint64_t err_connect, err_read, err_write, err_status, err_parse, err_closed, lost, incomplete;
    uint64_t opened;             // connections opened (TCP connects started)
    uint64_t handshakes, resumed, err_tls;   // -S: TLS handshakes completed, how many resumed a session, failed
};

static struct sockaddr_storage target;
static socklen_t target_len;
static char *request;
static size_t request_len;
static int epoll_fd;
static struct stats st;
static struct histogram latency, lag;
static uint64_t measure_from;   // requests intended before this are warm-up and not recorded
static uint64_t measure_until;  // the measured window's end: no request is scheduled after it
static uint64_t in_flight;      // requests queued or sent and not yet answered, all connections
static SSL_CTX *tls;            // -S
static int close_each;          // -k: one request per connection
static int closed_loop;         // -C

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("loadgen: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

// -s: every measured request's intended send time, latency and send lag, in completion order.
struct sample { uint64_t intended, latency, lag; };
static struct sample *samples;
static size_t sample_count, sample_cap;
static int keep_samples;

static void keep_sample(uint64_t intended, uint64_t took, uint64_t late)
{
    if (sample_count == sample_cap) {
        sample_cap = sample_cap ? sample_cap * 2 : 65536;
        samples = realloc(samples, sample_cap * sizeof *samples);
        if (!samples)
            die("out of memory");
    }
    samples[sample_count++] = (struct sample){ intended, took, late };
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void set_events(struct conn *c, int op)
{
    struct epoll_event ev = { .events = EPOLLIN | (c->want_out ? EPOLLOUT : 0), .data.ptr = c };
    if (epoll_ctl(epoll_fd, op, c->fd, &ev) != 0)
        die("epoll_ctl: %s", strerror(errno));
}

static void conn_open(struct conn *c)
{
    c->fd = socket(target.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        die("socket: %s", strerror(errno));
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->connecting = 1;
    c->want_out = 1;
    c->rlen = 0;
    c->written = 0;
    c->requests_written = 0;
    st.opened++;
    if (connect(c->fd, (struct sockaddr *)&target, target_len) != 0 && errno != EINPROGRESS) {
        st.err_connect++;
    }
    set_events(c, EPOLL_CTL_ADD);
}

// The connection failed: requests already (partly) written are lost, unsent ones are kept and
// go out on the new connection.
static void conn_reset(struct conn *c)
{
    size_t gone = c->count - c->unsent;
    st.lost += gone;
    in_flight -= gone;
    c->head = (c->head + gone) % c->cap;
    c->count = c->unsent;
    if (c->ssl) {
        SSL_free(c->ssl);   // no close_notify: the connection is dropped either way
        c->ssl = NULL;
    }
    c->handshaking = 0;
    close(c->fd);
    conn_open(c);
}

static void conn_push(struct conn *c, uint64_t intended, uint64_t late)
{
    if (c->count == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        uint64_t *ring = malloc(cap * sizeof *ring), *lags = malloc(cap * sizeof *lags);
        if (!ring || !lags)
            die("out of memory");
        for (size_t i = 0; i < c->count; i++) {
            ring[i] = c->intended[(c->head + i) % c->cap];
            lags[i] = c->lag[(c->head + i) % c->cap];
        }
        free(c->intended);
        free(c->lag);
        c->intended = ring;
        c->lag = lags;
        c->head = 0;
        c->cap = cap;
    }
    c->intended[(c->head + c->count) % c->cap] = intended;
    c->lag[(c->head + c->count) % c->cap] = late;
    c->count++;
    c->unsent++;
    in_flight++;
}

static void update_out(struct conn *c, int want)
{
    if (want != c->want_out) {
        c->want_out = want;
        set_events(c, EPOLL_CTL_MOD);
    }
}

// -S: one request per SSL_write (no partial writes: a write that must wait is repeated whole, as OpenSSL asks).
static void conn_write_tls(struct conn *c)
{
    int want = 0;
    while (c->unsent > 0 && !(close_each && c->requests_written > 0)) {
        ERR_clear_error();
        int w = SSL_write(c->ssl, request, (int)request_len);
        if (w > 0) {
            c->unsent--;
            c->requests_written++;
            st.sent++;
            continue;
        }
        int err = SSL_get_error(c->ssl, w);
        if (err == SSL_ERROR_WANT_WRITE) {
            want = 1;
            break;
        }
        if (err == SSL_ERROR_WANT_READ)
            break;
        st.err_write++;
        conn_reset(c);
        return;
    }
    update_out(c, want);
}

// Writes as many queued requests as the socket takes, gathered into one writev (-k: one request per connection).
static void conn_write(struct conn *c)
{
    if (c->connecting || c->handshaking)
        return;
    if (tls) {
        conn_write_tls(c);
        return;
    }
    while (c->unsent > 0 && !(close_each && c->requests_written > 0)) {
        struct iovec iov[64];
        int n = 0;
        size_t bytes = 0;
        for (size_t i = 0; i < c->unsent && n < (close_each ? 1 : 64); i++, n++) {
            size_t off = i == 0 ? c->written : 0;
            iov[n].iov_base = request + off;
            iov[n].iov_len = request_len - off;
            bytes += iov[n].iov_len;
        }
        ssize_t w = writev(c->fd, iov, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            st.err_write++;
            conn_reset(c);
            return;
        }
        size_t done = (size_t)w + c->written;
        size_t whole = done / request_len;
        c->unsent -= whole;
        c->requests_written += (int)whole;
        c->written = done % request_len;
        st.sent += whole;
        if ((size_t)w < bytes)
            break;
    }
    update_out(c, c->unsent > 0 && !(close_each && c->requests_written > 0));
}

static const char *find_crlfcrlf(const char *p, size_t n)
{
    return memmem(p, n, "\r\n\r\n", 4);
}

// The length of a complete chunked body (RFC 9112 7.1) at p, of which n bytes have arrived: 0 while it is
// incomplete, -1 when it is malformed. MVC's formatters answer this way (no Content-Length).
static long long chunked_length(const char *p, size_t n)
{
    size_t pos = 0;
    for (;;) {
        const char *eol = memmem(p + pos, n - pos, "\r\n", 2);
        if (!eol)
            return 0;
        char *end;
        unsigned long long size = strtoull(p + pos, &end, 16);   // stops at ';' (an extension) or CR
        if (end == p + pos)
            return -1;
        pos = (size_t)(eol - p) + 2;
        if (size == 0) {
            for (;;) {   // trailer lines, up to the empty line that ends the message
                const char *line_end = memmem(p + pos, n - pos, "\r\n", 2);
                if (!line_end)
                    return 0;
                size_t len = (size_t)(line_end - (p + pos));
                pos += len + 2;
                if (len == 0)
                    return (long long)pos;
            }
        }
        if (n - pos < size + 2)
            return 0;
        pos += size;
        if (memcmp(p + pos, "\r\n", 2) != 0)
            return -1;
        pos += 2;
    }
}

// Parses every complete response in the buffer. Returns -1 when the connection must be reset.
static int conn_parse(struct conn *c, uint64_t now)
{
    size_t pos = 0;
    int reset = 0;
    while (pos < c->rlen) {
        const char *start = c->rbuf + pos;
        size_t avail = c->rlen - pos;
        const char *end = find_crlfcrlf(start, avail);
        if (!end)
            break;
        size_t head = (size_t)(end - start) + 4;
        if (avail < 12 || memcmp(start, "HTTP/1.", 7) != 0) {
            st.err_parse++;
            return -1;
        }
        int status = atoi(start + 9);
        long long length = -1;
        int close_after = 0, chunked = 0;
        const char *line = memchr(start, '\n', head) + 1;
        while (line < start + head - 2) {
            const char *eol = memchr(line, '\n', (size_t)(start + head - line));
            size_t len = (size_t)(eol - line);
            if (len > 15 && strncasecmp(line, "content-length:", 15) == 0)
                length = atoll(line + 15);
            else if (len > 11 && strncasecmp(line, "connection:", 11) == 0
                     && memmem(line, len, "close", 5))
                close_after = 1;
            else if (len > 18 && strncasecmp(line, "transfer-encoding:", 18) == 0) {
                if (!memmem(line, len, "chunked", 7)) {
                    st.err_parse++;   // no other coding is expected from the test servers
                    return -1;
                }
                chunked = 1;
            }
            line = eol + 1;
        }
        if (chunked)
            length = chunked_length(start + head, avail - head);   // never 0 when complete: "0\r\n\r\n"
        if (length < 0) {
            st.err_parse++;
            return -1;
        }
        if (chunked ? length == 0 : avail < head + (size_t)length)
            break;
        pos += head + (size_t)length;
        if (c->count == c->unsent) {
            st.err_parse++;   // an answer to nothing we sent
            return -1;
        }
        uint64_t intended = c->intended[c->head], late = c->lag[c->head];
        c->head = (c->head + 1) % c->cap;
        c->count--;
        in_flight--;
        st.completed++;
        if (now >= measure_from && now < measure_until)
            st.window_completed++;
        if (status < 200 || status > 399)
            st.err_status++;
        else if (intended >= measure_from) {
            uint64_t took = now > intended ? now - intended : 0;
            hist_record(&latency, took);
            if (keep_samples)
                keep_sample(intended, took, late);
            st.recorded++;
        }
        if (close_after) {
            if (!close_each)
                st.err_closed++;   // -k asked for it; otherwise the server dropped a keep-alive connection
            reset = 1;
            break;
        }
    }
    if (pos > 0) {
        memmove(c->rbuf, c->rbuf + pos, c->rlen - pos);
        c->rlen -= pos;
    }
    return reset ? -1 : 0;
}

static void conn_read(struct conn *c)
{
    for (;;) {
        if (c->rcap - c->rlen < 4096) {
            size_t cap = c->rcap ? c->rcap * 2 : 16384;
            if (cap > (64u << 20))
                die("a response larger than 64 MiB");
            char *p = realloc(c->rbuf, cap);
            if (!p)
                die("out of memory");
            c->rbuf = p;
            c->rcap = cap;
        }
        if (tls) {
            // Decrypted bytes OpenSSL holds are invisible to epoll: read until it wants the socket again.
            ERR_clear_error();
            int n = SSL_read(c->ssl, c->rbuf + c->rlen, (int)(c->rcap - c->rlen));
            if (n > 0) {
                c->rlen += (size_t)n;
                if (conn_parse(c, now_ns()) != 0) {
                    conn_reset(c);
                    return;
                }
                continue;
            }
            int err = SSL_get_error(c->ssl, n);
            if (err == SSL_ERROR_WANT_READ)
                return;
            if (err == SSL_ERROR_WANT_WRITE) {
                update_out(c, 1);
                return;
            }
            st.err_read++;   // EOF (close_notify or not) or an error while requests may be outstanding
            conn_reset(c);
            return;
        }
        ssize_t n = read(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen);
        if (n > 0) {
            c->rlen += (size_t)n;
            if (conn_parse(c, now_ns()) != 0) {
                conn_reset(c);
                return;
            }
            if ((size_t)n < 4096)
                return;   // most likely drained: level-triggered epoll reports the rest
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        st.err_read++;   // EOF or an error while requests may be outstanding
        conn_reset(c);
        return;
    }
}

// -S: drives the handshake on; 1 once it is done, 0 while it waits for the socket, -1 when it failed (reset).
static int conn_handshake(struct conn *c)
{
    ERR_clear_error();
    int r = SSL_do_handshake(c->ssl);
    if (r == 1) {
        c->handshaking = 0;
        st.handshakes++;
        if (SSL_session_reused(c->ssl))
            st.resumed++;
        update_out(c, c->unsent > 0);
        return 1;
    }
    int err = SSL_get_error(c->ssl, r);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        update_out(c, err == SSL_ERROR_WANT_WRITE);
        return 0;
    }
    st.err_tls++;
    if (st.err_tls == 1) {
        char text[256];
        fprintf(stderr, "loadgen: TLS handshake failed: %s\n", tls_error_text(err, text, sizeof text));
    }
    conn_reset(c);
    return -1;
}

static void conn_event(struct conn *c, uint32_t events)
{
    if (c->connecting) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0 || (events & (EPOLLERR | EPOLLHUP))) {
            st.err_connect++;
            close(c->fd);
            usleep(1000);   // avoid a hot reconnect loop against a refusing server
            conn_open(c);
            return;
        }
        if (!(events & EPOLLOUT))
            return;
        c->connecting = 0;
        if (tls) {
            c->ssl = SSL_new(tls);
            if (!c->ssl || SSL_set_fd(c->ssl, c->fd) != 1)
                die("SSL_new failed");
            SSL_set_connect_state(c->ssl);
            c->handshaking = 1;
        }
    }
    if (c->handshaking) {
        if (conn_handshake(c) <= 0)
            return;
        events |= EPOLLIN;   // the server's first bytes may have come with the handshake's last flight
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
        conn_read(c);
    if (!c->connecting)
        conn_write(c);
}

static int wait_events(struct epoll_event *events, int max, uint64_t timeout_ns)
{
    struct timespec ts = { .tv_sec = (time_t)(timeout_ns / 1000000000u), .tv_nsec = (long)(timeout_ns % 1000000000u) };
    int n = epoll_pwait2(epoll_fd, events, max, &ts, NULL);
    if (n < 0 && errno == ENOSYS)   // kernels before 5.11: millisecond timeouts
        n = epoll_wait(epoll_fd, events, max, (int)((timeout_ns + 999999) / 1000000));
    return n;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: loadgen -p PORT -r RATE [options]\n"
            "  -a ADDRESS  numeric server address (default 127.0.0.1)\n"
            "  -p PORT     server port\n"
            "  -P PATH     request path (default /json)\n"
            "  -c N        connections (default 256)\n"
            "  -r RATE     total requests per second, spread evenly over the connections\n"
            "  -d SECONDS  measured duration (default 5)\n"
            "  -w SECONDS  warm-up at the same rate before measuring (default 1)\n"
            "  -T SECONDS  how long to wait for outstanding answers at the end (default 2)\n"
            "  -H HEADER   extra request header, repeatable\n"
            "  -s FILE     also write each measured request as \"INTENDED_NS LATENCY_NS LAG_NS\" (CLOCK_MONOTONIC)\n"
            "  -m          mark the measured window on stderr: \"loadgen: window start|end NS\" (CLOCK_MONOTONIC)\n"
            "  -S          HTTPS: TLS without session resumption (every connection a full handshake), ALPN http/1.1\n"
            "  -k          a new connection for every request (Connection: close)\n"
            "  -C          closed loop: each connection sends its next request when its last is answered (no -r)\n");
    exit(2);
}

static void print_us(const char *name, uint64_t ns, int last)
{
    printf("\"%s\": %.1f%s", name, (double)ns / 1000.0, last ? "" : ", ");
}

int main(int argc, char **argv)
{
    const char *address = "127.0.0.1", *path = "/json", *samples_path = NULL;
    int port = -1, connections = 256, opt, mark_window = 0, use_tls = 0;
    double rate = 0, duration = 5, warmup = 1, drain = 2;
    char headers[4096] = "";
    while ((opt = getopt(argc, argv, "a:p:P:c:r:d:w:T:H:s:mSkCh")) != -1) {
        switch (opt) {
        case 'a': address = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 'P': path = optarg; break;
        case 'c': connections = atoi(optarg); break;
        case 'r': rate = atof(optarg); break;
        case 'd': duration = atof(optarg); break;
        case 'w': warmup = atof(optarg); break;
        case 'T': drain = atof(optarg); break;
        case 'H':
            if (strlen(headers) + strlen(optarg) + 3 > sizeof headers)
                die("headers too long");
            strcat(headers, optarg);
            strcat(headers, "\r\n");
            break;
        case 's': samples_path = optarg; break;
        case 'm': mark_window = 1; break;
        case 'S': use_tls = 1; break;
        case 'k': close_each = 1; break;
        case 'C': closed_loop = 1; break;
        default: usage();
        }
    }
    if (port <= 0 || port > 65535 || (rate <= 0 && !closed_loop) || connections < 1 || duration <= 0 || warmup < 0
        || drain < 0 || optind != argc)
        usage();

    char host[128];
    if (parse_target(address, port, &target, &target_len, host, sizeof host) != 0)
        die("not a numeric address: %s", address);
    if (asprintf(&request, "GET %s HTTP/1.1\r\nHost: %s\r\n%s%s\r\n", path, host, headers,
                 close_each ? "Connection: close\r\n" : "") < 0)
        die("out of memory");
    request_len = strlen(request);
    FILE *samples_file = NULL;
    if (samples_path) {
        samples_file = fopen(samples_path, "w");   // opened now, so a bad path fails before the run
        if (!samples_file)
            die("%s: %s", samples_path, strerror(errno));
        keep_samples = 1;
    }

    if (use_tls) {
        tls = tls_client_context();   // no session kept or offered again: no handshake is an abbreviated one
        if (!tls)
            die("OpenSSL could not make a TLS client context");
    }
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_TIMERSLACK, 1UL);   // the default 50 us slack would delay every scheduled send
    epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd < 0)
        die("epoll_create1: %s", strerror(errno));

    struct conn *conns = calloc((size_t)connections, sizeof *conns);
    if (!conns)
        die("out of memory");
    for (int i = 0; i < connections; i++)
        conn_open(&conns[i]);

    // Connect everything before the clock starts, within 5 s.
    enum { MAX_EVENTS = 1024 };
    static struct epoll_event events[MAX_EVENTS];
    uint64_t deadline = now_ns() + 5000000000ull;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < connections; i++)
            pending += conns[i].connecting || conns[i].handshaking;
        if (pending == 0)
            break;
        uint64_t now = now_ns();
        if (now >= deadline)
            die("%d of %d connections not established within 5 s", pending, connections);
        int n = wait_events(events, MAX_EVENTS, deadline - now);
        for (int i = 0; i < n; i++)
            conn_event(events[i].data.ptr, events[i].events);
    }

    const double interval = closed_loop ? 0 : 1e9 / rate;
    const uint64_t t0 = now_ns();
    measure_from = t0 + (uint64_t)(warmup * 1e9);
    const uint64_t send_until = measure_from + (uint64_t)(duration * 1e9);
    measure_until = send_until;
    const uint64_t drain_until = send_until + (uint64_t)(drain * 1e9);
    uint64_t next = 0;   // index of the next request in the whole run's schedule
    int marked = 0;      // window edges written to stderr (-m): 0, 1 (start) or 2 (end)
    for (;;) {
        uint64_t now = now_ns();
        if (mark_window && marked < 2 && now >= (marked == 0 ? measure_from : send_until)) {
            fprintf(stderr, "loadgen: window %s %llu\n", marked == 0 ? "start" : "end", (unsigned long long)now);
            fflush(stderr);
            marked++;
            continue;   // the end may be due in the same turn
        }
        if (closed_loop && now < send_until) {
            // Each connection's next request goes out as soon as its last was answered (or it reconnected).
            for (int i = 0; i < connections; i++) {
                struct conn *c = &conns[i];
                if (c->count == 0) {
                    conn_push(c, now, 0);
                    conn_write(c);
                }
            }
        }
        for (; !closed_loop;) {
            uint64_t due = t0 + (uint64_t)((double)next * interval);
            if (due > now || due >= send_until)
                break;
            struct conn *c = &conns[next % (uint64_t)connections];
            if (due >= measure_from)
                hist_record(&lag, now - due);
            conn_push(c, due, now - due);
            conn_write(c);
            next++;
        }
        now = now_ns();
        if (now >= send_until && (in_flight == 0 || now >= drain_until))
            break;
        uint64_t due = closed_loop ? send_until : t0 + (uint64_t)((double)next * interval);
        uint64_t wake = due < send_until ? due : drain_until;
        if (mark_window && marked < 2) {   // wake for the next edge, not only for the next request
            uint64_t edge = marked == 0 ? measure_from : send_until;
            wake = edge < wake ? edge : wake;
        }
        int n = wait_events(events, MAX_EVENTS, wake > now ? wake - now : 0);
        if (n < 0 && errno != EINTR)
            die("epoll_wait: %s", strerror(errno));
        for (int i = 0; i < n; i++)
            conn_event(events[i].data.ptr, events[i].events);
    }
    for (int i = 0; i < connections; i++) {
        for (size_t k = 0; k < conns[i].count; k++) {
            if (conns[i].intended[(conns[i].head + k) % conns[i].cap] >= measure_from)
                st.incomplete++;
        }
    }

    if (samples_file) {
        for (size_t i = 0; i < sample_count; i++)
            fprintf(samples_file, "%llu %llu %llu\n", (unsigned long long)samples[i].intended,
                    (unsigned long long)samples[i].latency, (unsigned long long)samples[i].lag);
        if (fclose(samples_file) != 0)
            die("%s: %s", samples_path, strerror(errno));
    }

    printf("{\"target_rate\": %.1f, \"connections\": %d, \"path\": \"%s\", \"warmup_s\": %.3f, "
           "\"duration_s\": %.3f, ",
           rate, connections, path, warmup, duration);
    printf("\"sent\": %llu, \"completed\": %llu, \"recorded\": %llu, \"window_completed\": %llu, "
           "\"achieved_rate\": %.1f, ",
           (unsigned long long)st.sent, (unsigned long long)st.completed,
           (unsigned long long)st.recorded, (unsigned long long)st.window_completed,
           (double)st.recorded / duration);
    printf("\"errors\": {\"connect\": %llu, \"read\": %llu, \"write\": %llu, \"status\": %llu, "
           "\"parse\": %llu, \"closed\": %llu, \"lost\": %llu, \"incomplete\": %llu",
           (unsigned long long)st.err_connect, (unsigned long long)st.err_read,
           (unsigned long long)st.err_write, (unsigned long long)st.err_status,
           (unsigned long long)st.err_parse, (unsigned long long)st.err_closed,
           (unsigned long long)st.lost, (unsigned long long)st.incomplete);
    if (tls)   // a failed handshake is an error of the run
        printf(", \"tls\": %llu", (unsigned long long)st.err_tls);
    printf("}, ");
    printf("\"connections_opened\": %llu, \"tls\": %s, \"handshakes\": %llu, \"resumed\": %llu, "
           "\"close_each\": %s, \"closed_loop\": %s, ",
           (unsigned long long)st.opened, tls ? "true" : "false", (unsigned long long)st.handshakes,
           (unsigned long long)st.resumed, close_each ? "true" : "false", closed_loop ? "true" : "false");
    printf("\"latency_us\": {");
    print_us("min", latency.min, 0);
    print_us("p50", hist_percentile(&latency, 50), 0);
    print_us("p75", hist_percentile(&latency, 75), 0);
    print_us("p90", hist_percentile(&latency, 90), 0);
    print_us("p99", hist_percentile(&latency, 99), 0);
    print_us("p99.9", hist_percentile(&latency, 99.9), 0);
    print_us("p99.99", hist_percentile(&latency, 99.99), 0);
    print_us("max", latency.max, 0);
    printf("\"mean\": %.1f}, ", latency.total ? (double)(latency.sum / latency.total) / 1000.0 : 0.0);
    printf("\"send_lag_us\": {");
    print_us("p50", hist_percentile(&lag, 50), 0);
    print_us("p99", hist_percentile(&lag, 99), 0);
    print_us("max", lag.max, 1);
    printf("}, \"histogram\": {\"sub_buckets\": %d, \"max_relative_error\": %.4f}}\n", SUB_COUNT,
           1.0 / SUB_COUNT);
    return 0;
}
