/*
 * test_ring_accept.c - the io_uring engine's multishot accept, over real loopback sockets:
 * every connection arrives as one completion carrying a usable socket, the argument checks,
 * and no socket leaks when the accept is removed or the ring destroyed with connections
 * accepted into completions nobody read.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ktl_test.h"

#define ACCEPT_DATA (KTL_RING_ACCEPT | 7u)

static void test_arguments(ktl_ring *ring)
{
    CHECK_EQ(ktl_ring_accept(NULL, 3, ACCEPT_DATA), -EINVAL);
    CHECK_EQ(ktl_ring_accept(ring, -1, ACCEPT_DATA), -EINVAL);
    CHECK_EQ(ktl_ring_accept(ring, 3, 7), -EINVAL);                          /* no accept bit */
    CHECK_EQ(ktl_ring_accept(ring, 3, ACCEPT_DATA | KTL_RING_INTERNAL), -EINVAL);
    CHECK_EQ(ktl_ring_poll(ring, 3, POLLIN, ACCEPT_DATA), -EINVAL);          /* a poll may not pose as one */
}

/* Each connection is one completion, the accept stays armed, and the socket is the peer's. */
static void test_accepts_each_connection(ktl_ring *ring)
{
    enum { N = 5 };
    struct sockaddr_in addr;
    int listener = tcp_listener(&addr, 64);
    int clients[N];
    ktl_cqe ev[8];
    int got = 0;

    CHECK_EQ(ktl_ring_accept(ring, listener, ACCEPT_DATA), 0);
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 8), 0);
    for (int i = 0; i < N; i++)
        clients[i] = tcp_connect(&addr);

    for (int round = 0; round < 50 && got < N; round++) {
        int32_t n = ktl_ring_wait(ring, 100, ev, 8);
        CHECK(n >= 0);
        for (int32_t j = 0; j < n; j++) {
            struct sockaddr_in peer, local;
            socklen_t plen = sizeof(peer), llen = sizeof(local);
            int fd = ev[j].res;
            CHECK_EQ(ev[j].user_data, ACCEPT_DATA);
            CHECK(fd >= 0);
            CHECK((ev[j].flags & KTL_CQE_MORE) != 0);
            CHECK((fcntl(fd, F_GETFL) & O_NONBLOCK) != 0);
            CHECK((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
            /* The accepted socket's peer is one of our clients. */
            CHECK(getpeername(fd, (struct sockaddr *)&peer, &plen) == 0);
            int match = 0;
            for (int i = 0; i < N; i++) {
                llen = sizeof(local);
                CHECK(getsockname(clients[i], (struct sockaddr *)&local, &llen) == 0);
                match += local.sin_port == peer.sin_port;
            }
            CHECK_EQ(match, 1);
            write_all(fd, "x", 1);
            close(fd);
            got++;
        }
    }
    CHECK_EQ(got, N);
    for (int i = 0; i < N; i++) {
        char c;
        CHECK_EQ(read(clients[i], &c, 1), 1);
        close(clients[i]);
    }
    CHECK_EQ(ktl_ring_remove(ring, ACCEPT_DATA, 1), 0);
    close(listener);
}

/*
 * A connection arriving just before a waited removal is either accepted into a completion
 * the engine consumes (and closes: the client sees EOF) or left in the backlog for accept4;
 * never an open fd nobody knows. After the removal the ring accepts nothing more.
 */
static void test_removal_leaks_nothing(ktl_ring *ring)
{
    struct sockaddr_in addr;
    int listener = tcp_listener(&addr, 64);
    int before = open_fds();
    ktl_cqe ev[8];

    CHECK_EQ(ktl_ring_accept(ring, listener, ACCEPT_DATA), 0);
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 8), 0);
    int first = tcp_connect(&addr);
    CHECK_EQ(ktl_ring_remove(ring, ACCEPT_DATA, 1), 0);
    int second = tcp_connect(&addr);
    CHECK_EQ(ktl_ring_wait(ring, 100, ev, 8), 0);                            /* nothing reported */

    int left = accept4(listener, NULL, NULL, SOCK_CLOEXEC);                 /* `second`, maybe `first` */
    CHECK(left >= 0);
    int also = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (also >= 0) {
        close(also);                                                         /* `first` was not taken */
    } else {
        CHECK_EQ(errno, EAGAIN);
        CHECK(sees_eof(first));                                              /* taken, and closed */
    }
    close(left);
    close(first);
    close(second);
    CHECK_EQ(open_fds(), before);
    close(listener);
}

/*
 * Destroying a ring closes the sockets accepted into completions nobody read: those in the
 * ring, its kept list, and the kernel's overflow list, which holds what a full completion queue
 * could not: 40 connections against a ring of 8 entries (32 CQEs).
 */
static void test_destroy_closes_unread_accepts(void)
{
    enum { N = 40 };
    struct sockaddr_in addr;
    int listener = tcp_listener(&addr, 128);
    int wake_fd = -1;
    ktl_ring *ring = test_ring_create(8, &wake_fd);
    int clients[N];
    ktl_cqe ev[1];
    int before;

    CHECK(ring != NULL);
    before = open_fds();
    CHECK_EQ(ktl_ring_accept(ring, listener, ACCEPT_DATA), 0);
    CHECK_EQ(ktl_ring_wait(ring, 0, ev, 1), 0);
    for (int i = 0; i < N; i++)
        clients[i] = tcp_connect(&addr);
    usleep(20 * 1000);
    /* One read; the rest fill the CQ, and the accept's last one overflows it. */
    CHECK_EQ(ktl_ring_wait(ring, 1000, ev, 1), 1);
    CHECK(ev[0].res >= 0);
    close(ev[0].res);
    ktl_ring_destroy(ring);
    close(wake_fd);

    int eofs = 0, left = 0;
    for (int fd; (fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC)) >= 0;) {
        left++;                                                              /* never accepted: still in the backlog */
        close(fd);
    }
    for (int i = 0; i < N; i++) {
        eofs += sees_eof(clients[i]);                                        /* closed by the ring, or just above */
        close(clients[i]);
    }
    CHECK_EQ(eofs, N);
    CHECK(N - left > 32);                                                    /* more than the CQ holds were accepted */
    CHECK_EQ(open_fds(), before - 2);                                        /* less the ring's fd and the eventfd */
    close(listener);
}

void run_ring_accept_tests(void)
{
    int wake_fd = -1;
    ktl_ring *ring = test_ring_create(64, &wake_fd);
    if (ring == NULL)
        return;
    test_arguments(ring);
    test_accepts_each_connection(ring);
    test_removal_leaks_nothing(ring);
    ktl_ring_destroy(ring);
    close(wake_fd);
    test_destroy_closes_unread_accepts();
    printf("ring_accept: ok\n");
}
