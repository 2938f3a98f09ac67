/*
 * test_abi.c - the parts of the contract the C# side depends on without ever doing
 * I/O: version, struct layout, argument validation, engine creation with and without
 * AIO.
 */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ktl_test.h"

/* The managed mirror (NativeEngine.cs) hard-codes these; a change here is an ABI break. */
_Static_assert(sizeof(ktl_op) == 32, "ktl_op must stay 32 bytes");
_Static_assert(offsetof(ktl_op, fd) == 0, "fd offset");
_Static_assert(offsetof(ktl_op, iov_count) == 4, "iov_count offset");
_Static_assert(offsetof(ktl_op, iov) == 8, "iov offset");
_Static_assert(offsetof(ktl_op, result) == 16, "result offset");
_Static_assert(offsetof(ktl_op, flags) == 24, "flags offset");
_Static_assert(offsetof(ktl_op, tag) == 28, "tag offset");

static void test_version_and_layout(void)
{
    CHECK_EQ(ktl_abi_version(), KTL_ABI_VERSION);
    CHECK_EQ(KTL_ABI_VERSION, 7);
    CHECK_EQ(sizeof(ktl_cqe), 16);
    CHECK_EQ(offsetof(ktl_cqe, res), 8);
    CHECK_EQ(offsetof(ktl_cqe, flags), 12);
    CHECK_EQ(sizeof(ktl_ring_info), 24);
    CHECK_EQ(offsetof(ktl_ring_info, abilities), 16);
    CHECK_EQ(KTL_RING_SEND_DONE, 1ull << 61);
    CHECK_EQ(sizeof(ktl_op), 32);
    CHECK_EQ(offsetof(ktl_op, fd), 0);
    CHECK_EQ(offsetof(ktl_op, iov_count), 4);
    CHECK_EQ(offsetof(ktl_op, iov), 8);
    CHECK_EQ(offsetof(ktl_op, result), 16);
    CHECK_EQ(offsetof(ktl_op, flags), 24);
    CHECK_EQ(offsetof(ktl_op, tag), 28);
    CHECK_EQ(KTL_SEND_ZEROCOPY, 1);
    CHECK_EQ(sizeof(struct iovec), 16);
    CHECK_EQ(KTL_OP_RECEIVE, 0);
    CHECK_EQ(KTL_OP_SEND, 1);
}

static void test_engine_create(void)
{
    int32_t err = -1;
    ktl_engine *engine = ktl_engine_create(0, &err);
    CHECK(engine != NULL);
    CHECK_EQ(err, 0);
    CHECK_EQ(ktl_engine_has_aio(engine), 0);
    ktl_engine_destroy(engine);

    err = -1;
    engine = ktl_engine_create(-1, &err);
    CHECK(engine != NULL);
    CHECK_EQ(err, EINVAL);
    CHECK_EQ(ktl_engine_has_aio(engine), 0);
    ktl_engine_destroy(engine);

    /* aio_error is optional. */
    engine = ktl_engine_create(8, NULL);
    CHECK(engine != NULL);
    ktl_engine_destroy(engine);

    /* More than io_setup allows (EINVAL above 0x10000000 / sizeof(io_event), EAGAIN
     * above fs.aio-max-nr): the engine must still come up, synchronous, and say why. */
    err = 0;
    engine = ktl_engine_create(INT32_MAX, &err);
    CHECK(engine != NULL);
    CHECK(err > 0);
    CHECK_EQ(ktl_engine_has_aio(engine), 0);
    {
        int fds[2];
        uint8_t buf[16];
        struct iovec iov = { buf, sizeof(buf) };
        ktl_op op = { .fd = 0, .iov_count = 1, .iov = &iov, .result = 0 };
        unix_pair(fds);
        write_all(fds[1], "hello", 5);
        op.fd = fds[0];
        CHECK_EQ(ktl_batch(engine, KTL_OP_RECEIVE, 1, &op, 1), 1);
        CHECK_EQ(op.result, 5);
        close(fds[0]);
        close(fds[1]);
    }
    ktl_engine_destroy(engine);

    CHECK_EQ(ktl_engine_has_aio(NULL), 0);
    ktl_engine_destroy(NULL);
}

static void test_invalid_batch_args(void)
{
    int32_t err;
    ktl_engine *engine = ktl_engine_create(4, &err);
    ktl_op op = { .fd = 0, .iov_count = 1, .iov = NULL, .result = 0 };

    CHECK(engine != NULL);
    CHECK_EQ(ktl_batch(NULL, KTL_OP_RECEIVE, 0, &op, 1), -EINVAL);
    CHECK_EQ(ktl_batch(engine, KTL_OP_RECEIVE, 0, NULL, 1), -EINVAL);
    CHECK_EQ(ktl_batch(engine, KTL_OP_RECEIVE, 0, &op, -1), -EINVAL);
    CHECK_EQ(ktl_batch(engine, 2, 0, &op, 1), -EINVAL);
    CHECK_EQ(ktl_batch(engine, -1, 1, &op, 1), -EINVAL);

    /* An empty batch is valid and touches nothing. */
    op.result = 12345;
    CHECK_EQ(ktl_batch(engine, KTL_OP_SEND, 0, &op, 0), 0);
    CHECK_EQ(ktl_batch(engine, KTL_OP_SEND, 1, &op, 0), 0);
    CHECK_EQ(op.result, 12345);

    ktl_engine_destroy(engine);
}

/* A bad op fails alone; in particular iov_count 0 must not come back as 0 (= EOF). */
static void test_invalid_ops(void)
{
    for (int use_aio = 0; use_aio <= 1; use_aio++) {
        for (int32_t dir = KTL_OP_RECEIVE; dir <= KTL_OP_SEND; dir++) {
            int32_t err;
            ktl_engine *engine = ktl_engine_create(4, &err);
            int fds[2];
            uint8_t buf[8] = { 0 };
            struct iovec iov = { buf, sizeof(buf) };
            ktl_op ops[7];

            CHECK(engine != NULL);
            unix_pair(fds);
            write_all(fds[1], "x", 1);

            ops[0] = (ktl_op){ .fd = fds[0], .iov_count = 0, .iov = &iov, .result = 99 };
            ops[1] = (ktl_op){ .fd = fds[0], .iov_count = 1, .iov = NULL, .result = 99 };
            ops[2] = (ktl_op){ .fd = fds[0], .iov_count = IOV_MAX + 1, .iov = &iov, .result = 99 };
            ops[3] = (ktl_op){ .fd = fds[0], .iov_count = -3, .iov = &iov, .result = 99 };
            /* Unknown flags, a send flag on a receive, a tag on an op that is not a zero-copy send. */
            ops[4] = (ktl_op){ .fd = fds[0], .iov_count = 1, .iov = &iov, .result = 99, .flags = 0x40 };
            ops[5] = (ktl_op){ .fd = fds[0], .iov_count = 1, .iov = &iov, .result = 99, .flags = dir == KTL_OP_RECEIVE ? KTL_SEND_ZEROCOPY : 0x2 };
            ops[6] = (ktl_op){ .fd = fds[0], .iov_count = 1, .iov = &iov, .result = 99, .flags = 0, .tag = 1 };
            CHECK_EQ(ktl_batch(engine, dir, use_aio, ops, 7), 7);
            for (int i = 0; i < 7; i++)
                CHECK_EQ(ops[i].result, -EINVAL);

            close(fds[0]);
            close(fds[1]);
            ktl_engine_destroy(engine);
        }
    }
}

void run_abi_tests(void)
{
    test_version_and_layout();
    test_engine_create();
    test_invalid_batch_args();
    test_invalid_ops();
}
