using System.Diagnostics;
using System.IO.Pipelines;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Loop;

namespace Kestrel.Transport.Linux.Scheduling;

/// <summary>
/// A connection's application scheduler with <see cref="ApplicationSchedulingMode.Adaptive"/>: a continuation
/// scheduled on the loop's thread runs there, later in the same pass (<see cref="LoopContinuations.TryQueue"/>);
/// one scheduled anywhere else, or for a connection that blocked its loop recently, goes to the loop's
/// thread-pool dispatch queue, as with <see cref="ApplicationSchedulingMode.ThreadPool"/>.
/// </summary>
/// <remarks>
/// <para>A connection that blocked its loop, or computed on it for milliseconds, runs on the pool for a while
/// (<see cref="Demote"/>): from the take until the continuation that blocked returns, and from then on for as long as
/// its continuations on the pool run longer than the loop's blocking threshold; after the first that is quick, 1 s more
/// (counted from the end of the last long one) the first time, twice as long each time it comes back and blocks again
/// soon, up to <see cref="MaxDemotion"/>; each spell as long as the demotion without blocking halves it again. So an
/// endpoint that always blocks costs one hand-off per connection, not one each time a demotion ran out under a long
/// block, nor one each time a starved pool sent a response late.</para>
/// <para>A loop that was taken often in the last second starts its new connections on the pool
/// (<see cref="LoopContinuations.NewConnectionsStartOnPool"/>), so that short connections to such an endpoint do not
/// cost a hand-off each either.</para>
/// </remarks>
internal sealed class AdaptiveScheduler : PipeScheduler
{
    private static readonly long s_firstDemotion = Stopwatch.Frequency;
    private static readonly long MaxDemotion = Stopwatch.Frequency * 64;

    /// <summary><see cref="_demotedUntil"/> from a take until the continuation that blocked returns.</summary>
    private const long UntilReturned = long.MaxValue;

    /// <summary><see cref="_demotedUntil"/> from a long continuation until a quick one; then the demotion after <see cref="_lastLongEnded"/>.</summary>
    private const long UntilQuick = long.MaxValue - 1;

    private static readonly Action<object?> s_runDemoted = static s => ((DemotedContinuation)s!).Run();

    private readonly EventLoop _loop;
    private readonly LinuxConnection _connection;
    private readonly ThreadPoolDispatchQueue _pool;
    private readonly long _longOnPoolTicks;
    private long _demotedUntil;
    private long _demotion;
    private long _lastLongEnded;

    public AdaptiveScheduler(EventLoop loop, LinuxConnection connection, ThreadPoolDispatchQueue pool)
    {
        _loop = loop;
        _connection = connection;
        _pool = pool;
        _longOnPoolTicks = loop.Options.Tuning.AdaptiveThresholdMicroseconds * Stopwatch.Frequency / 1_000_000;
        if (loop.Continuations is { NewConnectionsStartOnPool: true })
        {
            Demote(untilReturned: false);
            loop.Metrics.ConnectionsStartedOnPool.Add(1, loop.MetricTag);
        }
    }

    public override void Schedule(Action<object?> action, object? state)
    {
        if (IsDemoted)
        {
            // Timed, to keep the demotion going while the connection keeps blocking there; the wrapper is allocated only
            // for a connection that blocked lately.
            _pool.Schedule(s_runDemoted, new DemotedContinuation(this, action, state));
        }
        else if (_loop.Continuations?.TryQueue(action, state, _connection) != true)
        {
            _pool.Schedule(action, state);
        }
    }

    /// <summary>True while the connection runs on the pool because it blocked its loop.</summary>
    public bool IsDemoted
    {
        get
        {
            long until = Volatile.Read(ref _demotedUntil);
            return until != 0 && (until >= UntilQuick || Stopwatch.GetTimestamp() < until);
        }
    }

    /// <summary>
    /// Any thread (the monitor): the connection blocked or computed on its loop. It runs on the pool from now on, for
    /// the demotion after the continuation that blocked returns (<paramref name="untilReturned"/>: <see cref="Returned"/>
    /// says when), or after now.
    /// </summary>
    public void Demote(bool untilReturned)
    {
        long now = Stopwatch.GetTimestamp();
        long demotion = NextDemotion(now);
        Volatile.Write(ref _demotion, demotion);
        Volatile.Write(ref _demotedUntil, untilReturned ? UntilReturned : now + demotion);
    }

    /// <summary>
    /// The thread the loop was taken from: the continuation that blocked returned at <paramref name="now"/>. The connection
    /// stays on the pool until one of its continuations there is quick, and then for the demotion.
    /// </summary>
    public void Returned(long now)
    {
        Volatile.Write(ref _lastLongEnded, now);
        Interlocked.CompareExchange(ref _demotedUntil, UntilQuick, UntilReturned);
    }

    /// <summary>
    /// The length of the next demotion: the first, or twice the last when it ended less than its own length ago;
    /// each stretch of the last one's length since it ended halves it first.
    /// </summary>
    private long NextDemotion(long now)
    {
        long demotion = Volatile.Read(ref _demotion);
        long until = Volatile.Read(ref _demotedUntil);
        if (demotion == 0)
        {
            return s_firstDemotion;
        }

        long calm = until >= UntilQuick ? 0 : Math.Max(0, now - until);
        while (demotion > s_firstDemotion && calm >= demotion)
        {
            calm -= demotion;
            demotion /= 2;
        }

        return calm >= demotion ? demotion : Math.Min(demotion * 2, MaxDemotion);
    }

    /// <summary>
    /// A pool thread: a continuation of this demoted connection ran from <paramref name="started"/> to <paramref name="ended"/>.
    /// One that would have blocked the loop keeps the connection on the pool until a quick one; the first quick one lets
    /// the demotion run out, counted from the end of the last long one.
    /// </summary>
    private void RanOnPool(long started, long ended)
    {
        long until = Volatile.Read(ref _demotedUntil);
        if (until == UntilReturned)
        {
            return; // a take is under way: its return decides
        }

        if (ended - started >= _longOnPoolTicks)
        {
            Volatile.Write(ref _lastLongEnded, ended);
            Interlocked.CompareExchange(ref _demotedUntil, UntilQuick, until);
        }
        else if (until == UntilQuick)
        {
            Interlocked.CompareExchange(ref _demotedUntil, Volatile.Read(ref _lastLongEnded) + Volatile.Read(ref _demotion), UntilQuick);
        }
    }

    /// <summary>A continuation of a demoted connection, on the pool, timed.</summary>
    private sealed class DemotedContinuation(AdaptiveScheduler scheduler, Action<object?> action, object? state)
    {
        public void Run()
        {
            long started = Stopwatch.GetTimestamp();
            try
            {
                action(state);
            }
            finally
            {
                scheduler.RanOnPool(started, Stopwatch.GetTimestamp());
            }
        }
    }
}

/// <summary>An application continuation queued to run on its connection's loop (Adaptive scheduling).</summary>
internal readonly struct Continuation(Action<object?> action, object? state, LinuxConnection connection)
{
    public LinuxConnection Connection { get; } = connection;

    public void Run() => action(state);
}
