using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Diagnostics;

/// <summary>
/// What this kernel (and the container around it) lets the transport use, found by trying each feature once on
/// throw-away fds. The transport logs it at start-up and falls back where a feature is missing.
/// </summary>
/// <remarks>
/// Three parts, each probed on first use and once per process. The socket and epoll options every backend uses
/// (<see cref="Sockets"/>: setsockopt and epoll_ctl only) are always probed. Linux AIO (<c>io_setup</c>) is probed only
/// for <see cref="IoBackend.EpollAio"/>, and io_uring (<c>io_uring_setup</c>) only for a backend that may run on it,
/// never for the default: where a seccomp profile kills the process on a call rather than refusing it (systemd's
/// <c>SystemCallFilter=</c> without <c>SystemCallErrorNumber=</c>), or audits it, a probe of a facility the
/// configuration does not use would kill the server or raise an alert for nothing.
/// </remarks>
internal sealed record KernelFeatures(string? NativeEngineError, SocketFeatures Sockets, int? AioError, RingFeatures? Ring)
{
    private static readonly Lazy<SocketFeatures> s_sockets = new(ProbeSockets);
    private static readonly Lazy<int> s_aio = new(ProbeAio);
    private static readonly Lazy<RingFeatures> s_ring = new(ProbeRing);

    /// <summary>The socket and epoll features, probed on first use.</summary>
    public static SocketFeatures SocketsHere => s_sockets.Value;

    /// <summary>Whether an io_uring ring can be set up here, and with what: probed (<c>io_uring_setup</c>) on first use.</summary>
    public static RingFeatures RingHere => s_ring.Value;

    /// <summary>
    /// What the transport with <paramref name="options"/> may use, probing nothing else: AIO only for
    /// <see cref="IoBackend.EpollAio"/>, io_uring only where <see cref="EngineChoice.MayUseIoUring"/> says the
    /// backend may run on it.
    /// </summary>
    public static KernelFeatures For(LinuxTransportOptions options) => new(
        Interop.NativeEngine.LoadError,
        s_sockets.Value,
        options.IoBackend == IoBackend.EpollAio ? s_aio.Value : null,
        EngineChoice.MayUseIoUring(options) ? s_ring.Value : null);

    public bool NativeEngine => NativeEngineError is null;

    public override string ToString() =>
        $"native engine {(NativeEngine ? "yes" : $"no ({NativeEngineError}; managed P/Invoke path in use)")}, {Sockets}, " +
        $"Linux AIO {AioError switch
        {
            null => "not probed (IoBackend is not EpollAio)",
            0 => "yes",
            < 0 => "no (needs the native engine)",
            int errno => $"no ({Errno.Describe(errno)})",
        }}, " +
        $"io_uring {(Ring is null ? "not probed (IoBackend may not use it)" : Ring.ToString())}";

    private static SocketFeatures ProbeSockets()
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

        return new SocketFeatures(reusePort, exclusive, zeroCopy, busyPoll, epollParams);
    }

    /// <summary>0 when an AIO context can be set up, the errno of io_setup when not, -1 without the native engine.</summary>
    private static int ProbeAio()
    {
        int aioError = -1;
        if (Interop.NativeEngine.IsSupported)
        {
            using var executor = BatchExecutor.Create(preferNative: true, aioCapacity: 1, out aioError);
        }

        return aioError;
    }

    private static RingFeatures ProbeRing()
    {
        // A ring and its eventfd, created, started on this thread and closed again: the same calls a loop makes, so
        // the same answer.
        uint setup = 0, features = 0;
        bool sendsZeroCopy = false;
        using (var ring = UringEngine.TryCreate(out _, out string? unavailable))
        {
            if (ring is null)
            {
                return new RingFeatures(unavailable, 0, 0, false);
            }

            setup = ring.Info.Setup;
            features = ring.Info.Features;
            try
            {
                ring.Start();
                sendsZeroCopy = ring.SendsZeroCopyAsOps;
            }
            catch (Exception e) when (e is System.Net.Sockets.SocketException or IOException)
            {
                // A ring that will not start leaves SENDMSG_ZC unknown; the loop's own start reports the error.
            }
        }

        return new RingFeatures(null, setup, features, sendsZeroCopy);
    }
}

/// <summary>The socket and epoll options the transport sets wherever it runs (setsockopt and epoll_ctl, nothing else).</summary>
internal sealed record SocketFeatures(bool ReusePort, bool EpollExclusive, bool ZeroCopy, bool BusyPoll, bool EpollBusyPollParameters)
{
    public override string ToString() =>
        $"SO_REUSEPORT {YesNo(ReusePort)}, EPOLLEXCLUSIVE {YesNo(EpollExclusive)}, MSG_ZEROCOPY {YesNo(ZeroCopy)}, " +
        $"SO_BUSY_POLL {YesNo(BusyPoll)}, epoll busy-poll parameters {YesNo(EpollBusyPollParameters)}";

    private static string YesNo(bool value) => value ? "yes" : "no";
}

/// <summary>Whether an io_uring ring could be set up (<see cref="Unavailable"/> says why not), its setup flags and the kernel features it reported.</summary>
internal sealed record RingFeatures(string? Unavailable, uint Setup, uint Features, bool SendsZeroCopy)
{
    // IORING_FEAT_* bits the io_uring engine relies on, where present, with the names the log gives them.
    private static readonly (uint Bit, string Name)[] s_ringFeatures =
    [
        (1u << 1, "NODROP"), (1u << 5, "FAST_POLL"), (1u << 8, "EXT_ARG"), (1u << 11, "CQE_SKIP"), (1u << 13, "REG_REG_RING"),
    ];

    public bool Available => Unavailable is null;

    /// <summary>The setup flags and the kernel features the engine uses, as the start-up log names them, or why there is no ring.</summary>
    public string Description => Available
        ? $"{UringEngine.SetupName(Setup)}; {string.Join(", ", s_ringFeatures.Where(f => (Features & f.Bit) != 0).Select(f => f.Name))}"
            + (SendsZeroCopy ? "; SENDMSG_ZC" : "")
        : Unavailable!;

    public override string ToString() => $"{(Available ? "yes" : "no")} ({Description})";
}
