using System.Buffers;
using System.Collections.Concurrent;
using System.Diagnostics;
using System.Text;
using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>
/// An <see cref="IMemoryPoolFactory{T}"/> whose pools hand out pinned 4096-byte blocks, as Kestrel's do,
/// and remember every block that is out. After a transport or host is disposed,
/// <see cref="AssertAllReturned"/> names every block still out and every misuse seen on the way.
/// </summary>
/// <remarks>
/// Returned blocks are overwritten with <see cref="PoisonByte"/> before reuse, so a transport that keeps
/// reading a block after returning it corrupts the data, which the checksummed transfers then detect.
/// Set KTL_TEST_POOL_STACKS=1 to record the stack of every rent (slow; for chasing a leak).
/// </remarks>
public sealed class DiagnosticMemoryPoolFactory : IMemoryPoolFactory<byte>
{
    public const int BlockSize = 4096;
    public const byte PoisonByte = 0xDD;

    // Enough for a few in-flight 16 MB transfers without unbounded growth of the pinned heap.
    private const int MaxFreeArrays = 8192;

    private readonly ConcurrentDictionary<long, DiagnosticBlock> _outstanding = new();
    private readonly ConcurrentQueue<byte[]> _freeArrays = new();
    private readonly ConcurrentQueue<string> _violations = new();
    private readonly ConcurrentQueue<DiagnosticMemoryPool> _pools = new();
    private long _nextBlockId;
    private long _totalRented;

    public DiagnosticMemoryPoolFactory()
    {
        CaptureStackTraces = Environment.GetEnvironmentVariable("KTL_TEST_POOL_STACKS") == "1";
    }

    public bool CaptureStackTraces { get; }

    /// <summary>Blocks rented over the factory's lifetime; a test checks it is non-zero so that "all returned" is not vacuous.</summary>
    public long TotalRented => Interlocked.Read(ref _totalRented);

    public int OutstandingCount => _outstanding.Count;

    public int PoolCount => _pools.Count;

    /// <summary>The <see cref="MemoryPoolOptions.Owner"/> each pool was created with, in order.</summary>
    public IReadOnlyList<string> Owners => [.. _pools.Select(static p => p.Owner)];

    public IReadOnlyCollection<string> Violations => _violations.ToArray();

    public MemoryPool<byte> Create(MemoryPoolOptions? options = null)
    {
        var pool = new DiagnosticMemoryPool(this, options?.Owner ?? "(no owner)", _pools.Count);
        _pools.Enqueue(pool);
        return pool;
    }

    /// <summary>Fails when a block is still rented or when any pool saw misuse (double return, rent after dispose, disposal with blocks out).</summary>
    public void AssertAllReturned()
    {
        var outstanding = _outstanding.Values.OrderBy(b => b.Id).ToArray();
        var violations = _violations.ToArray();
        if (outstanding.Length == 0 && violations.Length == 0)
        {
            return;
        }

        var message = new StringBuilder();
        message.Append("The memory pools are not clean: ")
            .Append(outstanding.Length).Append(" block(s) still rented of ").Append(TotalRented)
            .Append(" rented in all, and ").Append(violations.Length).Append(" misuse(s).").AppendLine();
        foreach (var violation in violations.Take(20))
        {
            message.Append("  misuse: ").AppendLine(violation);
        }

        foreach (var block in outstanding.Take(20))
        {
            message.Append("  still rented: ").AppendLine(block.Describe());
        }

        if (outstanding.Length > 20)
        {
            message.Append("  ... and ").Append(outstanding.Length - 20).AppendLine(" more.");
        }

        if (!CaptureStackTraces)
        {
            message.AppendLine("  (set KTL_TEST_POOL_STACKS=1 to record where each block was rented)");
        }

        Assert.Fail(message.ToString());
    }

    internal DiagnosticBlock Rent(DiagnosticMemoryPool pool)
    {
        if (!_freeArrays.TryDequeue(out var array))
        {
            array = GC.AllocateUninitializedArray<byte>(BlockSize, pinned: true);
        }

        var block = new DiagnosticBlock(
            pool,
            array,
            Interlocked.Increment(ref _nextBlockId),
            CaptureStackTraces ? new StackTrace(2, fNeedFileInfo: true).ToString() : null);
        _outstanding[block.Id] = block;
        Interlocked.Increment(ref _totalRented);
        return block;
    }

    internal void Return(DiagnosticBlock block, byte[] array)
    {
        _outstanding.TryRemove(block.Id, out _);
        array.AsSpan().Fill(PoisonByte);
        if (_freeArrays.Count < MaxFreeArrays)
        {
            _freeArrays.Enqueue(array);
        }
    }

    internal IEnumerable<DiagnosticBlock> OutstandingBlocksOf(DiagnosticMemoryPool pool) => _outstanding.Values.Where(b => b.Pool == pool);

    internal void RecordViolation(string violation) => _violations.Enqueue(violation);
}

/// <summary>One pool created by <see cref="DiagnosticMemoryPoolFactory"/>. Blocks are at most and exactly 4096 bytes.</summary>
public sealed class DiagnosticMemoryPool : MemoryPool<byte>
{
    private int _disposed;

    internal DiagnosticMemoryPool(DiagnosticMemoryPoolFactory factory, string owner, int index)
    {
        Factory = factory;
        Owner = owner;
        Index = index;
    }

    public string Owner { get; }

    internal DiagnosticMemoryPoolFactory Factory { get; }

    public int Index { get; }

    public bool IsDisposed => Volatile.Read(ref _disposed) != 0;

    public override int MaxBufferSize => DiagnosticMemoryPoolFactory.BlockSize;

    public override IMemoryOwner<byte> Rent(int minBufferSize = -1)
    {
        if (minBufferSize > DiagnosticMemoryPoolFactory.BlockSize)
        {
            throw new ArgumentOutOfRangeException(
                nameof(minBufferSize),
                minBufferSize,
                $"This pool's blocks are {DiagnosticMemoryPoolFactory.BlockSize} bytes.");
        }

        if (IsDisposed)
        {
            Factory.RecordViolation($"a block was rented from pool {this} after it was disposed:{Environment.NewLine}{new StackTrace(1, fNeedFileInfo: true)}");
            throw new ObjectDisposedException(ToString());
        }

        return Factory.Rent(this);
    }

    public override string ToString() => $"#{Index} '{Owner}'";

    protected override void Dispose(bool disposing)
    {
        if (Interlocked.Exchange(ref _disposed, 1) != 0)
        {
            return;
        }

        var outstanding = Factory.OutstandingBlocksOf(this).OrderBy(b => b.Id).ToArray();
        if (outstanding.Length > 0)
        {
            Factory.RecordViolation(
                $"pool {this} was disposed with {outstanding.Length} block(s) still rented: " +
                string.Join(", ", outstanding.Take(10).Select(b => "#" + b.Id.ToString(System.Globalization.CultureInfo.InvariantCulture))));
        }
    }
}

/// <summary>A rented block. A fresh owner object per rent, so a stale double return cannot release someone else's block.</summary>
internal sealed class DiagnosticBlock : IMemoryOwner<byte>
{
    private readonly byte[] _array;
    private readonly long _rentedAt = Stopwatch.GetTimestamp();
    private readonly string? _rentStack;
    private int _returned;

    public DiagnosticBlock(DiagnosticMemoryPool pool, byte[] array, long id, string? rentStack)
    {
        Pool = pool;
        _array = array;
        Id = id;
        _rentStack = rentStack;
    }

    public DiagnosticMemoryPool Pool { get; }

    public long Id { get; }

    public Memory<byte> Memory
    {
        get
        {
            ObjectDisposedException.ThrowIf(Volatile.Read(ref _returned) != 0, this);
            return _array;
        }
    }

    public void Dispose()
    {
        if (Interlocked.Exchange(ref _returned, 1) != 0)
        {
            Pool.Factory.RecordViolation($"block #{Id} of pool {Pool} was returned twice:{Environment.NewLine}{new StackTrace(1, fNeedFileInfo: true)}");
            return;
        }

        Pool.Factory.Return(this, _array);
    }

    public string Describe()
    {
        var age = Stopwatch.GetElapsedTime(_rentedAt);
        var text = $"block #{Id} of pool {Pool}{(Pool.IsDisposed ? " (pool disposed)" : "")}, rented {age.TotalMilliseconds:F0} ms ago";
        return _rentStack is null ? text : text + Environment.NewLine + _rentStack;
    }
}
