/*
 * test_ring_zerocopy.c - zero-copy sends as ring ops (IORING_OP_SENDMSG_ZC), over real
 * loopback TCP: the bytes arrive intact, the result comes with the batch, and exactly one
 * notification per op follows through ktl_ring_wait carrying its tag, also for an op that
 * failed. Over loopback the kernel copies, and the notification has to say so.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ktl_test.h"

/* Waits up to timeout_ms for one notification; returns its res (0 or 1), or -1 when none came.
 * Any other completion fails the test: nothing else is armed on this ring. */
static int wait_notification(ktl_ring *ring, uint32_t tag, int timeout_ms)
{
    ktl_cqe ev[8];
    for (int waited = 0; waited < timeout_ms; waited += 100) {
        int32_t n = ktl_ring_wait(ring, 100, ev, 8);
        CHECK(n >= 0);
        if (n > 0) {
            CHECK_EQ(n, 1);
            CHECK_EQ(ev[0].user_data, KTL_RING_SEND_DONE | tag);
            return ev[0].res;
        }
    }
    return -1;
}

static void test_send_arrives_and_notifies(ktl_ring *ring)
{
    enum { LEN = 48 * 1024 };
    int fds[2];
    uint8_t *out = malloc(LEN), *in = malloc(LEN);
    CHECK(out != NULL && in != NULL);
    zerocopy_pair(fds);
    fill_pattern(out, LEN, 7, 0);

    /* Two buffers, as a pipe's segments would be, and a plain op beside it in the batch. */
    struct iovec iov[2] = { { out, LEN / 2 }, { out + LEN / 2, LEN / 2 } };
    const char plain[] = "plain";
    struct iovec plain_iov = { (void *)plain, sizeof(plain) };
    int other[2];
    tcp_pair(other);
    ktl_op ops[2] = {
        { .fd = other[0], .iov_count = 1, .iov = &plain_iov, .result = 99 },
        { .fd = fds[0], .iov_count = 2, .iov = iov, .result = 99, .flags = KTL_SEND_ZEROCOPY, .tag = 0xC0FFEEu },
    };
    CHECK_EQ(ktl_ring_batch(ring, KTL_OP_SEND, ops, 2), 2);
    CHECK_EQ(ops[0].result, (int64_t)sizeof(plain));
    CHECK_EQ(ops[1].result, LEN);
    CHECK_EQ(ops[1].tag, 0xC0FFEEu);                          /* its notification will come */

    read_exact(fds[1], in, LEN);
    CHECK(check_pattern(in, LEN, 7, 0));
    /* Loopback: the kernel copied when it delivered the bytes, and says so. */
    CHECK_EQ(wait_notification(ring, 0xC0FFEEu, 2000), 1);
    /* Exactly one. */
    CHECK_EQ(wait_notification(ring, 0xC0FFEEu, 300), -1);

    close(fds[0]);
    close(fds[1]);
    close(other[0]);
    close(other[1]);
    free(out);
    free(in);
}

/* A send that moves nothing (a full socket: -EAGAIN) still brings its one notification. */
static void test_failed_send_still_notifies(ktl_ring *ring)
{
    enum { CHUNK = 64 * 1024 };
    int fds[2];
    uint8_t *buf = calloc(1, CHUNK);
    CHECK(buf != NULL);
    zerocopy_pair(fds);
    while (write(fds[0], buf, CHUNK) > 0) {
    }
    CHECK_EQ(errno, EAGAIN);

    struct iovec iov = { buf, CHUNK };
    ktl_op op = { .fd = fds[0], .iov_count = 1, .iov = &iov, .result = 99, .flags = KTL_SEND_ZEROCOPY, .tag = 41 };
    CHECK_EQ(ktl_ring_batch(ring, KTL_OP_SEND, &op, 1), 1);
    CHECK_EQ(op.result, -EAGAIN);
    CHECK_EQ(op.tag, 41);                                     /* failed, and still notified */
    CHECK(wait_notification(ring, 41, 2000) >= 0);
    CHECK_EQ(wait_notification(ring, 41, 300), -1);

    close(fds[0]);
    close(fds[1]);
    free(buf);
}

void run_ring_zerocopy_tests(void)
{
    int wake_fd = -1;
    ktl_ring *ring = test_ring_create(64, &wake_fd);
    if (ring == NULL)
        return;
    /* Linux 6.2+ has it; the CI and dev machines run newer kernels, so its absence is a failure
     * there, and elsewhere (KTL_TEST_ALLOW_NO_URING=1) the engine's copy path is what runs. */
    if (!(test_ring_abilities & KTL_RING_SENDS_ZEROCOPY)) {
        CHECK(test_allowed("KTL_TEST_ALLOW_NO_URING"));
        printf("SKIPPED: the ring has no SENDMSG_ZC with usage reports (KTL_TEST_ALLOW_NO_URING=1)\n");
    } else {
        test_send_arrives_and_notifies(ring);
        test_failed_send_still_notifies(ring);
    }
    ktl_ring_destroy(ring);
    close(wake_fd);
    printf("ring_zerocopy: ok\n");
}
