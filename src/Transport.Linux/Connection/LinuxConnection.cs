using System.Buffers;
using System.IO.Pipelines;
using System.Net;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Loop;
using Kestrel.Transport.Linux.Scheduling;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Connections.Features;
using Microsoft.AspNetCore.Http.Features;

namespace Kestrel.Transport.Linux.Connection;

/// <summary>
/// One accepted socket and its two pipes, as Kestrel sees it. The work is done by three parts, each owning its
/// state: <see cref="ReceiveSide"/> (socket to input pipe), <see cref="SendSide"/> (output pipe to socket, with
/// <see cref="PoolThreadSends"/> and <see cref="ZeroCopySends"/>) and <see cref="ConnectionLifetime"/> (ending,
/// closing, aborting). The socket is owned here and closed by the lifetime, once.
/// </summary>
/// <remarks>
/// <para><b>Which thread runs what.</b> Everything runs on the owning loop's thread (the thread that holds the loop
/// now: with Adaptive scheduling the loop may move to another thread between two application continuations; see
/// <see cref="EventLoop"/>), except:</para>
/// <list type="bullet">
/// <item><see cref="Abort"/>, <see cref="DisposeAsync"/> and <see cref="ConnectionClosed"/>'s
/// callbacks, from any thread. Abort and dispose only record a reason and post to the loop; the callbacks run on
/// the thread pool, and post back to the loop when it waits for them (ConnectionLifetime).</item>
/// <item>With ThreadPool scheduling, the output pipe's reader may resume on a pool thread (PoolThreadSends).
/// That thread sends under <see cref="SendSide.Lock"/>, and only while the send side is not done and the socket
/// not closed; what it cannot finish it hands back to the loop, keeping <see cref="SendSide.ReadPending"/> set
/// until the loop has taken it.</item>
/// <item>The loop takes the same lock to end the send side, to read zero-copy completions, and to close the
/// socket, so a pool thread never sends past the end of the send side or on a closed (or reused) fd.</item>
/// </list>
/// <para>The output's read result is in one thread's hands at a time: a pool thread's while it runs the read's
/// continuation, the loop's otherwise, which is why the loop's own sends need no lock. Nothing else is shared:
/// the receive side and the lifetime are the loop's alone.</para>
/// </remarks>
internal sealed class LinuxConnection : ConnectionContext,
    IConnectionIdFeature, IConnectionTransportFeature, IConnectionItemsFeature,
    IMemoryPoolFeature, IConnectionLifetimeFeature, IConnectionEndPointFeature, IConnectionSocketFeature
{
    /// <summary>
    /// What the loop registers the socket for, once for its life: everything, edge-triggered, so no event ever
    /// costs an epoll_ctl to re-arm it.
    /// </summary>
    public const uint RegistrationEvents = Epoll.EPOLLIN | Epoll.EPOLLOUT | Epoll.EPOLLRDHUP | Epoll.EPOLLET;

    private readonly FeatureCollection _features = new();
    private string? _connectionId;
    private IDictionary<object, object?>? _items;
    private System.Net.Sockets.Socket? _socketForOptions;

    public LinuxConnection(EventLoop loop, OwnedFd socket, EndPoint? localEndPoint, EndPoint? remoteEndPoint)
    {
        Loop = loop;
        Socket = socket;
        LocalEndPoint = localEndPoint;
        RemoteEndPoint = remoteEndPoint;

        var (inputOptions, outputOptions) = loop.PipeOptionsFor(this, out var scheduler);
        Scheduler = scheduler;
        var input = new Pipe(inputOptions);
        var output = new Pipe(outputOptions);
        Transport = new DuplexPipe(input.Reader, output.Writer);

        bool tcp = remoteEndPoint is IPEndPoint;
        Receive = new ReceiveSide(this, input.Writer, quickAck: loop.SocketOptions.QuickAck && tcp);
        Send = new SendSide(this, output.Reader, loop.SocketOptions.ZeroCopy && tcp ? new ZeroCopySends() : null);
        Lifetime = new ConnectionLifetime(this);

        _features.Set<IConnectionIdFeature>(this);
        _features.Set<IConnectionTransportFeature>(this);
        _features.Set<IConnectionItemsFeature>(this);
        _features.Set<IMemoryPoolFeature>(this);
        _features.Set<IConnectionLifetimeFeature>(this);
        _features.Set<IConnectionEndPointFeature>(this);
        _features.Set<IConnectionSocketFeature>(this);
    }

    public EventLoop Loop { get; }

    /// <summary>The connection's socket: its number reads -1 once the lifetime has closed it.</summary>
    public OwnedFd Socket { get; }

    public ReceiveSide Receive { get; }

    public SendSide Send { get; }

    public ConnectionLifetime Lifetime { get; }

    /// <summary>With Adaptive scheduling, where this connection's application continuations run; null otherwise.</summary>
    public AdaptiveScheduler? Scheduler { get; }

    /// <summary>The socket's number while it is open (diagnostics, tests and the loop's registration).</summary>
    public int Fd => Socket.Value;

    public override string ConnectionId
    {
        get => _connectionId ??= ConnectionIds.Next();
        set => _connectionId = value;
    }

    public override IFeatureCollection Features => _features;

    public override IDictionary<object, object?> Items
    {
        get => _items ??= new ConnectionItems();
        set => _items = value;
    }

    public override IDuplexPipe Transport { get; set; }

    public override EndPoint? LocalEndPoint { get; set; }

    public override EndPoint? RemoteEndPoint { get; set; }

    public override CancellationToken ConnectionClosed
    {
        get => Lifetime.ConnectionClosed;
        set => throw new NotSupportedException("The transport owns the ConnectionClosed token.");
    }

    public MemoryPool<byte> MemoryPool => Loop.Pool;

    /// <summary>The largest single read so far (diagnostics and tests).</summary>
    public long LargestRead => Receive.LargestRead;

    /// <summary>True when this connection may send with MSG_ZEROCOPY (diagnostics and tests).</summary>
    public bool ZeroCopyEnabled => Send.ZeroCopy is not null;

    /// <summary>Zero-copy sends the kernel has not reported done yet (any thread; diagnostics and tests).</summary>
    public int ZeroCopyInFlight
    {
        get
        {
            lock (Send.Lock)
            {
                return Send.ZeroCopy?.InFlight ?? 0;
            }
        }
    }

    /// <summary>Any thread. Resets the connection: reads throw <paramref name="abortReason"/> and the peer gets RST.</summary>
    public override void Abort(ConnectionAbortedException abortReason)
    {
        Lifetime.SetAbortReason(abortReason);
        Loop.Post(static s => ((LinuxConnection)s!).Lifetime.Abort(null), this);
    }

    /// <summary>Any thread. Completes the application's side of the pipes and waits until the transport has let go of the socket.</summary>
    public override async ValueTask DisposeAsync()
    {
        Transport.Input.Complete();
        Transport.Output.Complete();
        Loop.Post(static s => ((LinuxConnection)s!).Lifetime.EndGracefully(), this);
        await Lifetime.Released;
        await Lifetime.ClosedCallbacksRan;
        Lifetime.Dispose();
        await base.DisposeAsync();
    }

    /// <summary>Starts reading the app's output; the loop has registered the socket.</summary>
    public void Start() => Send.Start();

    /// <summary>
    /// The <paramref name="index"/>-th event of <paramref name="engine"/>'s last wait, which is this connection's: what
    /// epoll reported for the socket, that the engine's zero-copy op is done (<see cref="IoEngine.ZeroCopyDone"/>),
    /// whose blocks then go back, or that the engine lost the socket's registration (<see cref="IoEngine.RegistrationLost"/>).
    /// </summary>
    public void OnEvent(IoEngine engine, int index)
    {
        uint events = engine.EventsAt(index);
        if (events == IoEngine.RegistrationLost)
        {
            Fault(new IOException($"The {engine.Backend} engine can no longer watch the socket of connection {ConnectionId} (its poll failed or could not be armed again), so the connection is reset."));
            return;
        }

        if (events != IoEngine.ZeroCopyDone)
        {
            OnEvents(events);
            return;
        }

        var (send, copied) = engine.ZeroCopyDoneAt(index);
        if (Send.ZeroCopy!.OnOpDone(this, send, copied))
        {
            Lifetime.OnZeroCopyReaped();
        }
    }

    /// <summary>What epoll reported for the socket.</summary>
    private void OnEvents(uint events)
    {
        if (Socket.IsClosed)
        {
            return;
        }

        // EPOLLERR also means that zero-copy completions are queued on the socket's error queue; that alone is
        // no error. A reset or timeout comes with EPOLLHUP, and a read would report it anyway.
        if ((events & Epoll.EPOLLERR) != 0 && Send.ZeroCopy is { } zeroCopy && zeroCopy.ReapErrorQueue(this))
        {
            events &= ~Epoll.EPOLLERR;
            Lifetime.OnZeroCopyReaped();
            if (Socket.IsClosed)
            {
                return;
            }
        }

        if ((events & (Epoll.EPOLLIN | Epoll.EPOLLRDHUP | Epoll.EPOLLHUP | Epoll.EPOLLERR)) != 0)
        {
            Receive.OnReadable(hungUp: (events & (Epoll.EPOLLRDHUP | Epoll.EPOLLHUP | Epoll.EPOLLERR)) != 0);
        }

        if ((events & (Epoll.EPOLLOUT | Epoll.EPOLLHUP | Epoll.EPOLLERR)) != 0 && Send.WaitingWritable)
        {
            Send.OnWritable();
        }
    }

    /// <summary>A fault in this connection's processing: log it and reset the connection, never the loop.</summary>
    public void Fault(Exception error)
    {
        TransportLog.ConnectionFault(Loop.Logger, ConnectionId, error);
        Lifetime.Abort(error as ConnectionAbortedException ?? new ConnectionAbortedException(error.Message, error));
    }

    /// <summary>The exception a failed socket call ends a side with: a reset as a reset, anything else as the abort's reason or an I/O error.</summary>
    public Exception ErrorFor(int errno, string operation) => errno switch
    {
        Errno.ECONNRESET or Errno.EPIPE => new ConnectionResetException($"{operation} failed on connection {ConnectionId}: {Errno.Describe(errno)}."),
        _ => Lifetime.AbortReason ?? (Exception)new IOException($"{operation} failed on connection {ConnectionId}: {Errno.Describe(errno)}."),
    };

    /// <summary>A completed pipe operation's result, or the exception it completed with.</summary>
    public static T Outcome<T>(ValueTask<T> operation, out Exception? error)
        where T : struct
    {
        error = null;
        try
        {
            return operation.GetAwaiter().GetResult();
        }
        catch (Exception e)
        {
            error = e;
            return default;
        }
    }

    string IConnectionIdFeature.ConnectionId
    {
        get => ConnectionId;
        set => ConnectionId = value;
    }

    void IConnectionLifetimeFeature.Abort() => Abort(new ConnectionAbortedException("The connection was aborted by the application via IConnectionLifetimeFeature.Abort()."));

    /// <summary>
    /// IConnectionSocketFeature: a <see cref="System.Net.Sockets.Socket"/> over this connection's socket, made on first use,
    /// for its options only (keep-alive, TCP_INFO, peer credentials). The loop owns every read and write, so a read or a
    /// write through it would take bytes from, or put them between, Kestrel's; and Shutdown would end the connection
    /// behind the transport's back. Its handle does not own the fd (ownsHandle false): disposing it never closes the
    /// connection. It is made, and disposed (<see cref="DisposeSocketForOptions"/>), under the send lock, which the loop
    /// holds to close the fd: it never wraps a number the kernel may have handed to another socket, and from the close on
    /// it throws ObjectDisposedException, as the Sockets transport's does.
    /// </summary>
    System.Net.Sockets.Socket IConnectionSocketFeature.Socket
    {
        get
        {
            if (Volatile.Read(ref _socketForOptions) is { } existing)
            {
                return existing;
            }

            lock (Send.Lock)
            {
                ObjectDisposedException.ThrowIf(Socket.IsClosed, typeof(System.Net.Sockets.Socket));
                return _socketForOptions ??= new System.Net.Sockets.Socket(new System.Net.Sockets.SafeSocketHandle(Socket.Value, ownsHandle: false));
            }
        }
    }

    /// <summary>
    /// Loop, under the send lock, right before the fd is closed: disposes the IConnectionSocketFeature socket, if one was
    /// made. With a handle that does not own the fd, that only marks the handle closed: no system call, no wait.
    /// </summary>
    internal void DisposeSocketForOptions() => _socketForOptions?.Dispose();

    private sealed class DuplexPipe(PipeReader input, PipeWriter output) : IDuplexPipe
    {
        public PipeReader Input { get; } = input;

        public PipeWriter Output { get; } = output;
    }
}
