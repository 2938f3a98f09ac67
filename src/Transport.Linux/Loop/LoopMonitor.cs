using System.Diagnostics;
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
/// the same CPU. The idea is Go's: a goroutine that blocks in a system call has
/// its processor handed to another thread by the scheduler's monitor.
/// </summary>
/// <remarks>
/// A server under light load runs a quick continuation now and then, so the monitor never parks; the calm interval
/// keeps it from waking a thousand times a second on the server's CPU for looks that find nothing to do. A
/// continuation that blocks right after a calm look is seen at the next one and taken one interval later.
/// It costs nothing on an idle server: after <see cref="IdleLooksBeforeParking"/> looks in a row in which no
/// continuation ran, it parks until the next continuation starts (<see cref="OnContinuationStarted"/>, a read of
/// one field per continuation). Parking and the loops' <see cref="LoopRunner.BeginContinuation"/> each write, fence
/// and then read the other's field, so either the monitor sees the continuation or the loop sees it parked.
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
    private long _lastLook;
    private long _lastSleepTicks;
    private bool _lastWasLate;
    private readonly ManualResetEventSlim _unpark = new(false, spinCount: 0);
    private readonly ILogger _logger;
    private readonly Thread _thread;
    private long[] _seen = [];
    private long[] _blockedAt = [];
    private long[] _cpuFor = [];
    private long[] _cpuAt = [];
    private TimeSpan _lastPauses;
    private int _parked;
    private volatile bool _stopping;
    private int _noThreadLogged;

    public LoopMonitor(LinuxTransportOptions options, ILogger logger)
    {
        _logger = logger;
        _thresholdTicks = options.Tuning.AdaptiveThresholdMicroseconds * Stopwatch.Frequency / 1_000_000;
        _runningThresholdNanoseconds = options.Tuning.AdaptiveRunningThresholdMicroseconds * 1000L;
        _interval = options.Tuning.AdaptiveIntervalMilliseconds;
        _calmInterval = options.Tuning.AdaptiveCalmIntervalMilliseconds;
        Threads = new LoopThreads(options.ThreadCount, options.Tuning.MaxLoopThreads(options.ThreadCount), TimeSpan.FromMilliseconds(options.Tuning.StandbyRetireMilliseconds));
        _thread = new Thread(Run) { IsBackground = true, Name = "Kestrel Linux monitor" };
    }

    /// <summary>The kernel's id of the monitor's thread, once it runs (tests).</summary>
    internal int ThreadId => Volatile.Read(ref _threadId);

    private int _threadId;

    /// <summary>The threads that hold the loops this monitor watches.</summary>
    public LoopThreads Threads { get; }

    /// <summary>Before <see cref="Start"/>: a loop to watch.</summary>
    public void Add(EventLoop loop) => _loops.Add(loop);

    public void Start()
    {
        _seen = new long[_loops.Count];
        _blockedAt = new long[_loops.Count];
        _cpuFor = new long[_loops.Count];
        _cpuAt = new long[_loops.Count];
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
            var look = Look();
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
            bool blocked = watch && runner.IsBlockedInKernel;
            bool computing = false;
            if (watch && !blocked)
            {
                long cpu = runner.CpuNanoseconds;
                if (_cpuFor[i] != started)
                {
                    _cpuFor[i] = started;
                    _cpuAt[i] = cpu;
                }

                computing = cpu >= 0 && cpu - _cpuAt[i] >= _runningThresholdNanoseconds;
            }

            if (!late && running >= _thresholdTicks && (computing || (blocked && _blockedAt[i] == started)))
            {
                Take(loop, runner, started);
            }

            _blockedAt[i] = blocked ? started : 0;
        }

        return watching ? Activity.Watching : active ? Activity.Quick : Activity.None;
    }

    private void Take(EventLoop loop, LoopRunner runner, long started)
    {
        if (Threads.TryHandOver(loop, () => loop.TryTake(runner, started)))
        {
            loop.Continuations!.OnTaken(runner);
            return;
        }

        // The cap on threads is reached (or the group stops): this loop stays blocked until the continuation returns.
        if (!_stopping && runner.ContinuationStarted == started && Interlocked.Exchange(ref _noThreadLogged, 1) == 0)
        {
            TransportLog.NoThreadForBlockedLoop(_logger, loop.Index, Threads.Count);
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

        _unpark.Wait();
        _unpark.Reset();
    }
}
