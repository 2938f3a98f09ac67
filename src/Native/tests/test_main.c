/*
 * test_main.c - one binary, one suite per ctest test, so a failure names the path
 * (sync, AIO through the ring, AIO through io_getevents, AIO in small chunks, io_uring
 * batches, and the io_uring engine's readiness and wake-up).
 */
#include <string.h>

#include "ktl_test.h"

static const io_mode modes[] = {
    { "sync", 0, 0, 0 },
    { "aio", 1, 64, 0 },
    /* Far below the batch sizes the tests use, so every batch is split into chunks. */
    { "aio_small", 1, 4, 0 },
    /* Every I/O check again, with the batches submitted through an io_uring ring. */
    { "uring", 0, 0, 1 },
};

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s abi|sync|aio|aio_small|uring|ring|ring_accept|ring_zerocopy\n", argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "abi") == 0) {
        run_abi_tests();
        printf("abi: ok\n");
        return 0;
    }
    if (strcmp(argv[1], "ring") == 0) {
        run_ring_tests();
        return 0;
    }
    if (strcmp(argv[1], "ring_accept") == 0) {
        run_ring_accept_tests();
        return 0;
    }
    if (strcmp(argv[1], "ring_zerocopy") == 0) {
        run_ring_zerocopy_tests();
        return 0;
    }
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        if (strcmp(argv[1], modes[i].name) == 0) {
            run_io_tests(&modes[i]);
            printf("%s: ok\n", modes[i].name);
            return 0;
        }
    }
    fprintf(stderr, "unknown suite %s\n", argv[1]);
    return 2;
}
