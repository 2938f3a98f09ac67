namespace Kestrel.Transport.Linux;

/// <summary>
/// How each event loop hands its sockets' reads and writes to the kernel. Every backend runs the same loop:
/// one thread, one epoll instance, a pass that receives every readable socket in one batch and sends
/// everything flushed during the pass in another.
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
}
