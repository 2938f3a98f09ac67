/*
 * test_io.c - receive and send batches over real AF_UNIX and loopback TCP sockets.
 * The same checks run once per io_mode, so the synchronous path, the AIO ring path and
 * the chunked AIO path must all produce identical results.
 */
#include <errno.h>
#include <time.h> /* before linux/errqueue.h, which uses struct timespec */
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ktl_test.h"

#define NOT_SET (-999)

static volatile sig_atomic_t sigpipe_count;

static void on_sigpipe(int sig)
{
    (void)sig;
    sigpipe_count++;
}

static void close_pair(int fds[2])
{
    close(fds[0]);
    close(fds[1]);
}

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void make_pair(int i, int fds[2])
{
    if (i % 2 == 0)
        unix_pair(fds);
    else
        tcp_pair(fds);
}

/* Several sockets, several kinds, single and scattered iovecs, one call. */
static void test_receive_many(const io_mode *m)
{
    enum { N = 8, BUF = 4096 };
    ktl_engine *engine = test_engine(m, m->aio_capacity);
    int pairs[N][2];
    size_t lens[N];
    static uint8_t bufs[N][BUF];
    struct iovec iovs[N][3];
    ktl_op ops[N];
    uint8_t payload[BUF];

    for (int i = 0; i < N; i++) {
        int scattered = i % 3 == 0;
        make_pair(i, pairs[i]);
        lens[i] = scattered ? 700 : 1 + (size_t)i * 397;
        fill_pattern(payload, lens[i], (unsigned)i, 0);
        write_all(pairs[i][1], payload, lens[i]);

        memset(bufs[i], 0xEE, BUF);
        if (scattered) {
            /* Out of memory order, so data landing contiguously instead of per iovec
             * shows up as a pattern mismatch. */
            iovs[i][0] = (struct iovec){ bufs[i] + 3000, 5 };
            iovs[i][1] = (struct iovec){ bufs[i] + 2000, 100 };
            iovs[i][2] = (struct iovec){ bufs[i], 900 };
            ops[i] = (ktl_op){ .fd = pairs[i][0], .iov_count = 3, .iov = iovs[i], .result = NOT_SET };
        } else {
            iovs[i][0] = (struct iovec){ bufs[i], BUF };
            ops[i] = (ktl_op){ .fd = pairs[i][0], .iov_count = 1, .iov = iovs[i], .result = NOT_SET };
        }
        CHECK(wait_readable(pairs[i][0], 5000));
    }

    CHECK_EQ(test_batch(engine, m, KTL_OP_RECEIVE, ops, N), N);

    for (int i = 0; i < N; i++) {
        CHECK_EQ(ops[i].result, (long long)lens[i]);
        if (ops[i].iov_count == 3) {
            CHECK(check_pattern(bufs[i] + 3000, 5, (unsigned)i, 0));
            CHECK(check_pattern(bufs[i] + 2000, 100, (unsigned)i, 5));
            CHECK(check_pattern(bufs[i], 595, (unsigned)i, 105));
            CHECK_EQ(bufs[i][595], 0xEE);
            CHECK_EQ(bufs[i][3005], 0xEE);
        } else {
            CHECK(check_pattern(bufs[i], lens[i], (unsigned)i, 0));
            CHECK_EQ(bufs[i][lens[i]], 0xEE);
        }
    }

    /* Everything was consumed: the next pass finds every socket empty. */
    CHECK_EQ(test_batch(engine, m, KTL_OP_RECEIVE, ops, N), N);
    for (int i = 0; i < N; i++)
        CHECK_EQ(ops[i].result, -EAGAIN);

    for (int i = 0; i < N; i++)
        close_pair(pairs[i]);
    ktl_engine_destroy(engine);
}

/* Per-op outcomes must not bleed into each other, including when io_submit stops
 * part-way at an op it rejects (bad fd) and the rest runs synchronously. */
enum role { DATA_U, EMPTY, AT_EOF, BAD_FD, NO_IOV, DATA_T, DATA_U2 };

static void test_receive_mixed(const io_mode *m)
{
    enum { N = 7 };
    /* Round 0 has the bad fd mid-batch (io_submit returns a short count); round 1 has it
     * first (io_submit fails outright). */
    static const enum role layouts[2][N] = {
        { DATA_U, EMPTY, AT_EOF, BAD_FD, NO_IOV, DATA_T, DATA_U2 },
        { BAD_FD, DATA_U, EMPTY, AT_EOF, NO_IOV, DATA_T, DATA_U2 },
    };
    ktl_engine *engine = test_engine(m, m->aio_capacity);
    int data_u[2], empty[2], eof[2], data_t[2], data_u2[2];
    uint8_t bufs[N][64];
    struct iovec iovs[N];
    ktl_op ops[N];
    uint8_t payload[64];

    unix_pair(data_u);
    unix_pair(empty);
    unix_pair(eof);
    tcp_pair(data_t);
    unix_pair(data_u2);
    CHECK(shutdown(eof[1], SHUT_WR) == 0);

    for (int round = 0; round < 2; round++) {
        fill_pattern(payload, 10, 1, 0);
        write_all(data_u[1], payload, 10);
        fill_pattern(payload, 20, 2, 0);
        write_all(data_t[1], payload, 20);
        fill_pattern(payload, 30, 3, 0);
        write_all(data_u2[1], payload, 30);
        CHECK(wait_readable(data_t[0], 5000));

        for (int i = 0; i < N; i++) {
            enum role r = layouts[round][i];
            int fd = r == DATA_U ? data_u[0] : r == EMPTY ? empty[0] : r == AT_EOF ? eof[0]
                   : r == DATA_T ? data_t[0] : r == DATA_U2 ? data_u2[0]
                   : r == NO_IOV ? data_u[0] : -1;
            memset(bufs[i], 0, sizeof(bufs[i]));
            iovs[i] = (struct iovec){ bufs[i], sizeof(bufs[i]) };
            ops[i] = (ktl_op){ .fd = fd, .iov_count = r == NO_IOV ? 0 : 1, .iov = &iovs[i], .result = NOT_SET };
        }

        CHECK_EQ(test_batch(engine, m, KTL_OP_RECEIVE, ops, N), N);

        for (int i = 0; i < N; i++) {
            switch (layouts[round][i]) {
            case DATA_U:
                CHECK_EQ(ops[i].result, 10);
                CHECK(check_pattern(bufs[i], 10, 1, 0));
                break;
            case EMPTY: CHECK_EQ(ops[i].result, -EAGAIN); break;
            case AT_EOF: CHECK_EQ(ops[i].result, 0); break;
            case BAD_FD: CHECK_EQ(ops[i].result, -EBADF); break;
            case NO_IOV: CHECK_EQ(ops[i].result, -EINVAL); break;
            case DATA_T:
                CHECK_EQ(ops[i].result, 20);
                CHECK(check_pattern(bufs[i], 20, 2, 0));
                break;
            case DATA_U2:
                CHECK_EQ(ops[i].result, 30);
                CHECK(check_pattern(bufs[i], 30, 3, 0));
                break;
            }
        }
    }

    close_pair(data_u);
    close_pair(empty);
    close_pair(eof);
    close_pair(data_t);
    close_pair(data_u2);
    ktl_engine_destroy(engine);
}

static int64_t receive_one(ktl_engine *engine, const io_mode *m, int fd, void *buf, size_t len)
{
    struct iovec iov = { buf, len };
    ktl_op op = { .fd = fd, .iov_count = 1, .iov = &iov, .result = NOT_SET };
    CHECK_EQ(test_batch(engine, m, KTL_OP_RECEIVE, &op, 1), 1);
    return op.result;
}

static int64_t send_one(ktl_engine *engine, const io_mode *m, int fd, const void *buf, size_t len)
{
    struct iovec iov = { (void *)buf, len };
    ktl_op op = { .fd = fd, .iov_count = 1, .iov = &iov, .result = NOT_SET };
    CHECK_EQ(test_batch(engine, m, KTL_OP_SEND, &op, 1), 1);
    return op.result;
}

static void test_receive_eagain_and_eof(const io_mode *m)
{
    ktl_engine *engine = test_engine(m, m->aio_capacity);
    uint8_t buf[32];

    for (int kind = 0; kind < 2; kind++) {
        int fds[2];
        make_pair(kind, fds);
        CHECK_EQ(receive_one(engine, m, fds[0], buf, sizeof(buf)), -EAGAIN);
        write_all(fds[1], "abc", 3);
        CHECK(wait_readable(fds[0], 5000));
        CHECK_EQ(receive_one(engine, m, fds[0], buf, sizeof(buf)), 3);
        CHECK(memcmp(buf, "abc", 3) == 0);
        CHECK(shutdown(fds[1], SHUT_WR) == 0);
        CHECK(wait_readable(fds[0], 5000));
        CHECK_EQ(receive_one(engine, m, fds[0], buf, sizeof(buf)), 0);
        /* EOF is sticky, as the transport relies on when it sees it twice. */
        CHECK_EQ(receive_one(engine, m, fds[0], buf, sizeof(buf)), 0);
        close_pair(fds);
    }
    ktl_engine_destroy(engine);
}

/* An RST (SO_LINGER {1, 0} close) reaches the reader as -ECONNRESET, not as EOF. */
static void test_receive_reset(const io_mode *m)
{
    ktl_engine *engine = test_engine(m, m->aio_capacity);
    struct linger lg = { 1, 0 };
    uint8_t buf[32];
    int fds[2];

    tcp_pair(fds);
    CHECK(setsockopt(fds[1], SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) == 0);
    close(fds[1]);
    CHECK(wait_readable(fds[0], 5000));
    CHECK_EQ(receive_one(engine, m, fds[0], buf, sizeof(buf)), -ECONNRESET);
    close(fds[0]);
    ktl_engine_destroy(engine);
}

/* Gathered sends on several sockets in one call; every peer reads its bytes intact. */
static void test_send_many(const io_mode *m)
{
    enum { N = 8 };
    ktl_engine *engine = test_engine(m, m->aio_capacity);
    int pairs[N][2];
    static uint8_t src[N][3][2048];
    static uint8_t got[3 * 2048];
    struct iovec iovs[N][3];
    size_t totals[N];
    ktl_op ops[N];

    for (int i = 0; i < N; i++) {
        size_t seg[3] = { 1 + (size_t)i * 100, 17, 2048 - (size_t)i * 200 };
        size_t off = 0;
        make_pair(i, pairs[i]);
        for (int s = 0; s < 3; s++) {
            fill_pattern(src[i][s], seg[s], (unsigned)(i + 40), off);
            iovs[i][s] = (struct iovec){ src[i][s], seg[s] };
            off += seg[s];
        }
        totals[i] = off;
        ops[i] = (ktl_op){ .fd = pairs[i][0], .iov_count = 3, .iov = iovs[i], .result = NOT_SET };
    }

    CHECK_EQ(test_batch(engine, m, KTL_OP_SEND, ops, N), N);

    for (int i = 0; i < N; i++) {
        CHECK_EQ(ops[i].result, (long long)totals[i]);
        read_exact(pairs[i][1], got, totals[i]);
        CHECK(check_pattern(got, totals[i], (unsigned)(i + 40), 0));
        /* Nothing beyond what the op reported. */
        CHECK_EQ(read(pairs[i][1], got, 1), -1);
        CHECK_EQ(errno, EAGAIN);
        close_pair(pairs[i]);
    }
    ktl_engine_destroy(engine);
}

/* A send into a full socket reports what fitted, then -EAGAIN; the reported count is
 * exactly what the peer receives. */
static void test_send_full(const io_mode *m)
{
    const size_t big = 32u << 20; /* above tcp_wmem + tcp_rmem maxima (4 + 6 MiB defaults) */
    ktl_engine *engine = test_engine(m, m->aio_capacity);
    uint8_t *data = malloc(big);
    uint8_t *back = malloc(big);

    CHECK(data != NULL && back != NULL);
    fill_pattern(data, big, 77, 0);

    for (int kind = 0; kind < 2; kind++) {
        int fds[2];
        size_t total = 0;
        int64_t r;
        int tries = 0;

        make_pair(kind, fds);
        r = send_one(engine, m, fds[0], data, big);
        CHECK(r > 0 && (size_t)r < big);
        total += (size_t)r;

        /* AF_UNIX charges queued data to the sender's buffer, so the very next send
         * fails; TCP may still grow its windows a little, hence the loop. */
        for (;;) {
            r = send_one(engine, m, fds[0], data + total, big - total);
            if (r < 0)
                break;
            CHECK(kind == 1 && r > 0);
            total += (size_t)r;
            CHECK(++tries < 10000);
        }
        CHECK_EQ(r, -EAGAIN);

        read_exact(fds[1], back, total);
        CHECK(check_pattern(back, total, 77, 0));
        CHECK_EQ(read(fds[1], back, 1), -1);
        CHECK_EQ(errno, EAGAIN);

        /* Drained, the socket takes data again. */
        r = send_one(engine, m, fds[0], data + total, 1000);
        CHECK_EQ(r, 1000);
        read_exact(fds[1], back, 1000);
        CHECK(check_pattern(back, 1000, 77, total));
        close_pair(fds);
    }

    free(data);
    free(back);
    ktl_engine_destroy(engine);
}

/* A peer that went away is an op result, never the death of the process. */
static void test_send_closed_peer(const io_mode *m)
{
    ktl_engine *engine = test_engine(m, m->aio_capacity);
    uint8_t data[1024];
    int fds[2];
    int64_t r;
    int tries = 0;

    memset(data, 'x', sizeof(data));

    unix_pair(fds);
    close(fds[1]);
    CHECK_EQ(send_one(engine, m, fds[0], data, sizeof(data)), -EPIPE);
    close(fds[0]);

    /* TCP learns of the close from the FIN and then the RST its next segment provokes,
     * so the first sends may still succeed. */
    tcp_pair(fds);
    close(fds[1]);
    do {
        r = send_one(engine, m, fds[0], data, sizeof(data));
        if (r >= 0)
            sleep_ms(5);
        CHECK(++tries < 1000);
    } while (r >= 0);
    CHECK(r == -EPIPE || r == -ECONNRESET);
    close(fds[0]);

    ktl_engine_destroy(engine);
}

/* 50 ops against capacity 4: chunking must cover every op exactly once. */
static void test_batch_larger_than_capacity(const io_mode *m)
{
    enum { N = 50 };
    ktl_engine *engine = test_engine(m, 4);
    int pairs[N][2];
    static uint8_t bufs[N][1024];
    struct iovec iovs[N];
    ktl_op ops[N];
    uint8_t payload[1024];

    for (int i = 0; i < N; i++) {
        unix_pair(pairs[i]);
        fill_pattern(payload, 10 + (size_t)i * 13, (unsigned)i, 0);
        write_all(pairs[i][1], payload, 10 + (size_t)i * 13);
        memset(bufs[i], 0, sizeof(bufs[i]));
        iovs[i] = (struct iovec){ bufs[i], sizeof(bufs[i]) };
        ops[i] = (ktl_op){ .fd = pairs[i][0], .iov_count = 1, .iov = &iovs[i], .result = NOT_SET };
    }

    CHECK_EQ(test_batch(engine, m, KTL_OP_RECEIVE, ops, N), N);
    for (int i = 0; i < N; i++) {
        CHECK_EQ(ops[i].result, 10 + i * 13);
        CHECK(check_pattern(bufs[i], 10 + (size_t)i * 13, (unsigned)i, 0));
    }

    CHECK_EQ(test_batch(engine, m, KTL_OP_RECEIVE, ops, N), N);
    for (int i = 0; i < N; i++)
        CHECK_EQ(ops[i].result, -EAGAIN);

    for (int i = 0; i < N; i++) {
        fill_pattern(bufs[i], 5 + (size_t)i * 7, (unsigned)(i + 100), 0);
        iovs[i] = (struct iovec){ bufs[i], 5 + (size_t)i * 7 };
        ops[i].fd = pairs[i][1];
        ops[i].result = NOT_SET;
    }
    CHECK_EQ(test_batch(engine, m, KTL_OP_SEND, ops, N), N);
    for (int i = 0; i < N; i++) {
        CHECK_EQ(ops[i].result, 5 + i * 7);
        read_exact(pairs[i][0], payload, 5 + (size_t)i * 7);
        CHECK(check_pattern(payload, 5 + (size_t)i * 7, (unsigned)(i + 100), 0));
    }

    for (int i = 0; i < N; i++)
        close_pair(pairs[i]);
    ktl_engine_destroy(engine);
}

/* Thousands of events through one engine: the AIO ring's head and tail wrap many
 * times, and a reaping bug would misattribute or lose a result. */
static void test_many_rounds(const io_mode *m)
{
    enum { N = 16, ROUNDS = 300 };
    ktl_engine *engine = test_engine(m, m->aio_capacity);
    int pairs[N][2];
    uint8_t bufs[N][64];
    uint8_t payload[64];
    struct iovec iovs[N];
    ktl_op ops[N];

    memset(bufs, 0, sizeof(bufs));
    for (int i = 0; i < N; i++)
        unix_pair(pairs[i]);

    for (int round = 0; round < ROUNDS; round++) {
        /* Leave some sockets empty each round so results differ op to op. */
        for (int i = 0; i < N; i++) {
            size_t len = 1 + (size_t)((round + i) % 40);
            if ((round + i) % 5 != 0) {
                fill_pattern(payload, len, (unsigned)(round * N + i), 0);
                write_all(pairs[i][1], payload, len);
            }
            iovs[i] = (struct iovec){ bufs[i], sizeof(bufs[i]) };
            ops[i] = (ktl_op){ .fd = pairs[i][0], .iov_count = 1, .iov = &iovs[i], .result = NOT_SET };
        }
        CHECK_EQ(test_batch(engine, m, KTL_OP_RECEIVE, ops, N), N);
        for (int i = 0; i < N; i++) {
            size_t len = 1 + (size_t)((round + i) % 40);
            if ((round + i) % 5 != 0) {
                CHECK_EQ(ops[i].result, (long long)len);
                CHECK(check_pattern(bufs[i], len, (unsigned)(round * N + i), 0));
            } else {
                CHECK_EQ(ops[i].result, -EAGAIN);
            }
        }

        /* Echo back, so sends wrap the ring too. */
        for (int i = 0; i < N; i++) {
            iovs[i].iov_len = ops[i].result > 0 ? (size_t)ops[i].result : 1;
            ops[i].result = NOT_SET;
        }
        CHECK_EQ(test_batch(engine, m, KTL_OP_SEND, ops, N), N);
        for (int i = 0; i < N; i++) {
            CHECK_EQ(ops[i].result, (long long)iovs[i].iov_len);
            read_exact(pairs[i][1], payload, iovs[i].iov_len);
            CHECK(memcmp(payload, bufs[i], iovs[i].iov_len) == 0);
        }
    }

    for (int i = 0; i < N; i++)
        close_pair(pairs[i]);
    ktl_engine_destroy(engine);
}

/*
 * Reads one MSG_ZEROCOPY completion from fd's error queue, waiting up to a second:
 * 1 with the range of send ids it covers and whether the kernel copied, 0 if none came.
 */
static int read_zerocopy_completion(int fd, uint32_t *lo, uint32_t *hi, int *copied)
{
    for (int attempt = 0; attempt < 1000; attempt++) {
        char control[128];
        struct msghdr msg = { 0 };
        struct cmsghdr *cm;
        msg.msg_control = control;
        msg.msg_controllen = sizeof(control);
        if (recvmsg(fd, &msg, MSG_ERRQUEUE) < 0) {
            CHECK(errno == EAGAIN || errno == EINTR);
            sleep_ms(1);
            continue;
        }
        for (cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
            const struct sock_extended_err *ee = (const struct sock_extended_err *)CMSG_DATA(cm);
            if (!((cm->cmsg_level == SOL_IP && cm->cmsg_type == IP_RECVERR)
                  || (cm->cmsg_level == SOL_IPV6 && cm->cmsg_type == IPV6_RECVERR)))
                continue;
            CHECK_EQ(ee->ee_origin, SO_EE_ORIGIN_ZEROCOPY);
            CHECK_EQ(ee->ee_errno, 0);
            *lo = ee->ee_info;
            *hi = ee->ee_data;
            *copied = (ee->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) != 0;
            return 1;
        }
    }
    return 0;
}

/*
 * A KTL_SEND_ZEROCOPY op delivers its bytes like any send and, unlike a plain one,
 * earns a completion notification per call on the error queue, ids counting from 0.
 * Over loopback the kernel copies on delivery and says so (SO_EE_CODE_ZEROCOPY_COPIED).
 * In an AIO batch the op must still go out, as a sendmsg of its own.
 */
static void test_send_zerocopy(const io_mode *m)
{
    enum { LEN = 64 * 1024 };
    ktl_engine *engine = test_engine(m, m->aio_capacity);
    static uint8_t out[LEN], in[LEN];
    int fds[2];
    uint32_t lo = 99, hi = 99, seen = 0;
    int copied = 0;
    int64_t sent;

    tcp_pair(fds);
    if (setsockopt(fds[0], SOL_SOCKET, SO_ZEROCOPY, &(int){ 1 }, sizeof(int)) != 0) {
        /* qemu-user does not pass SO_ZEROCOPY on; a real kernel since 4.14 takes it. */
        const char *allow = getenv("KTL_TEST_ALLOW_NO_ZEROCOPY");
        CHECK(allow != NULL && strcmp(allow, "1") == 0);
        printf("[%s] SO_ZEROCOPY unavailable (%s): zero-copy send test not run\n", m->name, strerror(errno));
        close_pair(fds);
        ktl_engine_destroy(engine);
        return;
    }

    for (unsigned round = 0; round < 2; round++) {
        struct iovec iov = { out, LEN };
        ktl_op ops[1] = {
            { .fd = fds[0], .iov_count = 1, .iov = &iov, .result = NOT_SET, .flags = KTL_SEND_ZEROCOPY },
        };
        fill_pattern(out, LEN, 7 + round, 0);
        CHECK_EQ(test_batch(engine, m, KTL_OP_SEND, ops, 1), 1);
        sent = ops[0].result;
        CHECK(sent > 0);
        memset(in, 0, sizeof(in));
        read_exact(fds[1], in, (size_t)sent);
        CHECK(check_pattern(in, (size_t)sent, 7 + round, 0));
    }

    /* Two calls: ids 0 and 1, in one notification or two. */
    while (seen < 2) {
        CHECK(read_zerocopy_completion(fds[0], &lo, &hi, &copied));
        CHECK_EQ(lo, seen);
        CHECK(hi >= lo);
        seen = hi + 1;
    }
    CHECK_EQ(seen, 2);
    (void)copied; /* loopback copies, a real NIC need not: either is correct here */

    close_pair(fds);
    ktl_engine_destroy(engine);
}

void run_io_tests(const io_mode *m)
{
    struct sigaction sa;

    if (m->use_ring && test_ring() == NULL)
        return; /* io_uring unavailable and allowed to be: test_ring_create said why */

    memset(&sa, 0, sizeof(sa));
    sigemptyset(&sa.sa_mask);
    if (m->use_aio) {
        /* PWRITEV cannot carry MSG_NOSIGNAL (see ktl_aio.c); the .NET runtime ignores
         * SIGPIPE, and counting it here stands in for that. */
        sa.sa_handler = on_sigpipe;
        sa.sa_flags = SA_RESTART;
    } else {
        /* Default action, i.e. death: proves the synchronous path never raises it. */
        sa.sa_handler = SIG_DFL;
    }
    CHECK(sigaction(SIGPIPE, &sa, NULL) == 0);

    test_receive_many(m);
    test_receive_mixed(m);
    test_receive_eagain_and_eof(m);
    test_receive_reset(m);
    test_send_many(m);
    test_send_full(m);
    test_send_closed_peer(m);
    test_batch_larger_than_capacity(m);
    test_many_rounds(m);
    test_send_zerocopy(m);

    if (m->use_aio)
        printf("[%s] SIGPIPE raised %d time(s) by AIO sends to closed peers\n", m->name,
               (int)sigpipe_count);
    else
        CHECK_EQ(sigpipe_count, 0);
}
