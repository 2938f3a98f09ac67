using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Connection;

/// <summary>
/// How a connection ends: a graceful end once both sides are done, an abort's reset, the socket's close
/// (once, after the kernel is done with the last zero-copy send, reset or not), the ConnectionClosed token, and
/// the moment the transport lets go of the pipes. Loop thread, except <see cref="SetAbortReason"/> and the
/// ConnectionClosed callbacks (see <see cref="LinuxConnection"/>).
/// </summary>
internal sealed class ConnectionLifetime(LinuxConnection connection) : IDisposable
{
    // The ConnectionClosed callbacks against an output completion held back for them (SendSide.CompleteOutput):
    // NotYet, then either Waiting (the send side holds it; the callbacks' thread posts back to the loop when
    // they are done) or Done (they ran first; the send side completes at once). Only a held-back completion
    // costs a post back to the loop.
    private const int CallbacksNotYet = 0;
    private const int CallbacksWaiting = 1;
    private const int CallbacksDone = 2;

    private readonly LinuxConnection _connection = connection;
    private readonly CancellationTokenSource _connectionClosed = new();
    private readonly TaskCompletionSource _released = new(TaskCreationOptions.RunContinuationsAsynchronously);
    private readonly TaskCompletionSource _callbacksRan = new(TaskCreationOptions.RunContinuationsAsynchronously);
    private ConnectionAbortedException? _abortReason;
    private int _closedFired;
    private int _callbacksState;
    private bool _reset;
    private bool _resetSent;
    private bool _closeAwaitsZeroCopy;

    public CancellationToken ConnectionClosed => _connectionClosed.Token;

    /// <summary>Completes once the socket is closed and the transport has let go of both pipes.</summary>
    public Task Released => _released.Task;

    /// <summary>
    /// Completes once the ConnectionClosed callbacks have run, if they were fired: the token must not be disposed
    /// before (a callback registered by the app would then never run, as Cancel on a disposed source throws).
    /// </summary>
    public Task ClosedCallbacksRan => Volatile.Read(ref _closedFired) != 0 ? _callbacksRan.Task : Task.CompletedTask;

    /// <summary>Why the connection was aborted, when it was.</summary>
    public ConnectionAbortedException? AbortReason => Volatile.Read(ref _abortReason);

    /// <summary>Any thread: keeps the first reason given.</summary>
    public void SetAbortReason(ConnectionAbortedException? reason) => Interlocked.CompareExchange(ref _abortReason, reason, null);

    /// <summary>The app disposed the connection: end both sides, gracefully where still possible.</summary>
    public void EndGracefully()
    {
        // The app's writer is complete, so whatever is in flight on the send side (a pending read, a queued
        // send, a wait for EPOLLOUT) runs to the end of the data and then ends it gracefully, as the Sockets
        // transport drains before its DisposeAsync returns. A pending input flush completes because the app's
        // reader is complete.
        if (!_connection.Receive.FlushPending)
        {
            _connection.Receive.End(null);
        }

        MaybeClose();
    }

    /// <summary>
    /// Resets the connection (SO_LINGER 0, then close): the peer gets RST, the app's readers the reason. With
    /// <see cref="LinuxTransportOptions.FinOnError"/> the peer gets FIN instead.
    /// </summary>
    public void Abort(ConnectionAbortedException? reason)
    {
        if (_connection.Socket.IsClosed)
        {
            return;
        }

        SetAbortReason(reason);

        // With Kestrel's FinOnError switch the peer gets FIN after what the kernel already holds, as on Sockets;
        // what the app wrote but the transport had not sent yet is dropped either way.
        bool fin = _connection.Loop.Options.FinOnError;
        if (!fin)
        {
            _reset = true;
            _ = Interop.Socket.SetLingerZero(_connection.Socket.Value);
        }

        _connection.Receive.End(AbortReason);
        _connection.Send.End(AbortReason, graceful: fin);
        Close();
    }

    /// <summary>Closes once both sides are done.</summary>
    public void MaybeClose()
    {
        if (_connection.Receive.IsDone && _connection.Send.IsDone)
        {
            Close();
        }
    }

    /// <summary>After the loop took zero-copy completions: a close that waited for the last of them happens now.</summary>
    public void OnZeroCopyReaped()
    {
        if (_closeAwaitsZeroCopy && _connection.Send.ZeroCopy!.InFlight == 0)
        {
            _closeAwaitsZeroCopy = false;
            Close();
        }
    }

    /// <summary>
    /// The loop is ending before the kernel said it is done with this connection's zero-copy sends: closes the
    /// socket, and keeps their blocks out of the pool for good (<see cref="ZeroCopySends.Abandon"/>), since the
    /// kernel may still send from them. Returns how many blocks were kept; 0 when the close waited for nothing.
    /// </summary>
    public int Abandon()
    {
        if (!_closeAwaitsZeroCopy)
        {
            return 0;
        }

        _closeAwaitsZeroCopy = false;
        int blocks;
        lock (_connection.Send.Lock)
        {
            blocks = _connection.Send.ZeroCopy!.Abandon();
        }

        Close();
        return blocks;
    }

    /// <summary>Closes the socket exactly once, and reports the connection released once the pipes are released too.</summary>
    private void Close()
    {
        var socket = _connection.Socket;
        if (!socket.IsClosed)
        {
            if (_connection.Send.ZeroCopy is { InFlight: > 0 })
            {
                // The kernel may still read zero-copy sends from pool blocks, and not only from the socket's queue, which a
                // reset drops: from packets already handed to a qdisc or a NIC's ring too, until each send's notification.
                // A closed socket gets no MSG_ZEROCOPY notification, so the socket stays open until the last one is in
                // (OnZeroCopyReaped). A reset goes out now all the same: a disconnect sends RST and drops the queued
                // data, and keeps the socket and its error queue (ring notifications need no socket at all).
                if (_reset && !_resetSent)
                {
                    _resetSent = true;
                    _ = Interop.Socket.Disconnect(socket.Value);
                }

                _closeAwaitsZeroCopy = true;
                return;
            }

            _connection.Loop.Close(_connection);
            FireConnectionClosed();
        }

        // A pending flush or read will report back on this loop (they were cancelled), and an output held back
        // for the ConnectionClosed callbacks completes after them; the pipes' blocks go back to the pool when
        // both sides are complete.
        if (!_connection.Receive.FlushPending && !_connection.Send.ReadPending && !_connection.Send.OutputHeldBack)
        {
            _released.TrySetResult();
        }
    }

    /// <summary>Fires ConnectionClosed once, on the thread pool: user callbacks must not run on the loop.</summary>
    public void FireConnectionClosed()
    {
        if (Interlocked.Exchange(ref _closedFired, 1) != 0)
        {
            return;
        }

        ThreadPool.UnsafeQueueUserWorkItem(static lifetime =>
        {
            try
            {
                lifetime._connectionClosed.Cancel();
            }
            catch (ObjectDisposedException)
            {
            }

            lifetime._callbacksRan.TrySetResult();
            if (Interlocked.Exchange(ref lifetime._callbacksState, CallbacksDone) == CallbacksWaiting)
            {
                lifetime._connection.Loop.Post(static s => ((LinuxConnection)s!).Send.CompleteHeldOutput(), lifetime._connection);
            }
        }, this, preferLocal: false);
    }

    /// <summary>
    /// True when the ConnectionClosed callbacks have not run yet: the caller holds its output completion back,
    /// and the callbacks' thread has the loop complete it (<see cref="SendSide.CompleteHeldOutput"/>).
    /// </summary>
    public bool HoldUntilCallbacksRan()
        => Interlocked.CompareExchange(ref _callbacksState, CallbacksWaiting, CallbacksNotYet) != CallbacksDone;

    /// <summary>After <see cref="Released"/>: the token is no longer needed.</summary>
    public void Dispose() => _connectionClosed.Dispose();
}
