/*
 * test_ring_faults.c - the io_uring engine where the kernel or the allocator says no. This
 * suite links ktl_native_faults, the engine built with KTL_FAULT_INJECTION, whose fault sites
 * (src/ktl_fault.h) fail on demand: an SQE refused (a full submission queue whose flush
 * failed), an io_uring_enter refused, no memory to keep a completion. Each call that could
 * hang runs under an alarm, so a hang fails with the call's name instead of stalling ctest.
 */
#include <errno.h>
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

/* One SQE refused in the middle of a removal: the rest still go, and every request ends. */
static void test_removal_goes_on_past_a_refused_sqe(ktl_ring *ring)
{
    watched w = watch(ring, 12, 1, 700);
    ktl_cqe ev[16];

    ktl_fault_arm(KTL_FAULT_SQE, 4, 1, EBUSY);
    guard("ktl_ring_remove_all with its fifth SQE refused once");
    CHECK_EQ(ktl_ring_remove_all(ring, w.data, w.count), 0);
    unguard();
    CHECK_EQ(ktl_fault_fired(KTL_FAULT_SQE), 1);
    close_released(&w);
    CHECK_EQ(ktl_ring_wait(ring, 50, ev, 16), 0);
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

/*
 * A loop that closes more connections in one pass than the ring has SQEs: the submission
 * queue fills, is flushed, and goes on; also when that flush fails once. 2,100 requests on a
 * 1,024-entry ring: their cancels and last completions (4,200) overflow its 4,096 CQEs too.
 */
static void test_removal_of_more_requests_than_sqes(void)
{
    int wake_fd = -1;
    ktl_ring *ring = test_ring_create(1024, &wake_fd);
    ktl_cqe ev[16];
    CHECK(ring != NULL);

    watched w = watch(ring, 2100, 21, 10000);
    guard("ktl_ring_remove_all of 2,100 requests on a 1,024-entry ring");
    CHECK_EQ(ktl_ring_remove_all(ring, w.data, w.count), 0);
    unguard();
    close_released(&w);
    CHECK_EQ(ktl_ring_wait(ring, 50, ev, 16), 0);

    w = watch(ring, 1100, 11, 20000);
    ktl_fault_arm(KTL_FAULT_SQE, 1024, 1, EBUSY);
    guard("ktl_ring_remove_all of 1,100 requests with the flush of the full queue refused once");
    CHECK_EQ(ktl_ring_remove_all(ring, w.data, w.count), 0);
    unguard();
    CHECK_EQ(ktl_fault_fired(KTL_FAULT_SQE), 1);
    close_released(&w);
    CHECK_EQ(ktl_ring_wait(ring, 50, ev, 16), 0);

    ktl_ring_destroy(ring);
    close(wake_fd);
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
}

static const struct {
    const char *name;
    void (*run)(void);
} tests[] = {
    { "removals", removals_on_a_shared_ring },
    { "removal_of_more_requests_than_sqes", test_removal_of_more_requests_than_sqes },
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
