using System.Buffers;
using System.Collections.Concurrent;
using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Connection;

// MSG_ZEROCOPY (LinuxTransportOptions.ZeroCopySendThreshold; the kernel's msg_zerocopy.rst).
//
// A zero-copy send returns before the kernel has read the bytes: it pins the pages and reads them
// until the peer has acknowledged the data, then queues a completion on the socket's error queue.
// Until then the memory must not be reused. The output pipe hands its blocks back to its pool as soon
// as the transport advances past them, so with zero-copy on, the output pipes rent from a
// ZeroCopyMemoryPool: its blocks go back to the loop's pool only once the pipe has let go of them AND
// every zero-copy send that covered them has completed.

/// <summary>The output pipes' pool when zero-copy sends are on: wraps the loop's pool (see above).</summary>
internal sealed class ZeroCopyMemoryPool(MemoryPool<byte> inner) : MemoryPool<byte>
{
    private readonly ConcurrentQueue<ZeroCopyBlock> _wrappers = new();
    private long _outstanding;

    public override int MaxBufferSize => inner.MaxBufferSize;

    /// <summary>Blocks rented and not yet back in the loop's pool: held by a pipe, by the kernel, or both.</summary>
    public long Outstanding => Volatile.Read(ref _outstanding);

    public override IMemoryOwner<byte> Rent(int minBufferSize = -1)
    {
        var block = _wrappers.TryDequeue(out var reused) ? reused : new ZeroCopyBlock(this);
        block.Attach(inner.Rent(minBufferSize));
        Interlocked.Increment(ref _outstanding);
        return block;
    }

    internal void Return(ZeroCopyBlock block)
    {
        Interlocked.Decrement(ref _outstanding);
        _wrappers.Enqueue(block);
    }

    protected override void Dispose(bool disposing)
    {
        // The loop disposes the pool this one wraps.
    }
}

/// <summary>
/// A block of the loop's pool, lent to an output pipe. It counts its owners: the pipe (until it
/// disposes the block) and each zero-copy send in flight over its bytes; the last one to let go
/// returns it to the loop's pool.
/// </summary>
internal sealed class ZeroCopyBlock(ZeroCopyMemoryPool pool) : MemoryManager<byte>
{
    // 1 for the pipe, plus 2 per zero-copy send in flight.
    private int _owners;
    private IMemoryOwner<byte>? _inner;
    private Memory<byte> _memory;

    internal void Attach(IMemoryOwner<byte> inner)
    {
        _inner = inner;
        _memory = inner.Memory;
        _owners = 1;
    }

    public override Span<byte> GetSpan() => _memory.Span;

    public override MemoryHandle Pin(int elementIndex = 0) => _memory[elementIndex..].Pin();

    public override void Unpin()
    {
    }

    /// <summary>A zero-copy send covers this block's bytes (called before the pipe may let go of it).</summary>
    public void AddSend() => Interlocked.Add(ref _owners, 2);

    /// <summary>The kernel reported a send over this block done.</summary>
    public void ReleaseSend() => Release(2);

    /// <summary>The pipe is done with the block.</summary>
    protected override void Dispose(bool disposing) => Release(1);

    private void Release(int owners)
    {
        if (Interlocked.Add(ref _owners, -owners) == 0)
        {
            var inner = _inner!;
            _inner = null;
            _memory = default;
            inner.Dispose();
            pool.Return(this);
        }
    }
}

/// <summary>
/// One connection's zero-copy sends in flight. The kernel numbers a socket's MSG_ZEROCOPY sends from 0,
/// one id per call that queued data, and reports them done in ranges of ids; each send holds the blocks
/// its iovecs pointed into until then. Used under the connection's send lock, or on its loop.
/// </summary>
internal sealed class ZeroCopySends(uint firstId = 0)
{
    private readonly List<ZeroCopyBlock> _staged = [];
    private readonly Queue<ZeroCopyBlock> _held = new();
    private readonly List<(uint Id, int Blocks, bool Done)> _sends = [];
    private uint _nextId = firstId;

    /// <summary>Set once the kernel reported that it copied a send (loopback, or a device without scatter-gather).</summary>
    public bool KernelCopies { get; private set; }

    /// <summary>Set after ENOBUFS, for the next send only (msg_zerocopy.rst: over the socket's optmem limit).</summary>
    public bool SkipNext { get; set; }

    public int InFlight => _sends.Count;

    /// <summary>
    /// Collects the blocks behind the first <paramref name="maxSegments"/> non-empty segments of
    /// <paramref name="buffer"/>; false (and nothing staged) when any of them is memory this pool did not
    /// lend, which a zero-copy send must not point at.
    /// </summary>
    public bool Stage(in ReadOnlySequence<byte> buffer, int maxSegments)
    {
        _staged.Clear();
        foreach (var segment in buffer)
        {
            if (segment.IsEmpty)
            {
                continue;
            }

            if (!MemoryMarshal.TryGetMemoryManager<byte, ZeroCopyBlock>(segment, out var block))
            {
                _staged.Clear();
                return false;
            }

            _staged.Add(block);
            if (_staged.Count == maxSegments)
            {
                break;
            }
        }

        return _staged.Count > 0;
    }

    /// <summary>
    /// After a send: false when it was not a staged zero-copy send. Otherwise true; a call that sent
    /// bytes took the next id, and its blocks stay held until <see cref="Complete"/>; a failed call took none.
    /// </summary>
    public bool Commit(long sent)
    {
        if (_staged.Count == 0)
        {
            return false;
        }

        if (sent > 0)
        {
            foreach (var block in _staged)
            {
                block.AddSend();
                _held.Enqueue(block);
            }

            _sends.Add((_nextId++, _staged.Count, false));
        }

        _staged.Clear();
        return true;
    }

    /// <summary>
    /// The kernel completed ids <paramref name="first"/>..<paramref name="last"/> (inclusive, modulo 2^32).
    /// Blocks go back in send order, so a send completed ahead of an earlier one waits for it.
    /// Returns the number of sends this completed.
    /// </summary>
    public int Complete(uint first, uint last, bool copied)
    {
        KernelCopies |= copied;
        uint span = last - first;
        int completed = 0;
        for (int i = 0; i < _sends.Count; i++)
        {
            var send = _sends[i];
            if (!send.Done && send.Id - first <= span)
            {
                _sends[i] = (send.Id, send.Blocks, true);
                completed++;
            }
        }

        int finished = 0;
        while (finished < _sends.Count && _sends[finished].Done)
        {
            for (int b = 0; b < _sends[finished].Blocks; b++)
            {
                _held.Dequeue().ReleaseSend();
            }

            finished++;
        }

        _sends.RemoveRange(0, finished);
        return completed;
    }

    /// <summary>After a reset and close: the kernel dropped the queued data along with the socket.</summary>
    public void ReleaseAll()
    {
        while (_held.TryDequeue(out var block))
        {
            block.ReleaseSend();
        }

        _sends.Clear();
        _staged.Clear();
    }
}
