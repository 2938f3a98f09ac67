using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Engines;

/// <summary>
/// <see cref="UringEngine"/>'s batches: each one <c>ktl_ring_batch</c> on the loop's ring, every op with its result
/// when the call returns (a zero-copy op's notification comes later, through the engine's wait). Loop thread only;
/// the engine owns the ring and outlives every batch.
/// </summary>
/// <remarks>
/// A batch whose <c>io_uring_enter</c> failed still returns each op's own result where it has one, and the error for
/// the rest (ktl.h): overwriting them all would make a zero-copy send that went out read as failed, and its blocks
/// would go back to the pool while the kernel still reads them.
/// </remarks>
internal sealed unsafe class RingExecutor(nint ring) : BatchExecutor
{
    public override bool IsNative => true;

    public override bool UsesAio => false;

    public override void Execute(IoDirection direction, IoOp* ops, int count)
        => _ = NativeEngine.ktl_ring_batch(ring, (int)direction, ops, count);

    public override void Dispose()
    {
    }
}
