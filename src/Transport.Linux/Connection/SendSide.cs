using System.Buffers;
using System.IO.Pipelines;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Interop;
using Microsoft.AspNetCore.Connections;

// The pipe's ValueTask is stored and read back in its completion callback, which only runs once it has
// completed; CA2012 cannot see that.
#pragma warning disable CA2012

namespace Kestrel.Transport.Linux.Connection;

/// <summary>
/// A connection's send side: the output pipe to the socket. It reads what the app flushed and sends it in
/// one gathered write: queued for the loop's end-of-pass batch, or, with ThreadPool scheduling, sent at once
/// by the pool thread that resumed the read (<see cref="PoolThreadSends"/>). What the socket cannot take
/// waits for EPOLLOUT; large sends may go out with MSG_ZEROCOPY (<see cref="ZeroCopySends"/>). The threads it
/// runs on, and the lock that keeps them apart, are described on <see cref="LinuxConnection"/>.
/// </summary>
internal sealed class SendSide : IBatchOwner
{
    /// <summary>At most this many buffers go into one sendmsg (IOV_MAX is 1024, sysconf(3)); the rest goes next.</summary>
    internal const int MaxBuffersPerSend = 64;

    private readonly LinuxConnection _connection;
    private readonly PipeReader _output;
    private readonly Action _onReadable;
    private readonly PoolThreadSends _poolSends;

    private bool _queued;
    private bool _hasReadResult;
    private IoBatch? _opBatch;
    private int _opIndex;
    private ReadResult _readResult;
    private ValueTask<ReadResult> _read;
    private Exception? _pendingError;

    public SendSide(LinuxConnection connection, PipeReader output, ZeroCopySends? zeroCopy)
    {
        _connection = connection;
        _output = output;
        ZeroCopy = zeroCopy;
        _onReadable = OnReadable;
        _poolSends = new PoolThreadSends(connection, this, output);
    }

    /// <summary>
    /// Held by a pool thread while it sends, and by the loop to end the side, take zero-copy completions or close
    /// the socket. The loop's own sends need no lock: the output's read result is in one thread's hands at a time
    /// (<see cref="ReadPending"/>), and a pool thread sends only what its own read returned.
    /// </summary>
    public Lock Lock { get; } = new();

    /// <summary>True once the send side has ended (under <see cref="Lock"/>).</summary>
    public bool IsDone { get; private set; }

    /// <summary>True while a read of the output pipe is pending, or a pool thread's hand-back is on its way to the loop.</summary>
    public bool ReadPending { get; set; }

    /// <summary>True while a send the socket could not take whole waits for EPOLLOUT.</summary>
    public bool WaitingWritable { get; private set; }

    /// <summary>True while the output's completion waits for the ConnectionClosed callbacks (see <see cref="CompleteOutput"/>).</summary>
    public bool OutputHeldBack { get; private set; }

    /// <summary>This connection's MSG_ZEROCOPY sends; null when zero-copy is off for it.</summary>
    public ZeroCopySends? ZeroCopy { get; }

    public void Start() => ReadOutput();

    /// <summary>EPOLLOUT (or an error) while a send waited for room: send the rest.</summary>
    public void OnWritable()
    {
        WaitingWritable = false;
        ReadOutput();
    }

    public void ReadOutput()
    {
        if (IsDone || ReadPending)
        {
            return;
        }

        if (TryStartRead(out var result, out var error))
        {
            OnRead(result, error);
        }
    }

    /// <summary>
    /// Reads the app's output: true with the outcome when the read completed at once, false when its
    /// continuation (<see cref="OnReadable"/>) was registered. Any thread that owns the side.
    /// </summary>
    public bool TryStartRead(out ReadResult result, out Exception? error)
    {
        result = default;
        error = null;
        try
        {
            var read = _output.ReadAsync();
            if (!read.IsCompleted)
            {
                ReadPending = true;
                _read = read;
                read.GetAwaiter().UnsafeOnCompleted(_onReadable);
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
    private void OnReadable()
    {
        var result = LinuxConnection.Outcome(_read, out var error);
        _read = default;

        if (_connection.Loop.IsLoopThread)
        {
            OnPendingReadDone(result, error);
            return;
        }

        _poolSends.Send(result, error);
    }

    /// <summary>On the loop: the outcome of a read that was pending (<paramref name="result"/> is live when <paramref name="error"/> is null).</summary>
    public void OnPendingReadDone(ReadResult result, Exception? error)
    {
        ReadPending = false;
        if (IsDone)
        {
            // End cancelled this read, or ended the side while a pool thread had it: the reader can be
            // completed now.
            if (error is null)
            {
                _output.AdvanceTo(result.Buffer.Start);
            }

            CompleteOutput(_pendingError);
            return;
        }

        OnRead(result, error);
    }

    private void OnRead(ReadResult result, Exception? error)
    {
        if (error is not null)
        {
            End(error, graceful: false);
            return;
        }

        if (result.Buffer.IsEmpty)
        {
            _output.AdvanceTo(result.Buffer.End);
            if (result.IsCompleted || result.IsCanceled)
            {
                End(null, graceful: true);
            }
            else
            {
                ReadOutput();
            }

            return;
        }

        _readResult = result;
        _hasReadResult = true;
        if (!_queued)
        {
            _queued = true;
            _connection.Loop.QueueSend(this);
        }
    }

    public void AddTo(IoBatch batch)
    {
        _queued = false;
        if (IsDone || !_hasReadResult || _connection.Socket.IsClosed)
        {
            return;
        }

        AddBuffers(batch, _readResult.Buffer, onLoop: true);
    }

    /// <summary>
    /// Adds one op for <paramref name="buffer"/>'s first <see cref="MaxBuffersPerSend"/> segments, zero-copy where it
    /// may; <paramref name="onLoop"/>: for the loop's batch, which the engine performs (else a pool thread's own).
    /// </summary>
    public void AddBuffers(IoBatch batch, in ReadOnlySequence<byte> buffer, bool onLoop)
    {
        uint tag = 0;
        int flags = ZeroCopy is { } zeroCopy ? zeroCopy.SendFlags(_connection, buffer, onLoop, out tag) : 0;
        _opBatch = batch;
        _opIndex = batch.Count;
        batch.BeginOp(this, _connection.Socket.Value, flags, tag);
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

    public void Complete(SysResult result, long requested)
    {
        if (!_hasReadResult)
        {
            return;
        }

        var buffer = _readResult.Buffer;
        bool writerCompleted = _readResult.IsCompleted;
        _hasReadResult = false;
        _readResult = default;

        if (ZeroCopy is { } zeroCopy && zeroCopy.AfterSend(_connection, result, _opBatch!.NotifiesAt(_opIndex)))
        {
            // Read the same bytes again; the refusal made the next send a copying one.
            _output.AdvanceTo(buffer.Start);
            ReadOutput();
        }
        else if (!result.IsError)
        {
            long sent = result.Value;
            _output.AdvanceTo(buffer.GetPosition(sent));
            if (sent < requested)
            {
                // The socket's send buffer is full. The EPOLLOUT edge (the registration is edge-triggered,
                // for writes too) resumes us.
                WaitingWritable = true;
            }
            else if (writerCompleted && sent == buffer.Length)
            {
                End(null, graceful: true);
            }
            else
            {
                ReadOutput();
            }
        }
        else if (result.Is(Errno.EAGAIN))
        {
            _output.AdvanceTo(buffer.Start);
            WaitingWritable = true;
        }
        else
        {
            _output.AdvanceTo(buffer.Start);
            End(_connection.ErrorFor(result.Error, "send"), graceful: false);
        }
    }

    public void Fault(Exception error) => _connection.Fault(error);

    /// <summary>
    /// Ends the send side: a graceful end shuts the socket's write side (FIN after everything the app wrote);
    /// either way the receive side ends too, as on the Sockets transport, and input readers learn why.
    /// </summary>
    public void End(Exception? error, bool graceful)
    {
        lock (Lock)
        {
            if (IsDone)
            {
                return;
            }

            IsDone = true;
            if (_hasReadResult)
            {
                _output.AdvanceTo(_readResult.Buffer.Start);
                _hasReadResult = false;
                _readResult = default;
            }

            if (ReadPending)
            {
                // The read's continuation (or a pool thread's hand-back) completes the reader.
                _pendingError = error;
                _output.CancelPendingRead();
            }
            else
            {
                CompleteOutput(error);
            }
        }

        if (graceful && !_connection.Socket.IsClosed)
        {
            _ = Interop.Socket.Shutdown(_connection.Socket.Value, Interop.Socket.SHUT_WR);
        }

        _connection.Receive.End(error ?? _connection.Lifetime.AbortReason ?? new ConnectionAbortedException("The Linux transport's send side completed."));
        _connection.Lifetime.MaybeClose();
    }

    /// <summary>
    /// Completes the transport's reader of the app's output. As the Sockets transport does, the app's output
    /// learns only of unexpected errors: after a reset or an abort its flushes report completion, not an
    /// exception (which Kestrel would log as unexpected). And it learns of it only after the ConnectionClosed
    /// callbacks have run, so Kestrel has aborted the request before any flush of the app can return as if
    /// the response had gone out; until then backpressure holds the app's writes.
    /// </summary>
    private void CompleteOutput(Exception? error)
    {
        if (error is ConnectionResetException or ConnectionAbortedException)
        {
            if (_connection.Lifetime.HoldUntilCallbacksRan())
            {
                OutputHeldBack = true;
                return;
            }

            error = null;
        }

        _output.Complete(error);
        _connection.Lifetime.MaybeClose();
    }

    /// <summary>On the loop, once the ConnectionClosed callbacks have run, for an output completion held back for them.</summary>
    public void CompleteHeldOutput()
    {
        OutputHeldBack = false;
        _output.Complete();
        _connection.Lifetime.MaybeClose();
    }
}
