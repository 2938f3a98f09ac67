using System.Net;
using System.Threading.Channels;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Interop;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Listening;

/// <summary>
/// One bound endpoint, as Kestrel sees it: every loop of the group polls its listening sockets
/// (<see cref="ListenSockets"/>) and hands what it accepts to <see cref="AcceptAsync"/>.
/// </summary>
internal sealed class LinuxConnectionListener : IConnectionListener
{
    private readonly Channel<LinuxConnection> _accepted = Channel.CreateUnbounded<LinuxConnection>(
        new UnboundedChannelOptions { SingleReader = false, SingleWriter = false });

    private readonly EventLoopGroup _group;
    private readonly ListenSockets _sockets;
    private readonly ILogger _logger;
    private readonly List<ListenRegistration> _registrations = [];
    private int _unbound;
    private int _disposed;

    private LinuxConnectionListener(EventLoopGroup group, ListenSockets sockets, ILogger logger)
    {
        _group = group;
        _sockets = sockets;
        _logger = logger;
    }

    public EndPoint EndPoint => _sockets.EndPoint;

    /// <summary>Binds <paramref name="endPoint"/> and starts accepting on every loop of <paramref name="group"/>.</summary>
    public static async ValueTask<LinuxConnectionListener> BindAsync(EventLoopGroup group, EndPoint endPoint, LinuxTransportOptions options, ILogger logger)
    {
        var sockets = ListenSockets.Bind(endPoint, group.Loops.Count, options, logger);
        var listener = new LinuxConnectionListener(group, sockets, logger);
        for (int i = 0; i < group.Loops.Count; i++)
        {
            var loop = group.Loops[i];
            var registration = new ListenRegistration(listener, loop, sockets.FdFor(i), sockets.Shared);
            listener._registrations.Add(registration);
            loop.AddListener(registration);
        }

        try
        {
            await Task.WhenAll(listener._registrations.Select(static r => r.Added.Task));
        }
        catch
        {
            // A loop could not poll its socket: the loops that could let go, then the sockets close, and the bind fails.
            await listener.UnregisterAsync(CancellationToken.None);
            throw;
        }

        TransportLog.Bound(logger, listener.EndPoint, group.Loops.Count, sockets.Shared ? "one shared fd (EPOLLEXCLUSIVE)" : "SO_REUSEPORT socket per loop");
        return listener;
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

        // Kestrel's accept loop ends (AcceptAsync returns null) once this returns, even when a loop did not let go in time.
        await UnregisterAsync(cancellationToken);
        _accepted.Writer.TryComplete();

        // Connections accepted but never taken by Kestrel are ours to close.
        while (_accepted.Reader.TryRead(out var orphan))
        {
            orphan.Abort(new ConnectionAbortedException("The listener was unbound before the connection was accepted."));
            await orphan.DisposeAsync();
        }
    }

    /// <summary>
    /// Every loop stops polling the listening sockets, and then they close, so that the port is free for a new server.
    /// A loop held by application code that blocks (Inline scheduling) may not get to it for a long time: the wait
    /// ends with <paramref name="cancellationToken"/> (Kestrel passes the host's shutdown timeout), and the sockets
    /// then close once that loop lets go, not before, since a loop may not poll an fd number that was closed.
    /// </summary>
    private async Task UnregisterAsync(CancellationToken cancellationToken)
    {
        foreach (var registration in _registrations)
        {
            registration.Loop.RemoveListener(registration);
        }

        var removed = Task.WhenAll(_registrations.Select(static r => r.Removed.Task));
        try
        {
            await removed.WaitAsync(cancellationToken);
        }
        catch (OperationCanceledException) when (cancellationToken.IsCancellationRequested)
        {
            var stuck = _registrations.Where(static r => !r.Removed.Task.IsCompleted).Select(static r => r.Loop.Index);
            TransportLog.UnbindTimedOut(_logger, EndPoint, string.Join(", ", stuck));
            _ = removed.ContinueWith(static (_, s) => ((LinuxConnectionListener)s!).CloseSockets(), this, CancellationToken.None, TaskContinuationOptions.ExecuteSynchronously, TaskScheduler.Default);
            return;
        }

        CloseSockets();
    }

    private void CloseSockets()
    {
        _sockets.Dispose();
        DeleteUnixSocketFile();
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
        if (_sockets.UnixPath is { } path
            && !FileStatus.TryGet(path, out int type, out ulong inode).IsError
            && type == FileStatus.S_IFSOCK && inode == _sockets.UnixInode)
        {
            try
            {
                File.Delete(path);
            }
            catch (IOException e)
            {
                TransportLog.UnixSocketCleanupFailed(_logger, path, e);
            }
            catch (UnauthorizedAccessException e)
            {
                TransportLog.UnixSocketCleanupFailed(_logger, path, e);
            }
        }
    }
}
