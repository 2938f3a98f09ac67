using System.Diagnostics;

namespace Kestrel.Transport.Linux.Diagnostics;

/// <summary>
/// At most one message per interval for one kind of warning (any thread): the ones in between are counted, and the
/// next message that may go out says how many there were.
/// </summary>
internal sealed class RateLimitedLog(TimeSpan interval)
{
    private readonly long _intervalTicks = (long)(interval.TotalSeconds * Stopwatch.Frequency);
    private long _last;
    private int _skipped;

    /// <summary>True when a message may be logged at <paramref name="now"/> (a Stopwatch timestamp), with how many were skipped since the last one.</summary>
    public bool TryEnter(long now, out int skipped)
    {
        skipped = 0;
        long previous = Volatile.Read(ref _last);
        if (previous != 0 && now - previous < _intervalTicks)
        {
            Interlocked.Increment(ref _skipped);
            return false;
        }

        if (Interlocked.CompareExchange(ref _last, now, previous) != previous)
        {
            return false;
        }

        skipped = Interlocked.Exchange(ref _skipped, 0);
        return true;
    }
}
