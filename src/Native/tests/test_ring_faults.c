/*
 * test_ring_faults.c - the io_uring engine where the kernel or the allocator says no. This
 * suite links ktl_native_faults, the engine built with KTL_FAULT_INJECTION, whose fault sites
 * (src/ktl_fault.h) fail on demand: an SQE refused (a full submission queue whose flush
 * failed), an io_uring_enter refused, no memory to keep a completion. Each call that could
 * hang runs under an alarm, so a hang fails with the call's name instead of stalling ctest.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ktl_fault.h"
#include "ktl_test.h"

#define GUARD_SECONDS 5

static const char *guarded;

static void on_alarm(int signal)
{
    static const char prefix[] = "HANG: ";
    static const char suffix[] = " did not return within 5 s\n";
    (void)signal;
    (void)!write(2, prefix, sizeof(prefix) - 1);
    (void)!write(2, guarded, strlen(guarded));
    (void)!write(2, suffix, sizeof(suffix) - 1);
    _exit(1);
}

/* From here to unguard(), a hang fails the suite naming `what`. */
static void guard(const char *what)
{
    guarded = what;
    alarm(GUARD_SECONDS);
}

static void unguard(void)
{
    alarm(0);
}

/* count polls, `per_socket` on each of count / per_socket connections, armed and submitted. */
typedef struct watched {
    int count;
    int sockets;
    int (*fds)[2];
    uint64_t *data;
} watched;

static watched watch(ktl_ring *ring, int count, int per_socket, uint64_t first)
{
    watched w = { .count = count, .sockets = count / per_socket };
    ktl_cqe ev[16];
    w.fds = calloc((size_t)w.sockets, sizeof(*w.fds));
    w.data = calloc((size_t)count, sizeof(*w.data));
    CHECK(w.fds != NULL && w.data != NULL);
    for (int s = 0; s < w.sockets; s++)
        tcp_pair(w.fds[s]);
    for (int i = 0; i < count; i++) {
        w.data[i] = first + (uint64_t)i;
        CHECK_EQ(ktl_ring_poll(ring, w.fds[i % w.sockets][0], POLLIN | POLLRDHUP | EPOLLET, w.data[i]), 0);
    }
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 16), 0);
    return w;
}

/* Closes the watched sockets: each peer sees EOF only if every poll had let go of its socket. */
static void close_released(watched *w)
{
    for (int s = 0; s < w->sockets; s++)
        close(w->fds[s][0]);
    for (int s = 0; s < w->sockets; s++) {
        set_nonblocking(w->fds[s][1], 0);
        if (!sees_eof(w->fds[s][1])) {
            fprintf(stderr, "socket %d of %d: no EOF after close, so a poll still holds it\n", s, w->sockets);
            CHECK(0);
        }
        close(w->fds[s][1]);
    }
    free(w->fds);
    free(w->data);
}

/* Removes every watched request under the guard `what`, expecting `fired` SQE refusals: the
 * removal succeeds, every socket is let go of, and nothing is reported for them afterwards. */
static void remove_and_release(ktl_ring *ring, watched *w, const char *what, int fired)
{
    ktl_cqe ev[16];

    guard(what);
    CHECK_EQ(ktl_ring_remove_all(ring, w->data, w->count), 0);
    unguard();
    CHECK_EQ(ktl_fault_fired(KTL_FAULT_SQE), fired);
    close_released(w);
    CHECK_EQ(ktl_ring_wait(ring, 50, ev, 16), 0);
}

/* One SQE refused in the middle of a removal: the rest still go, and every request ends. */
static void test_removal_goes_on_past_a_refused_sqe(ktl_ring *ring)
{
    watched w = watch(ring, 12, 1, 700);

    ktl_fault_arm(KTL_FAULT_SQE, 4, 1, EBUSY);
    remove_and_release(ring, &w, "ktl_ring_remove_all with its fifth SQE refused once", 1);
}

/* No SQE to be had at all: the removal says so at once instead of waiting for answers that
 * cannot come; asked again once SQEs are back, it ends every request. */
static void test_removal_without_sqes_fails_instead_of_hanging(ktl_ring *ring)
{
    watched w = watch(ring, 12, 1, 800);
    ktl_cqe ev[16];

    ktl_fault_arm(KTL_FAULT_SQE, 4, 1000, EBUSY);
    guard("ktl_ring_remove_all with every SQE refused from the fifth on");
    CHECK_EQ(ktl_ring_remove_all(ring, w.data, w.count), -EBUSY);
    unguard();
    ktl_fault_arm(KTL_FAULT_SQE, 0, 0, 0);

    guard("ktl_ring_remove_all asked again");
    CHECK_EQ(ktl_ring_remove_all(ring, w.data, w.count), 0);
    unguard();
    close_released(&w);
    CHECK_EQ(ktl_ring_wait(ring, 50, ev, 16), 0);
}

/* An io_uring_enter that reports dropped completions (EBADR): the removal returns the error, and
 * asked again it completes, not taking the first call's answers (which arrive during the second)
 * for its own. The ring itself is lost from then on: its waits fail, since some request's
 * completion is gone and nobody can say whose. */
static void test_removal_after_an_enter_that_dropped_completions(void)
{
    int wake_fd = -1;
    ktl_ring *ring = test_ring_create(64, &wake_fd);
    CHECK(ring != NULL);
    watched w = watch(ring, 12, 1, 900);
    ktl_cqe ev[16];

    ktl_fault_arm(KTL_FAULT_ENTER, 0, 1, EBADR);
    guard("ktl_ring_remove_all with its io_uring_enter refused");
    CHECK_EQ(ktl_ring_remove_all(ring, w.data, w.count), -EBADR);
    unguard();
    CHECK_EQ(ktl_fault_fired(KTL_FAULT_ENTER), 1);

    guard("ktl_ring_remove_all asked again");
    CHECK_EQ(ktl_ring_remove_all(ring, w.data + 6, 6), 0);
    CHECK_EQ(ktl_ring_remove_all(ring, w.data, 6), 0);
    unguard();
    close_released(&w);
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 16), -EBADR);
    ktl_ring_destroy(ring);
    close(wake_fd);
}

/*
 * A loop that closes more connections in one pass than the ring has SQEs: the submission
 * queue fills, is flushed, and goes on; also when that flush fails once. 2,100 requests on a
 * 1,024-entry ring: their cancels and last completions (4,200) overflow its 4,096 CQEs too.
 */
static void test_removal_of_more_requests_than_sqes(void)
{
    int wake_fd = -1;
    ktl_ring *ring = test_ring_create(1024, &wake_fd);
    CHECK(ring != NULL);

    watched w = watch(ring, 2100, 21, 10000);
    ktl_fault_arm(KTL_FAULT_SQE, 0, 0, 0);
    remove_and_release(ring, &w, "ktl_ring_remove_all of 2,100 requests on a 1,024-entry ring", 0);

    w = watch(ring, 1100, 11, 20000);
    ktl_fault_arm(KTL_FAULT_SQE, 1024, 1, EBUSY);
    remove_and_release(ring, &w, "ktl_ring_remove_all of 1,100 requests with the flush of the full queue refused once", 1);

    ktl_ring_destroy(ring);
    close(wake_fd);
}

/*
 * A batch whose io_uring_enter fails (EFAULT here) after part of it completed: on a ring of 8 entries, a
 * batch of 12 sends submits its first 8 when it needs a ninth SQE, and then the enter that
 * would submit the rest fails. Each op keeps its own result (a zero-copy send that went out
 * keeps its number: its notification comes); the 4 that never reached the kernel get the
 * error, and never go out later either.
 */
static void test_batch_keeps_each_result_when_an_enter_fails(void)
{
    enum { N = 12, ZC_SENT = 2, ZC_UNSENT = 10 };
    int wake_fd = -1;
    ktl_ring *ring = test_ring_create(8, &wake_fd);
    int fds[N][2];
    ktl_op ops[N];
    struct iovec iov = { (void *)"abc", 3 };
    ktl_cqe ev[8];
    char buf[8];
    CHECK(ring != NULL);
    if (!(test_ring_abilities & KTL_RING_SENDS_ZEROCOPY)) {
        CHECK(test_allowed("KTL_TEST_ALLOW_NO_URING"));
        printf("SKIPPED: the batch check needs SENDMSG_ZC with usage reports (KTL_TEST_ALLOW_NO_URING=1)\n");
        ktl_ring_destroy(ring);
        close(wake_fd);
        return;
    }

    for (int i = 0; i < N; i++) {
        if (i == ZC_SENT || i == ZC_UNSENT)
            zerocopy_pair(fds[i]);
        else
            tcp_pair(fds[i]);
        ops[i] = (ktl_op){ .fd = fds[i][0], .iov_count = 1, .iov = &iov, .result = 99 };
        if (i == ZC_SENT || i == ZC_UNSENT) {
            ops[i].flags = KTL_SEND_ZEROCOPY;
            ops[i].tag = 500u + (uint32_t)i;
        }
    }

    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 8), 0);     /* the wake-up's read, queued by start, goes in */
    ktl_fault_arm(KTL_FAULT_ENTER, 0, 2, EFAULT);
    guard("ktl_ring_batch with its io_uring_enter refused");
    CHECK_EQ(ktl_ring_batch(ring, KTL_OP_SEND, ops, N), -EFAULT);
    unguard();
    for (int i = 0; i < 8; i++)
        CHECK_EQ(ops[i].result, 3);
    for (int i = 8; i < N; i++)
        CHECK_EQ(ops[i].result, -EFAULT);
    CHECK_EQ(ops[ZC_SENT].tag, 500u + ZC_SENT);   /* it went out: its notification will come */
    CHECK_EQ(ops[ZC_UNSENT].tag, 0);              /* never submitted: none will */
    ktl_fault_arm(KTL_FAULT_ENTER, 0, 0, 0);

    /* The next waits submit whatever the failed batch left queued: nothing may go out of it. */
    int notified = 0;
    for (int round = 0; round < 10; round++) {
        int32_t n = ktl_ring_wait(ring, 50, ev, 8);
        CHECK(n >= 0);
        for (int32_t j = 0; j < n; j++) {
            CHECK_EQ(ev[j].user_data, KTL_RING_SEND_DONE | (500u + ZC_SENT));
            notified++;
        }
    }
    CHECK_EQ(notified, 1);
    for (int i = 0; i < N; i++) {
        ssize_t got = recv(fds[i][1], buf, sizeof(buf), MSG_DONTWAIT);
        if (i < 8) {
            CHECK_EQ(got, 3);
        } else {
            CHECK_EQ(got, -1);
            CHECK_EQ(errno, EAGAIN);
        }
        close(fds[i][0]);
        close(fds[i][1]);
    }
    ktl_ring_destroy(ring);
    close(wake_fd);
}

/*
 * A completion the engine cannot keep for lack of memory (here an accepted socket that
 * arrived while a removal waited) is never dropped in silence: the socket in it is closed,
 * and every later wait fails with ENOMEM, since the caller cannot know which request went quiet.
 */
static void test_a_completion_that_cannot_be_kept_fails_the_ring(void)
{
    struct sockaddr_in addr;
    int listener = tcp_listener(&addr, 128);
    int wake_fd = -1;
    ktl_ring *ring = test_ring_create(64, &wake_fd);
    int other[2];
    uint64_t poll_data = 77;
    ktl_cqe ev[8];
    CHECK(ring != NULL);

    tcp_pair(other);
    CHECK_EQ(ktl_ring_poll(ring, other[0], POLLIN | EPOLLET, poll_data), 0);
    CHECK_EQ(ktl_ring_accept(ring, listener, KTL_RING_ACCEPT | 5u), 0);
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 8), 0);
    int client = tcp_connect(&addr);
    int before = open_fds();                        /* the accept runs in the removal below */
    usleep(20 * 1000);

    ktl_fault_arm(KTL_FAULT_KEEP, 0, 1, ENOMEM);
    CHECK_EQ(ktl_ring_remove_all(ring, &poll_data, 1), 0);
    CHECK_EQ(ktl_fault_fired(KTL_FAULT_KEEP), 1);   /* the accept's completion came during the removal */

    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 8), -ENOMEM);
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 8), -ENOMEM);
    CHECK(sees_eof(client));                       /* the socket in it was closed, not leaked */
    CHECK_EQ(open_fds(), before);

    ktl_ring_destroy(ring);
    close(wake_fd);
    close(client);
    close(other[0]);
    close(other[1]);
    close(listener);
}

static void removals_on_a_shared_ring(void)
{
    int wake_fd = -1;
    ktl_ring *ring = test_ring_create(64, &wake_fd);
    CHECK(ring != NULL);
    test_removal_goes_on_past_a_refused_sqe(ring);
    test_removal_without_sqes_fails_instead_of_hanging(ring);
    ktl_ring_destroy(ring);
    close(wake_fd);
    test_removal_after_an_enter_that_dropped_completions();
}

static const struct {
    const char *name;
    void (*run)(void);
} tests[] = {
    { "removals", removals_on_a_shared_ring },
    { "removal_of_more_requests_than_sqes", test_removal_of_more_requests_than_sqes },
    { "batch_keeps_each_result", test_batch_keeps_each_result_when_an_enter_fails },
    { "completion_not_kept", test_a_completion_that_cannot_be_kept_fails_the_ring },
};

/* Runs every test, or the one named (ktl_fault_tests NAME). */
int main(int argc, char **argv)
{
    int wake_fd = -1;
    ktl_ring *probe;
    int ran = 0;

    signal(SIGALRM, on_alarm);
    probe = test_ring_create(8, &wake_fd);
    if (probe == NULL)
        return 0;
    ktl_ring_destroy(probe);
    close(wake_fd);
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        if (argc > 1 && strcmp(argv[1], tests[i].name) != 0)
            continue;
        tests[i].run();
        printf("ring_faults: %s ok\n", tests[i].name);
        ran++;
    }
    if (ran == 0) {
        fprintf(stderr, "no test named %s\n", argv[1]);
        return 2;
    }
    return 0;
}
