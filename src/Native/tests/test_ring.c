/*
 * test_ring.c - the io_uring engine's own duties, over real sockets: multishot polls that
 * report readiness edges, the eventfd wake-up, timeouts, removal (and the socket being let
 * go of before its fd is closed), and poll completions that arrive during a batch.
 */
#include <errno.h>
#include <poll.h>
#include <sys/epoll.h>
#include <pthread.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ktl_test.h"

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until the ring reports something other than a wake-up, or timeout_ms passes. */
static int32_t wait_events(ktl_ring *ring, ktl_cqe *out, int32_t capacity, int timeout_ms)
{
    long end = now_ms() + timeout_ms;
    int32_t n;
    do {
        n = ktl_ring_wait(ring, timeout_ms, out, capacity);
        CHECK(n >= 0);
    } while (n == 0 && now_ms() < end);
    return n;
}

static void test_create_arguments(void)
{
    int32_t err = 0;
    CHECK(ktl_ring_create(0, 0, NULL, &err) == NULL);
    CHECK_EQ(err, EINVAL);
    CHECK(ktl_ring_create(100, 0, NULL, &err) == NULL); /* not a power of two */
    CHECK_EQ(err, EINVAL);
    CHECK(ktl_ring_create(8, 2, NULL, &err) == NULL);    /* an unknown flag */
    CHECK_EQ(err, EINVAL);
    CHECK_EQ(ktl_ring_poll(NULL, 0, POLLIN, 1), -EINVAL);
    CHECK_EQ(ktl_ring_wait(NULL, 0, NULL, 0), -EINVAL);
    CHECK_EQ(ktl_ring_batch(NULL, KTL_OP_SEND, NULL, 0), -EINVAL);
    /* Refused as a whole, the batch still gives every op its result (and no notification). */
    ktl_op op = { .fd = 0, .result = 99, .flags = KTL_SEND_ZEROCOPY, .tag = 5 };
    CHECK_EQ(ktl_ring_batch(NULL, KTL_OP_SEND, &op, 1), -EINVAL);
    CHECK_EQ(op.result, -EINVAL);
    CHECK_EQ(op.tag, 0);
    ktl_ring_destroy(NULL);
}

static void test_nonblocking_wake_fd_refused(void)
{
    int32_t err = 0;
    ktl_ring *ring = ktl_ring_create(8, 0, NULL, &err);
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    CHECK(ring != NULL && fd >= 0);
    CHECK_EQ(ktl_ring_start(ring, fd, NULL), -EINVAL);
    ktl_ring_destroy(ring);
    close(fd);
}

static void test_poll_reports_edges(ktl_ring *ring)
{
    int fds[2];
    ktl_cqe ev[8];
    char buf[64];

    tcp_pair(fds);
    CHECK_EQ(ktl_ring_poll(ring, fds[0], POLLIN | POLLRDHUP | EPOLLET, 42), 0);
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 8), 0);              /* nothing to read yet */

    write_all(fds[1], "a", 1);
    CHECK_EQ(wait_events(ring, ev, 8, 2000), 1);
    CHECK_EQ(ev[0].user_data, 42);
    CHECK(ev[0].res > 0 && (ev[0].res & POLLIN) != 0);
    CHECK((ev[0].flags & KTL_CQE_MORE) != 0);                /* still armed */
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 8), 0);              /* an edge, not a level */

    write_all(fds[1], "b", 1);                                /* a new edge */
    CHECK_EQ(wait_events(ring, ev, 8, 2000), 1);
    CHECK_EQ(ev[0].user_data, 42);
    CHECK_EQ(read(fds[0], buf, sizeof(buf)), 2);

    shutdown(fds[1], SHUT_WR);                                /* FIN: POLLRDHUP */
    CHECK_EQ(wait_events(ring, ev, 8, 2000), 1);
    CHECK((ev[0].res & POLLRDHUP) != 0);

    /* Removal with wait consumes the poll's last completion itself: nothing more is reported. */
    CHECK_EQ(ktl_ring_remove(ring, 42, 1), 0);
    CHECK_EQ(ktl_ring_wait(ring, 50, ev, 8), 0);
    close(fds[0]);
    close(fds[1]);
}

/* Removal with submit lets the socket go at once: closing the fd then sends FIN, with no
 * further call into the ring (a poll holds its own reference to the socket). */
static void test_cancel_then_close_releases_socket(ktl_ring *ring)
{
    int fds[2];
    ktl_cqe ev[8];
    char c;

    tcp_pair(fds);
    CHECK_EQ(ktl_ring_poll(ring, fds[0], POLLIN | POLLOUT | POLLRDHUP | EPOLLET, 7), 0);
    CHECK_EQ(wait_events(ring, ev, 8, 2000), 1);              /* POLLOUT at once */
    CHECK_EQ(ktl_ring_remove(ring, 7, 1), 0);
    close(fds[0]);
    set_nonblocking(fds[1], 0);
    CHECK_EQ(wait_readable(fds[1], 2000), 1);
    CHECK_EQ(read(fds[1], &c, 1), 0);                         /* EOF, not a hang */
    close(fds[1]);
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 8), 0);               /* the removal left nothing behind */
}

/* Many removals with one call: each socket is let go of when it returns, so closing the fds
 * sends FIN on every one; a socket still readable when removed reports nothing more. */
static void test_remove_all_releases_every_socket(ktl_ring *ring)
{
    enum { N = 12 };
    int fds[N][2];
    uint64_t data[N];
    ktl_cqe ev[16];
    char c;

    for (int i = 0; i < N; i++) {
        tcp_pair(fds[i]);
        data[i] = 500 + (uint64_t)i;
        CHECK_EQ(ktl_ring_poll(ring, fds[i][0], POLLIN | POLLRDHUP | EPOLLET, data[i]), 0);
    }
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 16), 0);
    for (int i = 0; i < N; i += 2)
        write_all(fds[i][1], "r", 1);                         /* half of them with an event pending */
    CHECK_EQ(ktl_ring_remove_all(ring, data, N), 0);
    CHECK_EQ(ktl_ring_remove_all(ring, data, 0), 0);
    CHECK_EQ(ktl_ring_remove_all(ring, NULL, 1), -EINVAL);
    for (int i = 0; i < N; i++) {
        if (i % 2 == 0)
            read_exact(fds[i][0], &c, 1);                     /* unread data would make close send RST */
        close(fds[i][0]);
    }
    for (int i = 0; i < N; i++) {
        set_nonblocking(fds[i][1], 0);
        CHECK_EQ(wait_readable(fds[i][1], 2000), 1);
        CHECK_EQ(read(fds[i][1], &c, 1), 0);                  /* EOF: the ring let go of each */
        close(fds[i][1]);
    }
    CHECK_EQ(ktl_ring_wait(ring, 50, ev, 16), 0);             /* and reports nothing for them */
}

/* Without EPOLLET a poll is one-shot; re-armed while the condition holds, it reports it again. */
static void test_level_poll_reports_again_when_rearmed(ktl_ring *ring)
{
    int fds[2];
    ktl_cqe ev[8];

    tcp_pair(fds);
    write_all(fds[1], "abc", 3);
    CHECK_EQ(ktl_ring_poll(ring, fds[0], POLLIN, 11), 0);
    CHECK_EQ(wait_events(ring, ev, 8, 2000), 1);
    CHECK((ev[0].res & POLLIN) != 0);
    CHECK((ev[0].flags & KTL_CQE_MORE) == 0);                /* ended: one-shot */
    CHECK_EQ(ktl_ring_wait(ring, 50, ev, 8), 0);              /* and says nothing more by itself */
    CHECK_EQ(ktl_ring_poll(ring, fds[0], POLLIN, 12), 0);     /* re-armed, data still unread */
    CHECK_EQ(wait_events(ring, ev, 8, 2000), 1);
    CHECK_EQ(ev[0].user_data, 12);
    CHECK_EQ(ktl_ring_remove(ring, 13, 1), 0);                /* nothing armed under 13: no hang */
    close(fds[0]);
    close(fds[1]);
}

static int g_wake_fd;

static void *wake_later(void *arg)
{
    uint64_t one = 1;
    (void)arg;
    usleep(50 * 1000);
    CHECK(write(g_wake_fd, &one, sizeof(one)) == sizeof(one));
    return NULL;
}

static void test_wake_and_timeout(ktl_ring *ring, int wake_fd)
{
    ktl_cqe ev[4];
    long start;

    g_wake_fd = wake_fd;
    for (int round = 0; round < 3; round++) {               /* the read is re-armed each time */
        pthread_t t;
        CHECK_EQ(pthread_create(&t, NULL, wake_later, NULL), 0);
        start = now_ms();
        CHECK_EQ(ktl_ring_wait(ring, -1, ev, 4), 0);          /* no limit: only the wake-up ends it */
        CHECK(now_ms() - start < 5000);
        pthread_join(t, NULL);
    }

    start = now_ms();
    CHECK_EQ(ktl_ring_wait(ring, 100, ev, 4), 0);
    CHECK(now_ms() - start >= 90);
}

/* A wake-up that a removal happened to consume still ends the next wait: the loop decided to
 * sleep before another thread posted work and signalled, and must see that signal. */
static void test_wake_consumed_by_removal_ends_next_wait(ktl_ring *ring, int wake_fd)
{
    int fds[2];
    uint64_t one = 1;
    ktl_cqe ev[4];
    long start;

    tcp_pair(fds);
    CHECK_EQ(ktl_ring_poll(ring, fds[0], POLLIN | EPOLLET, 77), 0);
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 4), 0);
    CHECK_EQ(write(wake_fd, &one, sizeof(one)), (ssize_t)sizeof(one));
    CHECK_EQ(ktl_ring_remove(ring, 77, 1), 0);                 /* its io_uring_enter reaps the wake-up */
    start = now_ms();
    CHECK_EQ(ktl_ring_wait(ring, 5000, ev, 4), 0);
    CHECK(now_ms() - start < 1000);                           /* not the 5 s timeout */
    start = now_ms();
    CHECK_EQ(ktl_ring_wait(ring, 100, ev, 4), 0);              /* and only once */
    CHECK(now_ms() - start >= 90);
    close(fds[0]);
    close(fds[1]);
}

/* Readiness that completes while a batch waits for its ops is kept for the next wait, once. */
static void test_poll_during_batch_kept(ktl_ring *ring)
{
    int a[2], b[2];
    ktl_cqe ev[8];
    char out[16] = "0123456789abcdef";
    struct iovec iov = { out, sizeof(out) };
    ktl_op op = { 0 };

    tcp_pair(a);
    tcp_pair(b);
    CHECK_EQ(ktl_ring_poll(ring, a[0], POLLIN | EPOLLET, 9), 0);
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 8), 0);
    write_all(a[1], "x", 1);
    usleep(20 * 1000);

    op.fd = b[0];
    op.iov = &iov;
    op.iov_count = 1;
    CHECK_EQ(ktl_ring_batch(ring, KTL_OP_SEND, &op, 1), 1);
    CHECK_EQ(op.result, (int64_t)sizeof(out));

    CHECK_EQ(wait_events(ring, ev, 8, 2000), 1);
    CHECK_EQ(ev[0].user_data, 9);
    CHECK((ev[0].res & POLLIN) != 0);
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 8), 0);               /* exactly once */

    CHECK_EQ(ktl_ring_remove(ring, 9, 1), 0);
    close(a[0]);
    close(a[1]);
    close(b[0]);
    close(b[1]);
}

/* More sockets become ready than one wait may return: the rest come with the next waits. */
static void test_more_events_than_capacity(ktl_ring *ring)
{
    enum { N = 40 };
    int fds[N][2];
    ktl_cqe ev[16];
    int seen[N] = { 0 };
    int total = 0;

    for (int i = 0; i < N; i++) {
        tcp_pair(fds[i]);
        CHECK_EQ(ktl_ring_poll(ring, fds[i][0], POLLIN | EPOLLET, 1000 + (uint64_t)i), 0);
    }
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 16), 0);
    for (int i = 0; i < N; i++)
        write_all(fds[i][1], "z", 1);
    usleep(20 * 1000);
    for (int round = 0; round < 50 && total < N; round++) {
        int32_t n = ktl_ring_wait(ring, 100, ev, 16);
        CHECK(n >= 0 && n <= 16);
        for (int32_t j = 0; j < n; j++) {
            int idx = (int)(ev[j].user_data - 1000);
            CHECK(idx >= 0 && idx < N);
            seen[idx]++;
            total++;
        }
    }
    CHECK_EQ(total, N);
    for (int i = 0; i < N; i++) {
        CHECK_EQ(seen[i], 1);
        CHECK_EQ(ktl_ring_remove(ring, 1000 + (uint64_t)i, 0), 0); /* queued: -ECANCELED comes by wait */
    }
    for (int got = 0; got < N;) {
        int32_t n = wait_events(ring, ev, 16, 2000);
        CHECK(n > 0);
        for (int32_t j = 0; j < n; j++)
            CHECK_EQ(ev[j].res, -ECANCELED);
        got += n;
    }
    for (int i = 0; i < N; i++)
    {
        close(fds[i][0]);
        close(fds[i][1]);
    }
}

/*
 * A ring that moves between threads (KTL_RING_MOVABLE, Adaptive scheduling): thread A starts it
 * and arms a poll, then sleeps in the kernel as a blocked continuation would; the main thread,
 * which now holds the loop, gets the poll's completions at once and submits to the ring itself.
 * Once A has exited, the next event of A's poll ends it (-ECANCELED): why a thread that held a ring's loop never
 * retires while the ring lives. A ring set up for one thread refuses another's submission
 * (EEXIST, or EINVAL where its fd is registered with its owner).
 */
struct movable_arm {
    ktl_ring *ring;
    int wake_fd;
    int fd;
    int sleep_ms;
};

static void *movable_arm_then_sleep(void *arg)
{
    struct movable_arm *a = arg;
    CHECK_EQ(ktl_ring_start(a->ring, a->wake_fd, NULL), 0);
    ktl_cqe ev[4];
    CHECK_EQ(ktl_ring_poll(a->ring, a->fd, POLLIN | POLLRDHUP | EPOLLET, 77), 0);
    CHECK_EQ(ktl_ring_wait(a->ring, 0, ev, 4), 0); /* submits the poll on this thread */
    usleep((useconds_t)a->sleep_ms * 1000);
    return NULL;
}

static void test_movable_ring_serves_another_thread(void)
{
    int32_t err = 0;
    int fds[2];
    ktl_cqe ev[8];
    ktl_ring_info info;
    pthread_t armer;
    ktl_ring *ring = ktl_ring_create(8, KTL_RING_MOVABLE, &info, &err);
    CHECK(ring != NULL);
    CHECK_EQ(info.setup & (KTL_RING_SINGLE_ISSUER | KTL_RING_DEFER_TASKRUN), 0);
    CHECK((info.setup & KTL_RING_COOP_TASKRUN) != 0);

    int wake_fd = eventfd(0, EFD_CLOEXEC);
    CHECK(wake_fd >= 0);
    tcp_pair(fds);
    struct movable_arm arm = { ring, wake_fd, fds[0], 1500 };
    CHECK_EQ(pthread_create(&armer, NULL, movable_arm_then_sleep, &arm), 0);
    usleep(200 * 1000); /* the poll is armed; its thread sleeps */

    long started = now_ms();
    write_all(fds[1], "a", 1);
    CHECK_EQ(wait_events(ring, ev, 8, 1000), 1);
    CHECK_EQ(ev[0].user_data, 77);
    CHECK((ev[0].res & POLLIN) != 0);
    CHECK(now_ms() - started < 1000); /* not held until the arming thread wakes (1.5 s) */

    /* This thread submits too: a second poll, on the other end. */
    CHECK_EQ(ktl_ring_poll(ring, fds[1], POLLIN | EPOLLET, 78), 0);
    write_all(fds[0], "b", 1);
    CHECK_EQ(wait_events(ring, ev, 8, 2000), 1);
    CHECK_EQ(ev[0].user_data, 78);

    /* The arming thread exits: the next event of its poll ends it (the completion work queued to
     * an exited thread fails), while this thread's poll goes on. */
    CHECK_EQ(pthread_join(armer, NULL), 0);
    write_all(fds[1], "d", 1);
    CHECK_EQ(wait_events(ring, ev, 8, 2000), 1);
    CHECK_EQ(ev[0].user_data, 77);
    CHECK_EQ(ev[0].res, -ECANCELED);
    CHECK((ev[0].flags & KTL_CQE_MORE) == 0);
    write_all(fds[0], "c", 1);
    CHECK_EQ(wait_events(ring, ev, 8, 2000), 1);
    CHECK_EQ(ev[0].user_data, 78);

    ktl_ring_destroy(ring);
    close(fds[0]);
    close(fds[1]);
    close(wake_fd);
}

static void *poll_on_ring(void *arg)
{
    struct movable_arm *a = arg;
    ktl_cqe ev[4];
    CHECK_EQ(ktl_ring_poll(a->ring, a->fd, POLLIN, 79), 0);
    a->sleep_ms = ktl_ring_wait(a->ring, 0, ev, 4); /* the submission's outcome */
    return NULL;
}

static void test_single_issuer_ring_refuses_another_thread(ktl_ring *ring)
{
    int fds[2];
    pthread_t other;
    tcp_pair(fds);
    struct movable_arm arm = { ring, -1, fds[0], 0 };
    CHECK_EQ(pthread_create(&other, NULL, poll_on_ring, &arm), 0);
    CHECK_EQ(pthread_join(other, NULL), 0);
    /* EEXIST from SINGLE_ISSUER, or EINVAL first: the ring's fd is registered with its owner only. */
    if ((test_ring_setup & KTL_RING_SINGLE_ISSUER) != 0)
        CHECK(arm.sleep_ms == -EEXIST || arm.sleep_ms == -EINVAL);
    ktl_ring_remove(ring, 79, 1);
    close(fds[0]);
    close(fds[1]);
}

void run_ring_tests(void)
{
    int wake_fd = -1;
    ktl_ring *ring;

    ring = test_ring_create(64, &wake_fd);
    if (ring == NULL)
        return;
    test_create_arguments();
    test_nonblocking_wake_fd_refused();
    test_poll_reports_edges(ring);
    test_cancel_then_close_releases_socket(ring);
    test_remove_all_releases_every_socket(ring);
    test_level_poll_reports_again_when_rearmed(ring);
    test_wake_and_timeout(ring, wake_fd);
    test_wake_consumed_by_removal_ends_next_wait(ring, wake_fd);
    test_poll_during_batch_kept(ring);
    test_more_events_than_capacity(ring);
    test_single_issuer_ring_refuses_another_thread(ring);
    test_movable_ring_serves_another_thread();
    ktl_ring_destroy(ring);
    close(wake_fd);
    printf("ring: ok\n");
}
