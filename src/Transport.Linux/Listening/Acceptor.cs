using System.Net;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Loop;
using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Listening;

/// <summary>
/// One loop's listening sockets: it accepts what epoll reports on them (or takes what io_uring's multishot accept
/// brings), makes each new socket a connection of the loop, and backs a listener off (doubling up to a second)
/// when accept fails for want of resources, so a level-triggered listener cannot spin the loop. Loop thread only.
/// </summary>
internal sealed class Acceptor(EventLoop loop, AcceptedSocketOptions socketOptions)
{
    /// <summary>At most this many accepts per event, so a connect storm cannot keep the loop from its sockets.</summary>
    private const int MaxAcceptsPerEvent = 64;

    private readonly List<ListenRegistration> _listeners = [];
    private readonly List<ListenRegistration> _backedOff = [];

    /// <summary>How many listeners this loop polls.</summary>
    public int Count => _listeners.Count;

    /// <summary>Milliseconds until the next backed-off listener is due again; -1 when none waits.</summary>
    public int MillisecondsToNextRetry
        => _backedOff.Count == 0 ? -1 : (int)Math.Clamp(_backedOff.Min(static r => r.RetryAt) - Environment.TickCount64, 0, 1000);

    /// <summary>
    /// Starts polling a listener. A listener this loop cannot poll fails its bind: a bind that succeeded without it
    /// would leave the loop's share of new connections (its SO_REUSEPORT socket's) with nobody to accept them.
    /// </summary>
    public void Add(ListenRegistration registration)
    {
        var result = loop.Engine.RegisterListener(registration.Fd, registration, registration.Events);
        if (result.IsError)
        {
            TransportLog.ListenerRegistrationFailed(loop.Logger, loop.Index, registration.Listener.EndPoint, Errno.Describe(result.Error));
            registration.Removed.TrySetResult();
            registration.Added.TrySetException(new SocketException(
                (int)Errno.ToSocketError(result.Error),
                $"Loop {loop.Index} could not poll the listening socket of {registration.Listener.EndPoint}: {Errno.Describe(result.Error)}."));
            return;
        }

        _listeners.Add(registration);
        registration.Added.TrySetResult();
    }

    public void Remove(ListenRegistration registration)
    {
        if (_listeners.Remove(registration))
        {
            // The fd stays open until every loop has let go of it (LinuxConnectionListener closes it).
            loop.Engine.Unregister(registration.Fd, registration, stillOpen: true);
        }

        registration.Removed.TrySetResult();
    }

    /// <summary>The loop is gone: whoever waits on a registration stops waiting.</summary>
    public void ReleaseAll()
    {
        foreach (var registration in _listeners)
        {
            registration.Added.TrySetResult();
            registration.Removed.TrySetResult();
        }

        _listeners.Clear();
        _backedOff.Clear();
    }

    /// <summary>epoll reported the listener readable: accept what is queued, up to <see cref="MaxAcceptsPerEvent"/>.</summary>
    public void Accept(ListenRegistration registration)
    {
        Span<byte> address = stackalloc byte[SockAddr.MaxLength];
        for (int i = 0; i < MaxAcceptsPerEvent; i++)
        {
            var accepted = Interop.Socket.Accept(registration.Fd, address, out int addressLength);
            if (!accepted.IsError)
            {
                AcceptOne(registration, new OwnedFd((int)accepted.Value), address[..addressLength]);
                continue;
            }

            if (accepted.Error == Errno.EAGAIN || !TryNextAfter(registration, accepted.Error))
            {
                return;
            }
        }
    }

    /// <summary>
    /// The engine accepted in the kernel (<see cref="Engines.IoEngine.AcceptsInKernel"/>): <paramref name="result"/>
    /// is the new socket, whose peer address getpeername supplies, or -errno.
    /// </summary>
    public void Accepted(ListenRegistration registration, int result)
    {
        if (result < 0)
        {
            // The error ended the kernel's accept: it accepts again once resumed, now or after a backoff.
            if (TryNextAfter(registration, -result))
            {
                Resume(registration);
            }

            return;
        }

        var socket = new OwnedFd(result);
        Span<byte> address = stackalloc byte[SockAddr.MaxLength];
        var peer = Interop.Socket.GetPeerAddress(socket.Value, address, out int addressLength);
        if (peer.IsError)
        {
            // ENOTCONN: reset by the peer before we looked. Nothing to serve.
            socket.Dispose();
            return;
        }

        AcceptOne(registration, socket, address[..addressLength]);
    }

    /// <summary>Every pass: listeners whose backoff has passed are polled again.</summary>
    public void RetryBackedOff()
    {
        if (_backedOff.Count == 0)
        {
            return;
        }

        long now = Environment.TickCount64;
        for (int i = _backedOff.Count - 1; i >= 0; i--)
        {
            var registration = _backedOff[i];
            if (!_listeners.Contains(registration))
            {
                _backedOff.RemoveAt(i);
            }
            else if (registration.RetryAt <= now)
            {
                _backedOff.RemoveAt(i);
                Resume(registration);
            }
        }
    }

    /// <summary>Polls (or, on io_uring, accepts on) a listener again; when the engine cannot, it backs off once more.</summary>
    private void Resume(ListenRegistration registration)
    {
        var resumed = loop.Engine.Resume(registration.Fd, registration.Events);
        if (resumed.IsError)
        {
            _ = TryNextAfter(registration, resumed.Error);
        }
    }

    /// <summary>
    /// An accept failed with <paramref name="error"/>: true when the next one may be fine (the peer gave up first,
    /// accept(2)); otherwise (EMFILE, ENFILE, ENOBUFS, ENOMEM, EPERM...: never fatal) the listener stops being
    /// polled for a while, since level-triggered it would spin the loop, and the answer is false.
    /// </summary>
    private bool TryNextAfter(ListenRegistration registration, int error)
    {
        if (error is Errno.EINTR or Errno.ECONNABORTED)
        {
            return true;
        }

        registration.BackOff();
        loop.Metrics.AcceptErrors.Add(1, TransportMetrics.ErrnoTag(Errno.Name(error)));
        TransportLog.AcceptFailed(loop.Logger, loop.Index, registration.Listener.EndPoint, Errno.Describe(error), registration.BackoffMs);
        _ = loop.Engine.Pause(registration.Fd);
        _backedOff.Add(registration);
        return false;
    }

    private void AcceptOne(ListenRegistration registration, OwnedFd socket, ReadOnlySpan<byte> address)
    {
        LinuxConnection? connection = null;
        try
        {
            var remote = SockAddr.Parse(address);
            if (remote is IPEndPoint)
            {
                socketOptions.Apply(socket.Value);
            }

            var local = Interop.Socket.GetLocalEndPoint(socket.Value) ?? registration.Listener.EndPoint;
            connection = new LinuxConnection(loop, socket, local, remote);
            registration.ResetBackoff();
            loop.Register(connection);
            connection.Start();
            if (!registration.Listener.Offer(connection))
            {
                connection.Lifetime.Abort(new ConnectionAbortedException("The listener was unbound."));
            }
        }
        catch (Exception e)
        {
            if (connection is null)
            {
                TransportLog.ConnectionFault(loop.Logger, "(accepting)", e);
                socket.Dispose();
            }
            else
            {
                connection.Fault(e);
            }
        }
    }
}
