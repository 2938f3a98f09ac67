namespace Kestrel.Transport.Linux;

/// <summary>
/// How each event loop hands its sockets' reads and writes to the kernel. Every backend runs the same loop:
/// one thread, one kernel readiness facility (an epoll instance or an io_uring ring), a pass that receives
/// every readable socket in one batch and sends everything flushed during the pass in another.
/// </summary>
public enum IoBackend
{
    /// <summary>
    /// epoll for readiness; each pass's receives as one readv per socket and its sends as one sendmsg per
    /// socket, all in one call into the native engine. The default: no extra kernel resources, allowed
    /// under every seccomp profile that allows epoll.
    /// </summary>
    Epoll = 0,

    /// <summary>
    /// epoll for readiness; each pass's receive batch and the loop's send batch go to the kernel as one
    /// Linux AIO <c>io_submit</c> (IOCB_CMD_PREADV, IOCB_CMD_PWRITEV), the design of the earlier Linux
    /// transport. Sends a thread-pool thread makes itself stay sendmsg. Each loop takes an AIO context of
    /// 512 requests from <c>fs.aio-max-nr</c>; where <c>io_setup</c> fails (the limit is exhausted, or a
    /// seccomp profile refuses it) the loop runs as <see cref="Epoll"/>, logged once per loop and counted by
    /// <c>kestrel.transport.linux.aio.fallbacks</c>.
    /// </summary>
    EpollAio = 1,

    /// <summary>
    /// An io_uring ring per loop (Linux 5.19 or later; SINGLE_ISSUER and DEFER_TASKRUN from 6.1): multishot
    /// polls for readiness, a pending read of the loop's eventfd for wake-ups, and each pass's receive and send
    /// batches as one <c>io_uring_enter</c> each, so a pass costs a few kernel crossings however many sockets it
    /// serves. Where io_uring cannot be set up (seccomp profiles such as Docker's and containerd's defaults,
    /// <c>kernel.io_uring_disabled</c>, an old kernel, an RLIMIT_MEMLOCK too low for the rings of a process without
    /// CAP_IPC_LOCK) the server fails to start, naming the cause; <see cref="Auto"/> falls back instead.
    /// </summary>
    IoUring = 2,

    /// <summary>
    /// The backend that measured best for the scheduling mode, where the kernel allows it: <see cref="IoUring"/> with
    /// <see cref="ApplicationSchedulingMode.Inline"/> (the loop makes every send, and io_uring measured ahead of epoll),
    /// <see cref="Epoll"/> with <see cref="ApplicationSchedulingMode.Adaptive"/>, the default (a ring that can follow its loop
    /// to another thread measured level with epoll), with <see cref="ApplicationSchedulingMode.ThreadPool"/> (io_uring measured
    /// no better), and where io_uring cannot be set up. The start-up log says which runs and why, and
    /// <c>kestrel.transport.linux.io_uring.fallbacks</c> counts the loops that wanted io_uring and fell back.
    /// </summary>
    Auto = 3,
}
