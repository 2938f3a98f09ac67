/* client.c - the load generator (CPU 0, epoll, plain syscalls): depth pipelined requests per
 * connection, every response byte checked, then the next batch. */

#include "ringrecv.h"

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

void *client_main(void *arg)
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
