/* completions.c - what each server CQE means: bytes land in the connection's own buffer, are
 * counted as requests and owed responses; ring buffers go back; sends and POLLOUT settle. */

#include "ringrecv.h"

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
    if (s->kind != V_POLL)
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

void return_buffer(struct server *s, unsigned bid)
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

void handle_cqe(struct server *s, const struct io_uring_cqe *cqe)
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
