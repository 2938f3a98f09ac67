using System.Buffers;
using System.Collections.Concurrent;

namespace Kestrel.Transport.Linux.Connection;

// MSG_ZEROCOPY (LinuxTransportOptions.ZeroCopySendThreshold; the kernel's msg_zerocopy.rst).
//
// A zero-copy send returns before the kernel has read the bytes: it pins the pages and reads them
// until the peer has acknowledged the data, then queues a completion on the socket's error queue.
// Until then the memory must not be reused. The output pipe hands its blocks back to its pool as soon
// as the transport advances past them, so with zero-copy on, the output pipes rent from a
// ZeroCopyMemoryPool: its blocks go back to the loop's pool only once the pipe has let go of them AND
// every zero-copy send that covered them has completed. Until then each such send also keeps the block
// pinned (ZeroCopySends), since the loop's pool need not hand out pinned memory.

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
