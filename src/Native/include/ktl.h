/*
 * ktl.h - the whole ABI between Kestrel.Transport.Linux (C#) and its native engine.
 *
 * The engine performs one event-loop pass's batch of socket receives or sends in a
 * single call, so the managed loop crosses into native code once per pass instead of
 * once per socket. A batch runs either as readv/sendmsg per socket, or as one Linux AIO
 * io_submit of IOCB_CMD_PREADV/PWRITEV whose completions are reaped from the user-space
 * AIO ring (falling back to io_getevents when the ring is not usable).
 *
 * Every struct here is mirrored in src/Transport.Linux/Interop/NativeEngine.cs; change
 * both together and bump KTL_ABI_VERSION.
 */
#ifndef KTL_H
#define KTL_H

#include <stdint.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KTL_ABI_VERSION 2

#define KTL_EXPORT __attribute__((visibility("default")))

/* Direction of a batch. */
#define KTL_OP_RECEIVE 0
#define KTL_OP_SEND 1

/*
 * Op flags. KTL_SEND_ZEROCOPY sends with MSG_ZEROCOPY (Linux 4.14, msg_zerocopy.rst): the
 * socket must have SO_ZEROCOPY set, and the caller must keep the buffers unchanged until
 * the kernel's completion notification for this send arrives on the socket's error queue
 * (recvmsg with MSG_ERRQUEUE), not just until the call returns. Such an op always runs
 * synchronously (sendmsg), also in an AIO batch. Valid on sends only.
 */
#define KTL_SEND_ZEROCOPY 1

/* One socket's share of a batch. 32 bytes on LP64; layout is part of the ABI. */
typedef struct ktl_op {
    int32_t fd;                /* non-blocking stream socket */
    int32_t iov_count;         /* 1..IOV_MAX */
    const struct iovec *iov;   /* buffers; must stay valid for the duration of the call */
    int64_t result;            /* out: bytes transferred (0 = EOF on receive), or -errno */
    int32_t flags;             /* KTL_SEND_* bits; 0 for a plain op */
    int32_t reserved;          /* must be 0 */
} ktl_op;

typedef struct ktl_engine ktl_engine;

/* Returns KTL_ABI_VERSION; the managed side refuses a library whose version differs. */
KTL_EXPORT int32_t ktl_abi_version(void);

/*
 * Creates an engine for one event-loop thread. aio_capacity > 0 asks for a Linux AIO
 * context able to hold that many in-flight operations (io_setup). When io_setup fails
 * (fs.aio-max-nr exhausted: EAGAIN; seccomp: ENOSYS/EPERM) the engine is still created,
 * without AIO, and *aio_error receives the positive errno; otherwise *aio_error is 0.
 * Returns NULL only when memory is exhausted.
 */
KTL_EXPORT ktl_engine *ktl_engine_create(int32_t aio_capacity, int32_t *aio_error);

/* 1 when the engine holds a usable AIO context, 0 otherwise. */
KTL_EXPORT int32_t ktl_engine_has_aio(const ktl_engine *engine);

/* Releases the AIO context (io_destroy) and the engine's memory. NULL is ignored. */
KTL_EXPORT void ktl_engine_destroy(ktl_engine *engine);

/*
 * Performs every op in ops[0..count) in the given direction and stores each op's result.
 * use_aio != 0 submits the batch with io_submit when the engine has AIO (in chunks of
 * at most aio_capacity); ops the kernel did not accept are performed synchronously, so
 * every op always gets a result. Sends use MSG_NOSIGNAL on the synchronous path.
 * EINTR is retried. An op with flags the direction does not allow gets -EINVAL. Returns count, or -errno if the arguments are invalid
 * (NULL engine/ops, count < 0, direction unknown).
 */
KTL_EXPORT int32_t ktl_batch(ktl_engine *engine, int32_t direction, int32_t use_aio,
                             ktl_op *ops, int32_t count);

#ifdef __cplusplus
}
#endif

#endif /* KTL_H */
