using System.IO.Pipelines;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Connection;

/// <summary>
/// The sends a thread-pool thread makes itself. With ThreadPool scheduling the output pipe's reader resumes on
/// the pool thread that drains the loop's dispatch batch (the SendFromThreadPool tuning), and that thread sends
/// what the app flushed with one sendmsg, under the send side's lock, instead of handing it back to the loop:
/// one hand-off and one loop wake-up fewer per response. Whatever it cannot finish (a full socket, an error,
/// the end of the output) it hands back to the loop, keeping the read pending until the loop has taken it.
/// </summary>
internal sealed class PoolThreadSends(LinuxConnection connection, SendSide side, PipeReader output)
{
    /// <summary>A pool thread's sends, one op at a time.</summary>
    [ThreadStatic]
    private static IoBatch? t_batch;

    private ReadResult _handedBack;
    private Exception? _handedBackError;

    /// <summary>On the pool thread that resumed the pending read: sends, or hands back to the loop.</summary>
    public void Send(ReadResult result, Exception? error)
    {
        lock (side.Lock)
        {
            if (error is null && !side.IsDone && !connection.Socket.IsClosed)
            {
                side.ReadPending = false;
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
                side.ReadPending = true;
            }

            _handedBack = result;
            _handedBackError = error;
        }

        connection.Loop.Post(static s => ((PoolThreadSends)s!).OnHandedBack(), this);
    }

    /// <summary>
    /// Under the send lock: sends what the read returned, and reads again as long as the socket takes
    /// everything. True when that ended with a pending read; false with what the loop must handle: a read
    /// result that is empty (the output ended) or that the socket could not take whole, or an error (with
    /// <paramref name="result"/> then holding nothing).
    /// </summary>
    private bool SendOnThisThread(ref ReadResult result, out Exception? error)
    {
        error = null;
        var batch = t_batch ??= new IoBatch();
        while (!result.Buffer.IsEmpty)
        {
            var buffer = result.Buffer;
            side.AddBuffers(batch, buffer, onLoop: false);
            SysResult sent;
            long requested;
            bool refused;
            try
            {
                batch.Execute(BatchExecutor.CallingThread, IoDirection.Send);
                sent = batch.ResultAt(0);
                requested = batch.RequestedAt(0);

                // sendmsg(MSG_ZEROCOPY), notified on the error queue, never by the engine. Before the batch lets go
                // of its pins: a zero-copy send keeps its memory pinned from here on.
                refused = side.ZeroCopy is { } zeroCopy && zeroCopy.AfterSend(connection, sent, notified: false);
            }
            finally
            {
                batch.Clear();
            }

            if (refused)
            {
                continue;
            }

            if (sent.IsError && !sent.Is(Errno.EAGAIN))
            {
                output.AdvanceTo(buffer.Start);
                result = default;
                error = connection.ErrorFor(sent.Error, "send");
                return false;
            }

            long bytes = sent.IsError ? 0 : sent.Value;
            connection.Loop.AddBytesSentOffLoop(bytes);
            output.AdvanceTo(buffer.GetPosition(bytes));
            if (!side.TryStartRead(out result, out error))
            {
                return true;
            }

            if (error is not null || bytes < requested)
            {
                // A full socket: the loop sends the rest when it can, and waits for EPOLLOUT if it must.
                return false;
            }
        }

        return false;
    }

    /// <summary>On the loop: what a pool thread handed back from <see cref="Send"/>.</summary>
    private void OnHandedBack()
    {
        ReadResult result;
        Exception? error;
        lock (side.Lock)
        {
            result = _handedBack;
            error = _handedBackError;
            _handedBack = default;
            _handedBackError = null;
        }

        side.OnPendingReadDone(result, error);
    }
}
