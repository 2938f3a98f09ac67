using System.Net;
using System.Net.Sockets;
using System.Threading.Channels;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Interop;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Listening;

/// <summary>
/// One bound endpoint. For an IP endpoint every loop gets its own SO_REUSEPORT socket, so the
/// kernel spreads accepts over the loops; a Unix socket or an inherited handle is one fd that
/// every loop polls with EPOLLEXCLUSIVE. Loops hand accepted connections to <see cref="AcceptAsync"/>.
/// </summary>
internal sealed class LinuxConnectionListener : IConnectionListener
{
    private readonly Channel<LinuxConnection> _accepted = Channel.CreateUnbounded<LinuxConnection>(
        new UnboundedChannelOptions { SingleReader = false, SingleWriter = false });

    private readonly EventLoopGroup _group;
    private readonly ILogger _logger;
    private readonly List<ListenRegistration> _registrations = [];
    private readonly List<int> _fds = [];
    private readonly string? _unixSocketPath;
    private readonly ulong _unixSocketInode;
    private int _unbound;
    private int _disposed;

    private LinuxConnectionListener(EventLoopGroup group, EndPoint endPoint, ILogger logger, string? unixSocketPath, ulong unixSocketInode)
    {
        _group = group;
        EndPoint = endPoint;
        _logger = logger;
        _unixSocketPath = unixSocketPath;
        _unixSocketInode = unixSocketInode;
    }

    public EndPoint EndPoint { get; }

    /// <summary>Binds <paramref name="endPoint"/> and starts accepting on every loop of <paramref name="group"/>.</summary>
    public static async ValueTask<LinuxConnectionListener> BindAsync(EventLoopGroup group, EndPoint endPoint, LinuxTransportOptions options, ILogger logger)
    {
        LinuxConnectionListener listener;
        bool shared;
        List<int> fds;
        switch (endPoint)
        {
            case IPEndPoint ip:
                // Without SO_REUSEPORT (Linux < 3.9, or a seccomp filter), one socket serves all loops.
                shared = !KernelFeatures.Current.ReusePort;
                fds = BindReusePortGroup(ip, shared ? 1 : group.Loops.Count, options.Backlog, reusePort: !shared, out int port);
                listener = new LinuxConnectionListener(group, new IPEndPoint(ip.Address, port), logger, null, 0);
                if (options.TcpDeferAcceptSeconds > 0)
                {
                    SetDeferAccept(fds, options.TcpDeferAcceptSeconds, listener.EndPoint, logger);
                }

                if (shared)
                {
                    TransportLog.NoReusePort(logger, listener.EndPoint);
                }

                break;
            case UnixDomainSocketEndPoint unix:
                string path = unix.ToString();
                int fd = BindUnixSocket(path, options.Backlog, out ulong inode);
                fds = [fd];
                listener = new LinuxConnectionListener(group, endPoint, logger, path, inode);
                shared = true;
                break;
            case FileHandleEndPoint handle:
                fds = [AdoptHandle(handle)];
                listener = new LinuxConnectionListener(group, endPoint, logger, null, 0);
                shared = true;
                break;
            default:
                throw new NotSupportedException($"The Linux transport cannot bind {endPoint.GetType().Name} '{endPoint}'.");
        }

        listener._fds.AddRange(fds);
        for (int i = 0; i < group.Loops.Count; i++)
        {
            var loop = group.Loops[i];
            var registration = new ListenRegistration(listener, loop, shared ? fds[0] : fds[i], shared);
            listener._registrations.Add(registration);
            loop.AddListener(registration);
        }

        await Task.WhenAll(listener._registrations.Select(static r => r.Added.Task));
        TransportLog.Bound(logger, listener.EndPoint, group.Loops.Count, shared ? "one shared fd (EPOLLEXCLUSIVE)" : "SO_REUSEPORT socket per loop");
        return listener;
    }

    /// <summary>
    /// Binds one SO_REUSEPORT socket per loop. A probe without SO_REUSEPORT is bound first: it fails
    /// with EADDRINUSE when anyone already holds the port, including another SO_REUSEPORT group of
    /// the same user, which the group's own sockets would otherwise silently join.
    /// </summary>
    private static List<int> BindReusePortGroup(IPEndPoint endPoint, int count, int backlog, bool reusePort, out int port)
    {
        Span<byte> address = stackalloc byte[Interop.Socket.MaxAddressLength];
        int family = endPoint.AddressFamily == AddressFamily.InterNetworkV6 ? Interop.Socket.AF_INET6 : Interop.Socket.AF_INET;
        bool dualMode = endPoint.Address.Equals(IPAddress.IPv6Any);

        int probe = CreateTcpSocket(family, dualMode, reusePort: false, endPoint);
        try
        {
            int length = Interop.Socket.WriteAddress(endPoint, address);
            int rc = Interop.Socket.Bind(probe, address[..length]);
            if (rc < 0)
            {
                throw BindError(-rc, endPoint);
            }

            port = (Interop.Socket.GetLocalEndPoint(probe) as IPEndPoint)?.Port ?? endPoint.Port;
        }
        finally
        {
            LibC.CloseFd(probe);
        }

        var bound = new IPEndPoint(endPoint.Address, port);
        int boundLength = Interop.Socket.WriteAddress(bound, address);
        var fds = new List<int>(count);
        try
        {
            for (int i = 0; i < count; i++)
            {
                int fd = CreateTcpSocket(family, dualMode, reusePort, endPoint);
                fds.Add(fd);
                int rc = Interop.Socket.Bind(fd, address[..boundLength]);
                if (rc == 0)
                {
                    rc = Interop.Socket.Listen(fd, backlog);
                }

                if (rc < 0)
                {
                    throw BindError(-rc, bound);
                }
            }
        }
        catch
        {
            fds.ForEach(LibC.CloseFd);
            throw;
        }

        return fds;
    }

    /// <summary>TCP_DEFER_ACCEPT on each listening socket (tcp(7)); a refusal is logged, never fatal.</summary>
    private static void SetDeferAccept(List<int> fds, int seconds, EndPoint endPoint, ILogger logger)
    {
        foreach (int fd in fds)
        {
            int rc = Interop.Socket.SetOption(fd, Interop.Socket.IPPROTO_TCP, Interop.Socket.TCP_DEFER_ACCEPT, seconds);
            if (rc < 0)
            {
                TransportLog.OptionNotApplied(logger, "TCP_DEFER_ACCEPT", endPoint.ToString() ?? "listener", Errno.Describe(-rc));
                return;
            }
        }
    }

    private static int CreateTcpSocket(int family, bool dualMode, bool reusePort, IPEndPoint endPoint)
    {
        int fd = Interop.Socket.Create(family);
        if (fd < 0)
        {
            throw BindError(-fd, endPoint);
        }

        // SO_REUSEADDR lets a restarted server bind while old connections sit in TIME_WAIT; it never
        // lets two listeners share a port on Linux (socket(7)).
        Interop.Socket.SetOption(fd, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_REUSEADDR, 1);
        if (reusePort)
        {
            Interop.Socket.SetOption(fd, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_REUSEPORT, 1);
        }

        if (family == Interop.Socket.AF_INET6)
        {
            Interop.Socket.SetOption(fd, Interop.Socket.IPPROTO_IPV6, Interop.Socket.IPV6_V6ONLY, dualMode ? 0 : 1);
        }

        return fd;
    }

    private static Exception BindError(int errno, EndPoint endPoint) => errno == Errno.EADDRINUSE
        ? new AddressInUseException($"Failed to bind to address {endPoint}: address already in use.")
        : new SocketException((int)Errno.ToSocketError(errno), $"Failed to bind to address {endPoint}: {Errno.Describe(errno)}.");

    private static int BindUnixSocket(string path, int backlog, out ulong inode)
    {
        Span<byte> address = stackalloc byte[Interop.Socket.MaxAddressLength];
        int length = Interop.Socket.WriteAddress(path, address);
        if (length < 0)
        {
            throw new ArgumentException($"The Unix socket path '{path}' is longer than the 107 bytes sockaddr_un allows.", nameof(path));
        }

        var endPoint = new UnixDomainSocketEndPoint(path);
        if (FileStatus.TryGet(path, out int type, out _) == 0)
        {
            if (type != FileStatus.S_IFSOCK)
            {
                throw new AddressInUseException($"Failed to bind to '{path}': the path exists and is not a socket; it is left untouched.");
            }

            RemoveStaleSocketFile(path, address[..length]);
        }

        int fd = Interop.Socket.Create(Interop.Socket.AF_UNIX);
        if (fd < 0)
        {
            throw BindError(-fd, endPoint);
        }

        int bindResult = Interop.Socket.Bind(fd, address[..length]);
        if (bindResult == 0)
        {
            bindResult = Interop.Socket.Listen(fd, backlog);
        }

        if (bindResult < 0)
        {
            LibC.CloseFd(fd);
            throw BindError(-bindResult, endPoint);
        }

        FileStatus.TryGet(path, out _, out inode);
        return fd;
    }

    /// <summary>
    /// A socket file already sits at <paramref name="path"/>. Only a connect refused with ECONNREFUSED
    /// proves that nobody listens on it (unix(7)): that file is left over from a server that died, and
    /// is deleted. Anything else leaves it alone: an accepted or queued connect (the backlog is full:
    /// EAGAIN) is a live server, and a probe that could not be made (EMFILE), or a connect that failed
    /// otherwise (EACCES, or EPROTOTYPE from a live socket of another type), cannot tell, so it must not
    /// cost a live server its name.
    /// </summary>
    private static void RemoveStaleSocketFile(string path, ReadOnlySpan<byte> address)
    {
        int probe = Interop.Socket.Create(Interop.Socket.AF_UNIX);
        int rc = probe < 0 ? probe : Interop.Socket.Connect(probe, address);
        LibC.CloseFd(probe);
        switch (-rc)
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
                string step = probe < 0 ? "creating a socket to probe it" : "connecting to it";
                throw new SocketException(
                    (int)Errno.ToSocketError(-rc),
                    $"Failed to bind to '{path}': a socket file exists there, and {step} to see whether a server owns it failed: {Errno.Describe(-rc)}. It is left untouched; delete it if no server uses it.");
        }
    }

    private static int AdoptHandle(FileHandleEndPoint handle)
    {
        int fd = checked((int)handle.FileHandle);
        if (Interop.Socket.GetOption(fd, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_TYPE, out int type) < 0 || type != Interop.Socket.SOCK_STREAM)
        {
            throw new NotSupportedException($"File handle {fd} is not a stream socket; the Linux transport can only listen on sockets.");
        }

        int rc = LibC.SetNonBlocking(fd);
        if (rc < 0)
        {
            throw Errno.ToException(-rc, $"fcntl(O_NONBLOCK) on handle {fd}");
        }

        return fd;
    }

    /// <summary>Called by a loop for each accepted connection; false once the listener is unbound.</summary>
    public bool Offer(LinuxConnection connection)
        => Volatile.Read(ref _unbound) == 0 && _accepted.Writer.TryWrite(connection);

    public async ValueTask<ConnectionContext?> AcceptAsync(CancellationToken cancellationToken = default)
    {
        while (await _accepted.Reader.WaitToReadAsync(cancellationToken))
        {
            if (_accepted.Reader.TryRead(out var connection))
            {
                return connection;
            }
        }

        return null;
    }

    public async ValueTask UnbindAsync(CancellationToken cancellationToken = default)
    {
        if (Interlocked.Exchange(ref _unbound, 1) != 0)
        {
            return;
        }

        foreach (var registration in _registrations)
        {
            registration.Loop.RemoveListener(registration);
        }

        await Task.WhenAll(_registrations.Select(static r => r.Removed.Task));

        // No loop polls the fds any more: close them, so that the port is free for a new server.
        _fds.ForEach(LibC.CloseFd);
        _fds.Clear();
        DeleteUnixSocketFile();

        _accepted.Writer.TryComplete();

        // Connections accepted but never taken by Kestrel are ours to close.
        while (_accepted.Reader.TryRead(out var orphan))
        {
            orphan.Abort(new ConnectionAbortedException("The listener was unbound before the connection was accepted."));
            await orphan.DisposeAsync();
        }
    }

    public async ValueTask DisposeAsync()
    {
        if (Interlocked.Exchange(ref _disposed, 1) != 0)
        {
            return;
        }

        await UnbindAsync();
        _group.Release();
    }

    private void DeleteUnixSocketFile()
    {
        // Only our own socket file: if someone replaced it since we bound, it is theirs.
        if (_unixSocketPath is not null
            && FileStatus.TryGet(_unixSocketPath, out int type, out ulong inode) == 0
            && type == FileStatus.S_IFSOCK && inode == _unixSocketInode)
        {
            try
            {
                File.Delete(_unixSocketPath);
            }
            catch (IOException e)
            {
                TransportLog.UnixSocketCleanupFailed(_logger, _unixSocketPath, e);
            }
            catch (UnauthorizedAccessException e)
            {
                TransportLog.UnixSocketCleanupFailed(_logger, _unixSocketPath, e);
            }
        }
    }
}
