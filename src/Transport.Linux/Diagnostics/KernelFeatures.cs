using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Diagnostics;

/// <summary>
/// What this kernel (and the container around it) lets the transport use, found by trying each
/// feature once on throw-away fds. The transport logs it at start-up and falls back where a
/// feature is missing.
/// </summary>
internal sealed record KernelFeatures(
    string? NativeEngineError,
    bool ReusePort,
    bool EpollExclusive,
    int AioError,
    bool ZeroCopy,
    bool BusyPoll,
    bool EpollBusyPollParameters,
    string? IoUringUnavailable,
    uint IoUringSetup,
    uint IoUringFeatures,
    bool IoUringSendsZeroCopy)
{
    // IORING_FEAT_* bits the io_uring engine relies on, where present, with the names the log gives them.
    private static readonly (uint Bit, string Name)[] s_ringFeatures =
    [
        (1u << 1, "NODROP"), (1u << 5, "FAST_POLL"), (1u << 8, "EXT_ARG"), (1u << 11, "CQE_SKIP"), (1u << 13, "REG_REG_RING"),
    ];

    private static readonly Lazy<KernelFeatures> s_current = new(Probe);

    public static KernelFeatures Current => s_current.Value;

    public bool NativeEngine => NativeEngineError is null;

    public bool Aio => AioError == 0;

    public bool IoUring => IoUringUnavailable is null;

    /// <summary>The io_uring engine's setup flags and the kernel features it uses, as the start-up log names them.</summary>
    public string IoUringDescription => IoUring
        ? $"{UringEngine.SetupName(IoUringSetup)}; {string.Join(", ", s_ringFeatures.Where(f => (IoUringFeatures & f.Bit) != 0).Select(f => f.Name))}"
            + (IoUringSendsZeroCopy ? "; SENDMSG_ZC" : "")
        : IoUringUnavailable!;

    public override string ToString() =>
        $"native engine {(NativeEngine ? "yes" : $"no ({NativeEngineError}; managed P/Invoke path in use)")}, " +
        $"SO_REUSEPORT {YesNo(ReusePort)}, EPOLLEXCLUSIVE {YesNo(EpollExclusive)}, " +
        $"Linux AIO {(Aio ? "yes" : $"no ({(AioError < 0 ? "needs the native engine" : Errno.Describe(AioError))})")}, " +
        $"MSG_ZEROCOPY {YesNo(ZeroCopy)}, SO_BUSY_POLL {YesNo(BusyPoll)}, epoll busy-poll parameters {YesNo(EpollBusyPollParameters)}, " +
        $"io_uring {(IoUring ? "yes" : "no")} ({IoUringDescription})";

    private static string YesNo(bool value) => value ? "yes" : "no";

    private static KernelFeatures Probe()
    {
        bool reusePort = false, zeroCopy = false, busyPoll = false, exclusive = false, epollParams = false;
        using (var tcp = OwnedFd.TryTake(Interop.Socket.Create(Interop.Socket.AF_INET)))
        {
            if (tcp is not null)
            {
                reusePort = !Interop.Socket.SetOption(tcp.Value, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_REUSEPORT, 1).IsError;
                zeroCopy = !Interop.Socket.SetOption(tcp.Value, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_ZEROCOPY, 1).IsError;
                busyPoll = !Interop.Socket.SetOption(tcp.Value, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_BUSY_POLL, 0).IsError;
            }
        }

        using (var epoll = OwnedFd.TryTake(Epoll.Create()))
        using (var eventFd = OwnedFd.TryTake(EventFd.Create()))
        {
            if (epoll is not null && eventFd is not null)
            {
                exclusive = !Epoll.Control(epoll.Value, Epoll.EPOLL_CTL_ADD, eventFd.Value, Epoll.EPOLLIN | Epoll.EPOLLEXCLUSIVE).IsError;
                epollParams = !Epoll.GetBusyPollParameters(epoll.Value, out _).IsError;
            }
        }

        int aioError = -1;
        if (Interop.NativeEngine.IsSupported)
        {
            using var executor = BatchExecutor.Create(preferNative: true, aioCapacity: 1, out aioError);
        }

        // A ring and its eventfd, created, started on this thread and closed again: the same calls a loop makes, so
        // the same answer.
        uint ringSetup = 0, ringFeatures = 0;
        bool ringSendsZeroCopy = false;
        string? ringUnavailable;
        using (var ring = UringEngine.TryCreate(out _, out ringUnavailable))
        {
            if (ring is not null)
            {
                ringSetup = ring.Info.Setup;
                ringFeatures = ring.Info.Features;
                try
                {
                    ring.Start();
                    ringSendsZeroCopy = ring.SendsZeroCopyAsOps;
                }
                catch (Exception e) when (e is System.Net.Sockets.SocketException or IOException)
                {
                    // A ring that will not start leaves SENDMSG_ZC unknown; the loop's own start reports the error.
                }
            }
        }

        return new KernelFeatures(
            Interop.NativeEngine.LoadError, reusePort, exclusive, aioError, zeroCopy, busyPoll, epollParams, ringUnavailable, ringSetup, ringFeatures,
            ringSendsZeroCopy);
    }
}
