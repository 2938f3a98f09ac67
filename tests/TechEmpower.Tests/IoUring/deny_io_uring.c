/*
 * deny_io_uring: runs a command in which io_uring_setup, io_uring_enter and io_uring_register fail with a chosen
 * errno, the way a container runtime's seccomp profile makes them fail (Docker's default profile uses EPERM).
 *
 *     deny_io_uring EPERM|ENOSYS|<number> -- command [args...]
 *     deny_io_uring KILL -- command [args...]
 *
 * KILL instead kills the process (SECCOMP_RET_KILL_PROCESS, Linux 4.14) on any of the three io_uring calls and on
 * io_setup (Linux AIO), as systemd's SystemCallFilter= does without SystemCallErrorNumber=, and as custom
 * Kubernetes profiles may: a program that only probes either facility dies of SIGSYS. It knows io_setup's number
 * for the architecture it was built for only, so it kills any call made through another ABI.
 *
 * It sets no_new_privs (required to install a filter without CAP_SYS_ADMIN), installs a classic BPF seccomp filter
 * and execs the command with execvp, so the command keeps this process's pid and inherits the filter, as do all its
 * threads and children. It prints nothing unless it fails: 2 for a bad command line, 1 when the filter cannot be
 * installed, 127 when the command cannot be executed.
 *
 * Architectures: it builds for x86_64, i386, aarch64 and 32-bit arm, where the three calls are numbers 425 to 427
 * (x32 adds its bit 0x40000000 to the same numbers). The filter recognises the audit arch of each of those ABIs;
 * a system call made through any other ABI kills the process (SECCOMP_RET_KILL_PROCESS, Linux 4.14), so that the
 * filter can never be bypassed silently through a compat ABI whose numbers it does not know.
 *
 * Written for the Kestrel.Transport.Linux tests (tests/TechEmpower.Tests/IoUring); compiled by them at test time.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if !defined(__x86_64__) && !defined(__i386__) && !defined(__aarch64__) && !defined(__arm__)
#error "deny_io_uring knows the io_uring system call numbers of x86_64, i386, aarch64 and arm only."
#endif

/* The same on every ABI the filter accepts (the kernel's unified numbering since Linux 5.1). */
#define IO_URING_SETUP 425u
#define IO_URING_REGISTER 427u
_Static_assert(__NR_io_uring_setup == IO_URING_SETUP, "io_uring_setup number");
_Static_assert(__NR_io_uring_enter == IO_URING_SETUP + 1, "io_uring_enter number");
_Static_assert(__NR_io_uring_register == IO_URING_REGISTER, "io_uring_register number");

#define X32_SYSCALL_BIT 0x40000000u

#ifndef AUDIT_ARCH_AARCH64
#define AUDIT_ARCH_AARCH64 (EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE)
#endif
#ifndef SECCOMP_RET_KILL_PROCESS
#define SECCOMP_RET_KILL_PROCESS 0x80000000u
#endif

static int parse_errno(const char *text)
{
    if (strcmp(text, "EPERM") == 0) {
        return EPERM;
    }
    if (strcmp(text, "ENOSYS") == 0) {
        return ENOSYS;
    }

    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < 1 || value > 4095) {
        return -1;
    }
    return (int)value;
}

static int usage(void)
{
    fprintf(stderr, "usage: deny_io_uring EPERM|ENOSYS|<errno 1-4095>|KILL -- command [args...]\n");
    return 2;
}

#if defined(__x86_64__)
#define NATIVE_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__i386__)
#define NATIVE_AUDIT_ARCH AUDIT_ARCH_I386
#elif defined(__aarch64__)
#define NATIVE_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#define NATIVE_AUDIT_ARCH AUDIT_ARCH_ARM
#endif

/* KILL: io_setup and the three io_uring calls kill the process; so does any call through a foreign ABI (x32 on
 * x86_64 included), whose io_setup number this filter would not know. */
static struct sock_filter kill_filter[] = {
    /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_AUDIT_ARCH, 1, 0),
    /* 2 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    /* 3 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    /* 4 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, 4, 0),
    /* 5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_setup, 3, 0),
    /* 6 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, IO_URING_SETUP, 0, 3),
    /* 7 */ BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, IO_URING_REGISTER, 2, 0),
    /* 8 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    /* 9 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    /* 10 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
};

int main(int argc, char **argv)
{
    if (argc < 4 || strcmp(argv[2], "--") != 0) {
        return usage();
    }

    int kill_mode = strcmp(argv[1], "KILL") == 0;
    int denied = kill_mode ? 0 : parse_errno(argv[1]);
    if (denied < 0) {
        fprintf(stderr, "deny_io_uring: '%s' is not EPERM, ENOSYS, KILL or an errno number from 1 to 4095.\n", argv[1]);
        return usage();
    }

    /* struct seccomp_data: the syscall number at offset 0, the audit arch at offset 4. */
    struct sock_filter filter[] = {
        /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 4, 0),
        /* 2 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_I386, 3, 0),
        /* 3 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_AARCH64, 2, 0),
        /* 4 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_ARM, 1, 0),
        /* 5 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        /* 6 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        /* 7: x32 numbers are x86_64's plus a high bit, which the other ABIs never set. */
        /* 7 */ BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~X32_SYSCALL_BIT),
        /* 8 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, IO_URING_SETUP, 0, 2),
        /* 9 */ BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, IO_URING_REGISTER, 1, 0),
        /* 10 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((unsigned)denied & SECCOMP_RET_DATA)),
        /* 11 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {
        .len = (unsigned short)(sizeof(filter) / sizeof(filter[0])),
        .filter = filter,
    };
    if (kill_mode) {
        program.len = (unsigned short)(sizeof(kill_filter) / sizeof(kill_filter[0]));
        program.filter = kill_filter;
    }

    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        fprintf(stderr, "deny_io_uring: prctl(PR_SET_NO_NEW_PRIVS) failed: %s (errno %d)\n", strerror(errno), errno);
        return 1;
    }
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program, 0, 0) != 0) {
        fprintf(stderr, "deny_io_uring: prctl(PR_SET_SECCOMP) failed: %s (errno %d)\n", strerror(errno), errno);
        return 1;
    }

    execvp(argv[3], &argv[3]);
    fprintf(stderr, "deny_io_uring: cannot execute '%s': %s (errno %d)\n", argv[3], strerror(errno), errno);
    return 127;
}
