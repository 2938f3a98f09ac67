// ceiling: a minimal HTTP/1.1 server in C for the TechEmpower plaintext and JSON tests, used by
// benchmarks/compare.sh as the reference row "what this machine can do" for every transport.
//
// Design (the one the transport copies, without a runtime in between):
//   - one thread per CPU in the process's affinity mask (or -t N);
//   - each thread owns an epoll instance and its own SO_REUSEPORT listening socket, so the kernel
//     spreads connections across threads and a connection never changes thread;
//   - client sockets are non-blocking and edge-triggered (EPOLLIN | EPOLLOUT | EPOLLET), registered
//     once: no epoll_ctl per request;
//   - every request that is complete in the receive buffer is answered before anything is sent,
//     so the responses to one pipelined write leave in one send();
//   - responses are assembled per request from their parts (TechEmpower forbids one pre-rendered
//     buffer) and the JSON body is serialized per request; the Date header is re-rendered when
//     the second changes.
//
// It serves GET /plaintext and GET /json; anything else is 404 (405 for other methods). It honours
// "Connection: close" and HTTP/1.0 semantics, skips request bodies announced by Content-Length,
// rejects chunked request bodies (501) and oversized request heads (431), and stops reading a
// connection whose unsent responses pile up (back-pressure) until the peer drains them.
//
// Build: gcc -O2 -Wall -Wextra -pthread -o ceiling ceiling.c
// Run:   ceiling -p 8080 [-a 127.0.0.1] [-t THREADS]

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum {
    IN_CAPACITY = 16384,       // receive buffer per connection; a request head must fit in it
    MAX_HEAD = 8192,           // larger request heads are answered 431 (same order as Kestrel's 32 KiB limit)
    OUT_INITIAL = 8192,
    OUT_HIGH_WATER = 262144,   // stop reading while this much is unsent (back-pressure)
    MAX_EVENTS = 512,
    LISTEN_BACKLOG = 4096,
};

struct conn {
    int fd;
    int close_after_flush;     // a response said "Connection: close": no more requests are parsed
    int read_paused;           // back-pressure: the socket may still hold unread data (edge-triggered)
    int peer_closed;
    size_t body_to_skip;       // bytes of a request body still to discard
    size_t in_len;
    char *in;
    size_t out_off, out_len, out_cap;
    char *out;
};

struct worker {
    int index;
    int listen_fd;
    int epoll_fd;
    time_t date_second;
    char date[40];
    size_t date_len;
    pthread_t thread;
};

static const char *server_name = "ceiling";

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ceiling: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void refresh_date(struct worker *w)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME_COARSE, &now);
    if (now.tv_sec == w->date_second)
        return;
    struct tm tm;
    gmtime_r(&now.tv_sec, &tm);
    w->date_len = strftime(w->date, sizeof w->date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    w->date_second = now.tv_sec;
}

// ---- output buffer ---------------------------------------------------------------------------

static int out_reserve(struct conn *c, size_t extra)
{
    if (c->out_off > 0 && c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    if (c->out_len + extra <= c->out_cap)
        return 0;
    if (c->out_off > 0) {
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
        if (c->out_len + extra <= c->out_cap)
            return 0;
    }
    size_t cap = c->out_cap ? c->out_cap : OUT_INITIAL;
    while (cap < c->out_len + extra)
        cap *= 2;
    char *p = realloc(c->out, cap);
    if (!p)
        return -1;
    c->out = p;
    c->out_cap = cap;
    return 0;
}

static inline char *put(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

#define PUT_LITERAL(p, s) put((p), (s), sizeof(s) - 1)

static char *put_decimal(char *p, size_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

enum connection_header { KEEP_ALIVE_DEFAULT, CLOSE, KEEP_ALIVE_HTTP10 };

// Appends one whole response: status line, Server, Date, Content-Type, Content-Length, body.
// CLOSE adds "Connection: close" and stops parsing further requests; KEEP_ALIVE_HTTP10 tells an
// HTTP/1.0 client that asked for keep-alive that it got it.
static int respond(struct worker *w, struct conn *c, const char *status, const char *content_type,
                   const char *body, size_t body_len, enum connection_header connection)
{
    int close = connection == CLOSE;
    size_t status_len = strlen(status), type_len = content_type ? strlen(content_type) : 0;
    if (out_reserve(c, 160 + status_len + type_len + w->date_len + body_len) != 0)
        return -1;
    char *p = c->out + c->out_len;
    p = PUT_LITERAL(p, "HTTP/1.1 ");
    p = put(p, status, status_len);
    p = PUT_LITERAL(p, "\r\nServer: ");
    p = put(p, server_name, strlen(server_name));
    p = PUT_LITERAL(p, "\r\nDate: ");
    p = put(p, w->date, w->date_len);
    if (content_type) {
        p = PUT_LITERAL(p, "\r\nContent-Type: ");
        p = put(p, content_type, type_len);
    }
    p = PUT_LITERAL(p, "\r\nContent-Length: ");
    p = put_decimal(p, body_len);
    if (close)
        p = PUT_LITERAL(p, "\r\nConnection: close");
    else if (connection == KEEP_ALIVE_HTTP10)
        p = PUT_LITERAL(p, "\r\nConnection: keep-alive");
    p = PUT_LITERAL(p, "\r\n\r\n");
    p = put(p, body, body_len);
    c->out_len = (size_t)(p - c->out);
    if (close)
        c->close_after_flush = 1;
    return 0;
}

// A JSON string writer: enough of RFC 8259 to serialize any C string correctly.
static char *json_string(char *p, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    *p++ = '"';
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            *p++ = '\\';
            *p++ = (char)ch;
        } else if (ch < 0x20) {
            p = PUT_LITERAL(p, "\\u00");
            *p++ = hex[ch >> 4];
            *p++ = hex[ch & 15];
        } else {
            *p++ = (char)ch;
        }
    }
    *p++ = '"';
    return p;
}

static size_t serialize_message(char *buf, const char *message)
{
    // Worst case 6 bytes per input byte; callers pass short literals into a 256-byte buffer.
    char *p = buf;
    *p++ = '{';
    p = json_string(p, "message");
    *p++ = ':';
    p = json_string(p, message);
    *p++ = '}';
    return (size_t)(p - buf);
}

// ---- request parsing -------------------------------------------------------------------------

static int token_in_list(const char *value, size_t len, const char *token)
{
    // Case-insensitive search of a comma-separated header value for one token.
    size_t tlen = strlen(token);
    size_t i = 0;
    while (i < len) {
        while (i < len && (value[i] == ' ' || value[i] == '\t' || value[i] == ','))
            i++;
        size_t start = i;
        while (i < len && value[i] != ',')
            i++;
        size_t end = i;
        while (end > start && (value[end - 1] == ' ' || value[end - 1] == '\t'))
            end--;
        if (end - start == tlen && strncasecmp(value + start, token, tlen) == 0)
            return 1;
    }
    return 0;
}

static int header_is(const char *name, size_t len, const char *want)
{
    return len == strlen(want) && strncasecmp(name, want, len) == 0;
}

// Parses and answers every complete request at the start of c->in. Returns -1 on allocation
// failure (the caller closes the connection).
static int handle_requests(struct worker *w, struct conn *c)
{
    size_t pos = 0;
    while (!c->close_after_flush) {
        if (c->body_to_skip) {
            size_t n = c->in_len - pos < c->body_to_skip ? c->in_len - pos : c->body_to_skip;
            pos += n;
            c->body_to_skip -= n;
            if (c->body_to_skip)
                break;
        }
        const char *start = c->in + pos;
        size_t avail = c->in_len - pos;
        if (avail == 0)
            break;
        const char *end = memmem(start, avail, "\r\n\r\n", 4);
        if (!end) {
            if (avail > MAX_HEAD) {
                if (respond(w, c, "431 Request Header Fields Too Large", NULL, "", 0, CLOSE) != 0)
                    return -1;
            }
            break;
        }
        size_t head_len = (size_t)(end - start) + 4;
        if (head_len > MAX_HEAD) {
            if (respond(w, c, "431 Request Header Fields Too Large", NULL, "", 0, CLOSE) != 0)
                return -1;
            break;
        }

        // Request line: METHOD SP TARGET SP HTTP/1.x CRLF
        const char *line_end = memmem(start, head_len, "\r\n", 2);
        const char *sp1 = memchr(start, ' ', (size_t)(line_end - start));
        const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(line_end - sp1 - 1)) : NULL;
        if (!sp1 || !sp2 || line_end - sp2 - 1 != 8 || memcmp(sp2 + 1, "HTTP/1.", 7) != 0
            || (sp2[8] != '0' && sp2[8] != '1')) {
            if (respond(w, c, "400 Bad Request", NULL, "", 0, CLOSE) != 0)
                return -1;
            break;
        }
        int http10 = sp2[8] == '0';
        int keep_alive = !http10;
        size_t content_length = 0;
        int chunked = 0, bad = 0;

        // Header lines up to the blank line.
        const char *line = line_end + 2;
        const char *head_end = start + head_len - 2;
        while (line < head_end) {
            const char *eol = memmem(line, (size_t)(head_end - line) + 2, "\r\n", 2);
            const char *colon = memchr(line, ':', (size_t)(eol - line));
            if (!colon) {
                bad = 1;
                break;
            }
            size_t name_len = (size_t)(colon - line);
            const char *value = colon + 1;
            while (value < eol && (*value == ' ' || *value == '\t'))
                value++;
            size_t value_len = (size_t)(eol - value);
            if (header_is(line, name_len, "connection")) {
                if (token_in_list(value, value_len, "close"))
                    keep_alive = 0;
                else if (token_in_list(value, value_len, "keep-alive"))
                    keep_alive = 1;
            } else if (header_is(line, name_len, "content-length")) {
                char *num_end;
                char tmp[24];
                if (value_len == 0 || value_len >= sizeof tmp) {
                    bad = 1;
                    break;
                }
                memcpy(tmp, value, value_len);
                tmp[value_len] = 0;
                unsigned long long v = strtoull(tmp, &num_end, 10);
                while (*num_end == ' ' || *num_end == '\t')
                    num_end++;
                if (*num_end || tmp[0] == '-') {
                    bad = 1;
                    break;
                }
                content_length = (size_t)v;
            } else if (header_is(line, name_len, "transfer-encoding")) {
                chunked = 1;
            }
            line = eol + 2;
        }
        if (bad) {
            if (respond(w, c, "400 Bad Request", NULL, "", 0, CLOSE) != 0)
                return -1;
            break;
        }
        if (chunked) {
            if (respond(w, c, "501 Not Implemented", NULL, "", 0, CLOSE) != 0)
                return -1;
            break;
        }

        const char *target = sp1 + 1;
        size_t target_len = (size_t)(sp2 - target);
        size_t method_len = (size_t)(sp1 - start);
        int is_get = method_len == 3 && memcmp(start, "GET", 3) == 0;
        enum connection_header connection = !keep_alive ? CLOSE : http10 ? KEEP_ALIVE_HTTP10 : KEEP_ALIVE_DEFAULT;
        int rc;
        if (!is_get) {
            rc = respond(w, c, "405 Method Not Allowed", NULL, "", 0, connection);
        } else if (target_len == 10 && memcmp(target, "/plaintext", 10) == 0) {
            rc = respond(w, c, "200 OK", "text/plain", "Hello, World!", 13, connection);
        } else if (target_len == 5 && memcmp(target, "/json", 5) == 0) {
            char body[256];
            size_t body_len = serialize_message(body, "Hello, World!");
            rc = respond(w, c, "200 OK", "application/json", body, body_len, connection);
        } else {
            rc = respond(w, c, "404 Not Found", NULL, "", 0, connection);
        }
        if (rc != 0)
            return -1;
        pos += head_len;
        c->body_to_skip = content_length;
    }

    // Keep the unparsed tail at the front of the buffer.
    if (pos > 0) {
        memmove(c->in, c->in + pos, c->in_len - pos);
        c->in_len -= pos;
    }
    if (c->close_after_flush)
        c->in_len = 0;
    return 0;
}

// ---- connection I/O --------------------------------------------------------------------------

static void conn_close(struct conn *c)
{
    close(c->fd);   // also removes it from the epoll set: the fd is never dup'ed
    free(c->in);
    free(c->out);
    free(c);
}

// Sends what is buffered. Returns -1 when the connection failed.
static int conn_flush(struct conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;   // EPOLLOUT (edge) tells when to continue
        return -1;
    }
    c->out_off = c->out_len = 0;
    return 0;
}

static size_t conn_unsent(const struct conn *c)
{
    return c->out_len - c->out_off;
}

// Reads until the socket is drained (edge-triggered), answering as requests complete.
// Returns -1 when the connection must be closed now.
static int conn_read(struct worker *w, struct conn *c)
{
    c->read_paused = 0;
    while (!c->close_after_flush) {
        if (conn_unsent(c) >= OUT_HIGH_WATER) {
            if (conn_flush(c) != 0)
                return -1;
            if (conn_unsent(c) >= OUT_HIGH_WATER) {
                c->read_paused = 1;   // resumed from the EPOLLOUT handler once drained
                return 0;
            }
        }
        if (c->in_len == IN_CAPACITY) {
            // Only reachable with a head over MAX_HEAD, which handle_requests already answered.
            return -1;
        }
        ssize_t n = recv(c->fd, c->in + c->in_len, IN_CAPACITY - c->in_len, 0);
        if (n > 0) {
            c->in_len += (size_t)n;
            if (handle_requests(w, c) != 0)
                return -1;
            continue;
        }
        if (n == 0) {
            c->peer_closed = 1;
            return 0;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return -1;
    }
    return 0;
}

static void conn_event(struct worker *w, struct conn *c, uint32_t events)
{
    if (events & EPOLLERR) {
        conn_close(c);
        return;
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) {
        if (conn_read(w, c) != 0) {
            conn_close(c);
            return;
        }
    }
    if (conn_flush(c) != 0) {
        conn_close(c);
        return;
    }
    if (c->read_paused && conn_unsent(c) < OUT_HIGH_WATER) {
        if (conn_read(w, c) != 0 || conn_flush(c) != 0) {
            conn_close(c);
            return;
        }
    }
    if (conn_unsent(c) == 0 && (c->close_after_flush || c->peer_closed)) {
        if (c->close_after_flush)
            shutdown(c->fd, SHUT_WR);   // FIN after the last response, as Kestrel does
        conn_close(c);
    }
}

static void accept_all(struct worker *w)
{
    for (int i = 0; i < 256; i++) {   // bounded so a connection storm cannot starve the loop
        int fd = accept4(w->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return;   // EAGAIN, or EMFILE/ENFILE: level-triggered, so retried next pass
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn *c = calloc(1, sizeof *c);
        char *in = malloc(IN_CAPACITY);
        if (!c || !in) {
            free(c);
            free(in);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->in = in;
        struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = c };
        if (epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            conn_close(c);
            continue;
        }
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct epoll_event events[MAX_EVENTS];
    for (;;) {
        // A 1 s timeout keeps the Date header fresh on an idle loop.
        int n = epoll_wait(w->epoll_fd, events, MAX_EVENTS, 1000);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait: %s", strerror(errno));
        }
        refresh_date(w);
        for (int i = 0; i < n; i++) {
            if (events[i].data.ptr == NULL)
                accept_all(w);
            else
                conn_event(w, events[i].data.ptr, events[i].events);
        }
    }
    return NULL;
}

static int open_listener(const char *address, int port)
{
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, address, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        len = sizeof *v4;
    } else if (inet_pton(AF_INET6, address, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        len = sizeof *v6;
    } else {
        die("not a numeric IPv4 or IPv6 address: %s", address);
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die("socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0)
        die("SO_REUSEPORT: %s", strerror(errno));
    if (bind(fd, (struct sockaddr *)&ss, len) != 0)
        die("bind %s:%d: %s", address, port, strerror(errno));
    if (listen(fd, LISTEN_BACKLOG) != 0)
        die("listen: %s", strerror(errno));
    return fd;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: ceiling -p PORT [-a ADDRESS] [-t THREADS]\n"
            "  -p PORT      TCP port to listen on (required)\n"
            "  -a ADDRESS   numeric address to bind (default 127.0.0.1)\n"
            "  -t THREADS   event-loop threads (default: CPUs in this process's affinity mask)\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *address = "127.0.0.1";
    int port = -1, threads = 0, opt;
    while ((opt = getopt(argc, argv, "a:p:t:h")) != -1) {
        switch (opt) {
        case 'a': address = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 't': threads = atoi(optarg); break;
        default: usage();
        }
    }
    if (port < 0 || port > 65535 || threads < 0 || threads > 1024 || optind != argc)
        usage();
    if (threads == 0) {
        cpu_set_t set;
        threads = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
        if (threads < 1)
            threads = 1;
    }

    // Workers never see SIGINT/SIGTERM; the main thread waits for them and exits the process.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct worker *workers = calloc((size_t)threads, sizeof *workers);
    if (!workers)
        die("out of memory");
    // Bind every listener before starting any thread, so a bind error fails the start cleanly.
    for (int i = 0; i < threads; i++) {
        struct worker *w = &workers[i];
        w->index = i;
        w->listen_fd = open_listener(address, port);
        if (port == 0) {
            struct sockaddr_storage ss;
            socklen_t len = sizeof ss;
            getsockname(w->listen_fd, (struct sockaddr *)&ss, &len);
            port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                                 : ((struct sockaddr_in6 *)&ss)->sin6_port);
        }
        w->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
        if (w->epoll_fd < 0)
            die("epoll_create1: %s", strerror(errno));
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
        if (epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, w->listen_fd, &ev) != 0)
            die("epoll_ctl: %s", strerror(errno));
        refresh_date(w);
    }
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]) != 0)
            die("pthread_create failed");
    }
    printf("ceiling: threads=%d urls=http://%s%s%s:%d\n", threads, strchr(address, ':') ? "[" : "",
           address, strchr(address, ':') ? "]" : "", port);
    fflush(stdout);

    int sig;
    sigwait(&stop, &sig);
    return 0;
}
