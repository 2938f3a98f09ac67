namespace Kestrel.Transport.Linux.Connection;

/// <summary>
/// How much a connection's next read asks for. It adapts to what the socket delivers: a read that fills its
/// buffer doubles the next one (up to the MaxBytesPerRead tuning), so a large upload takes a few large reads
/// instead of one per pool block; a read that uses under a quarter of its buffer halves it, back down to
/// <see cref="Minimum"/>, so small requests never reserve more than a fraction of one 4 KiB block.
/// </summary>
internal struct ReadSize(int maximum)
{
    /// <summary>Half a 4 KiB pool block, as Kestrel's Sockets transport asks for.</summary>
    public const int Minimum = 2048;

    public int Current { get; private set; } = Minimum;

    /// <summary>The largest single read so far (diagnostics and tests).</summary>
    public long Largest { get; private set; }

    /// <summary>A read that asked for <paramref name="requested"/> bytes got <paramref name="received"/> (more than 0).</summary>
    public void Observe(long received, long requested)
    {
        if (received == requested)
        {
            Current = (int)Math.Min(maximum, Math.Max(Current, requested) * 2);
        }
        else if (received < requested / 4 && Current > Minimum)
        {
            Current = Math.Max(Minimum, Current / 2);
        }

        Largest = Math.Max(Largest, received);
    }
}
