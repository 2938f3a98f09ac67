/*
 * io_uring_probe: makes the three io_uring system calls and their neighbours by number and prints one line for each,
 * "NAME: ok ..." or "NAME: errno N (description)", for the tests of deny_io_uring (DenyIoUringTests.cs).
 *
 * io_uring_setup asks for a 1-entry ring; when it succeeds the line also shows what /proc/self/fd calls the ring's
 * fd. io_uring_enter and io_uring_register are given fd -1, so without a filter they fail with EBADF.
 * pidfd_send_signal (424) and open_tree (428) sit either side of the io_uring numbers and must not be filtered.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static void report(const char *name, long result)
{
    if (result < 0) {
        int error = errno;
        printf("%s: errno %d (%s)\n", name, error, strerror(error));
    } else {
        printf("%s: ok\n", name);
    }
}

int main(void)
{
    struct io_uring_params params;
    memset(&params, 0, sizeof(params));
    long ring = syscall(__NR_io_uring_setup, 1, &params);
    if (ring >= 0) {
        char path[64], target[256];
        snprintf(path, sizeof(path), "/proc/self/fd/%ld", ring);
        ssize_t length = readlink(path, target, sizeof(target) - 1);
        target[length < 0 ? 0 : length] = '\0';
        printf("io_uring_setup: ok (fd link %s)\n", target);
        close((int)ring);
    } else {
        report("io_uring_setup", ring);
    }

    report("io_uring_enter", syscall(__NR_io_uring_enter, -1, 0, 0, 0, NULL, 0));
    report("io_uring_register", syscall(__NR_io_uring_register, -1, 0, NULL, 0));
    report("pidfd_send_signal", syscall(__NR_pidfd_send_signal, -1, 0, NULL, 0));
    report("open_tree", syscall(__NR_open_tree, -1, "", 0));
    return 0;
}
