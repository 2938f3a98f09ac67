using System.Diagnostics;
using System.Runtime;
using Kestrel.Transport.Linux.Diagnostics;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// With Adaptive scheduling, one thread per loop group that looks at each loop every
/// <see cref="Hosting.TransportTuning.AdaptiveIntervalMilliseconds"/> while a continuation runs long enough to
/// watch, and less often, up to <see cref="Hosting.TransportTuning.AdaptiveCalmIntervalMilliseconds"/>, while every
/// continuation it sees is quick: a loop whose thread has been inside one
/// application continuation longer than <see cref="Hosting.TransportTuning.AdaptiveThresholdMicroseconds"/> and
/// is asleep in the kernel (a blocking call), or that has computed for
/// <see cref="Hosting.TransportTuning.AdaptiveRunningThresholdMicroseconds"/> of its own CPU time, is taken from
/// that thread and handed to another (<see cref="LoopThreads"/>), so the loop's other connections go on. A thread
/// that is only waiting for a CPU (preempted on a busy machine) keeps its loop: another thread would wait for
/// the same CPU. A continuation that computes for <see cref="Hosting.TransportTuning.AdaptiveComputeDemotionMicroseconds"/>
/// keeps its loop but moves its connection to the pool, without a hand-off. The idea is Go's: a goroutine that blocks
/// in a system call has its processor handed to another thread by the scheduler's monitor.
/// </summary>
/// <remarks>
/// A server under light load runs a quick continuation now and then, so the monitor never parks; the calm interval
/// keeps it from waking a thousand times a second on the server's CPU for looks that find nothing to do. A
/// continuation that blocks right after a calm look is seen at the next one and taken one interval later.
/// It costs nothing on an idle server: after <see cref="IdleLooksBeforeParking"/> looks in a row in which no
/// continuation ran, it parks until the next continuation starts (<see cref="OnContinuationStarted"/>, a read of
/// one field per continuation), with the holders' /proc files closed (<see cref="HolderStats"/>). Parking and the loops'
/// <see cref="LoopRunner.BeginContinuation"/> each write, fence and then read the other's field, so either the monitor
/// sees the continuation or the loop sees it parked.
/// A logger that throws, or anything else a look runs into, is caught: the monitor goes on.
/// </remarks>
internal sealed class LoopMonitor : IDisposable
{
    /// <summary>Looks without any continuation before the monitor parks (with the default intervals, about 50 ms: 1, 2, 4, then 8 ms apart).</summary>
    private const int IdleLooksBeforeParking = 8;

    private readonly int _interval;
    private readonly int _calmInterval;

    private readonly List<EventLoop> _loops = [];
    private readonly long _thresholdTicks;
    private readonly long _runningThresholdNanoseconds;
    private readonly long _demoteNanoseconds;
    private readonly string _statsDirectory;
    private long _lastLook;
    private long _lastSleepTicks;
    private bool _lastWasLate;
    private readonly ManualResetEventSlim _unpark = new(false, spinCount: 0);
    private readonly ILogger _logger;
    private readonly TransportMetrics _metrics;
    private readonly Thread _thread;

    // Per loop, by index: what the last look saw (continuations begun, the start of one seen asleep), the CPU and JIT
    // time when a running continuation was first watched, and the continuation last demoted or refused a hand-off.
    private HolderStats[] _stats = [];
    private long[] _seen = [];
    private long[] _blockedAt = [];
    private long[] _cpuFor = [];
    private long[] _cpuAt = [];
    private TimeSpan[] _jitAt = [];
    private long[] _demotedFor = [];
    private long[] _refusedFor = [];

    private readonly RateLimitedLog _noThreadLog = new(TimeSpan.FromSeconds(10));
    private readonly RateLimitedLog _startFailedLog = new(TimeSpan.FromSeconds(10));
    private TimeSpan _lastPauses;
    private int _parked;
    private int _threadId;
    private volatile bool _stopping;

    public LoopMonitor(LinuxTransportOptions options, ILogger logger, TransportMetrics metrics)
    {
        var tuning = options.Tuning;
        _logger = logger;
        _metrics = metrics;
        _thresholdTicks = tuning.AdaptiveThresholdMicroseconds * Stopwatch.Frequency / 1_000_000;
        _runningThresholdNanoseconds = tuning.AdaptiveRunningThresholdMicroseconds * 1000L;
        _demoteNanoseconds = Math.Clamp(tuning.AdaptiveComputeDemotionMicroseconds, tuning.AdaptiveThresholdMicroseconds, tuning.AdaptiveRunningThresholdMicroseconds) * 1000L;
        _interval = tuning.AdaptiveIntervalMilliseconds;
        _calmInterval = tuning.AdaptiveCalmIntervalMilliseconds;
        _statsDirectory = tuning.ThreadStatsDirectory;
        Threads = new LoopThreads(options.ThreadCount, tuning.MaxLoopThreads(options.ThreadCount), tuning.LoopThreadCeilingFor(options.ThreadCount), TimeSpan.FromMilliseconds(tuning.StandbyRetireMilliseconds));
        _thread = new Thread(Run) { IsBackground = true, Name = "Kestrel Linux monitor" };
    }

    /// <summary>The kernel's id of the monitor's thread, once it runs (tests).</summary>
    internal int ThreadId => Volatile.Read(ref _threadId);

    /// <summary>The threads that hold the loops this monitor watches.</summary>
    public LoopThreads Threads { get; }

    /// <summary>Before <see cref="Start"/>: a loop to watch.</summary>
    public void Add(EventLoop loop) => _loops.Add(loop);

    public void Start()
    {
        int count = _loops.Count;
        _stats = [.. _loops.Select(_ => new HolderStats(_statsDirectory))];
        _seen = new long[count];
        _blockedAt = new long[count];
        _cpuFor = new long[count];
        _cpuAt = new long[count];
        _jitAt = new TimeSpan[count];
        _demotedFor = new long[count];
        _refusedFor = new long[count];
        _thread.Start();
    }

    /// <summary>A loop's thread, right after it began a continuation: wakes a parked monitor.</summary>
    public void OnContinuationStarted()
    {
        if (Volatile.Read(ref _parked) != 0 && Interlocked.Exchange(ref _parked, 0) != 0)
        {
            _unpark.Set();
        }
    }

    /// <summary>The group has ended: the monitor's thread exits, and so does every standby.</summary>
    public void Dispose()
    {
        _stopping = true;
        Interlocked.Exchange(ref _parked, 0);
        _unpark.Set();
        Threads.Stop();
    }

    private void Run()
    {
        Volatile.Write(ref _threadId, Interop.Affinity.CurrentThreadId());
        int idleLooks = 0;
        int sleep = _interval;
        while (!_stopping)
        {
            _lastSleepTicks = sleep * Stopwatch.Frequency / 1000;
            Thread.Sleep(sleep);
            var look = Activity.Watching;
            try
            {
                look = Look();
            }
            catch (Exception e)
            {
                Guarded(() => TransportLog.MonitorLookFailed(_logger, e));
            }

            idleLooks = look == Activity.None ? idleLooks + 1 : 0;
            // Twice as long after each look that found only quick continuations (or none), back to the interval as
            // soon as one runs long enough to watch.
            sleep = look == Activity.Watching ? _interval : Math.Min(sleep * 2, _calmInterval);
            if (idleLooks >= IdleLooksBeforeParking)
            {
                idleLooks = 0;
                Park();
                _lastLook = 0;
                sleep = _interval;
            }
        }

        foreach (var stats in _stats)
        {
            stats.Dispose();
        }
    }

    /// <summary>What one look found.</summary>
    private enum Activity
    {
        /// <summary>No continuation ran since the last look, and none runs now.</summary>
        None,

        /// <summary>Continuations ran, and none has run long enough to watch.</summary>
        Quick,

        /// <summary>A continuation has run at least half the threshold: the next look must come soon.</summary>
        Watching,
    }

    /// <summary>One look at every loop.</summary>
    private Activity Look()
    {
        bool active = false;
        bool watching = false;
        long now = Stopwatch.GetTimestamp();

        // A look that comes late (this thread was not scheduled), or after a garbage collection (which held every
        // thread of the app asleep in the kernel), would see every continuation that ran meanwhile as one that ran
        // long or blocked: it only takes note, and the next look decides (on a machine so busy that every look is
        // late, every other one does).
        var pauses = GC.GetTotalPauseDuration();
        long lateTicks = (2 * _lastSleepTicks) + _thresholdTicks;
        bool late = ((_lastLook != 0 && now - _lastLook > lateTicks) || pauses != _lastPauses) && !_lastWasLate;
        _lastWasLate = late;
        _lastLook = now;
        _lastPauses = pauses;
        for (int i = 0; i < _loops.Count; i++)
        {
            var loop = _loops[i];
            if (loop.Runner is not { } runner)
            {
                continue;
            }

            long started = runner.ContinuationStarted;
            long continuations = runner.Continuations;
            active |= started > 0 || continuations != _seen[i];
            _seen[i] = continuations;
            // Asleep in the kernel at two looks in a row, not only at one: a thread caught waking up (from a lock
            // held for a moment, say) is not blocked. Or computing: the thread's own CPU time (schedstat) since the
            // monitor first saw this continuation, not the time since it began, which counts the time others had
            // the CPU (on a busy CPU, pool threads running connections that were moved off the loop would otherwise
            // make the loop's quick continuations look long, and move it again).
            long running = now - started;
            bool watch = started > 0 && running >= _thresholdTicks / 2;
            watching |= watch;
            if (!watch)
            {
                _blockedAt[i] = 0;
                continue;
            }

            var stats = _stats[i];
            stats.Follow(runner, runner.ThreadId);
            bool blocked = stats.IsBlocked;
            bool computing = false;
            bool firstUse = false;
            if (!blocked)
            {
                long cpu = stats.CpuNanoseconds;
                if (_cpuFor[i] != started)
                {
                    _cpuFor[i] = started;
                    _cpuAt[i] = cpu;
                    _jitAt[i] = JitInfo.GetCompilationTime(currentThread: false);
                }

                // Compute that was mostly the JIT's (the process compiled for half the CPU time the holder used since the
                // monitor first watched it, or more: 80-90% on a cold start; a quarter let the tiering of an app's first
                // minutes pass for it too often) is first-use work: a cold start, or an endpoint's first call. It is
                // handed off like any computation, but logged at Debug, and moves no connection to the pool.
                long used = cpu < 0 ? -1 : cpu - _cpuAt[i];
                computing = used >= _runningThresholdNanoseconds;
                if (used >= _demoteNanoseconds)
                {
                    firstUse = (JitInfo.GetCompilationTime(currentThread: false) - _jitAt[i]).Ticks * 100 * 2 >= used;
                    if (!firstUse && _demotedFor[i] != started)
                    {
                        _demotedFor[i] = started;
                        loop.Continuations!.OnComputedLong(runner, started);
                    }
                }
            }

            // Work posted to the loop that only it can do (a stop, an unbind) does not wait for a second look.
            bool control = loop.HasControlWork;
            if (!late && running >= _thresholdTicks && (computing || (blocked && (_blockedAt[i] == started || control))))
            {
                Take(i, loop, runner, started, blocked, control, firstUse);
            }

            _blockedAt[i] = blocked ? started : 0;
        }

        return watching ? Activity.Watching : active ? Activity.Quick : Activity.None;
    }

    private void Take(int i, EventLoop loop, LoopRunner runner, long started, bool blocked, bool control, bool firstUse)
    {
        var need = control ? LoopThreads.Need.Control : blocked ? LoopThreads.Need.Blocked : LoopThreads.Need.Computing;
        var outcome = Threads.TryHandOver(loop, runner, started, need);
        if (outcome == LoopThreads.Outcome.HandedOver)
        {
            loop.Continuations!.OnTaken(runner, started, blocked, firstUse);
            return;
        }

        if (outcome is not (LoopThreads.Outcome.AtCeiling or LoopThreads.Outcome.StartFailed) || _refusedFor[i] == started)
        {
            return;
        }

        // Once per continuation that could not be handed off: it keeps its loop until it returns, or a thread frees up.
        _refusedFor[i] = started;
        ReportRefused(loop, atCeiling: outcome == LoopThreads.Outcome.AtCeiling);
    }

    private void ReportRefused(EventLoop loop, bool atCeiling)
    {
        _metrics.LoopHandoffsRefused.Add(1, loop.MetricTag, atCeiling ? TransportMetrics.RefusedAtThreadLimit : TransportMetrics.RefusedThreadStartFailed);
        long now = Stopwatch.GetTimestamp();
        int threads = Threads.Count;
        if (atCeiling && _noThreadLog.TryEnter(now, out int skipped))
        {
            Guarded(() => TransportLog.NoThreadForBlockedLoop(_logger, loop.Index, threads, skipped));
        }
        else if (!atCeiling && _startFailedLog.TryEnter(now, out skipped))
        {
            var failure = Threads.LastStartFailure;
            Guarded(() => TransportLog.ThreadStartFailed(_logger, loop.Index, threads, skipped, failure));
        }
    }

    private void Park()
    {
        Volatile.Write(ref _parked, 1);
        Interlocked.MemoryBarrier();
        foreach (var loop in _loops)
        {
            if (loop.Runner is { ContinuationStarted: > 0 })
            {
                Volatile.Write(ref _parked, 0);
                return;
            }
        }

        // Parked, the monitor reads nothing: the holders' files are closed until it looks again.
        foreach (var stats in _stats)
        {
            stats.Close();
        }

        _unpark.Wait();
        _unpark.Reset();
    }

    /// <summary>Logs from the monitor's thread: a logger that throws (a disposed one, at shutdown) must not end it.</summary>
    internal static void Guarded(Action log)
    {
        try
        {
            log();
        }
        catch (Exception)
        {
            // Nothing to report it to: the logger is what failed.
        }
    }
}
