using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Engines;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// What one loop pass receives and sends: the connections queued for the pass's receive batch and for its
/// send batch, the batch itself, and the byte totals the meter reads. A connection queues itself (once per
/// pass); the loop runs the receives after the wait and the sends at the end of the pass, each as one call
/// into the engine. Loop thread only, except the totals.
/// </summary>
internal sealed class PassBatches(IoEngine engine, TransportMetrics metrics, bool deferSends)
{
    private readonly IoBatch _batch = new();
    private List<IBatchOwner> _receiveQueue = [];
    private List<IBatchOwner> _receiveRunning = [];
    private List<IBatchOwner> _sendQueue = [];
    private List<IBatchOwner> _sendRunning = [];
    private bool _running;
    private long _bytesReceived;
    private long _bytesSent;

    /// <summary>True when a batch waits: the loop must not block in its next wait.</summary>
    public bool HasQueued => _receiveQueue.Count > 0 || _sendQueue.Count > 0;

    public long BytesReceived => Volatile.Read(ref _bytesReceived);

    public long BytesSent => Volatile.Read(ref _bytesSent);

    public void QueueReceive(IBatchOwner receive) => _receiveQueue.Add(receive);

    /// <summary>
    /// Queues a send for the end of the pass; with the DeferSend tuning off, sends it now, unless a batch is
    /// being built or completed (this is called from inside one).
    /// </summary>
    public void QueueSend(IBatchOwner send)
    {
        if (deferSends || _batch.Count > 0 || _running)
        {
            _sendQueue.Add(send);
            return;
        }

        send.AddTo(_batch);
        Run(IoDirection.Send);
    }

    public void RunReceives()
    {
        if (_receiveQueue.Count == 0)
        {
            return;
        }

        // Receives that complete at once may queue the same connection again, for the next pass.
        (_receiveQueue, _receiveRunning) = (_receiveRunning, _receiveQueue);
        foreach (var receive in _receiveRunning)
        {
            receive.AddTo(_batch);
        }

        _receiveRunning.Clear();
        Run(IoDirection.Receive);
    }

    public void RunSends()
    {
        if (_sendQueue.Count == 0)
        {
            return;
        }

        (_sendQueue, _sendRunning) = (_sendRunning, _sendQueue);
        if (metrics.SendQueueLength.Enabled)
        {
            metrics.SendQueueLength.Record(_sendRunning.Count);
        }

        foreach (var send in _sendRunning)
        {
            send.AddTo(_batch);
        }

        _sendRunning.Clear();
        Run(IoDirection.Send);
    }

    private void Run(IoDirection direction)
    {
        if (_batch.Count == 0)
        {
            return;
        }

        _running = true;
        try
        {
            engine.Execute(_batch, direction);
            long bytes = 0;
            for (int i = 0; i < _batch.Count; i++)
            {
                var owner = _batch.OwnerAt(i);
                var result = _batch.ResultAt(i);
                bytes += result.IsError ? 0 : result.Value;
                try
                {
                    owner.Complete(result, _batch.RequestedAt(i));
                }
                catch (Exception e)
                {
                    owner.Fault(e);
                }
            }

            Record(direction, bytes);
        }
        finally
        {
            _batch.Clear();
            _running = false;
        }
    }

    private void Record(IoDirection direction, long bytes)
    {
        bool receive = direction == IoDirection.Receive;
        if (receive)
        {
            Volatile.Write(ref _bytesReceived, _bytesReceived + bytes);
        }
        else
        {
            Volatile.Write(ref _bytesSent, _bytesSent + bytes);
        }

        if (metrics.BytesPerPass.Enabled)
        {
            metrics.BytesPerPass.Record(bytes, receive ? TransportMetrics.Received : TransportMetrics.Sent);
        }
    }
}
