/* run.c - one measurement: fresh connections, the server and load-generator threads, the
 * end-of-run accounting checks, and the counters turned into a result. */

#include "ringrecv.h"

int listen_fd;
struct sockaddr_in listen_addr;
int skipped[V_COUNT];
char skip_why[V_COUNT][256];

static void join_or_die(pthread_t t, const char *who, double limit_s)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)limit_s;
    int r = pthread_timedjoin_np(t, NULL, &ts);
    if (r != 0)
        die("the %s thread did not finish within %.0f s of the end of the measurement: %s", who, limit_s, strerror(r));
}

struct result run_one(int variant)
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
        memcpy(cl->wbuf + (size_t)d * REQ_LEN, REQUEST_TEXT, REQ_LEN);
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
        double passes = (double)(b->passes - a->passes);
        res.cqes_per_wait = (double)(b->wait_cqes - a->wait_cqes) / passes;
        res.capped_share = (double)(b->capped_waits - a->capped_waits) / passes;
        res.drains_per_pass = (double)(b->drain_enters - a->drain_enters) / passes;
        res.enobufs = b->enobufs - a->enobufs;
        res.ms_ended = b->ms_ended - a->ms_ended;
        res.short_sends = b->short_sends - a->short_sends;
        res.eagain_sends = b->eagain_sends - a->eagain_sends;
        res.recv_eagain = b->recv_eagain - a->recv_eagain;
        res.recv_ops = b->recv_ops - a->recv_ops;
        res.recv_cqes = b->recv_cqes - a->recv_cqes;
        if (opt.verbose)
            fprintf(stderr,
                    "  [%s] lifetime: %llu io_uring_enter (%llu to drain), %llu CQEs, %llu passes, %llu requests, "
                    "%llu ENOBUFS\n",
                    variant_names[variant], (unsigned long long)s->c.enters, (unsigned long long)s->c.drain_enters,
                    (unsigned long long)s->c.cqes,
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
