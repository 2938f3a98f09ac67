using System.Collections.Concurrent;
using System.Diagnostics;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Scheduling;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// Adaptive scheduling's part of one loop: the application continuations its connections scheduled on the loop's
/// thread, run later in the same pass under the monitor's watch (<see cref="Run"/>), and what follows when the
/// monitor takes the loop from a thread stuck in one of them (<see cref="OnTaken"/>, the warning that names the
/// connection).
/// </summary>
/// <remarks>
/// Threads: <see cref="TryQueue"/> and <see cref="Run"/> run on the loop's thread (the holder; a thread the loop was
/// just taken from fails <see cref="TryQueue"/>'s check or wakes the next holder); <see cref="OnTaken"/> on the
/// monitor's; <see cref="NewConnectionsStartOnPool"/> anywhere.
/// </remarks>
internal sealed class LoopContinuations(EventLoop loop, LoopMonitor monitor, LoopWakeup wakeup)
{
    /// <summary>A loop taken this many times within one second starts its new connections on the pool.</summary>
    private const int TakesBeforeNewConnectionsStartOnPool = 8;

    /// <summary>How long new connections start on the pool after takes came that often (10 s).</summary>
    private static readonly long s_poolStartSpell = Stopwatch.Frequency * 10;

    private readonly ConcurrentQueue<Continuation> _queue = new();

    // At most one "blocked the loop" warning per loop per 10 s; the ones in between are counted in the next.
    private readonly RateLimitedLog _blockedLog = new(TimeSpan.FromSeconds(10));

    // Written by the monitor: takes in the current one-second window, and until when new connections start on
    // the pool because takes came that often (0: they start on the loop).
    private long _takeWindowStart;
    private int _takesInWindow;
    private long _newConnectionsOnPoolUntil;

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
    /// The loop's thread: runs the continuations queued before this call, each one watched by the monitor. False
    /// when the loop was taken from this thread while one ran: the caller must return at once.
    /// </summary>
    public bool Run(LoopRunner runner)
    {
        // Only what was queued before this point, as the loop's scheduled work.
        int count = _queue.IsEmpty ? 0 : _queue.Count;
        while (count-- > 0 && _queue.TryDequeue(out var work))
        {
            long started = runner.BeginContinuation(work.Connection);
            Monitor.OnContinuationStarted();
            try
            {
                work.Run();
            }
            catch (Exception e)
            {
                TransportLog.ScheduledWorkFailed(loop.Logger, loop.Index, e);
            }

            if (!runner.EndContinuation())
            {
                ReportBlocked(work.Connection, started);
                return false;
            }
        }

        return true;
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
    /// Monitor thread, after a take: the connection that blocked goes to the pool for a while; a loop taken often
    /// starts its new connections there.
    /// </summary>
    public void OnTaken(LoopRunner runner)
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

        runner.Connection?.Scheduler?.Demote();
        loop.Metrics.LoopHandoffs.Add(1, loop.MetricTag);
    }

    /// <summary>
    /// On the thread the loop was taken from, once the continuation that blocked has returned: a warning that
    /// names the connection and how long it held the thread.
    /// </summary>
    private void ReportBlocked(LinuxConnection connection, long started)
    {
        long now = Stopwatch.GetTimestamp();
        if (_blockedLog.TryEnter(now, out int skipped))
        {
            TransportLog.ContinuationBlockedLoop(
                loop.Logger, connection.ConnectionId, loop.Index, Stopwatch.GetElapsedTime(started, now).TotalMilliseconds, connection.RemoteEndPoint, connection.LocalEndPoint, skipped);
        }
    }
}
