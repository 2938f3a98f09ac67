// wsload: a closed-loop WebSocket echo load generator, for compare.sh's protocols phase.
//
// Each of N connections opens with the HTTP/1.1 upgrade of RFC 6455 section 4: a random 16-byte
// Sec-WebSocket-Key, and the answer's Sec-WebSocket-Accept checked against base64(SHA-1(key + the RFC's
// GUID)). Then it keeps one message in flight: a masked binary frame of SIZE bytes (a fresh random mask
// per frame, as section 5.3 requires), and the next only once the echo is back, matched byte for byte
// (the server may split it into continuation frames). Every connection is upgraded before the clock
// starts; echoes verified inside the window are the "requests". At the end each connection sends a
// close frame and waits for the server's.
//
// With -S every connection speaks TLS (wss) before the upgrade: OpenSSL, the server's certificate not verified
// (benchmark servers make theirs at start), SNI "localhost", ALPN http/1.1 (a WebSocket upgrade needs HTTP/1.1;
// Kestrel also offers h2), TLS 1.2 or 1.3 as OpenSSL negotiates. The TLS handshakes are done before the clock
// starts too, and a failed one before then stops wsload with OpenSSL's reason.
//
// One thread, level-triggered epoll. Output: one JSON line on stdout, in the shape of the WRK_RESULT
// line of benchmarks/lib/pipeline.lua (requests, duration_us, bytes, errors, latency_us), so compare.py
// reads it as it reads wrk's. Latencies are exact to the microsecond up to 100 ms.
//
// Build: gcc -O2 -Wall -Wextra -o wsload wsload.c -lssl -lcrypto     (Debian: libssl-dev)
// Run:   wsload -p PORT [-a 127.0.0.1] [-P /ws] [-c 16] [-d 3] [-s 32] [-S]

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
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
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../loadgen/target.h"
#include "../loadgen/tls.h"

enum {
    MAX_MESSAGE = 1 << 20,
    MAX_HEADER = 14,               // 2 + 8 bytes of 64-bit length + 4 bytes of mask
    IN_SLACK = 8192 + MAX_HEADER,  // read buffer beyond one message: the upgrade answer, a frame's header, a ping
    LAT_BUCKETS = 100000,          // 1 us each: exact up to 100 ms, everything slower in the last one
    DRAIN_NS = 2000000000,         // how long the close handshakes may take at the end
    TIMEOUT_NS = 1000000000,       // a message unanswered this long when the window ends counts as a timeout
};

static const char GUID[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";   // RFC 6455 section 1.3

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("wsload: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// ---- SHA-1 (FIPS 180-4) and base64, for the handshake only -------------------------------------

static uint32_t rol(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

static void sha1(const uint8_t *data, size_t len, uint8_t out[20])
{
    uint32_t h[5] = { 0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0 };
    size_t total = (len + 9 + 63) / 64 * 64;   // the message, 0x80, zeros, the 64-bit bit length
    uint8_t block[64];
    for (size_t off = 0; off < total; off += 64) {
        for (size_t i = 0; i < 64; i++) {
            size_t at = off + i;
            block[i] = at < len ? data[at] : at == len ? 0x80 : 0;
        }
        if (off + 64 == total) {
            uint64_t bits = (uint64_t)len * 8;
            for (int i = 0; i < 8; i++)
                block[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
        }
        uint32_t w[80];
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 | (uint32_t)block[4 * i + 2] << 8 | block[4 * i + 3];
        for (int i = 16; i < 80; i++)
            w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
        for (int i = 0; i < 80; i++) {
            uint32_t f, k;
            if (i < 20) { f = (b & c) | (~b & d); k = 0x5A827999; }
            else if (i < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1; }
            else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDC; }
            else { f = b ^ c ^ d; k = 0xCA62C1D6; }
            uint32_t t = rol(a, 5) + f + e + k + w[i];
            e = d; d = c; c = rol(b, 30); b = a; a = t;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e;
    }
    for (int i = 0; i < 20; i++)
        out[i] = (uint8_t)(h[i / 4] >> (24 - 8 * (i % 4)));
}

static void base64(const uint8_t *in, size_t len, char *out)
{
    static const char table[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < len ? (uint32_t)in[i + 1] << 8 : 0) | (i + 2 < len ? in[i + 2] : 0);
        out[o++] = table[v >> 18 & 63];
        out[o++] = table[v >> 12 & 63];
        out[o++] = i + 1 < len ? table[v >> 6 & 63] : '=';
        out[o++] = i + 2 < len ? table[v & 63] : '=';
    }
    out[o] = '\0';
}

// ---- connections -------------------------------------------------------------------------------

enum state { CONNECTING, HANDSHAKING, UPGRADING, OPEN, CLOSING, DONE };   // HANDSHAKING: TLS, -S only

struct conn {
    int fd, index;
    enum state state;
    int want_out;                  // EPOLLOUT registered
    SSL *ssl;                      // -S: the TLS session, from the TCP connect on
    int read_wants_write;          // -S: the last SSL_read or SSL_do_handshake waits for the socket to take bytes
    int write_wants_read;          // -S: the last SSL_write waits for bytes from the server (the out bytes stay)
    char accept[29];               // the Sec-WebSocket-Accept the server must answer
    uint8_t *out;                  // bytes to write: the upgrade request, a frame, a pong, the close frame
    size_t out_len, out_off, out_cap;
    uint8_t *in;
    size_t in_len;
    uint8_t *message;              // the message in flight, unmasked
    uint64_t seq, sent_at;
    int in_flight;                 // a message is waiting for its echo
    size_t echoed;                 // bytes of its echo verified so far (continuation frames)
};

struct errors {
    uint64_t connect, read, write, status, parse, closed, close, timeout;
};

static struct sockaddr_storage target;
static socklen_t target_len;
static char host[128];
static const char *path = "/ws";
static size_t size = 32;
static int epoll_fd;
static SSL_CTX *tls;                        // -S
static struct errors err;
static uint64_t window_start, window_end;   // echoes verified in [start, end) are counted
static int stopping;                        // the window is over: a failed connection is not started again
static uint64_t requests, bytes_in;
static uint64_t lat_counts[LAT_BUCKETS], lat_total, lat_max;
static long double lat_sum;
static uint64_t rng;

static uint32_t random32(void)   // xorshift64*: cheap, seeded from getrandom, for frame masks
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 2685821657736338717ull) >> 32);
}

static void set_events(struct conn *c, int op)
{
    struct epoll_event ev = { .events = EPOLLIN | (c->want_out ? EPOLLOUT : 0), .data.ptr = c };
    if (epoll_ctl(epoll_fd, op, c->fd, &ev) != 0)
        die("epoll_ctl: %s", strerror(errno));
}

// EPOLLOUT is wanted while bytes wait for the socket (without TLS; with it, unless SSL_write waits to read, which
// EPOLLIN, always registered, reports), and while SSL_read or the handshake waits to write.
static void update_out(struct conn *c)
{
    int want = c->read_wants_write || (c->state != HANDSHAKING && c->out_off < c->out_len && !c->write_wants_read);
    if (want != c->want_out) {
        c->want_out = want;
        set_events(c, EPOLL_CTL_MOD);
    }
}

// Makes room for len more bytes to write: out holds the upgrade request, or a message, a pong and a close frame.
static uint8_t *reserve(struct conn *c, size_t len)
{
    if (c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    if (c->out_len + len > c->out_cap)
        die("more than %zu bytes waiting to be written on one connection", c->out_cap);
    uint8_t *at = c->out + c->out_len;
    c->out_len += len;
    return at;
}

// A client frame (RFC 6455 5.2): FIN, the opcode, the masked length, the mask, the masked payload.
static void queue_frame(struct conn *c, uint8_t opcode, const uint8_t *payload, size_t len)
{
    uint8_t head[MAX_HEADER];
    size_t n = 0;
    head[n++] = 0x80 | opcode;
    if (len < 126) {
        head[n++] = 0x80 | (uint8_t)len;
    } else if (len <= 0xFFFF) {
        head[n++] = 0x80 | 126;
        head[n++] = (uint8_t)(len >> 8);
        head[n++] = (uint8_t)len;
    } else {
        head[n++] = 0x80 | 127;
        for (int i = 7; i >= 0; i--)
            head[n++] = (uint8_t)((uint64_t)len >> (8 * i));
    }
    uint32_t mask = random32();
    memcpy(head + n, &mask, 4);
    const uint8_t *key = head + n;
    n += 4;
    uint8_t *frame = reserve(c, n + len);
    memcpy(frame, head, n);
    for (size_t i = 0; i < len; i++)
        frame[n + i] = payload[i] ^ key[i & 3];
}

static void conn_open(struct conn *c)
{
    c->fd = socket(target.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        die("socket: %s", strerror(errno));
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->state = CONNECTING;
    c->want_out = 1;
    c->read_wants_write = c->write_wants_read = 0;
    c->out_len = c->out_off = c->in_len = 0;
    c->in_flight = 0;
    if (connect(c->fd, (struct sockaddr *)&target, target_len) != 0 && errno != EINPROGRESS)
        err.connect++;

    uint8_t nonce[16], digest[20];
    char key[25], proof[64];
    if (getrandom(nonce, sizeof nonce, 0) != sizeof nonce)
        die("getrandom: %s", strerror(errno));
    base64(nonce, sizeof nonce, key);
    snprintf(proof, sizeof proof, "%s%s", key, GUID);
    sha1((const uint8_t *)proof, strlen(proof), digest);
    base64(digest, sizeof digest, c->accept);
    char request[512];
    int n = snprintf(request, sizeof request,
                     "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", path, host, key);
    memcpy(reserve(c, (size_t)n), request, (size_t)n);
    set_events(c, EPOLL_CTL_ADD);
}

// Closes the socket. -S: frees the TLS session, after a close_notify when the connection ended cleanly (best
// effort: the server's is not waited for).
static void conn_close(struct conn *c, int clean)
{
    if (c->ssl) {
        if (clean) {
            ERR_clear_error();
            SSL_shutdown(c->ssl);
        }
        SSL_free(c->ssl);
        c->ssl = NULL;
    }
    close(c->fd);
}

// Counts the failure and, until the window is over, starts the connection over (a new upgrade).
static void conn_fail(struct conn *c, uint64_t *counter)
{
    (*counter)++;
    conn_close(c, 0);
    if (stopping)
        c->state = DONE;
    else
        conn_open(c);
}

static void send_message(struct conn *c, uint64_t now)
{
    c->seq++;
    for (size_t i = 0; i < size; i++)   // the connection and the sequence number in every message
        c->message[i] = (uint8_t)(i < 8 ? c->seq >> (8 * i) : (uint64_t)c->index + i);
    queue_frame(c, 0x2, c->message, size);
    c->in_flight = 1;
    c->echoed = 0;
    c->sent_at = now;
}

static void record(uint64_t now, uint64_t took)
{
    if (now < window_start || now >= window_end)
        return;
    requests++;
    uint64_t us = took / 1000;
    lat_counts[us < LAT_BUCKETS ? us : LAT_BUCKETS - 1]++;
    lat_total++;
    lat_sum += (long double)us;
    if (us > lat_max)
        lat_max = us;
}

static uint64_t percentile(double p)
{
    uint64_t rank = (uint64_t)(p / 100.0 * (double)lat_total + 0.9999999), seen = 0;
    for (uint64_t b = 0; b < LAT_BUCKETS; b++) {
        seen += lat_counts[b];
        if (seen >= (rank ? rank : 1))
            return b < LAT_BUCKETS - 1 ? b : lat_max;
    }
    return lat_max;
}

// The server's answer to the upgrade: 0 while incomplete, 1 when accepted, -1 when refused or wrong.
static int parse_upgrade(struct conn *c)
{
    const uint8_t *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
    if (!end)
        return c->in_len > 8192 ? -1 : 0;
    size_t head = (size_t)(end - c->in) + 4;
    int ok = c->in_len >= 12 && memcmp(c->in, "HTTP/1.1 101", 12) == 0;
    int accepted = 0, upgraded = 0;
    const char *stop = (const char *)end;
    for (const char *line = (const char *)memchr(c->in, '\n', head) + 1; line < stop;) {
        const char *eol = memchr(line, '\n', (size_t)(stop + 2 - line));
        size_t len = (size_t)(eol - line);
        if (len > 21 && strncasecmp(line, "sec-websocket-accept:", 21) == 0) {
            const char *v = line + 21;
            while (*v == ' ')
                v++;
            accepted = eol - v >= 29 && memcmp(v, c->accept, 28) == 0 && (v[28] == '\r' || v[28] == ' ');
        } else if (len > 8 && strncasecmp(line, "upgrade:", 8) == 0) {
            upgraded = memmem(line, len, "websocket", 9) || memmem(line, len, "WebSocket", 9);
        }
        line = eol + 1;
    }
    if (!(ok && accepted && upgraded) && !window_start)   // before the run: a server without the endpoint
        die("the upgrade was refused: %.*s%s", (int)strcspn((const char *)c->in, "\r"), (const char *)c->in,
            ok ? " (without the right Upgrade or Sec-WebSocket-Accept)" : "");
    memmove(c->in, c->in + head, c->in_len - head);
    c->in_len -= head;
    return ok && accepted && upgraded ? 1 : -1;
}

// Consumes every complete frame in the buffer. Returns 0, or -1 after conn_fail or the end of a close.
static int parse_frames(struct conn *c, uint64_t now)
{
    size_t pos = 0;
    while (c->in_len - pos >= 2) {
        const uint8_t *f = c->in + pos;
        size_t avail = c->in_len - pos, head = 2;
        uint8_t opcode = f[0] & 0x0F;
        uint64_t len = f[1] & 0x7F;
        if ((f[0] & 0x70) || (f[1] & 0x80)) {   // no extension was negotiated, and a server never masks
            conn_fail(c, &err.parse);
            return -1;
        }
        if (len == 126) {
            if (avail < 4)
                break;
            len = (uint64_t)f[2] << 8 | f[3];
            head = 4;
        } else if (len == 127) {
            if (avail < 10)
                break;
            len = 0;
            for (int i = 0; i < 8; i++)
                len = len << 8 | f[2 + i];
            head = 10;
        }
        // Checked before the payload is waited for, so no frame can be larger than the buffer: a control frame
        // carries at most 125 bytes and is never fragmented (RFC 6455 5.5); an echo is no longer than its message.
        if ((opcode & 0x8) ? len > 125 || !(f[0] & 0x80) : c->echoed + len > size) {
            conn_fail(c, &err.parse);
            return -1;
        }
        if (avail < head + len)
            break;
        const uint8_t *payload = f + head;
        pos += head + (size_t)len;
        if (opcode == 0x8) {   // close: the answer to ours, or the server leaving
            if (c->state != CLOSING) {
                conn_fail(c, &err.closed);
                return -1;
            }
            c->state = DONE;
            epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
            conn_close(c, 1);
            return -1;
        }
        if (opcode == 0x9) {   // ping: a pong with the same payload
            queue_frame(c, 0xA, payload, (size_t)len);
            continue;
        }
        if (opcode == 0xA || c->state == CLOSING)   // an unsolicited pong; an echo after our close
            continue;
        int first = c->echoed == 0;
        if (!c->in_flight || (first ? opcode != 0x2 : opcode != 0x0)
            || memcmp(payload, c->message + c->echoed, (size_t)len) != 0) {
            conn_fail(c, &err.parse);
            return -1;
        }
        c->echoed += (size_t)len;
        if (f[0] & 0x80) {   // FIN: the whole message is back
            if (c->echoed != size) {
                conn_fail(c, &err.parse);
                return -1;
            }
            c->in_flight = 0;
            record(now, now - c->sent_at);
            if (now < window_end)
                send_message(c, now);
        }
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
    return 0;
}

// -S: one SSL_write per TLS record (partial writes on). One that waits is called again with the same bytes, though
// maybe more of them: the out buffer is only appended to while bytes wait. Returns 0, or -1 after conn_fail.
static int write_tls(struct conn *c)
{
    while (c->out_off < c->out_len) {
        ERR_clear_error();
        int w = SSL_write(c->ssl, c->out + c->out_off, (int)(c->out_len - c->out_off));
        if (w > 0) {
            c->write_wants_read = 0;
            c->out_off += (size_t)w;
            continue;
        }
        int e = SSL_get_error(c->ssl, w);
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
            conn_fail(c, &err.write);
            return -1;
        }
        c->write_wants_read = e == SSL_ERROR_WANT_READ;
        break;
    }
    return 0;
}

static int write_plain(struct conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (w < 0) {
            conn_fail(c, &err.write);
            return -1;
        }
        c->out_off += (size_t)w;
    }
    return 0;
}

// Writes what is queued, as far as the socket takes it.
static void conn_write(struct conn *c)
{
    if (c->state == CONNECTING || c->state == HANDSHAKING || c->state == DONE)
        return;
    if ((c->ssl ? write_tls(c) : write_plain(c)) == 0)
        update_out(c);
}

// n more bytes arrived in c->in: the upgrade's answer, frames. Returns 0, or -1 after conn_fail or the end of a close.
static int conn_received(struct conn *c, size_t n, uint64_t now)
{
    c->in_len += n;
    if (now >= window_start && now < window_end)
        bytes_in += (uint64_t)n;
    if (c->state == UPGRADING) {
        int upgraded = parse_upgrade(c);
        if (upgraded < 0) {
            conn_fail(c, &err.status);
            return -1;
        }
        if (upgraded == 0)
            return 0;
        c->state = OPEN;
        if (window_start && now < window_end)   // a connection started over during the window goes on
            send_message(c, now);
    }
    return parse_frames(c, now);
}

// -S: SSL_read until OpenSSL holds no more of what it took from the socket, which epoll would not report again (with
// read-ahead off, OpenSSL's default, it takes at most the record it decrypts; the rest stays in the socket).
static void read_tls(struct conn *c, uint64_t now)
{
    for (;;) {
        ERR_clear_error();   // parse_frames leaves room: at most one partial frame stays in the buffer
        int n = SSL_read(c->ssl, c->in + c->in_len, (int)(size + IN_SLACK - c->in_len));
        if (n <= 0) {
            int e = SSL_get_error(c->ssl, n);
            if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {   // EOF (close_notify or not) or an error
                conn_fail(c, c->state == CLOSING ? &err.close : &err.read);
                return;
            }
            c->read_wants_write = e == SSL_ERROR_WANT_WRITE;
            break;
        }
        c->read_wants_write = 0;
        if (conn_received(c, (size_t)n, now) != 0)
            return;
        if (!SSL_has_pending(c->ssl))
            break;
    }
    // What the frames queued (the next message, a pong), or a write that waited for this read.
    if (c->out_off < c->out_len)
        conn_write(c);
    else
        update_out(c);
}

static void conn_read(struct conn *c, uint64_t now)
{
    if (c->ssl) {
        read_tls(c, now);
        return;
    }
    ssize_t n = read(c->fd, c->in + c->in_len, size + IN_SLACK - c->in_len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    if (n <= 0) {   // EOF or an error before the closing handshake ended
        conn_fail(c, c->state == CLOSING ? &err.close : &err.read);
        return;
    }
    if (conn_received(c, (size_t)n, now) == 0 && c->out_off < c->out_len)
        conn_write(c);
}

// -S: drives the TLS handshake on. Returns 1 once it is done (the connection is then UPGRADING), 0 while it waits for
// the socket, -1 after conn_fail. A failure is a connect error, and the first is told on stderr; one of TLS itself
// before the run (not a reset: a server that does not speak TLS on this port, say) stops wsload.
static int conn_handshake(struct conn *c)
{
    ERR_clear_error();
    int r = SSL_do_handshake(c->ssl);
    if (r == 1) {
        c->state = UPGRADING;
        c->read_wants_write = 0;
        return 1;
    }
    int e = SSL_get_error(c->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        c->read_wants_write = e == SSL_ERROR_WANT_WRITE;
        update_out(c);
        return 0;
    }
    char text[256];
    const char *why = tls_error_text(e, text, sizeof text);
    if (!window_start && e == SSL_ERROR_SSL)
        die("the TLS handshake with %s failed: %s (does the server speak TLS on this port?)", host, why);
    static int told;
    if (!told++)
        fprintf(stderr, "wsload: a TLS handshake with %s failed (a connect error): %s\n", host, why);
    usleep(1000);   // no hot reconnect loop, as after a refused connect
    conn_fail(c, &err.connect);
    return -1;
}

static void conn_event(struct conn *c, uint32_t events, uint64_t now)
{
    if (c->state == CONNECTING) {
        int e = 0;
        socklen_t len = sizeof e;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &len);
        if (e != 0 || (events & (EPOLLERR | EPOLLHUP))) {
            usleep(1000);   // no hot reconnect loop against a refusing server
            conn_fail(c, &err.connect);
            return;
        }
        if (!(events & EPOLLOUT))
            return;
        c->state = UPGRADING;
        if (tls) {
            c->ssl = SSL_new(tls);
            if (!c->ssl || SSL_set_fd(c->ssl, c->fd) != 1 || SSL_set_tlsext_host_name(c->ssl, "localhost") != 1)
                die("SSL_new failed");
            SSL_set_mode(c->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
            SSL_set_connect_state(c->ssl);
            c->state = HANDSHAKING;
        }
    }
    if (c->state == HANDSHAKING) {
        if (conn_handshake(c) == 1)
            conn_write(c);   // the upgrade request, queued since the connect
        return;
    }
    if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) || (c->read_wants_write && (events & EPOLLOUT)))
        conn_read(c, now);   // which writes what it queued, or starts the connection over
    else
        conn_write(c);
}

// Runs the loop until `until`, or until no connection is in one of the states `waiting` counts.
static void run(struct conn *conns, int count, uint64_t until, int (*waiting)(const struct conn *))
{
    static struct epoll_event events[256];
    for (;;) {
        uint64_t now = now_ns();
        int pending = 0;
        for (int i = 0; waiting && i < count; i++)
            pending += waiting(&conns[i]);
        if (now >= until || (waiting && pending == 0))
            return;
        int n = epoll_wait(epoll_fd, events, 256, (int)((until - now + 999999) / 1000000));
        if (n < 0 && errno != EINTR)
            die("epoll_wait: %s", strerror(errno));
        now = now_ns();
        for (int i = 0; i < n; i++)
            conn_event(events[i].data.ptr, events[i].events, now);
    }
}

static int not_open(const struct conn *c) { return c->state < OPEN; }   // connecting, handshaking, upgrading
static int not_done(const struct conn *c) { return c->state != DONE; }

static void usage(void)
{
    fprintf(stderr,
            "usage: wsload -p PORT [options]\n"
            "  -a ADDRESS  numeric server address (default 127.0.0.1)\n"
            "  -p PORT     server port\n"
            "  -P PATH     the WebSocket endpoint (default /ws)\n"
            "  -c N        connections, each with one message in flight (default 16)\n"
            "  -d SECONDS  measured duration (default 3)\n"
            "  -s BYTES    message size, 1 to %d (default 32)\n"
            "  -S          TLS (wss): a TLS handshake before the upgrade; the certificate is not verified,\n"
            "              SNI localhost, ALPN http/1.1\n", MAX_MESSAGE);
    exit(2);
}

int main(int argc, char **argv)
{
    const char *address = "127.0.0.1";
    int port = -1, connections = 16, opt, use_tls = 0;
    double duration = 3;
    while ((opt = getopt(argc, argv, "a:p:P:c:d:s:Sh")) != -1) {
        switch (opt) {
        case 'a': address = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 'P': path = optarg; break;
        case 'c': connections = atoi(optarg); break;
        case 'd': duration = atof(optarg); break;
        case 's': size = (size_t)atol(optarg); break;
        case 'S': use_tls = 1; break;
        default: usage();
        }
    }
    if (port <= 0 || port > 65535 || connections < 1 || duration <= 0 || size < 1 || size > MAX_MESSAGE
        || strlen(path) > 256 || optind != argc)
        usage();

    if (parse_target(address, port, &target, &target_len, host, sizeof host) != 0)
        die("not a numeric address: %s", address);
    if (getrandom(&rng, sizeof rng, 0) != sizeof rng)
        die("getrandom: %s", strerror(errno));
    rng |= 1;
    if (use_tls && !(tls = tls_client_context()))
        die("OpenSSL could not make a TLS client context");

    signal(SIGPIPE, SIG_IGN);
    epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd < 0)
        die("epoll_create1: %s", strerror(errno));
    struct conn *conns = calloc((size_t)connections, sizeof *conns);
    if (!conns)
        die("out of memory");
    for (int i = 0; i < connections; i++) {
        conns[i].index = i;
        conns[i].out_cap = size + 2 * MAX_HEADER + 125 + 2 + 512;   // a message, a pong, a close; or the upgrade
        conns[i].out = malloc(conns[i].out_cap);
        conns[i].in = malloc(size + IN_SLACK);
        conns[i].message = malloc(size);
        if (!conns[i].out || !conns[i].in || !conns[i].message)
            die("out of memory");
        conn_open(&conns[i]);
    }

    // Every connection upgraded before the clock starts, within 5 s.
    run(conns, connections, now_ns() + 5000000000ull, not_open);
    int refused = 0;
    for (int i = 0; i < connections; i++)
        refused += not_open(&conns[i]);
    if (refused)
        die("%d of %d connections not upgraded within 5 s (connect %llu, status %llu errors)", refused, connections,
            (unsigned long long)err.connect, (unsigned long long)err.status);

    window_start = now_ns();
    window_end = window_start + (uint64_t)(duration * 1e9);
    for (int i = 0; i < connections; i++) {
        send_message(&conns[i], window_start);
        conn_write(&conns[i]);
    }
    run(conns, connections, window_end, NULL);

    // The closing handshake (RFC 6455 7.1.2): ours, then the server's; echoes still in flight are dropped.
    uint64_t end = now_ns();
    stopping = 1;
    for (int i = 0; i < connections; i++) {
        struct conn *c = &conns[i];
        if (c->state != OPEN) {   // still upgrading after a failure
            conn_close(c, 0);
            c->state = DONE;
            continue;
        }
        if (c->in_flight && end - c->sent_at > TIMEOUT_NS)
            err.timeout++;
        static const uint8_t normal[2] = { 1000 >> 8, 1000 & 0xFF };
        queue_frame(c, 0x8, normal, sizeof normal);
        c->state = CLOSING;
        conn_write(c);
    }
    run(conns, connections, end + DRAIN_NS, not_done);
    for (int i = 0; i < connections; i++) {
        if (conns[i].state == CLOSING) {
            err.close++;
            conn_close(&conns[i], 0);
        }
    }

    printf("{\"requests\": %llu, \"duration_us\": %llu, \"bytes\": %llu, \"connections\": %d, \"message_bytes\": %zu, ",
           (unsigned long long)requests, (unsigned long long)((window_end - window_start) / 1000),
           (unsigned long long)bytes_in, connections, size);
    if (tls)
        printf("\"tls\": true, ");
    printf("\"errors\": {\"connect\": %llu, \"read\": %llu, \"write\": %llu, \"status\": %llu, \"parse\": %llu, "
           "\"closed\": %llu, \"close\": %llu, \"timeout\": %llu}, ",
           (unsigned long long)err.connect, (unsigned long long)err.read, (unsigned long long)err.write,
           (unsigned long long)err.status, (unsigned long long)err.parse, (unsigned long long)err.closed,
           (unsigned long long)err.close, (unsigned long long)err.timeout);
    printf("\"latency_us\": {\"p50\": %llu, \"p90\": %llu, \"p99\": %llu, \"max\": %llu, \"mean\": %.1f}}\n",
           (unsigned long long)percentile(50), (unsigned long long)percentile(90),
           (unsigned long long)percentile(99), (unsigned long long)lat_max,
           lat_total ? (double)(lat_sum / lat_total) : 0.0);
    return 0;
}
