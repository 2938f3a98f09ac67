using System.Net;
using System.Threading.Channels;
using LibuvComparator.Interop;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.Logging;

namespace LibuvComparator.Internal;

/// <summary>
/// One bound IP endpoint: a SO_REUSEPORT listening socket on every loop, so the kernel spreads
/// accepts over the loops.
/// </summary>
/// <remarks>
/// The old Microsoft libuv transport accepted on one listener thread and handed accepted sockets to
/// the other loops over uv pipes (uv_write2 with a handle), round robin. This comparator uses
/// SO_REUSEPORT instead, the same kernel accept balancing as our epoll transport, so that the
/// benchmark compares the I/O loops rather than the accept distribution.
/// </remarks>
internal sealed class LibuvConnectionListener : IConnectionListener
{
    private readonly Channel<LibuvConnection> _accepted = Channel.CreateUnbounded<LibuvConnection>(
        new UnboundedChannelOptions { SingleReader = false, SingleWriter = false });

    private readonly List<LoopListener> _loopListeners = [];
    private int _unbound;
    private int _disposed;

    private LibuvConnectionListener(EndPoint endPoint) => EndPoint = endPoint;

    public EndPoint EndPoint { get; }

    public static async ValueTask<LibuvConnectionListener> BindAsync(IReadOnlyList<LibuvLoop> loops, IPEndPoint endPoint, LibuvComparatorOptions options, ILogger logger)
    {
        // Learn the real port (port 0) and surface EADDRINUSE before any loop is involved.
        int port = ListenSocket.ProbePort(endPoint);
        var bound = new IPEndPoint(endPoint.Address, port);

        var fds = new List<int>(loops.Count);
        try
        {
            for (int i = 0; i < loops.Count; i++)
            {
                fds.Add(ListenSocket.CreateBound(bound));
            }
        }
        catch
        {
            fds.ForEach(ListenSocket.CloseUnadopted);
            throw;
        }

        var listener = new LibuvConnectionListener(bound);
        for (int i = 0; i < loops.Count; i++)
        {
            var loopListener = new LoopListener(listener, loops[i], fds[i], options.Backlog);
            listener._loopListeners.Add(loopListener);
            loopListener.Start();
        }

        try
        {
            await Task.WhenAll(listener._loopListeners.Select(static l => l.Started.Task));
        }
        catch
        {
            await listener.UnbindAsync();
            throw;
        }

        ComparatorLog.Bound(logger, bound, loops.Count);
        return listener;
    }

    /// <summary>Called on a loop for each accepted connection; false once the listener is unbound.</summary>
    public bool Offer(LibuvConnection connection)
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

        foreach (var loopListener in _loopListeners)
        {
            loopListener.Stop();
        }

        // The listening handles are closed (uv_close closes their fds), so the port is free again.
        await Task.WhenAll(_loopListeners.Select(static l => l.Closed.Task));
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
        if (Interlocked.Exchange(ref _disposed, 1) == 0)
        {
            await UnbindAsync();
        }
    }
}
