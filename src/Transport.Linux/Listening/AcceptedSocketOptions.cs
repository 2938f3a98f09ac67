using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Interop;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Listening;

/// <summary>
/// The socket options one loop sets on each accepted TCP socket. One the kernel refuses (a seccomp profile,
/// a missing capability) is logged once for the loop and then no longer tried. Loop thread only.
/// </summary>
internal sealed class AcceptedSocketOptions
{
    private readonly LinuxTransportOptions _options;
    private readonly ILogger _logger;
    private readonly int _loopIndex;
    private bool _busyPoll;
    private bool _notSentLowAt;

    public AcceptedSocketOptions(LinuxTransportOptions options, ILogger logger, int loopIndex)
    {
        _options = options;
        _logger = logger;
        _loopIndex = loopIndex;
        _busyPoll = options.BusyPollMicroseconds > 0;
        QuickAck = options.Tuning.TcpQuickAck;
        _notSentLowAt = options.Tuning.TcpNotSentLowAtBytes > 0;
        ZeroCopy = options.ZeroCopySendThreshold > 0;
    }

    /// <summary>True when receives re-arm TCP_QUICKACK (tcp(7): the kernel clears it by itself).</summary>
    public bool QuickAck { get; private set; }

    /// <summary>True when accepted TCP sockets get SO_ZEROCOPY (until the kernel refuses it once).</summary>
    public bool ZeroCopy { get; private set; }

    /// <summary>Sets what the options ask for on an accepted TCP socket.</summary>
    public void Apply(int fd)
    {
        if (_options.NoDelay)
        {
            _ = Interop.Socket.SetOption(fd, Interop.Socket.IPPROTO_TCP, Interop.Socket.TCP_NODELAY, 1);
        }

        if (_busyPoll)
        {
            _busyPoll = TrySet(fd, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_BUSY_POLL, _options.BusyPollMicroseconds, "SO_BUSY_POLL");
        }

        if (QuickAck)
        {
            QuickAck = TrySet(fd, Interop.Socket.IPPROTO_TCP, Interop.Socket.TCP_QUICKACK, 1, "TCP_QUICKACK");
        }

        if (_notSentLowAt)
        {
            _notSentLowAt = TrySet(fd, Interop.Socket.IPPROTO_TCP, Interop.Socket.TCP_NOTSENT_LOWAT, _options.Tuning.TcpNotSentLowAtBytes, "TCP_NOTSENT_LOWAT");
        }

        if (ZeroCopy)
        {
            ZeroCopy = TrySet(fd, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_ZEROCOPY, 1, "ZeroCopySendThreshold (SO_ZEROCOPY)");
        }
    }

    private bool TrySet(int fd, int level, int name, int value, string option)
    {
        var result = Interop.Socket.SetOption(fd, level, name, value);
        if (result.IsError)
        {
            TransportLog.OptionNotApplied(_logger, option, $"accepted sockets of loop {_loopIndex}", Errno.Describe(result.Error));
            return false;
        }

        return true;
    }
}
