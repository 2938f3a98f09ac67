/*
 * test_io.c - receive and send batches over real AF_UNIX and loopback TCP sockets.
 * The same checks run once per io_mode, so the synchronous path, the AIO ring path and
 * the chunked AIO path must all produce identical results. The receive checks and
 * batches of many ops are here, the send checks in test_io_send.c.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ktl_test.h"

static volatile sig_atomic_t sigpipe_count;

static void on_sigpipe(int sig)
{
    (void)sig;
    sigpipe_count++;
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
