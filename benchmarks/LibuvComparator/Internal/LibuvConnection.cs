using System.Buffers;
using System.IO.Pipelines;
using System.Net;
using System.Runtime.InteropServices;
using LibuvComparator.Interop;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Connections.Features;
using Microsoft.AspNetCore.Http.Features;

// The pipes' ValueTasks are stored and read back in their completion callbacks, which only run
// once they have completed; CA2012 cannot see that.
#pragma warning disable CA2012

namespace LibuvComparator.Internal;

/// <summary>
/// One accepted uv_tcp_t and its two pipes. Reads: uv_read_start into memory from the input pipe,
/// stopped while a flush waits for the application. Writes: the output pipe's segments go out in one
/// uv_write, one write in flight at a time. Every method without a thread note runs on the owning
/// loop's thread; <see cref="Abort"/> and <see cref="DisposeAsync"/> may be called from anywhere
/// and post to the loop.
/// </summary>
internal sealed class LibuvConnection : ConnectionContext,
    IConnectionIdFeature, IConnectionTransportFeature, IConnectionItemsFeature,
    IMemoryPoolFeature, IConnectionLifetimeFeature, IConnectionEndPointFeature, IUvHandleOwner
{
    /// <summary>Reads ask for at least this much room: half a 4 KiB pool block, as Kestrel's transports do.</summary>
    private const int MinReadSize = 2048;

    private static long s_lastId;

    private readonly LibuvLoop _loop;
    private readonly Pipe _input;
    private readonly Pipe _output;
    private readonly CancellationTokenSource _connectionClosedSource = new();
    private readonly TaskCompletionSource _closed = new(TaskCreationOptions.RunContinuationsAsynchronously);
    private readonly Action _onInputFlushed;
    private readonly Action _onOutputReadable;
    private readonly FeatureCollection _features = new();

    // Native state: the handle, one reusable request of each kind, and the GCHandle their data
    // fields hold. All freed in the close callback.
    private nint _handle;
    private nint _writeReq;
    private nint _shutdownReq;
    private GCHandle _self;

    private string? _connectionId;
    private IDictionary<object, object?>? _items;

    // Receive side.
    private bool _reading;
    private bool _receiveDone;
    private bool _flushPending;
    private ValueTask<FlushResult> _flush;
    private MemoryHandle _readPin;
    private Exception? _allocError;
    private Exception? _pendingInputError;

    // Send side.
    private bool _sendDone;
    private bool _outputReadPending;
    private ValueTask<ReadResult> _outputRead;
    private bool _writePending;
    private ReadOnlySequence<byte> _writeBuffer;
    private SequencePosition _writeEnd;
    private bool _writeEndsOutput;
    private MemoryHandle[] _writePins = new MemoryHandle[4];
    private int _writePinCount;
    private Exception? _pendingOutputError;

    // Closing.
    private bool _closing;
    private bool _handleClosed;
    private bool _resetOnClose;
    private int _connectionClosedFired;
    private ConnectionAbortedException? _abortReason;

    public LibuvConnection(LibuvLoop loop, nint handle, EndPoint? localEndPoint, EndPoint? remoteEndPoint)
    {
        _loop = loop;
        _handle = handle;
        LocalEndPoint = localEndPoint;
        RemoteEndPoint = remoteEndPoint;

        _input = new Pipe(loop.InputPipeOptions);
        _output = new Pipe(loop.OutputPipeOptions);
        Transport = new DuplexPipe(_input.Reader, _output.Writer);
        _onInputFlushed = OnInputFlushed;
        _onOutputReadable = OnOutputReadable;

        _self = GCHandle.Alloc(this);
        nint self = GCHandle.ToIntPtr(_self);
        _writeReq = UvMemory.AllocateRequest(UvReqType.Write);
        _shutdownReq = UvMemory.AllocateRequest(UvReqType.Shutdown);
        Uv.uv_handle_set_data(_handle, self);
        Uv.uv_req_set_data(_writeReq, self);
        Uv.uv_req_set_data(_shutdownReq, self);

        _features.Set<IConnectionIdFeature>(this);
        _features.Set<IConnectionTransportFeature>(this);
        _features.Set<IConnectionItemsFeature>(this);
        _features.Set<IMemoryPoolFeature>(this);
        _features.Set<IConnectionLifetimeFeature>(this);
        _features.Set<IConnectionEndPointFeature>(this);
    }

    public override string ConnectionId
    {
        get => _connectionId ??= $"U{Interlocked.Increment(ref s_lastId):X8}";
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

    /// <summary>Thread-safe. Resets the connection (RST); reads end with <paramref name="abortReason"/>.</summary>
    public override void Abort(ConnectionAbortedException abortReason)
    {
        Interlocked.CompareExchange(ref _abortReason, abortReason, null);
        _loop.Schedule(static s => ((LibuvConnection)s!).AbortOnLoop(null), this);
    }

    /// <summary>
    /// Thread-safe. Completes the application's side of both pipes (the transport's own pipe ends,
    /// not <see cref="Transport"/>, which middleware may have replaced) and waits until the handle is
    /// closed: what the application wrote is sent first, then FIN.
    /// </summary>
    public override async ValueTask DisposeAsync()
    {
        _input.Reader.Complete();
        _output.Writer.Complete();
        _loop.Schedule(static s => ((LibuvConnection)s!).EndReceive(null), this);
        await _closed.Task;
        _connectionClosedSource.Dispose();
        await base.DisposeAsync();
    }

    public void Start()
    {
        StartReading();
        ReadOutput();
    }

    // ---- Receive side -------------------------------------------------------------------------

    private unsafe void StartReading()
    {
        if (_reading || _receiveDone || _closing)
        {
            return;
        }

        int rc = Uv.uv_read_start(_handle, &OnAlloc, &OnRead);
        if (rc < 0)
        {
            EndReceive(ErrorFor(rc, "uv_read_start"));
            return;
        }

        _reading = true;
    }

    private void StopReading()
    {
        if (_reading)
        {
            _reading = false;
            _ = Uv.uv_read_stop(_handle);
        }
    }

    [UnmanagedCallersOnly]
    private static unsafe void OnAlloc(nint handle, nuint suggestedSize, UvBuf* buffer)
    {
        // Never close or stop the handle here: libuv calls the read callback right after, and
        // uv_read_stop would have cleared it. A failure is reported through UV_ENOBUFS instead.
        LibuvConnection? connection = null;
        try
        {
            connection = UvMemory.HandleOwner<LibuvConnection>(handle);
            var memory = connection._input.Writer.GetMemory(MinReadSize);
            connection._readPin = memory.Pin();
            buffer->Base = (byte*)connection._readPin.Pointer;
            buffer->Length = (nuint)memory.Length;
        }
        catch (Exception e)
        {
            connection?._allocError = e;
            buffer->Base = null;
            buffer->Length = 0;
        }
    }

    [UnmanagedCallersOnly]
    private static unsafe void OnRead(nint stream, nint nread, UvBuf* buffer)
    {
        LibuvConnection? connection = null;
        try
        {
            connection = UvMemory.HandleOwner<LibuvConnection>(stream);
            connection.CompleteRead(nread);
        }
        catch (Exception e)
        {
            Fault(connection, e);
        }
    }

    private void CompleteRead(nint nread)
    {
        _readPin.Dispose();
        _readPin = default;

        if (nread > 0)
        {
            _input.Writer.Advance((int)nread);
            FlushInput();
        }
        else if (nread == UvError.EOF)
        {
            EndReceive(null);
        }
        else if (nread == UvError.ENOBUFS && _allocError is { } allocError)
        {
            Fault(allocError);
        }
        else if (nread < 0)
        {
            EndReceive(ErrorFor((int)nread, "read"));
        }

        // nread == 0 is EAGAIN: nothing was read and the buffer is simply not advanced.
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
            // Backpressure: the application has MaxReadBufferSize unread. Stop reading until it catches up.
            StopReading();
            _flushPending = true;
            _flush = flush;
            flush.GetAwaiter().UnsafeOnCompleted(_onInputFlushed);
        }
    }

    /// <summary>The input pipe's writer scheduler is the loop: this runs on it (on the thread pool once the loop has exited).</summary>
    private void OnInputFlushed()
    {
        try
        {
            _flushPending = false;
            var flush = _flush;
            _flush = default;
            FlushResult result = default;
            Exception? error = null;
            try
            {
                result = flush.GetAwaiter().GetResult();
            }
            catch (Exception e)
            {
                error = e;
            }

            if (_receiveDone)
            {
                // The receive side ended while the flush was pending; finish what EndReceive deferred.
                _input.Writer.Complete(_pendingInputError);
                MaybeFinish();
            }
            else if (error is not null)
            {
                EndReceive(error);
            }
            else
            {
                AfterInputFlush(result);
            }
        }
        catch (Exception e)
        {
            Fault(e);
        }
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
            StartReading();
        }
    }

    private void EndReceive(Exception? error)
    {
        if (_receiveDone)
        {
            return;
        }

        _receiveDone = true;
        StopReading();
        if (_flushPending)
        {
            // Completing the writer under a pending flush would race its callback: cancel the flush
            // and complete when it reports back.
            _pendingInputError = error;
            _input.Writer.CancelPendingFlush();
        }
        else
        {
            _input.Writer.Complete(error);
        }

        FireConnectionClosed();
    }

    // ---- Send side ----------------------------------------------------------------------------

    private void ReadOutput()
    {
        if (_sendDone || _outputReadPending || _writePending)
        {
            return;
        }

        ValueTask<ReadResult> read;
        try
        {
            read = _output.Reader.ReadAsync();
        }
        catch (Exception e)
        {
            EndSend(e, graceful: false);
            return;
        }

        if (read.IsCompleted)
        {
            OnOutputRead(read);
        }
        else
        {
            _outputReadPending = true;
            _outputRead = read;
            read.GetAwaiter().UnsafeOnCompleted(_onOutputReadable);
        }
    }

    /// <summary>The output pipe's reader scheduler is the loop: this runs on it (on the thread pool once the loop has exited).</summary>
    private void OnOutputReadable()
    {
        try
        {
            _outputReadPending = false;
            var read = _outputRead;
            _outputRead = default;
            if (_sendDone)
            {
                // EndSend cancelled this read; the reader can be completed now.
                try
                {
                    _output.Reader.AdvanceTo(read.GetAwaiter().GetResult().Buffer.Start);
                }
                catch (Exception)
                {
                    // The application completed its writer with an error; the send side is over either way.
                }

                _output.Reader.Complete(_pendingOutputError);
                MaybeFinish();
                return;
            }

            OnOutputRead(read);
        }
        catch (Exception e)
        {
            Fault(e);
        }
    }

    private void OnOutputRead(ValueTask<ReadResult> read)
    {
        ReadResult result;
        try
        {
            result = read.GetAwaiter().GetResult();
        }
        catch (Exception e)
        {
            // The application completed its output with an error.
            EndSend(e, graceful: false);
            return;
        }

        var buffer = result.Buffer;
        if (buffer.IsEmpty)
        {
            _output.Reader.AdvanceTo(buffer.End);
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

        Write(buffer, result.IsCompleted);
    }

    private unsafe void Write(in ReadOnlySequence<byte> buffer, bool outputCompleted)
    {
        UvBuf* buffers = _loop.WriteBuffers;
        int count = 0;
        long bytes = 0;
        foreach (var segment in buffer)
        {
            if (segment.IsEmpty)
            {
                continue;
            }

            if (count == LibuvLoop.MaxWriteBuffers)
            {
                break;
            }

            if (count == _writePins.Length)
            {
                Array.Resize(ref _writePins, Math.Min(count * 2, LibuvLoop.MaxWriteBuffers));
            }

            // Kestrel's pool blocks are pinned already, so Pin() only takes the address; memory
            // from another pool gets a pinning GCHandle until the write completes.
            var pin = segment.Pin();
            _writePins[count] = pin;
            buffers[count].Base = (byte*)pin.Pointer;
            buffers[count].Length = (nuint)segment.Length;
            count++;
            bytes += segment.Length;
        }

        _writePinCount = count;
        bool all = bytes == buffer.Length;
        _writeBuffer = buffer;
        _writeEnd = all ? buffer.End : buffer.GetPosition(bytes);
        _writeEndsOutput = all && outputCompleted;

        int rc = Uv.uv_write(_writeReq, _handle, buffers, (uint)count, &OnWriteCompleted);
        if (rc < 0)
        {
            ReleaseWrite();
            _output.Reader.AdvanceTo(buffer.Start);
            EndSend(ErrorFor(rc, "uv_write"), graceful: false);
            return;
        }

        _writePending = true;
    }

    [UnmanagedCallersOnly]
    private static void OnWriteCompleted(nint req, int status)
    {
        LibuvConnection? connection = null;
        try
        {
            connection = UvMemory.RequestOwner<LibuvConnection>(req);
            connection.CompleteWrite(status);
        }
        catch (Exception e)
        {
            Fault(connection, e);
        }
    }

    private void CompleteWrite(int status)
    {
        _writePending = false;
        var buffer = _writeBuffer;
        ReleaseWrite();

        if (_sendDone)
        {
            // The connection was aborted (or its loop stopped) while the write was in flight: libuv
            // cancelled it, and the reader completion EndSend deferred happens now.
            _output.Reader.AdvanceTo(buffer.Start);
            _output.Reader.Complete(_pendingOutputError);
            MaybeFinish();
            return;
        }

        if (status < 0)
        {
            _output.Reader.AdvanceTo(buffer.Start);
            EndSend(ErrorFor(status, "write"), graceful: false);
            return;
        }

        _output.Reader.AdvanceTo(_writeEnd);
        if (_writeEndsOutput)
        {
            EndSend(null, graceful: true);
        }
        else
        {
            ReadOutput();
        }
    }

    private void ReleaseWrite()
    {
        for (int i = 0; i < _writePinCount; i++)
        {
            _writePins[i].Dispose();
            _writePins[i] = default;
        }

        _writePinCount = 0;
        _writeBuffer = default;
    }

    private unsafe void EndSend(Exception? error, bool graceful)
    {
        if (_sendDone)
        {
            return;
        }

        _sendDone = true;
        if (_outputReadPending)
        {
            _pendingOutputError = error;
            _output.Reader.CancelPendingRead();
        }
        else if (_writePending)
        {
            // Completed when libuv reports the write (cancelled by the close below).
            _pendingOutputError = error;
        }
        else
        {
            _output.Reader.Complete(error);
        }

        // As in Kestrel's Sockets transport, the end of the send side ends the connection; input
        // readers learn why.
        EndReceive(error ?? _abortReason ?? new ConnectionAbortedException("The libuv comparator's send side completed."));

        if (graceful && !_closing)
        {
            // Everything the application wrote has been handed to the kernel: FIN follows it.
            int rc = Uv.uv_shutdown(_shutdownReq, _handle, &OnShutdownCompleted);
            if (rc == 0)
            {
                return;
            }
        }

        CloseHandle();
    }

    [UnmanagedCallersOnly]
    private static void OnShutdownCompleted(nint req, int status)
    {
        LibuvConnection? connection = null;
        try
        {
            connection = UvMemory.RequestOwner<LibuvConnection>(req);
            connection.CloseHandle();
        }
        catch (Exception e)
        {
            Fault(connection, e);
        }
    }

    // ---- Ending -------------------------------------------------------------------------------

    /// <summary>Resets the connection: input ends with the abort reason, the peer gets RST.</summary>
    public void AbortOnLoop(ConnectionAbortedException? reason)
    {
        if (reason is not null)
        {
            Interlocked.CompareExchange(ref _abortReason, reason, null);
        }

        if (_closing)
        {
            return;
        }

        var why = _abortReason ?? new ConnectionAbortedException("The connection was aborted.");
        _resetOnClose = true;
        EndReceive(why);
        EndSend(why, graceful: false);

        // When the send side had ended already, a graceful shutdown is in flight: reset it.
        CloseHandle();
    }

    void IUvHandleOwner.CloseForLoopShutdown()
        => AbortOnLoop(new ConnectionAbortedException("The libuv comparator's loop is stopping."));

    private static void Fault(LibuvConnection? connection, Exception error)
    {
        if (connection is null)
        {
            LibuvLoop.LogCallbackFailure(error);
        }
        else
        {
            connection.Fault(error);
        }
    }

    /// <summary>A fault in this connection's processing: reset it, never the loop.</summary>
    private void Fault(Exception error)
    {
        try
        {
            ComparatorLog.ConnectionFault(_loop.Logger, ConnectionId, error);
            if (_loop.IsOnLoopThread)
            {
                AbortOnLoop(error as ConnectionAbortedException ?? new ConnectionAbortedException(error.Message, error));
            }
        }
        catch (Exception e)
        {
            LibuvLoop.LogCallbackFailure(e);
        }
    }

    private unsafe void CloseHandle()
    {
        if (_closing || !_loop.IsOnLoopThread)
        {
            return;
        }

        _closing = true;
        _reading = false;
        if (_resetOnClose)
        {
            // uv_tcp_close_reset (libuv 1.32) sets SO_LINGER 0 and closes; it refuses (UV_EINVAL)
            // while a shutdown is in flight, and then SO_LINGER is set here before a plain close.
            if (Uv.uv_tcp_close_reset(_handle, &OnClosed) == 0)
            {
                return;
            }

            int fd;
            if (Uv.uv_fileno(_handle, &fd) == 0)
            {
                ListenSocket.SetLingerZero(fd);
            }
        }

        Uv.uv_close(_handle, &OnClosed);
    }

    [UnmanagedCallersOnly]
    private static void OnClosed(nint handle)
    {
        try
        {
            UvMemory.HandleOwner<LibuvConnection>(handle).HandleClosed();
        }
        catch (Exception e)
        {
            LibuvLoop.LogCallbackFailure(e);
        }
    }

    private void HandleClosed()
    {
        // libuv has called back every request of this handle (cancelled ones with UV_ECANCELED)
        // before this close callback, so the blocks are free to go.
        UvMemory.Free(_handle);
        UvMemory.Free(_writeReq);
        UvMemory.Free(_shutdownReq);
        _handle = _writeReq = _shutdownReq = 0;
        _self.Free();
        _handleClosed = true;
        FireConnectionClosed();
        MaybeFinish();
    }

    /// <summary>DisposeAsync returns once the handle is closed and both of the transport's pipe ends are complete.</summary>
    private void MaybeFinish()
    {
        if (_handleClosed && !_flushPending && !_outputReadPending && !_writePending)
        {
            _closed.TrySetResult();
        }
    }

    private void FireConnectionClosed()
    {
        if (Interlocked.Exchange(ref _connectionClosedFired, 1) == 0)
        {
            // User callbacks on the token must not run on the loop thread.
            ThreadPool.UnsafeQueueUserWorkItem(static source =>
            {
                try
                {
                    source.Cancel();
                }
                catch (ObjectDisposedException)
                {
                }
            }, _connectionClosedSource, preferLocal: false);
        }
    }

    private Exception ErrorFor(int status, string operation) => status switch
    {
        UvError.ECONNRESET or UvError.EPIPE => new ConnectionResetException($"{operation} failed on connection {ConnectionId}: {Uv.Describe(status)}."),
        UvError.ECANCELED when _abortReason is not null => _abortReason,
        _ => new IOException($"{operation} failed on connection {ConnectionId}: {Uv.Describe(status)}."),
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
