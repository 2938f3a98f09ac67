using System.IO.Pipelines;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Interop;

// The pipe's ValueTask is stored and read back in its completion callback, which only runs once it has
// completed; CA2012 cannot see that.
#pragma warning disable CA2012

namespace Kestrel.Transport.Linux.Connection;

/// <summary>
/// A connection's receive side: the socket to the input pipe. The loop reads every readable socket in one
/// batch per pass; this side says how much to read, writes what arrived into the pipe, and stops reading
/// while the app has MaxReadBufferSize unread (backpressure). Loop thread only.
/// </summary>
internal sealed class ReceiveSide : IBatchOwner
{
    private readonly LinuxConnection _connection;
    private readonly PipeWriter _input;
    private readonly Action _onFlushed;
    private readonly bool _quickAck;

    private bool _readable;
    private bool _peerHungUp;
    private bool _queued;
    private ReadSize _readSize;
    private ValueTask<FlushResult> _flush;
    private Exception? _pendingError;

    public ReceiveSide(LinuxConnection connection, PipeWriter input, bool quickAck)
    {
        _connection = connection;
        _input = input;
        _quickAck = quickAck;
        _onFlushed = OnFlushed;
        _readSize = new ReadSize(connection.Loop.Options.Tuning.MaxBytesPerRead);
    }

    /// <summary>True once the input pipe's writer is complete, or about to be when a pending flush reports back.</summary>
    public bool IsDone { get; private set; }

    /// <summary>True while a flush waits for the app to read (backpressure); the pipe reports back on the loop.</summary>
    public bool FlushPending { get; private set; }

    /// <summary>The largest single read so far (diagnostics and tests).</summary>
    public long LargestRead => _readSize.Largest;

    /// <summary>
    /// epoll reported data, or the peer's FIN or an error (<paramref name="hungUp"/>), which a read reports in turn.
    /// After a hang-up no further edge comes, so the side then reads until end of stream.
    /// </summary>
    public void OnReadable(bool hungUp)
    {
        _peerHungUp |= hungUp;
        _readable = true;
        Queue();
    }

    private void Queue()
    {
        if (_readable && !IsDone && !FlushPending && !_queued)
        {
            _queued = true;
            _connection.Loop.QueueReceive(this);
        }
    }

    public void AddTo(IoBatch batch)
    {
        _queued = false;
        if (IsDone || FlushPending || _connection.Socket.IsClosed)
        {
            return;
        }

        batch.BeginOp(this, _connection.Socket.Value);
        batch.AddBuffer(_input.GetMemory(_readSize.Current));
    }

    public void Complete(SysResult result, long requested)
    {
        if (IsDone)
        {
            return;
        }

        if (result.IsError)
        {
            if (result.Is(Errno.EAGAIN))
            {
                _readable = false;
            }
            else
            {
                End(_connection.ErrorFor(result.Error, "recv"));
            }

            return;
        }

        long received = result.Value;
        if (received == 0)
        {
            End(null);
            return;
        }

        _input.Advance((int)received);
        _readSize.Observe(received, requested);
        if (_quickAck)
        {
            _ = Interop.Socket.SetOption(_connection.Socket.Value, Interop.Socket.IPPROTO_TCP, Interop.Socket.TCP_QUICKACK, 1);
        }

        // With edge-triggered epoll a short read means the socket is drained: any later arrival raises a
        // new edge. After a hang-up there is no further edge, so read until end of stream.
        if (received < requested && !_peerHungUp)
        {
            _readable = false;
        }

        Flush();
    }

    public void Fault(Exception error) => _connection.Fault(error);

    /// <summary>
    /// Ends the receive side: the input pipe's writer completes with <paramref name="error"/> (null: end of
    /// stream), and the connection's ConnectionClosed token fires.
    /// </summary>
    public void End(Exception? error)
    {
        if (IsDone)
        {
            return;
        }

        IsDone = true;
        if (FlushPending)
        {
            // Completing the writer under a pending flush would race the pipe's own callback: cancel the
            // flush and complete when it reports back.
            _pendingError = error;
            _input.CancelPendingFlush();
        }
        else
        {
            _input.Complete(error);
        }

        _connection.Lifetime.FireConnectionClosed();
        _connection.Lifetime.MaybeClose();
    }

    private void Flush()
    {
        var flush = _input.FlushAsync();
        if (flush.IsCompleted)
        {
            AfterFlush(flush.GetAwaiter().GetResult());
        }
        else
        {
            // Backpressure: the app has MaxReadBufferSize unread. Stop reading until it catches up.
            FlushPending = true;
            _flush = flush;
            flush.GetAwaiter().UnsafeOnCompleted(_onFlushed);
        }
    }

    /// <summary>A pending flush completed: on the loop (the input pipe's writer scheduler).</summary>
    private void OnFlushed()
    {
        FlushPending = false;
        var result = LinuxConnection.Outcome(_flush, out var error);
        _flush = default;

        if (IsDone)
        {
            // The side ended while the flush was pending; finish what End deferred.
            _input.Complete(_pendingError);
            _connection.Lifetime.MaybeClose();
            return;
        }

        if (error is not null)
        {
            End(error);
            return;
        }

        AfterFlush(result);
    }

    private void AfterFlush(FlushResult result)
    {
        if (result.IsCompleted || result.IsCanceled)
        {
            // The application completed its reader: it wants no more input.
            End(null);
        }
        else
        {
            Queue();
        }
    }
}
