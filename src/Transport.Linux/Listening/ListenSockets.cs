using System.Net;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Interop;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Listening;

/// <summary>
/// The listening sockets of one bound endpoint: one SO_REUSEPORT socket per loop for an IP endpoint, so the
/// kernel spreads accepts over the loops; one socket that every loop polls (<see cref="Shared"/>) for a Unix
/// socket, an inherited handle, or a kernel without SO_REUSEPORT. Disposing closes the sockets it made; a handle it
/// was given stays its owner's.
/// </summary>
internal sealed class ListenSockets : IDisposable
{
    private readonly List<OwnedFd> _fds;
    private readonly bool _owned;

    private ListenSockets(List<OwnedFd> fds, EndPoint endPoint, bool shared, string? unixPath, ulong unixInode, bool owned = true)
    {
        _fds = fds;
        _owned = owned;
        EndPoint = endPoint;
        Shared = shared;
        UnixPath = unixPath;
        UnixInode = unixInode;
    }

    /// <summary>The bound endpoint, with the real port when port 0 was asked for.</summary>
    public EndPoint EndPoint { get; }

    /// <summary>True when one fd serves every loop (each polls it with EPOLLEXCLUSIVE).</summary>
    public bool Shared { get; }

    /// <summary>The Unix socket's path and the inode it had when bound, so that only our own file is deleted later.</summary>
    public string? UnixPath { get; }

    public ulong UnixInode { get; }

    /// <summary>The fd loop <paramref name="index"/> polls.</summary>
    public int FdFor(int index) => _fds[Shared ? 0 : index].Value;

    public static ListenSockets Bind(EndPoint endPoint, int loops, LinuxTransportOptions options, ILogger logger)
    {
        switch (endPoint)
        {
            case IPEndPoint ip:
                // Without SO_REUSEPORT (Linux < 3.9, or a seccomp filter), one socket serves all loops.
                bool shared = !KernelFeatures.SocketsHere.ReusePort;
                var fds = BindReusePortGroup(ip, shared ? 1 : loops, options.Backlog, reusePort: !shared, out int port);
                var bound = new IPEndPoint(ip.Address, port);
                if (options.TcpDeferAcceptSeconds > 0)
                {
                    SetDeferAccept(fds, options.TcpDeferAcceptSeconds, bound, logger);
                }

                if (shared)
                {
                    TransportLog.NoReusePort(logger, bound);
                }

                return new ListenSockets(fds, bound, shared, null, 0);
            case UnixDomainSocketEndPoint unix:
                string path = unix.ToString();
                var socket = BindUnixSocket(path, options.Backlog, out ulong inode);
                return new ListenSockets([socket], endPoint, true, path, inode);
            case FileHandleEndPoint handle:
                return new ListenSockets([Listen(handle, options.Backlog)], endPoint, true, null, 0, owned: false);
            default:
                throw new NotSupportedException($"The Linux transport cannot bind {endPoint.GetType().Name} '{endPoint}'.");
        }
    }

    public void Dispose()
    {
        if (!_owned)
        {
            return;
        }

        foreach (var fd in _fds)
        {
            fd.Dispose();
        }
    }

    /// <summary>
    /// Binds one SO_REUSEPORT socket per loop. A probe without SO_REUSEPORT is bound first: it fails with
    /// EADDRINUSE when anyone already holds the port, including another SO_REUSEPORT group of the same user,
    /// which the group's own sockets would otherwise silently join.
    /// </summary>
    private static List<OwnedFd> BindReusePortGroup(IPEndPoint endPoint, int count, int backlog, bool reusePort, out int port)
    {
        Span<byte> address = stackalloc byte[SockAddr.MaxLength];
        int family = endPoint.AddressFamily == AddressFamily.InterNetworkV6 ? Interop.Socket.AF_INET6 : Interop.Socket.AF_INET;
        bool dualMode = endPoint.Address.Equals(IPAddress.IPv6Any);

        using (var probe = CreateTcpSocket(family, dualMode, reusePort: false, endPoint))
        {
            int length = SockAddr.Write(endPoint, address);
            var bound = Interop.Socket.Bind(probe.Value, address[..length]);
            if (bound.IsError)
            {
                throw BindError(bound.Error, endPoint);
            }

            port = (Interop.Socket.GetLocalEndPoint(probe.Value) as IPEndPoint)?.Port ?? endPoint.Port;
        }

        var group = new IPEndPoint(endPoint.Address, port);
        int groupLength = SockAddr.Write(group, address);
        var fds = new List<OwnedFd>(count);
        try
        {
            for (int i = 0; i < count; i++)
            {
                var fd = CreateTcpSocket(family, dualMode, reusePort, endPoint);
                fds.Add(fd);
                var result = Interop.Socket.Bind(fd.Value, address[..groupLength]);
                if (!result.IsError)
                {
                    result = Interop.Socket.Listen(fd.Value, backlog);
                }

                if (result.IsError)
                {
                    throw BindError(result.Error, group);
                }
            }
        }
        catch
        {
            fds.ForEach(static fd => fd.Dispose());
            throw;
        }

        return fds;
    }

    /// <summary>TCP_DEFER_ACCEPT on each listening socket (tcp(7)); a refusal is logged, never fatal.</summary>
    private static void SetDeferAccept(List<OwnedFd> fds, int seconds, EndPoint endPoint, ILogger logger)
    {
        foreach (var fd in fds)
        {
            var result = Interop.Socket.SetOption(fd.Value, Interop.Socket.IPPROTO_TCP, Interop.Socket.TCP_DEFER_ACCEPT, seconds);
            if (result.IsError)
            {
                TransportLog.OptionNotApplied(logger, "TCP_DEFER_ACCEPT", endPoint.ToString() ?? "listener", Errno.Describe(result.Error));
                return;
            }
        }
    }

    private static OwnedFd CreateTcpSocket(int family, bool dualMode, bool reusePort, IPEndPoint endPoint)
    {
        var created = Interop.Socket.Create(family);
        if (created.IsError)
        {
            throw BindError(created.Error, endPoint);
        }

        var fd = new OwnedFd((int)created.Value);

        // SO_REUSEADDR lets a restarted server bind while old connections sit in TIME_WAIT; it never lets two
        // listeners share a port on Linux (socket(7)).
        _ = Interop.Socket.SetOption(fd.Value, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_REUSEADDR, 1);
        if (reusePort)
        {
            _ = Interop.Socket.SetOption(fd.Value, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_REUSEPORT, 1);
        }

        if (family == Interop.Socket.AF_INET6)
        {
            _ = Interop.Socket.SetOption(fd.Value, Interop.Socket.IPPROTO_IPV6, Interop.Socket.IPV6_V6ONLY, dualMode ? 0 : 1);
        }

        return fd;
    }

    /// <summary>
    /// EADDRINUSE as <see cref="AddressInUseException"/>, anything else as a <see cref="SocketException"/>, never an
    /// IOException: Kestrel's localhost and IPv6 fallbacks continue only past non-IOExceptions.
    /// </summary>
    private static Exception BindError(int errno, EndPoint endPoint) => errno == Errno.EADDRINUSE
        ? new AddressInUseException($"Failed to bind to address {endPoint}: address already in use.")
        : new SocketException((int)Errno.ToSocketError(errno), $"Failed to bind to address {endPoint}: {Errno.Describe(errno)}.");

    private static OwnedFd BindUnixSocket(string path, int backlog, out ulong inode)
    {
        Span<byte> address = stackalloc byte[SockAddr.MaxLength];
        int length = SockAddr.Write(path, address);
        if (length < 0)
        {
            throw new ArgumentException($"The Unix socket path '{path}' is longer than the {SockAddr.UnixPathCapacity - 1} bytes sockaddr_un allows.", nameof(path));
        }

        var endPoint = new UnixDomainSocketEndPoint(path);
        if (!FileStatus.TryGet(path, out int type, out _).IsError)
        {
            if (type != FileStatus.S_IFSOCK)
            {
                throw new AddressInUseException($"Failed to bind to '{path}': the path exists and is not a socket; it is left untouched.");
            }

            RemoveStaleSocketFile(path, address[..length]);
        }

        var created = Interop.Socket.Create(Interop.Socket.AF_UNIX);
        if (created.IsError)
        {
            throw BindError(created.Error, endPoint);
        }

        var fd = new OwnedFd((int)created.Value);
        var result = Interop.Socket.Bind(fd.Value, address[..length]);
        if (!result.IsError)
        {
            result = Interop.Socket.Listen(fd.Value, backlog);
        }

        if (result.IsError)
        {
            fd.Dispose();
            throw BindError(result.Error, endPoint);
        }

        _ = FileStatus.TryGet(path, out _, out inode);
        return fd;
    }

    /// <summary>
    /// A socket file already sits at <paramref name="path"/>. Only a connect refused with ECONNREFUSED proves
    /// that nobody listens on it (unix(7)): that file is left over from a server that died, and is deleted.
    /// Anything else leaves it alone: an accepted or queued connect (the backlog is full: EAGAIN) is a live
    /// server, and a probe that could not be made (EMFILE), or a connect that failed otherwise (EACCES, or
    /// EPROTOTYPE from a live socket of another type), cannot tell, so it must not cost a live server its name.
    /// </summary>
    private static void RemoveStaleSocketFile(string path, ReadOnlySpan<byte> address)
    {
        var created = Interop.Socket.Create(Interop.Socket.AF_UNIX);
        using var probe = OwnedFd.TryTake(created);
        var result = probe is null ? created : Interop.Socket.Connect(probe.Value, address);
        switch (result.Error)
        {
            case Errno.ECONNREFUSED:
                File.Delete(path);
                return;
            case Errno.ENOENT:
                // Gone since it was looked at: nothing to delete.
                return;
            case 0:
            case Errno.EAGAIN:
                throw new AddressInUseException($"Failed to bind to '{path}': another server is listening on it.");
            default:
                string step = probe is null ? "creating a socket to probe it" : "connecting to it";
                throw new SocketException(
                    (int)Errno.ToSocketError(result.Error),
                    $"Failed to bind to '{path}': a socket file exists there, and {step} to see whether a server owns it failed: {Errno.Describe(result.Error)}. It is left untouched; delete it if no server uses it.");
        }
    }

    /// <summary>
    /// A socket handed over by its owner (systemd socket activation, a parent process): made non-blocking and
    /// listening, as the Sockets transport does with a <see cref="FileHandleEndPoint"/>, and never closed here, since
    /// the number is the owner's (it may bind it again, or close it itself later).
    /// </summary>
    private static OwnedFd Listen(FileHandleEndPoint handle, int backlog)
    {
        int fd = checked((int)handle.FileHandle);
        if (Interop.Socket.GetOption(fd, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_TYPE, out int type).IsError || type != Interop.Socket.SOCK_STREAM)
        {
            throw new NotSupportedException($"File handle {fd} is not a stream socket; the Linux transport can only listen on sockets.");
        }

        var result = LibC.SetNonBlocking(fd);
        if (result.IsError)
        {
            throw Errno.ToException(result.Error, $"fcntl(O_NONBLOCK) on handle {fd}");
        }

        // listen(2) on a socket that listens already only sets the backlog.
        result = Interop.Socket.Listen(fd, backlog);
        if (result.IsError)
        {
            throw BindError(result.Error, handle);
        }

        return new OwnedFd(fd);
    }
}
