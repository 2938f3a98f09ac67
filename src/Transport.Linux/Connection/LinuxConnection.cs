using System.Buffers;
using System.Diagnostics;
using System.IO.Pipelines;
using System.Net;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Loop;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Connections.Features;
using Microsoft.AspNetCore.Http.Features;

// The pipes' ValueTasks are stored and read back in their completion callbacks, which only run
// once they have completed; CA2012 cannot see that.
#pragma warning disable CA2012

namespace Kestrel.Transport.Linux.Connection;

/// <summary>
/// One accepted socket and its two pipes. Every method without a thread note runs on the owning
/// loop's thread; <see cref="Abort"/> and <see cref="DisposeAsync"/> may be called from anywhere and
/// post to the loop.
/// </summary>
internal sealed class LinuxConnection : ConnectionContext,
    IConnectionIdFeature, IConnectionTransportFeature, IConnectionItemsFeature,
    IMemoryPoolFeature, IConnectionLifetimeFeature, IConnectionEndPointFeature
{
    /// <summary>Reads ask for at least this much room: half a 4 KiB pool block, as Kestrel's Sockets transport.</summary>
    private const int MinReadSize = 2048;

    /// <summary>At most this many buffers go into one writev (IOV_MAX is 1024, see sysconf(3)); the rest goes next pass.</summary>
    private const int MaxBuffersPerSend = 64;

    private static long s_lastId;

    private readonly EventLoop _loop;
    private readonly Pipe _input;
    private readonly Pipe _output;
    private readonly CancellationTokenSource _connectionClosedSource = new();
    private readonly TaskCompletionSource _closed = new(TaskCreationOptions.RunContinuationsAsynchronously);
    private readonly Action _onInputFlushed;
    private readonly Action _onOutputReadable;
    private readonly FeatureCollection _features = new();

    private string? _connectionId;
    private IDictionary<object, object?>? _items;

    // Receive side.
    private bool _readable;
    private int _readSize = MinReadSize;
    private bool _peerHungUp;
    private bool _receiveQueued;
    private bool _receiveDone;
    private bool _flushPending;
    private ValueTask<FlushResult> _flush;

    // Send side. The loop owns it, except that a pending read's continuation may run on the app's
    // pool thread (LinuxTransportOptions.SendFromThreadPool): that thread sends what it read under _sendLock, and
    // hands anything else (an error, the end of the output, a full socket) back to the loop, keeping
    // _readPending set until the loop has taken it. The loop's EndSend and fd close take the same lock,
    // so a pool thread never sends on a closed fd or past the end of the send side.
    private readonly Lock _sendLock = new();
    private bool _sendQueued;
    private bool _sendDone;
    private bool _waitingWritable;
    private bool _readPending;
    private bool _hasReadResult;
    private ReadResult _readResult;
    private ValueTask<ReadResult> _read;
    private ReadResult _handedBack;
    private Exception? _handedBackError;

    /// <summary>A pool thread's sends, one op at a time (LinuxTransportOptions.SendFromThreadPool).</summary>
    [ThreadStatic]
    private static IoBatch? t_sendBatch;

    private readonly bool _quickAck;

    // MSG_ZEROCOPY (LinuxTransportOptions.ZeroCopySendThreshold): null when off for this connection.
    // The fd's close waits for the kernel's completions, except after a reset.
    private readonly ZeroCopySends? _zeroCopy;
    private bool _closeAwaitsZeroCopy;
    private bool _reset;

    private bool _fdClosed;
    private int _connectionClosedFired;
    private ConnectionAbortedException? _abortReason;

    public LinuxConnection(EventLoop loop, int fd, EndPoint? localEndPoint, EndPoint? remoteEndPoint)
    {
        _loop = loop;
        Fd = fd;
        LocalEndPoint = localEndPoint;
        RemoteEndPoint = remoteEndPoint;
        _quickAck = loop.QuickAck && remoteEndPoint is IPEndPoint;
        _zeroCopy = loop.ZeroCopy && remoteEndPoint is IPEndPoint ? new ZeroCopySends() : null;

        _input = new Pipe(loop.InputPipeOptions);
        _output = new Pipe(loop.OutputPipeOptions);
        Transport = new DuplexPipe(_input.Reader, _output.Writer);
        _onInputFlushed = OnInputFlushed;
        _onOutputReadable = OnOutputReadable;

        _features.Set<IConnectionIdFeature>(this);
        _features.Set<IConnectionTransportFeature>(this);
        _features.Set<IConnectionItemsFeature>(this);
        _features.Set<IMemoryPoolFeature>(this);
        _features.Set<IConnectionLifetimeFeature>(this);
        _features.Set<IConnectionEndPointFeature>(this);
    }

    public int Fd { get; }

    /// <summary>
    /// The events the loop registers the fd for (EPOLL_CTL_ADD): all of them, edge-triggered, once for the
    /// connection's life, so no event ever costs an epoll_ctl to re-arm it.
    /// </summary>
    public const uint RegistrationEvents = Epoll.EPOLLIN | Epoll.EPOLLOUT | Epoll.EPOLLRDHUP | Epoll.EPOLLET;

    public override string ConnectionId
    {
        get => _connectionId ??= $"L{Interlocked.Increment(ref s_lastId):X8}";
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
        get => _connectionClosedSource.Token;
        set => throw new NotSupportedException("The transport owns the ConnectionClosed token.");
    }

    public MemoryPool<byte> MemoryPool => _loop.Pool;

    /// <summary>Thread-safe. Resets the connection: reads throw <paramref name="abortReason"/> and the peer gets RST.</summary>
    public override void Abort(ConnectionAbortedException abortReason)
    {
        Interlocked.CompareExchange(ref _abortReason, abortReason, null);
        _loop.Post(static s => ((LinuxConnection)s!).AbortOnLoop(null), this);
    }

    /// <summary>Thread-safe. Completes the application's side of the pipes and waits until the transport has let go of the socket.</summary>
    public override async ValueTask DisposeAsync()
    {
        Transport.Input.Complete();
        Transport.Output.Complete();
        _loop.Post(static s => ((LinuxConnection)s!).EndOnLoop(), this);
        await _closed.Task;
        _connectionClosedSource.Dispose();
        await base.DisposeAsync();
    }

    public void Start() => ReadOutput();

    public void OnEvents(uint events)
    {
        if (_fdClosed)
        {
            return;
        }

        // EPOLLERR also means that zero-copy completions are queued on the socket's error queue; that
        // alone is no error. A reset or timeout comes with EPOLLHUP, and a read would report it anyway.
        if ((events & Epoll.EPOLLERR) != 0 && _zeroCopy is not null && ReapZeroCopy())
        {
            events &= ~Epoll.EPOLLERR;
            if (_fdClosed)
            {
                return;
            }
        }

        if ((events & (Epoll.EPOLLRDHUP | Epoll.EPOLLHUP | Epoll.EPOLLERR)) != 0)
        {
            _peerHungUp = true;
        }

        if ((events & (Epoll.EPOLLIN | Epoll.EPOLLRDHUP | Epoll.EPOLLHUP | Epoll.EPOLLERR)) != 0)
        {
            _readable = true;
            QueueReceive();
        }

        if ((events & (Epoll.EPOLLOUT | Epoll.EPOLLHUP | Epoll.EPOLLERR)) != 0 && _waitingWritable)
        {
            _waitingWritable = false;
            ReadOutput();
        }
    }

    // ---- Receive side -------------------------------------------------------------------------

    private void QueueReceive()
    {
        if (_readable && !_receiveDone && !_flushPending && !_receiveQueued)
        {
            _receiveQueued = true;
            _loop.QueueReceive(this);
        }
    }

    public void PrepareReceive(IoBatch batch)
    {
        _receiveQueued = false;
        if (_receiveDone || _flushPending || _fdClosed)
        {
            return;
        }

        batch.BeginOp(this, Fd);
        batch.AddBuffer(_input.Writer.GetMemory(_readSize));
    }

    /// <summary>
    /// Adapts the next read's size to what the socket delivers: a read that fills its buffer doubles
    /// the next one (up to MaxBytesPerRead), so a large burst takes a few large reads instead of one
    /// per pool block; a read that uses under a quarter of its buffer halves it, back down to a
    /// fraction of one pool block, so small requests never reserve more.
    /// </summary>
    private void AdaptReadSize(long result, long requested)
    {
        if (result == requested)
        {
            _readSize = (int)Math.Min(_loop.MaxBytesPerRead, Math.Max(_readSize, requested) * 2);
        }
        else if (result < requested / 4 && _readSize > MinReadSize)
        {
            _readSize = Math.Max(MinReadSize, _readSize / 2);
        }

        if (result > LargestRead)
        {
            LargestRead = result;
        }
    }

    /// <summary>Zero-copy sends the kernel has not reported done yet (any thread; diagnostics and tests).</summary>
    public int ZeroCopyInFlight
    {
        get
        {
            lock (_sendLock)
            {
                return _zeroCopy?.InFlight ?? 0;
            }
        }
    }

    /// <summary>True when this connection may send with MSG_ZEROCOPY (diagnostics and tests).</summary>
    public bool ZeroCopyEnabled => _zeroCopy is not null;

    /// <summary>The largest single read so far (diagnostics and tests).</summary>
    public long LargestRead { get; private set; }

    public void CompleteReceive(long result, long requested)
    {
        if (_receiveDone)
        {
            return;
        }

        if (result > 0)
        {
            _input.Writer.Advance((int)result);
            AdaptReadSize(result, requested);
            if (_quickAck)
            {
                Interop.Socket.SetOption(Fd, Interop.Socket.IPPROTO_TCP, Interop.Socket.TCP_QUICKACK, 1);
            }

            // With edge-triggered epoll a short read means the socket is drained: any later arrival
            // raises a new edge. After a hang-up there is no further edge, so read until EOF.
            if (result < requested && !_peerHungUp)
            {
                _readable = false;
            }

            FlushInput();
        }
        else if (result == 0)
        {
            EndReceive(null);
        }
        else if (result == -Errno.EAGAIN)
        {
            _readable = false;
        }
        else
        {
            EndReceive(ErrorFor((int)-result, "recv"));
        }
    }

    private void FlushInput()
    {
        var flush = _input.Writer.FlushAsync();
        if (flush.IsCompleted)
        {
            AfterInputFlush(flush.GetAwaiter().GetResult());
        }
        else
        {
            // Backpressure: the app has MaxReadBufferSize unread. Stop reading until it catches up.
            _flushPending = true;
            _flush = flush;
            flush.GetAwaiter().UnsafeOnCompleted(_onInputFlushed);
        }
    }

    private void OnInputFlushed()
    {
        _flushPending = false;
        var result = Outcome(_flush, out var error);
        _flush = default;

        if (_receiveDone)
        {
            // The receive side ended while the flush was pending; finish what EndReceive deferred.
            _input.Writer.Complete(_pendingInputError);
            MaybeClose();
            return;
        }

        if (error is not null)
        {
            EndReceive(error);
            return;
        }

        AfterInputFlush(result);
    }

    private void AfterInputFlush(FlushResult result)
    {
        if (result.IsCompleted || result.IsCanceled)
        {
            // The application completed its reader: it wants no more input.
            EndReceive(null);
        }
        else
        {
            QueueReceive();
        }
    }

    private Exception? _pendingInputError;

    private void EndReceive(Exception? error)
    {
        if (_receiveDone)
        {
            return;
        }

        _receiveDone = true;
        if (_flushPending)
        {
            // Completing the writer under a pending flush would race the pipe's own callback: cancel
            // the flush and complete when it reports back.
            _pendingInputError = error;
            _input.Writer.CancelPendingFlush();
        }
        else
        {
            _input.Writer.Complete(error);
        }

        FireConnectionClosed();
        MaybeClose();
    }

    // ---- Send side ----------------------------------------------------------------------------

    private void ReadOutput()
    {
        if (_sendDone || _readPending)
        {
            return;
        }

        if (TryStartRead(out var result, out var error))
        {
            OnOutputRead(result, error);
        }
    }

    /// <summary>
    /// Reads the app's output: true with the outcome when the read completed at once, false when its
    /// continuation (<see cref="OnOutputReadable"/>) was registered.
    /// </summary>
    private bool TryStartRead(out ReadResult result, out Exception? error)
    {
        result = default;
        error = null;
        try
        {
            var read = _output.Reader.ReadAsync();
            if (!read.IsCompleted)
            {
                _readPending = true;
                _read = read;
                read.GetAwaiter().UnsafeOnCompleted(_onOutputReadable);
                return false;
            }

            result = read.GetAwaiter().GetResult();
        }
        catch (Exception e)
        {
            // The application completed its output with an error.
            error = e;
        }

        return true;
    }

    /// <summary>The continuation of a pending read: on the loop, or on the pool thread that flushed.</summary>
    private void OnOutputReadable()
    {
        var result = Outcome(_read, out var error);
        _read = default;

        if (_loop.IsLoopThread)
        {
            OnPendingReadDone(result, error);
            return;
        }

        lock (_sendLock)
        {
            if (error is null && !_sendDone && !_fdClosed)
            {
                _readPending = false;
                try
                {
                    if (SendOnThisThread(ref result, out error))
                    {
                        return;
                    }
                }
                catch (Exception e)
                {
                    // A fault in this connection's send: the loop ends the send side with it.
                    result = default;
                    error = e;
                }

                // Still pending as far as the loop is concerned, until it has taken what follows.
                _readPending = true;
            }

            _handedBack = result;
            _handedBackError = error;
        }

        _loop.Post(static s => ((LinuxConnection)s!).OnHandedBack(), this);
    }

    /// <summary>
    /// On the app's pool thread, under <see cref="_sendLock"/>: sends what the read returned, and reads
    /// again as long as the socket takes everything. True when that ended with a pending read; false
    /// with what the loop must handle: a read result that is empty (the output ended) or that the
    /// socket could not take whole, or an error (with <paramref name="result"/> then holding nothing).
    /// </summary>
    private bool SendOnThisThread(ref ReadResult result, out Exception? error)
    {
        error = null;
        var batch = t_sendBatch ??= new IoBatch();
        while (!result.Buffer.IsEmpty)
        {
            var buffer = result.Buffer;
            AddSendBuffers(batch, buffer);
            batch.Execute(BatchEngine.CallingThread, NativeEngine.Send, useAio: false);
            long sent = batch.ResultAt(0);
            long requested = batch.RequestedAt(0);
            batch.Clear();

            if (CommitZeroCopy(sent))
            {
                continue;
            }

            if (sent < 0 && sent != -Errno.EAGAIN)
            {
                _output.Reader.AdvanceTo(buffer.Start);
                result = default;
                error = ErrorFor((int)-sent, "send");
                return false;
            }

            sent = Math.Max(sent, 0);
            _loop.AddBytesSentOffLoop(sent);
            _output.Reader.AdvanceTo(buffer.GetPosition(sent));
            if (!TryStartRead(out result, out error))
            {
                return true;
            }

            if (error is not null || sent < requested)
            {
                // A full socket: the loop sends the rest when it can, and waits for EPOLLOUT if it must.
                return false;
            }
        }

        return false;
    }

    /// <summary>On the loop: what a pool thread handed back from <see cref="OnOutputReadable"/>.</summary>
    private void OnHandedBack()
    {
        ReadResult result;
        Exception? error;
        lock (_sendLock)
        {
            result = _handedBack;
            error = _handedBackError;
            _handedBack = default;
            _handedBackError = null;
        }

        OnPendingReadDone(result, error);
    }

    /// <summary>On the loop: the outcome of a read that was pending (<paramref name="result"/> is live when <paramref name="error"/> is null).</summary>
    private void OnPendingReadDone(ReadResult result, Exception? error)
    {
        _readPending = false;
        if (_sendDone)
        {
            // EndSend cancelled this read, or ended the send side while a pool thread had it; the
            // reader can be completed now.
            if (error is null)
            {
                _output.Reader.AdvanceTo(result.Buffer.Start);
            }

            CompleteOutput(_pendingOutputError);
            return;
        }

        OnOutputRead(result, error);
    }

    private void OnOutputRead(ReadResult result, Exception? error)
    {
        if (error is not null)
        {
            EndSend(error, graceful: false);
            return;
        }

        if (result.Buffer.IsEmpty)
        {
            _output.Reader.AdvanceTo(result.Buffer.End);
            if (result.IsCompleted || result.IsCanceled)
            {
                EndSend(null, graceful: true);
            }
            else
            {
                ReadOutput();
            }

            return;
        }

        _readResult = result;
        _hasReadResult = true;
        if (!_sendQueued)
        {
            _sendQueued = true;
            if (_loop.Options.Tuning.DeferSend)
            {
                _loop.QueueSend(this);
            }
            else
            {
                _loop.SendNow(this);
            }
        }
    }

    public void PrepareSend(IoBatch batch)
    {
        _sendQueued = false;
        if (_sendDone || !_hasReadResult || _fdClosed)
        {
            return;
        }

        AddSendBuffers(batch, _readResult.Buffer);
    }

    private void AddSendBuffers(IoBatch batch, in ReadOnlySequence<byte> buffer)
    {
        int flags = 0;
        if (_zeroCopy is { } zeroCopy && buffer.Length >= _loop.ZeroCopySendThreshold
            && (!zeroCopy.KernelCopies || _loop.Options.Tuning.ZeroCopyWhenKernelCopies))
        {
            if (zeroCopy.SkipNext)
            {
                zeroCopy.SkipNext = false;
            }
            else if (zeroCopy.Stage(buffer, MaxBuffersPerSend))
            {
                flags = NativeEngine.SendZeroCopy;
            }
        }

        batch.BeginOp(this, Fd, flags);
        int buffers = 0;
        foreach (var segment in buffer)
        {
            if (segment.IsEmpty)
            {
                continue;
            }

            batch.AddBuffer(segment);
            if (++buffers == MaxBuffersPerSend)
            {
                break;
            }
        }
    }

    public void CompleteSend(long result, long requested)
    {
        if (!_hasReadResult)
        {
            return;
        }

        var buffer = _readResult.Buffer;
        bool writerCompleted = _readResult.IsCompleted;
        _hasReadResult = false;
        _readResult = default;

        if (CommitZeroCopy(result))
        {
            // Read the same bytes again; CommitZeroCopy made the next send a copying one.
            _output.Reader.AdvanceTo(buffer.Start);
            ReadOutput();
        }
        else if (result >= 0)
        {
            _output.Reader.AdvanceTo(buffer.GetPosition(result));
            if (result < requested)
            {
                // The socket's send buffer is full. The EPOLLOUT edge (the registration is
                // edge-triggered, for writes too) resumes us.
                _waitingWritable = true;
            }
            else if (writerCompleted && result == buffer.Length)
            {
                EndSend(null, graceful: true);
            }
            else
            {
                ReadOutput();
            }
        }
        else if (result == -Errno.EAGAIN)
        {
            _output.Reader.AdvanceTo(buffer.Start);
            _waitingWritable = true;
        }
        else
        {
            _output.Reader.AdvanceTo(buffer.Start);
            EndSend(ErrorFor((int)-result, "send"), graceful: false);
        }
    }

    /// <summary>
    /// After a send op, with the connection's send side owned: when it was a zero-copy send, the
    /// blocks it pointed into stay held until the kernel completes it (this must happen before the
    /// reader advances past them). True when it was one that failed with ENOBUFS (too many completions
    /// pending, msg_zerocopy.rst): the caller sends the same bytes again, and that send copies.
    /// </summary>
    private bool CommitZeroCopy(long result)
    {
        if (_zeroCopy is null || !_zeroCopy.Commit(result))
        {
            return false;
        }

        if (result > 0)
        {
            _loop.Metrics.ZeroCopySends.Add(1);
        }

        _zeroCopy.SkipNext = result == -Errno.ENOBUFS;
        if (_zeroCopy.SkipNext)
        {
            _loop.OnZeroCopyRefused();
        }

        return _zeroCopy.SkipNext;
    }

    /// <summary>
    /// On the loop: takes the kernel's MSG_ZEROCOPY completions off the socket's error queue and lets
    /// their blocks go; closes the fd if that waited for them. True when there were any.
    /// </summary>
    private bool ReapZeroCopy()
    {
        bool any = false;
        lock (_sendLock)
        {
            int rc;
            while ((rc = Interop.Socket.ReadZeroCopyCompletion(Fd, out uint first, out uint last, out bool copied)) >= 0)
            {
                if (rc == 1)
                {
                    any = true;
                    int completed = _zeroCopy!.Complete(first, last, copied);
                    _loop.Metrics.ZeroCopyCompletions.Add(completed, copied ? TransportMetrics.Copied : TransportMetrics.NotCopied);
                }
            }
        }

        if (_closeAwaitsZeroCopy && _zeroCopy!.InFlight == 0)
        {
            _closeAwaitsZeroCopy = false;
            CloseOnLoop();
        }

        return any;
    }

    private Exception? _pendingOutputError;
    private bool _outputCompletionDeferred;

    // ConnectionClosed callbacks against an output completion the loop holds back for them:
    // NotYet, then either Waiting (the loop holds it; the callbacks' thread posts back to the loop
    // when they are done) or Done (they ran first; the loop completes at once). Only a held-back
    // completion costs a post back to the loop.
    private const int CallbacksNotYet = 0;
    private const int CallbacksWaiting = 1;
    private const int CallbacksDone = 2;
    private int _callbacksState;

    private void EndSend(Exception? error, bool graceful)
    {
        lock (_sendLock)
        {
            if (_sendDone)
            {
                return;
            }

            _sendDone = true;
            if (_hasReadResult)
            {
                _output.Reader.AdvanceTo(_readResult.Buffer.Start);
                _hasReadResult = false;
                _readResult = default;
            }

            if (_readPending)
            {
                // The read's continuation (or a pool thread's hand-back) completes the reader.
                _pendingOutputError = error;
                _output.Reader.CancelPendingRead();
            }
            else
            {
                CompleteOutput(error);
            }
        }

        if (graceful && !_fdClosed)
        {
            // Everything the app wrote is in the kernel: FIN follows it (shutdown(2)).
            Interop.Socket.Shutdown(Fd, Interop.Socket.SHUT_WR);
        }

        // As the Sockets transport does, the end of the send side ends the connection; input
        // readers learn why.
        EndReceive(error ?? _abortReason ?? new ConnectionAbortedException("The Linux transport's send side completed."));
        MaybeClose();
    }

    /// <summary>
    /// Completes the transport's reader of the app's output. As the Sockets transport does, the app's
    /// output learns only of unexpected errors: after a reset or an abort its flushes report completion,
    /// not an exception (which Kestrel would log as unexpected). And it learns of it only after the
    /// ConnectionClosed callbacks have run, so Kestrel has aborted the request before any flush of the
    /// app can return as if the response had gone out; until then backpressure holds the app's writes.
    /// Kestrel then discards further writes, and fires RequestAborted from a thread-pool work item of
    /// its own, which may run after the app's remaining writes have returned (on Sockets too).
    /// </summary>
    private void CompleteOutput(Exception? error)
    {
        if (error is ConnectionResetException or ConnectionAbortedException)
        {
            if (Interlocked.CompareExchange(ref _callbacksState, CallbacksWaiting, CallbacksNotYet) != CallbacksDone)
            {
                _outputCompletionDeferred = true;
                return;
            }

            error = null;
        }

        _output.Reader.Complete(error);
        MaybeClose();
    }

    /// <summary>On the loop, once the ConnectionClosed callbacks have run, when it held the output back for them.</summary>
    private void OnConnectionClosedCallbacksDone()
    {
        Debug.Assert(_outputCompletionDeferred);
        _outputCompletionDeferred = false;
        _output.Reader.Complete();
        MaybeClose();
    }

    // ---- Ending -------------------------------------------------------------------------------

    /// <summary>The app disposed the connection: end both sides, gracefully where still possible.</summary>
    private void EndOnLoop()
    {
        // The app's writer is complete, so whatever is in flight on the send side (a pending read, a
        // queued send, a wait for EPOLLOUT) runs to the end of the data and then ends it gracefully,
        // as the Sockets transport drains before its DisposeAsync returns. A pending input flush
        // completes because the app's reader is complete.
        if (!_flushPending)
        {
            EndReceive(null);
        }

        MaybeClose();
    }

    /// <summary>Resets the connection (SO_LINGER 0, then close).</summary>
    public void AbortOnLoop(ConnectionAbortedException? reason)
    {
        if (_fdClosed)
        {
            return;
        }

        Interlocked.CompareExchange(ref _abortReason, reason, null);
        _reset = true;
        Interop.Socket.SetLingerZero(Fd);
        EndReceive(_abortReason);
        EndSend(_abortReason, graceful: false);
        CloseOnLoop();
    }

    /// <summary>A fault in this connection's processing: reset it, never the loop.</summary>
    public void Fail(Exception error)
    {
        AbortOnLoop(error as ConnectionAbortedException ?? new ConnectionAbortedException(error.Message, error));
    }

    private void MaybeClose()
    {
        if (_receiveDone && _sendDone)
        {
            CloseOnLoop();
        }
    }

    /// <summary>Closes the fd exactly once, and reports closure once the pipes are released too.</summary>
    private void CloseOnLoop()
    {
        if (!_fdClosed)
        {
            if (_zeroCopy is { InFlight: > 0 } && !_reset)
            {
                // The kernel still reads zero-copy sends from pool blocks, and their completions are
                // lost with the fd: close once they are in (ReapZeroCopy). An abort resets instead.
                _closeAwaitsZeroCopy = true;
                return;
            }

            lock (_sendLock)
            {
                // A pool thread that is sending holds the lock; once it is set, none sends again.
                _fdClosed = true;
            }

            _loop.Unregister(this);
            LibC.CloseFd(Fd);

            // A reset's close drops the socket's queued data, and the kernel's references to the
            // blocks with it.
            _zeroCopy?.ReleaseAll();
            FireConnectionClosed();
        }

        // A pending flush or read will report back on this loop (they were cancelled), and an output
        // held back for the ConnectionClosed callbacks completes after them; the pipes' blocks go back
        // to the pool when both sides are complete.
        if (!_flushPending && !_readPending && !_outputCompletionDeferred)
        {
            Debug.Assert(_receiveDone && _sendDone);
            _closed.TrySetResult();
        }
    }

    private void FireConnectionClosed()
    {
        if (Interlocked.Exchange(ref _connectionClosedFired, 1) == 0)
        {
            // User callbacks on the token must not run on the loop thread. Once they have run, the
            // loop may complete an output it held back for them (CompleteOutput).
            ThreadPool.UnsafeQueueUserWorkItem(static connection =>
            {
                try
                {
                    connection._connectionClosedSource.Cancel();
                }
                catch (ObjectDisposedException)
                {
                }

                if (Interlocked.Exchange(ref connection._callbacksState, CallbacksDone) == CallbacksWaiting)
                {
                    connection._loop.Post(static s => ((LinuxConnection)s!).OnConnectionClosedCallbacksDone(), connection);
                }
            }, this, preferLocal: false);
        }
    }

    /// <summary>A completed pipe operation's result, or the exception it completed with.</summary>
    private static T Outcome<T>(ValueTask<T> operation, out Exception? error)
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

    private Exception ErrorFor(int errno, string operation) => errno switch
    {
        Errno.ECONNRESET or Errno.EPIPE => new ConnectionResetException($"{operation} failed on connection {ConnectionId}: {Errno.Describe(errno)}."),
        _ => _abortReason ?? (Exception)new IOException($"{operation} failed on connection {ConnectionId}: {Errno.Describe(errno)}."),
    };

    string IConnectionIdFeature.ConnectionId
    {
        get => ConnectionId;
        set => ConnectionId = value;
    }

    void IConnectionLifetimeFeature.Abort() => Abort(new ConnectionAbortedException("The connection was aborted by the application via IConnectionLifetimeFeature.Abort()."));

    private sealed class DuplexPipe(PipeReader input, PipeWriter output) : IDuplexPipe
    {
        public PipeReader Input { get; } = input;

        public PipeWriter Output { get; } = output;
    }
}
