/*
 * ktl_test.h - the tests' assert macros and real-socket helpers. Every test talks to
 * the kernel through actual sockets: the engine is a thin layer over syscalls, so a
 * mock would only test the mock.
 */
#ifndef KTL_TEST_H
#define KTL_TEST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ktl.h"

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60 /* asm-generic/socket.h, Linux 4.14 */
#endif

#define CHECK(cond)                                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

/* Prints both values: "result was -11, expected 5" says far more than "false". */
#define CHECK_EQ(actual, expected)                                                 \
    do {                                                                           \
        long long a_ = (long long)(actual), e_ = (long long)(expected);            \
        if (a_ != e_) {                                                            \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %lld, expected %s == %lld\n", \
                    __FILE__, __LINE__, #actual, a_, #expected, e_);               \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

/* How a suite drives the engine. */
typedef struct io_mode {
    const char *name;
    int use_aio;
    int32_t aio_capacity; /* 0 = engine without AIO */
    int use_ring;         /* batches go through an io_uring ring (ktl_ring_batch) */
} io_mode;

/* The process's ring for use_ring modes: created and started on first use. */
ktl_ring *test_ring(void);

/* Creates and starts a ring with a blocking eventfd for wake-ups (*wake_fd), or returns NULL
 * after printing why when io_uring is unavailable and KTL_TEST_ALLOW_NO_URING=1 (fails otherwise). */
ktl_ring *test_ring_create(int32_t entries, int *wake_fd);
/* 1 when the environment variable is 1 (KTL_TEST_ALLOW_NO_AIO, KTL_TEST_ALLOW_NO_URING): a missing kernel
 * feature then skips its checks instead of failing them. */
int test_allowed(const char *variable);
extern uint32_t test_ring_abilities; /* ktl_ring_info.abilities of the last ring test_ring_create started */
extern uint32_t test_ring_setup;     /* ktl_ring_info.setup of that ring */

/* One batch through the mode's path: ktl_batch, or ktl_ring_batch for use_ring modes. */
int32_t test_batch(ktl_engine *engine, const io_mode *mode, int32_t direction, ktl_op *ops, int32_t count);

/* Creates the engine a mode asks for, insisting on AIO unless KTL_TEST_ALLOW_NO_AIO=1. */
ktl_engine *test_engine(const io_mode *mode, int32_t aio_capacity);

/* An op result no call produces: an op still holding it was never performed. */
#define NOT_SET (-999)

void unix_pair(int fds[2]);                 /* AF_UNIX stream, both ends non-blocking */
void tcp_pair(int fds[2]);                  /* loopback TCP, both ends non-blocking */
void make_pair(int i, int fds[2]);          /* unix_pair for an even i, tcp_pair for an odd one */
void close_pair(int fds[2]);
void sleep_ms(long ms);                     /* sleeps that long, through EINTR */
void zerocopy_pair(int fds[2]);             /* tcp_pair, fds[0] with SO_ZEROCOPY */
struct sockaddr_in;
int tcp_listener(struct sockaddr_in *addr, int backlog); /* non-blocking, on loopback; *addr gets its address */
int tcp_connect(const struct sockaddr_in *addr);         /* a blocking client, connected */
int open_fds(void);                         /* entries of /proc/self/fd */
int sees_eof(int fd);                       /* 1 when a read of fd ends (EOF) within 2 s: the peer closed */
void set_nonblocking(int fd, int on);
int wait_readable(int fd, int timeout_ms);  /* 1 when readable (or error/hup) in time */
void write_all(int fd, const void *buf, size_t len);
void read_exact(int fd, void *buf, size_t len);
void fill_pattern(uint8_t *buf, size_t len, unsigned seed, size_t start);
int check_pattern(const uint8_t *buf, size_t len, unsigned seed, size_t start);

void run_abi_tests(void);
void run_io_tests(const io_mode *mode);
/* test_io_send.c: the send checks run_io_tests runs, in its order. */
void test_send_many(const io_mode *mode);
void test_send_full(const io_mode *mode);
void test_send_closed_peer(const io_mode *mode);
void test_send_zerocopy(const io_mode *mode);
void run_ring_tests(void);
void run_ring_accept_tests(void);
void run_ring_zerocopy_tests(void);

#endif /* KTL_TEST_H */
