using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Engines;

/// <summary>
/// <see cref="UringEngine"/>'s batches: each one <c>ktl_ring_batch</c> on the loop's ring, every op with its result
/// when the call returns (a zero-copy op's notification comes later, through the engine's wait). Loop thread only;
/// the engine owns the ring and outlives every batch.
/// </summary>
internal sealed unsafe class RingExecutor(nint ring) : BatchExecutor
{
    public override bool IsNative => true;

    public override bool UsesAio => false;

    public override void Execute(IoDirection direction, IoOp* ops, int count)
    {
        int result = NativeEngine.ktl_ring_batch(ring, (int)direction, ops, count);
        if (result < 0)
        {
            // The batch as a whole failed (the ring is unusable): every op reports it, none reads as end of stream.
            for (int i = 0; i < count; i++)
            {
                ops[i].Result = result;
            }
        }
    }

    public override void Dispose()
    {
    }
}
