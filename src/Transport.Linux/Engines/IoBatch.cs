using System.Buffers;
using System.Runtime.CompilerServices;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Engines;

/// <summary>
/// What one loop pass receives or sends: an op per connection, its iovecs and the pins that keep their
/// memory in place while the kernel uses it. The arrays live on the pinned object heap and grow on demand,
/// so a batch of any size fits (a fixed 512-slot array once crashed an earlier transport after days of
/// uptime). Used only on its loop's thread, or as a pool thread's own batch for the sends it makes itself.
/// </summary>
internal sealed unsafe class IoBatch
{
    private IoOp[] _ops = GC.AllocateArray<IoOp>(64, pinned: true);
    private int[] _iovStart = new int[64];
    private IBatchOwner[] _owners = new IBatchOwner[64];
    private Iovec[] _iovs = GC.AllocateArray<Iovec>(256, pinned: true);
    private MemoryHandle[] _pins = new MemoryHandle[256];
    private int _iovCount;

    public int Count { get; private set; }

    public IBatchOwner OwnerAt(int index) => _owners[index];

    public SysResult ResultAt(int index) => SysResult.FromNative(_ops[index].Result);

    /// <summary>After a ring batch: true when the zero-copy op at <paramref name="index"/> will be notified (its tag kept, ktl.h).</summary>
    public bool NotifiesAt(int index) => _ops[index].Tag != 0;

    /// <summary>
    /// Starts an op on <paramref name="fd"/> for <paramref name="owner"/>; follow with <see cref="AddBuffer"/> calls.
    /// <paramref name="flags"/>: <see cref="NativeEngine.SendZeroCopy"/> or 0; <paramref name="tag"/>: a ring zero-copy
    /// send's number (<see cref="IoEngine.NextZeroCopySend"/>), else 0.
    /// </summary>
    public void BeginOp(IBatchOwner owner, int fd, int flags = 0, uint tag = 0)
    {
        if (Count == _ops.Length)
        {
            int size = Count * 2;
            var ops = GC.AllocateArray<IoOp>(size, pinned: true);
            _ops.AsSpan().CopyTo(ops);
            _ops = ops;
            Array.Resize(ref _iovStart, size);
            Array.Resize(ref _owners, size);
        }

        _ops[Count] = new IoOp { Fd = fd, Flags = flags, Tag = tag };
        _iovStart[Count] = _iovCount;
        _owners[Count] = owner;
        Count++;
    }

    /// <summary>Adds a buffer to the current op, pinning it until <see cref="Clear"/>.</summary>
    public void AddBuffer(ReadOnlyMemory<byte> memory)
    {
        if (_iovCount == _iovs.Length)
        {
            int size = _iovCount * 2;
            var iovs = GC.AllocateArray<Iovec>(size, pinned: true);
            _iovs.AsSpan().CopyTo(iovs);
            _iovs = iovs;
            Array.Resize(ref _pins, size);
        }

        // Pool blocks are pre-pinned, so Pin() is a pointer computation for them; other memory gets a GCHandle.
        MemoryHandle pin = memory.Pin();
        _pins[_iovCount] = pin;
        _iovs[_iovCount] = new Iovec { Base = pin.Pointer, Length = (nuint)memory.Length };
        _iovCount++;
        _ops[Count - 1].IovCount++;
    }

    /// <summary>Bytes the op at <paramref name="index"/> asked for.</summary>
    public long RequestedAt(int index)
    {
        long total = 0;
        int start = _iovStart[index];
        for (int i = 0; i < _ops[index].IovCount; i++)
        {
            total += (long)_iovs[start + i].Length;
        }

        return total;
    }

    /// <summary>Runs the batch through <paramref name="executor"/>.</summary>
    public void Execute(BatchExecutor executor, IoDirection direction)
    {
        if (Count == 0)
        {
            return;
        }

        // The iovec array may have moved while it grew: point every op at its iovecs only now.
        Iovec* iovs = (Iovec*)Unsafe.AsPointer(ref _iovs[0]);
        for (int i = 0; i < Count; i++)
        {
            _ops[i].Iov = iovs + _iovStart[i];
        }

        executor.Execute(direction, (IoOp*)Unsafe.AsPointer(ref _ops[0]), Count);
    }

    public void Clear()
    {
        for (int i = 0; i < _iovCount; i++)
        {
            _pins[i].Dispose();
            _pins[i] = default;
        }

        Array.Clear(_owners, 0, Count);
        _iovCount = 0;
        Count = 0;
    }
}
