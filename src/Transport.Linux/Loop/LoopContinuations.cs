using System.Collections.Concurrent;
using System.Diagnostics;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Scheduling;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// Adaptive scheduling's part of one loop: the application continuations its connections scheduled on the loop's
/// thread, run later in the same pass under the monitor's watch and within the pass's budget (<see cref="Run"/>),
/// and what follows when the monitor takes the loop from a thread stuck in one of them (<see cref="OnTaken"/>: the
/// hand-off is counted and the connection named at once; <see cref="OnReturned"/>, once it returns) or sees one
/// compute long (<see cref="OnComputedLong"/>).
/// </summary>
/// <remarks>
/// Threads: <see cref="TryQueue"/> and <see cref="Run"/> run on the loop's thread (the holder; a thread the loop was
/// just taken from fails <see cref="TryQueue"/>'s check or wakes the next holder); <see cref="OnTaken"/> and
/// <see cref="OnComputedLong"/> on the monitor's; <see cref="OnReturned"/> on the thread the loop was taken from, which
/// touches nothing of the loop; <see cref="NewConnectionsStartOnPool"/> anywhere. Logging after a take never throws
/// into its caller: a logger that fails must not end the monitor, nor make a thread that no longer holds the loop
/// shut it down.
/// </remarks>
internal sealed class LoopContinuations(EventLoop loop, LoopMonitor monitor, LoopWakeup wakeup)
{
    /// <summary>A loop taken this many times within one second starts its new connections on the pool.</summary>
    private const int TakesBeforeNewConnectionsStartOnPool = 8;

    /// <summary>How long new connections start on the pool after takes came that often (10 s).</summary>
    private static readonly long s_poolStartSpell = Stopwatch.Frequency * 10;

    /// <summary>A loop taken this many times within <see cref="s_stormWindow"/> from threads asleep in the kernel is in a storm of blocking continuations.</summary>
    private const int BlockedTakesForStorm = 3;

    /// <summary>50 ms: three takes, at the monitor's pace of one every few milliseconds, are continuations that block one after another.</summary>
    private static readonly long s_stormWindow = Stopwatch.Frequency / 20;

    /// <summary>
    /// How long a storm lasts after its last sign (1 s): a hand-off of a blocked holder, or a spilled continuation that
    /// blocked, whose sign comes only when it returns. Meanwhile the loop spills what it would run
    /// (<see cref="LoopSpills"/>): each continuation behind the first blockers would otherwise hold the loop
    /// for a take of its own, a few milliseconds each, and a quick request queued behind 200 of them waited for all of
    /// those (issue 38). Spilling what turns out quick costs a thread hop, as ThreadPool scheduling does.
    /// </summary>
    private static readonly long s_stormSpell = Stopwatch.Frequency;

    private readonly ConcurrentQueue<Continuation> _queue = new();

    /// <summary>How long one pass runs continuations before it goes on to its scheduled work and sends (<see cref="Hosting.TransportTuning.AdaptivePassBudgetMicroseconds"/>).</summary>
    private readonly long _budgetTicks = loop.Options.Tuning.AdaptivePassBudgetMicroseconds * Stopwatch.Frequency / 1_000_000;

    // At most one "blocked the loop" warning per loop per 10 s; the ones in between are counted in the next.
    private readonly RateLimitedLog _blockedLog = new(TimeSpan.FromSeconds(10));

    // Written by the monitor: takes in the current one-second window, and until when new connections start on
    // the pool because takes came that often (0: they start on the loop).
    private long _takeWindowStart;
    private int _takesInWindow;
    private long _newConnectionsOnPoolUntil;
    private long _blockedWindowStart;
    private int _blockedTakesInWindow;

    // Until when the loop spills its continuations (0: no storm); written by the monitor and by the threads that ran
    // spilled ones, read by the holder once per pass.
    private long _spillUntil;

    private readonly long _blockingTicks = loop.Options.Tuning.AdaptiveThresholdMicroseconds * Stopwatch.Frequency / 1_000_000;

    /// <summary>The monitor that watches this loop.</summary>
    public LoopMonitor Monitor { get; } = monitor;

    /// <summary>True when no continuation waits to run.</summary>
    public bool IsEmpty => _queue.IsEmpty;

    /// <summary>
    /// True while new connections start on the pool: the loop was taken often enough lately that one take per new
    /// connection would stall the others too often (an endpoint that blocks, on short connections).
    /// </summary>
    public bool NewConnectionsStartOnPool
    {
        get
        {
            long until = Volatile.Read(ref _newConnectionsOnPoolUntil);
            return until != 0 && Stopwatch.GetTimestamp() < until;
        }
    }

    /// <summary>
    /// An application continuation of <paramref name="connection"/>, scheduled by its <see cref="AdaptiveScheduler"/>:
    /// queued to run on the loop later in the pass, and true; false when the caller is not the loop's thread and the
    /// continuation must go to the pool instead.
    /// </summary>
    public bool TryQueue(Action<object?> action, object? state, LinuxConnection connection)
    {
        if (!loop.IsLoopThread)
        {
            return false;
        }

        _queue.Enqueue(new Continuation(action, state, connection));

        // Should the loop have been taken from this thread just now, its next holder must not sleep through this.
        Interlocked.MemoryBarrier();
        if (!loop.IsLoopThread)
        {
            wakeup.Wake();
        }

        return true;
    }

    /// <summary>
    /// The loop's thread: runs the continuations queued before this call, each one watched by the monitor, until the
    /// pass's budget is spent (the rest run next pass, after its accepts, receives and sends). False when the loop was
    /// taken from this thread while one ran: the caller must return at once.
    /// </summary>
    public bool Run(LoopRunner runner)
    {
        // Only what was queued before this point, as the loop's scheduled work. The budget is checked with the clock each
        // continuation reads anyway, as it begins: a pass runs at most one continuation past it.
        int count = _queue.IsEmpty ? 0 : _queue.Count;
        long budgetEnds = 0;
        bool spill = count > 0 && InStorm();
        while (count-- > 0 && _queue.TryDequeue(out var work))
        {
            if (spill && Monitor.Threads.Spills.TrySpill(work, this, loop.ThreadName))
            {
                loop.Metrics.Spills.Add(1, loop.MetricTag);
                continue;
            }

            long started = runner.BeginContinuation(work.Connection);
            Monitor.OnContinuationStarted();
            Exception? failure = null;
            try
            {
                work.Run();
            }
            catch (Exception e)
            {
                failure = e;
            }

            // Before anything else: from here on either this thread holds the loop, or it must not touch it.
            bool held = runner.EndContinuation(started);
            if (failure is not null)
            {
                ReportFailure(failure);
            }

            if (!held)
            {
                OnReturned(work.Connection, started);
                return false;
            }

            if (budgetEnds == 0)
            {
                budgetEnds = started + _budgetTicks;
            }
            else if (started >= budgetEnds)
            {
                break;
            }
        }

        return true;
    }

    /// <summary>
    /// A thread of <see cref="LoopThreads"/>, not the loop's: runs a continuation the loop spilled during a storm. One that
    /// blocked keeps the storm going.
    /// </summary>
    public void RunSpilled(Continuation work)
    {
        long started = Stopwatch.GetTimestamp();
        try
        {
            work.Run();
        }
        catch (Exception e)
        {
            ReportFailure(e);
        }

        long ended = Stopwatch.GetTimestamp();
        if (ended - started >= _blockingTicks)
        {
            ExtendStorm(ended);
        }
    }

    /// <summary>The loop has ended: what is still queued runs on the thread pool, so that pipes still complete.</summary>
    public void DrainToThreadPool()
    {
        while (_queue.TryDequeue(out var continuation))
        {
            ThreadPool.UnsafeQueueUserWorkItem(static c => c.Run(), continuation, preferLocal: false);
        }
    }

    /// <summary>
    /// Monitor thread, after a take: the connection whose continuation began at <paramref name="started"/> goes to the
    /// pool (until a while after it returns), the hand-off is counted with its reason and endpoint, and the connection is
    /// named in a warning now, while it still holds its thread. For <paramref name="firstUse"/> (the JIT's work) the
    /// connection stays on the loop, and the message is at Debug.
    /// A loop taken often starts its new connections on the pool.
    /// </summary>
    public void OnTaken(LoopRunner runner, long started, bool blocked, bool firstUse)
    {
        long now = Stopwatch.GetTimestamp();
        if (now - _takeWindowStart >= Stopwatch.Frequency)
        {
            _takeWindowStart = now;
            _takesInWindow = 0;
        }

        if (++_takesInWindow >= TakesBeforeNewConnectionsStartOnPool)
        {
            Volatile.Write(ref _newConnectionsOnPoolUntil, now + s_poolStartSpell);
        }

        if (blocked)
        {
            if (now - _blockedWindowStart >= s_stormWindow)
            {
                _blockedWindowStart = now;
                _blockedTakesInWindow = 0;
            }

            if (++_blockedTakesInWindow >= BlockedTakesForStorm)
            {
                ExtendStorm(now);
            }
        }

        var connection = runner.Connection;
        var reason = blocked ? TransportMetrics.Blocked : TransportMetrics.Computing;
        var endpoint = TransportMetrics.EndpointTags(connection?.LocalEndPoint);
        loop.Metrics.LoopHandoffs.Add(1, loop.MetricTag, reason, endpoint.Address, endpoint.Port);
        if (connection?.Scheduler is { } scheduler && !firstUse)
        {
            scheduler.Demote(untilReturned: true);
            loop.Metrics.Demotions.Add(1, reason, endpoint.Address, endpoint.Port);
        }

        if (connection is null)
        {
            return;
        }

        double heldFor = Stopwatch.GetElapsedTime(started, now).TotalMilliseconds;
        string doing = blocked ? "asleep in a blocking call" : firstUse ? "compiling code (the JIT: first-use work)" : "computing";
        if (firstUse)
        {
            LoopMonitor.Guarded(() => TransportLog.ContinuationBlockedLoop(loop.Logger, LogLevel.Debug, connection.ConnectionId, connection.RemoteEndPoint, connection.LocalEndPoint, loop.Index, heldFor, doing, 0));
        }
        else if (_blockedLog.TryEnter(now, out int skipped))
        {
            LoopMonitor.Guarded(() => TransportLog.ContinuationBlockedLoop(loop.Logger, LogLevel.Warning, connection.ConnectionId, connection.RemoteEndPoint, connection.LocalEndPoint, loop.Index, heldFor, doing, skipped));
        }
    }

    /// <summary>
    /// Monitor thread: the continuation <paramref name="runner"/> began at <paramref name="started"/> has computed for the
    /// demotion time without blocking: its connection goes to the pool for a while, and the loop keeps its thread.
    /// </summary>
    public void OnComputedLong(LoopRunner runner, long started)
    {
        // The connection is written before the start; a start that changed meanwhile may come with the next one's.
        var connection = runner.Connection;
        if (runner.ContinuationStarted == started && connection is { Scheduler: { } scheduler } && !scheduler.IsDemoted)
        {
            scheduler.Demote(untilReturned: false);
            var endpoint = TransportMetrics.EndpointTags(connection.LocalEndPoint);
            loop.Metrics.Demotions.Add(1, TransportMetrics.Computing, endpoint.Address, endpoint.Port);
        }
    }

    /// <summary>A continuation threw: logged, by any thread (a logger that throws too is no one's concern here).</summary>
    private void ReportFailure(Exception e) => LoopMonitor.Guarded(() => TransportLog.ScheduledWorkFailed(loop.Logger, loop.Index, e));

    /// <summary>Holder, once per pass with continuations: true while a storm lasts (one clock read, only after a storm began).</summary>
    private bool InStorm()
    {
        long until = Volatile.Read(ref _spillUntil);
        if (until == 0)
        {
            return false;
        }

        if (Stopwatch.GetTimestamp() < until)
        {
            return true;
        }

        Interlocked.CompareExchange(ref _spillUntil, 0, until); // over, unless extended meanwhile
        return false;
    }

    /// <summary>Any thread: the storm lasts at least until <see cref="s_stormSpell"/> after <paramref name="now"/>.</summary>
    private void ExtendStorm(long now)
    {
        long until = now + s_stormSpell;
        long current;
        do
        {
            current = Volatile.Read(ref _spillUntil);
            if (current >= until)
            {
                return;
            }
        }
        while (Interlocked.CompareExchange(ref _spillUntil, until, current) != current);
    }

    /// <summary>
    /// On the thread the loop was taken from, once the continuation that blocked has returned: the connection's demotion
    /// is timed from now, and the return is logged at Debug with how long the thread was held.
    /// </summary>
    private void OnReturned(LinuxConnection connection, long started)
    {
        long now = Stopwatch.GetTimestamp();
        connection.Scheduler?.Returned(now);
        LoopMonitor.Guarded(() => TransportLog.ContinuationReturned(loop.Logger, connection.ConnectionId, loop.Index, Stopwatch.GetElapsedTime(started, now).TotalMilliseconds));
    }
}
