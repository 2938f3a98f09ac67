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

#define KTL_ABI_VERSION 7

#define KTL_EXPORT __attribute__((visibility("default")))

/* Direction of a batch. */
#define KTL_OP_RECEIVE 0
#define KTL_OP_SEND 1

/*
 * Op flags. KTL_SEND_ZEROCOPY sends without copying, and the caller must keep the buffers
 * unchanged until the kernel says it is done with them, not just until the call returns.
 * Valid on sends only. In ktl_batch (and with tag 0 in a ring batch) it is sendmsg with
 * MSG_ZEROCOPY (Linux 4.14, msg_zerocopy.rst): the
 * socket must have SO_ZEROCOPY set, the op runs synchronously (also in an AIO batch), and the
 * notification arrives on the socket's error queue (recvmsg with MSG_ERRQUEUE). In a ring
 * batch, with a nonzero tag, it is IORING_OP_SENDMSG_ZC instead, and the notification is a
 * completion of ktl_ring_wait carrying the op's tag (KTL_RING_SEND_DONE); where the ring
 * cannot make it one (no KTL_RING_SENDS_ZEROCOPY, no room) it fails with -ENOBUFS, as
 * MSG_ZEROCOPY does without notification memory, and the caller sends the bytes by copying.
 * After a ring batch the op's tag says whether that notification will come: kept when it
 * will (also for a send that failed, or whose result was lost), 0 when it will not (the op
 * never reached the kernel). Until it comes the kernel may still read the buffers.
 */
#define KTL_SEND_ZEROCOPY 1

/* One socket's share of a batch. 32 bytes on LP64; layout is part of the ABI. */
typedef struct ktl_op {
    int32_t fd;                /* non-blocking stream socket */
    int32_t iov_count;         /* 1..IOV_MAX */
    const struct iovec *iov;   /* buffers; must stay valid for the duration of the call */
    int64_t result;            /* out: bytes transferred (0 = EOF on receive), or -errno */
    int32_t flags;             /* KTL_SEND_* bits; 0 for a plain op */
    uint32_t tag;              /* in: a zero-copy send's number for its ring notification, else 0;
                                  out (ring batch): 0 unless that notification will come */
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

/*
 * ---------------------------------------------------------------------------------------
 * The io_uring engine (IoBackend.IoUring): one ring per event-loop thread, owned by it.
 *
 * Readiness comes from multishot IORING_OP_POLL_ADD requests, one per registered socket,
 * whose completions ktl_ring_wait returns; the loop's wake-up is a pending read of its
 * eventfd, re-armed here. A pass's receives and sends go to the kernel as one
 * io_uring_enter (ktl_ring_batch): RECVMSG/SENDMSG with MSG_DONTWAIT, so each completes
 * (or fails with -EAGAIN) inside that call, and the call returns only once every op has
 * its result. No op ever outlives the call that submitted it, so the caller's buffers are
 * safe to release when it returns.
 *
 * Not thread-safe: everything but ktl_ring_create and ktl_ring_destroy must run on one
 * thread at a time, with a full barrier between two threads' turns; unless the ring was
 * created KTL_RING_MOVABLE, on the thread that called ktl_ring_start only (the ring is
 * IORING_SETUP_SINGLE_ISSUER where the kernel has it). A thread that armed polls or accepts
 * (ktl_ring_poll, ktl_ring_accept) must not exit while they are wanted: once it has exited,
 * their next event ends them with -ECANCELED.
 * ---------------------------------------------------------------------------------------
 */

/* ktl_ring_create flags: the ring will be entered by several threads, one at a time (a loop
 * that moves between threads): no SINGLE_ISSUER or DEFER_TASKRUN, whose ring only the thread
 * that started it may enter (EEXIST for any other), and no fd registered with one thread. */
#define KTL_RING_MOVABLE 1u

/* Setup flags the ring ended up with (ktl_ring_info.setup), mirrored from io_uring.h. */
#define KTL_RING_SINGLE_ISSUER (1u << 12)
#define KTL_RING_DEFER_TASKRUN (1u << 13)
#define KTL_RING_COOP_TASKRUN (1u << 8)

/* ktl_ring_info.abilities: KTL_SEND_ZEROCOPY ops of a ring batch are IORING_OP_SENDMSG_ZC
 * (Linux 6.2: the notification also says whether the kernel copied after all). */
#define KTL_RING_SENDS_ZEROCOPY 1u

/* What the ring is and what the kernel offers; filled by ktl_ring_create (setup, features,
 * sizes) and ktl_ring_start (abilities, which need the enabled ring to probe). */
typedef struct ktl_ring_info {
    uint32_t setup;      /* IORING_SETUP_* flags in use */
    uint32_t features;   /* IORING_FEAT_* from io_uring_setup */
    uint32_t sq_entries;
    uint32_t cq_entries;
    uint32_t abilities;  /* KTL_RING_* ability bits */
    uint32_t reserved;
} ktl_ring_info;

/* One completion as ktl_ring_wait reports it: 16 bytes, layout is part of the ABI. */
typedef struct ktl_cqe {
    uint64_t user_data;  /* as given to ktl_ring_poll */
    int32_t res;         /* poll: the ready events (poll(2)/epoll(7) bits), or -errno */
    uint32_t flags;      /* KTL_CQE_MORE: the multishot poll is still armed */
} ktl_cqe;

#define KTL_CQE_MORE 2u /* IORING_CQE_F_MORE */

/* user_data values with this bit set are the engine's own; ktl_ring_poll rejects them. */
#define KTL_RING_INTERNAL (1ull << 63)

/* Marks an accept's user_data (ktl_ring_accept): its completions carry accepted sockets. */
#define KTL_RING_ACCEPT (1ull << 62)

/*
 * Marks a zero-copy send's notification (a ring batch's KTL_SEND_ZEROCOPY op, where the ring
 * has KTL_RING_SENDS_ZEROCOPY): user_data is KTL_RING_SEND_DONE | the op's tag, res is 1 when
 * the kernel copied the bytes after all (loopback, a device without scatter-gather) and 0
 * when it sent from the buffers, which are the caller's again. Exactly one comes for every such
 * op, also for one that failed (which held nothing), after its result. ktl_ring_poll and
 * ktl_ring_accept reject this bit.
 */
#define KTL_RING_SEND_DONE (1ull << 61)

typedef struct ktl_ring ktl_ring;

/* 1 when this build has the io_uring engine (liburing was found at build time), else 0. */
KTL_EXPORT int32_t ktl_ring_supported(void);

/*
 * Creates a ring of `entries` submission slots (a power of two, 1..32768) in the disabled
 * state, from any thread. Tries SINGLE_ISSUER|DEFER_TASKRUN (Linux 6.1), then
 * COOP_TASKRUN (5.19); with KTL_RING_MOVABLE in `flags`, COOP_TASKRUN only. A kernel without
 * either is refused with EINVAL; unknown flags too. On failure returns
 * NULL and stores the positive errno of io_uring_setup (EPERM/ENOSYS: seccomp or
 * kernel.io_uring_disabled; ENOMEM: RLIMIT_MEMLOCK, which the ring's pages count against in a
 * process without CAP_IPC_LOCK: 34 pages for 1,024 entries, measured on Linux 6.18; EINVAL:
 * kernel too old), or ENOSYS when this build has no io_uring engine.
 */
KTL_EXPORT ktl_ring *ktl_ring_create(int32_t entries, uint32_t flags, ktl_ring_info *info, int32_t *error);

/*
 * On the thread that will own the ring (the first to use it, for a movable one): enables
 * it, registers its fd with the thread (where the kernel can; not for a movable ring), probes what the kernel can do with it (info->abilities; info may
 * be NULL) and arms the pending read of wake_fd (an eventfd). Returns 0 or -errno.
 */
KTL_EXPORT int32_t ktl_ring_start(ktl_ring *ring, int32_t wake_fd, ktl_ring_info *info);

/*
 * Queues a poll of fd for events (poll(2)/epoll(7) bits; EPOLLEXCLUSIVE allowed) whose
 * completions carry user_data (bits 63 and 62 clear). With EPOLLET it is multishot and reports
 * edges, as an edge-triggered epoll registration does; without, it is one-shot, and the
 * caller re-arms it after each completion, which then reports the level again at once if
 * it still holds. Submitted by the next ktl_ring_wait, ktl_ring_batch or ktl_ring_remove.
 * Returns 0 or -errno.
 */
KTL_EXPORT int32_t ktl_ring_poll(ktl_ring *ring, int32_t fd, uint32_t events, uint64_t user_data);

/*
 * Queues a multishot accept (Linux 5.19) on the listening socket fd: every connection it
 * accepts is one completion whose res is the new socket (non-blocking, close-on-exec), or
 * -errno; KTL_CQE_MORE says it is still armed (an error, or a full completion queue, ends it,
 * and the caller queues it again). No peer address comes with it (getpeername(2) has it).
 * user_data must have KTL_RING_ACCEPT set and bit 63 clear. A socket accepted into a
 * completion the caller never receives (its accept removed with wait, or the ring destroyed)
 * is closed here. Returns 0 or -errno.
 */
KTL_EXPORT int32_t ktl_ring_accept(ktl_ring *ring, int32_t fd, uint64_t user_data);

/*
 * Removes the poll or accept with user_data. wait != 0: submits now and returns once the
 * request has ended for good, its last completion consumed here (not reported): it holds a
 * reference to the socket, so only then does closing the fd release it (FIN or RST goes
 * out, an unbound listener stops taking connections). Usually one io_uring_enter. wait == 0:
 * only queues the removal; the request's -ECANCELED then comes through ktl_ring_wait.
 * Returns 0 or -errno. With wait, an error means the request may still hold its socket: no
 * SQE could be had (-EBUSY), or io_uring_enter failed; it never waits for an answer that
 * cannot come. Asking again later is safe.
 */
KTL_EXPORT int32_t ktl_ring_remove(ktl_ring *ring, uint64_t user_data, int32_t wait);

/*
 * As ktl_ring_remove with wait, for count requests at once: one io_uring_enter for all of
 * them (a loop closing several connections in one pass), more when they outnumber the
 * submission queue. Returns 0, or -errno as ktl_ring_remove does: then some of them may
 * still hold their sockets.
 */
KTL_EXPORT int32_t ktl_ring_remove_all(ktl_ring *ring, const uint64_t *user_data, int32_t count);

/*
 * Submits what is queued and waits up to timeout_ms (-1: no limit, 0: only looks) for
 * completions; copies at most capacity of them to out (wake-ups are consumed here and not
 * reported). On DEFER_TASKRUN rings one io_uring_enter runs at most 20 items of completion
 * work (Linux 6.13+): the rest comes with the next wait. A wake-up that a batch or a removal
 * consumed makes the next wait return at once. Returns the count, 0 on timeout, EINTR or a
 * wake-up, or -errno. Once a completion meant for the caller was lost (no memory to keep one
 * that a batch or a removal came across: -ENOMEM; the kernel dropped one: -EBADR) every wait
 * fails with that error: some request went quiet, and nobody can say which, so the ring
 * cannot be trusted (a socket accepted into a lost completion is closed, not leaked).
 */
KTL_EXPORT int32_t ktl_ring_wait(ktl_ring *ring, int32_t timeout_ms, ktl_cqe *out, int32_t capacity);

/*
 * As ktl_batch, through the ring: every op is submitted in one io_uring_enter (more when
 * the batch exceeds the submission queue) and has its result when the call returns.
 * Zero-copy sends are SENDMSG_ZC ops of the batch where the ring has KTL_RING_SENDS_ZEROCOPY
 * (their notifications come later, through ktl_ring_wait), and otherwise run synchronously
 * (sendmsg with MSG_ZEROCOPY). Poll completions that arrive meanwhile are kept for the next
 * ktl_ring_wait. Every op has a result when it returns (unless ops is NULL). Returns count,
 * or -errno: -EINVAL/-ENOMEM before anything was submitted (every op gets it), or the error of
 * an io_uring_enter that failed with ops outstanding. Then each op keeps its own result where
 * it has one, and the rest get the error; ops the kernel never read are voided
 * (no later enter sends them), and a zero-copy op keeps its tag only if its notification may
 * still come (ktl_op.tag).
 */
KTL_EXPORT int32_t ktl_ring_batch(ktl_ring *ring, int32_t direction, ktl_op *ops, int32_t count);

/* Closes the ring (from any thread, once its owner has stopped using it), closing the sockets
 * accepted into completions nobody read: kept ones, those in the CQ ring and, on the owner's
 * thread, those in the kernel's overflow list. NULL is ignored. */
KTL_EXPORT void ktl_ring_destroy(ktl_ring *ring);

#ifdef __cplusplus
}
#endif

#endif /* KTL_H */
