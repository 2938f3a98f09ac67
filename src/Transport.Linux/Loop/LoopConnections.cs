using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Interop;
using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// The connections of one <see cref="EventLoop"/>, and how a stop ends them: a graceful stop waits until the last
/// listener is gone and the last connection has closed; an aborting one resets every connection at once, and waits
/// for the kernel's zero-copy notifications at most <see cref="ZeroCopyStopWaitMs"/> before it keeps their blocks
/// from the pool (<see cref="ConnectionLifetime.Abandon"/>). Loop thread only, like the loop's passes.
/// </summary>
internal sealed class LoopConnections(EventLoop loop)
{
    /// <summary>
    /// How long a stop that resets the connections waits for the kernel's notifications of their zero-copy sends,
    /// which follow a reset as soon as the NIC has sent what it held.
    /// </summary>
    internal const int ZeroCopyStopWaitMs = 2000;

    private readonly HashSet<LinuxConnection> _connections = [];
    private bool _abortOnStop;
    private long _abortDeadline;

    /// <summary>The loop was asked to end (<see cref="RequestStop"/>).</summary>
    public bool StopRequested { get; private set; }

    /// <summary>An aborting stop was asked for: a listener added from now on is not started.</summary>
    public bool Aborting => _abortOnStop;

    /// <summary>A new connection of the loop: counted, and registered once, edge-triggered, for everything it will wait on.</summary>
    public void Register(LinuxConnection connection)
    {
        _connections.Add(connection);
        loop.Metrics.CurrentConnections.Add(1);
        loop.Metrics.TotalConnections.Add(1);
        var result = loop.Engine.Register(connection.Fd, connection, LinuxConnection.RegistrationEvents);
        if (result.IsError)
        {
            connection.Fault(Errno.ToException(result.Error, "epoll_ctl(ADD)"));
        }
    }

    /// <summary>
    /// Forgets a connection and closes its socket, under the send lock: a pool thread that is sending holds it, and
    /// once the socket reads as closed none sends again.
    /// </summary>
    public void Close(LinuxConnection connection)
    {
        lock (connection.Send.Lock)
        {
            connection.DisposeSocketForOptions();
            loop.Engine.Close(connection.Socket, connection);
        }

        if (_connections.Remove(connection))
        {
            loop.Metrics.CurrentConnections.Add(-1);
        }
    }

    /// <summary>The loop is to end; with <paramref name="abort"/>, at once: every connection is reset now.</summary>
    public void RequestStop(bool abort)
    {
        StopRequested = true;
        if (abort)
        {
            _abortOnStop = true;
            _abortDeadline = Environment.TickCount64 + ZeroCopyStopWaitMs;
            AbortAll("The Linux transport is shutting down.");
        }
    }

    /// <summary>
    /// A stop was asked for and nothing holds it up any more: after an abort, no connection is left or the
    /// zero-copy wait is over; otherwise no connection and no listener (<paramref name="listeners"/>) is left.
    /// </summary>
    public bool ReadyToExit(int listeners) => StopRequested && (_abortOnStop
        ? _connections.Count == 0 || Environment.TickCount64 >= _abortDeadline
        : _connections.Count == 0 && listeners == 0);

    /// <summary>
    /// How long the loop may wait in the kernel before the zero-copy wait of an aborting stop is over: -1 when no
    /// such wait is under way. Reset connections whose close waits for their notifications hold up a stop only so long.
    /// </summary>
    public int MillisecondsToAbortDeadline() => _abortOnStop && _connections.Count > 0
        ? (int)Math.Clamp(_abortDeadline - Environment.TickCount64, 0, ZeroCopyStopWaitMs)
        : -1;

    /// <summary>
    /// The loop's end: each abort closes and unregisters its connection (and counts it out of the meter), except those
    /// whose close waits for the kernel's zero-copy notifications: those go now, their blocks kept from the pool.
    /// </summary>
    public void EndAll()
    {
        AbortAll("The Linux transport's event loop stopped.");
        AbandonZeroCopy();
        _connections.Clear();
    }

    private void AbortAll(string reason)
    {
        var aborted = new ConnectionAbortedException(reason);
        foreach (var connection in _connections.ToArray())
        {
            connection.Lifetime.Abort(aborted);
        }
    }

    private void AbandonZeroCopy()
    {
        int connections = 0;
        int blocks = 0;
        foreach (var connection in _connections.ToArray())
        {
            int kept = connection.Lifetime.Abandon();
            connections += kept > 0 ? 1 : 0;
            blocks += kept;
        }

        if (connections > 0)
        {
            TransportLog.ZeroCopyAbandoned(loop.Logger, loop.Index, blocks, connections);
        }
    }
}
