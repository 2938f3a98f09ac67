using System.Globalization;

namespace Kestrel.Transport.Linux.Hosting;

/// <summary>
/// Switches that exist to measure the transport's design, not to be configured: each one's default was
/// chosen by an ablation (docs/performance.md). They are internal, reachable from tests, the
/// microbenchmarks and the TechEmpower sample's benchmarks-only <c>--tuning</c> argument, and never bound
/// from configuration.
/// </summary>
internal sealed class TransportTuning
{
    /// <summary>Defer the loop's sends to the end of its pass and coalesce each connection's flushes into one write (false: send on the next pass).</summary>
    public bool DeferSend { get; set; } = true;

    /// <summary>
    /// With ThreadPool scheduling, the pool thread that drains a loop's dispatch batch sends what a connection
    /// flushed itself, with one sendmsg, instead of handing it back to the loop. A send the socket cannot take
    /// whole goes back to the loop, which waits for EPOLLOUT.
    /// </summary>
    public bool SendFromThreadPool { get; set; } = true;

    /// <summary>With <see cref="SendFromThreadPool"/>, a flush's send joins the end of the dispatch batch (false: it runs ahead of the batch).</summary>
    public bool CoalesceThreadPoolSends { get; set; } = true;

    /// <summary>The most one read may ask for; reads adapt between half a 4 KiB pool block and this. 2048..1048576.</summary>
    public int MaxBytesPerRead { get; set; } = 64 * 1024;

    /// <summary>Run the loop threads under SCHED_BATCH (sched(7)), so a loop that wakes does not preempt the thread on its CPU.</summary>
    public bool SchedBatchLoops { get; set; } = true;

    /// <summary>TCP_QUICKACK after accept and after every receive (tcp(7): Linux clears it by itself).</summary>
    public bool TcpQuickAck { get; set; }

    /// <summary>TCP_NOTSENT_LOWAT on accepted sockets, in bytes (0 leaves <c>net.ipv4.tcp_notsent_lowat</c>).</summary>
    public int TcpNotSentLowAtBytes { get; set; }

    /// <summary>Use libktl_native.so when it loads (false: the managed P/Invoke engine).</summary>
    public bool UseNativeEngine { get; set; } = true;

    /// <summary>Keep sending with MSG_ZEROCOPY after the kernel reported it copied (loopback always copies), so that tests exercise the path.</summary>
    public bool ZeroCopyWhenKernelCopies { get; set; }

    /// <summary>
    /// Adaptive scheduling: how long one application continuation may hold its loop's thread before the monitor
    /// moves the loop to another thread (microseconds, 100..1000000).
    /// </summary>
    public int AdaptiveThresholdMicroseconds { get; set; } = 1000;

    /// <summary>
    /// Adaptive scheduling: as <see cref="AdaptiveThresholdMicroseconds"/>, for a continuation whose thread is running
    /// (computing, or preempted) rather than asleep in the kernel (microseconds, at least the former).
    /// </summary>
    public int AdaptiveRunningThresholdMicroseconds { get; set; } = 10_000;

    /// <summary>
    /// Adaptive scheduling: a continuation that computes this long on the loop (its thread's CPU time, microseconds, taken
    /// as at least <see cref="AdaptiveThresholdMicroseconds"/> and at most <see cref="AdaptiveRunningThresholdMicroseconds"/>) moves its connection
    /// to the pool for a while, without moving the loop: handlers that compute a few milliseconds per request would
    /// otherwise hold every other connection of their loop each time (issue 38).
    /// </summary>
    public int AdaptiveComputeDemotionMicroseconds { get; set; } = 2000;

    /// <summary>
    /// Adaptive scheduling: how long one pass runs application continuations before it goes on to its scheduled work,
    /// sends, and next wait; the rest run in the next pass (microseconds, 100..1000000). A pass runs at most one
    /// continuation past it.
    /// </summary>
    public int AdaptivePassBudgetMicroseconds { get; set; } = 2000;

    /// <summary>Adaptive scheduling: how often the monitor looks at the loops while continuations run (milliseconds, 1..1000).</summary>
    public int AdaptiveIntervalMilliseconds { get; set; } = 1;

    /// <summary>
    /// Adaptive scheduling: the longest the monitor waits between looks while every continuation it sees is quick
    /// (milliseconds, <see cref="AdaptiveIntervalMilliseconds"/>..1000; equal to it, the monitor looks at a steady pace).
    /// </summary>
    public int AdaptiveCalmIntervalMilliseconds { get; set; } = 8;

    /// <summary>
    /// With Adaptive and Inline scheduling, the longest an idle loop polls before it sleeps (microseconds, 0..1000; 0:
    /// it never polls): the cap of the window <see cref="Loop.IdlePoll"/> grows and shrinks, in the epochs where polling
    /// has cost less CPU per byte received than sleeping at the same load, never while the loop is saturated. Off: at 50
    /// (<see cref="Loop.IdlePollChoice"/>, 3 paired rounds on .NET 11) it served 1.28x requests/s at 1 connection and
    /// 1.13x at 2, closed loop, and cost 1.02x and 1.01x CPU per request at 5% and 60% of Sockets' saturated rate open
    /// loop, but 1.07x at 25%, where its explorations of polling cost 2.7x a sleeping epoch
    /// (docs/benchmarks/adaptive-default.md).
    /// </summary>
    public int IdlePollMaxMicroseconds { get; set; }

    /// <summary>
    /// How much more CPU per byte received (percent, 0..100) a poll may cost than a sleep and still be chosen (a saturated loop
    /// never polls): it answers sooner. 0, so that the poll is chosen only where it is the cheaper way to wait.
    /// </summary>
    public int IdlePollLatencyAllowancePercent { get; set; }

    /// <summary>Adaptive scheduling: how long a standby thread waits for a loop to take over before it exits (milliseconds).</summary>
    public int StandbyRetireMilliseconds { get; set; } = 20_000;

    /// <summary>
    /// Adaptive scheduling: the soft cap on threads that may hold, have held or wait to hold the loops (0: four per loop,
    /// and 4 more). Below it a loop gets a thread whenever it needs one; past it, at a bounded rate, up to
    /// <see cref="LoopThreadCeiling"/>.
    /// </summary>
    public int LoopThreadLimit { get; set; }

    /// <summary>
    /// Adaptive scheduling: the most threads the loops may use (0: <see cref="LoopThreadLimit"/>'s cap and 256 more), but
    /// for work only a held loop can do (a stop, an unbind), which always gets one.
    /// </summary>
    public int LoopThreadCeiling { get; set; }

    /// <summary>
    /// Where the threads' /proc entries are read from (stat and schedstat per thread id): a seam for tests, which point it
    /// at a directory that does not exist, as in gVisor or under a masked /proc. Not a switch (<see cref="Apply"/> does not know it).
    /// </summary>
    internal string ThreadStatsDirectory { get; set; } = "/proc/self/task";

    /// <summary>The cap on loop threads for <paramref name="loops"/> loops (see <see cref="LoopThreadLimit"/>).</summary>
    public int MaxLoopThreads(int loops) => Math.Min(LoopThreadLimit > 0 ? Math.Max(LoopThreadLimit, loops) : (loops * 4) + 4, LoopThreadCeilingFor(loops));

    /// <summary>The hard ceiling on loop threads for <paramref name="loops"/> loops (see <see cref="LoopThreadCeiling"/>).</summary>
    public int LoopThreadCeilingFor(int loops)
        => LoopThreadCeiling > 0 ? Math.Max(LoopThreadCeiling, loops) : (LoopThreadLimit > 0 ? Math.Max(LoopThreadLimit, loops) : (loops * 4) + 4) + 256;

    /// <summary>
    /// Applies <c>Name=value</c> pairs separated by commas (for example <c>SendFromThreadPool=false,MaxBytesPerRead=4096</c>).
    /// Returns null, or the error: an unknown name or a value that does not parse.
    /// </summary>
    public string? Apply(string settings)
    {
        foreach (string setting in settings.Split(',', StringSplitOptions.RemoveEmptyEntries | StringSplitOptions.TrimEntries))
        {
            int equals = setting.IndexOf('=', StringComparison.Ordinal);
            if (equals <= 0)
            {
                return $"'{setting}' is not Name=value.";
            }

            string name = setting[..equals].Trim();
            string value = setting[(equals + 1)..].Trim();
            string? error = name switch
            {
                nameof(DeferSend) => SetBool(value, v => DeferSend = v),
                nameof(SendFromThreadPool) => SetBool(value, v => SendFromThreadPool = v),
                nameof(CoalesceThreadPoolSends) => SetBool(value, v => CoalesceThreadPoolSends = v),
                nameof(SchedBatchLoops) => SetBool(value, v => SchedBatchLoops = v),
                nameof(TcpQuickAck) => SetBool(value, v => TcpQuickAck = v),
                nameof(UseNativeEngine) => SetBool(value, v => UseNativeEngine = v),
                nameof(ZeroCopyWhenKernelCopies) => SetBool(value, v => ZeroCopyWhenKernelCopies = v),
                nameof(MaxBytesPerRead) => SetInt(value, v => MaxBytesPerRead = v),
                nameof(TcpNotSentLowAtBytes) => SetInt(value, v => TcpNotSentLowAtBytes = v),
                nameof(AdaptiveThresholdMicroseconds) => SetInt(value, v => AdaptiveThresholdMicroseconds = v),
                nameof(AdaptiveIntervalMilliseconds) => SetInt(value, v => AdaptiveIntervalMilliseconds = v),
                nameof(AdaptiveCalmIntervalMilliseconds) => SetInt(value, v => AdaptiveCalmIntervalMilliseconds = v),
                nameof(AdaptiveRunningThresholdMicroseconds) => SetInt(value, v => AdaptiveRunningThresholdMicroseconds = v),
                nameof(StandbyRetireMilliseconds) => SetInt(value, v => StandbyRetireMilliseconds = v),
                nameof(LoopThreadLimit) => SetInt(value, v => LoopThreadLimit = v),
                nameof(IdlePollMaxMicroseconds) => SetInt(value, v => IdlePollMaxMicroseconds = v),
                nameof(IdlePollLatencyAllowancePercent) => SetInt(value, v => IdlePollLatencyAllowancePercent = v),
                nameof(LoopThreadCeiling) => SetInt(value, v => LoopThreadCeiling = v),
                nameof(AdaptiveComputeDemotionMicroseconds) => SetInt(value, v => AdaptiveComputeDemotionMicroseconds = v),
                nameof(AdaptivePassBudgetMicroseconds) => SetInt(value, v => AdaptivePassBudgetMicroseconds = v),
                _ => $"unknown tuning switch '{name}'; known: {string.Join(", ", Names)}.",
            };

            if (error is not null)
            {
                return $"{name}: {error}";
            }
        }

        return null;
    }

    /// <summary>The switches <see cref="Apply"/> knows.</summary>
    public static IReadOnlyList<string> Names { get; } =
    [
        nameof(DeferSend), nameof(SendFromThreadPool), nameof(CoalesceThreadPoolSends), nameof(MaxBytesPerRead),
        nameof(SchedBatchLoops), nameof(TcpQuickAck), nameof(TcpNotSentLowAtBytes), nameof(UseNativeEngine),
        nameof(ZeroCopyWhenKernelCopies), nameof(AdaptiveThresholdMicroseconds), nameof(AdaptiveRunningThresholdMicroseconds), nameof(AdaptiveIntervalMilliseconds),
        nameof(AdaptiveCalmIntervalMilliseconds), nameof(StandbyRetireMilliseconds), nameof(LoopThreadLimit), nameof(LoopThreadCeiling),
        nameof(AdaptiveComputeDemotionMicroseconds), nameof(AdaptivePassBudgetMicroseconds),
        nameof(IdlePollMaxMicroseconds), nameof(IdlePollLatencyAllowancePercent),
    ];

    internal IEnumerable<string> Validate()
    {
        if (MaxBytesPerRead is < 2048 or > 1024 * 1024)
        {
            yield return $"{nameof(TransportTuning)}.{nameof(MaxBytesPerRead)} must be between 2048 and 1048576, but was {MaxBytesPerRead}.";
        }

        if (AdaptiveThresholdMicroseconds is < 100 or > 1_000_000)
        {
            yield return $"{nameof(TransportTuning)}.{nameof(AdaptiveThresholdMicroseconds)} must be between 100 and 1000000, but was {AdaptiveThresholdMicroseconds}.";
        }

        if (AdaptiveRunningThresholdMicroseconds < AdaptiveThresholdMicroseconds || AdaptiveRunningThresholdMicroseconds > 10_000_000)
        {
            yield return $"{nameof(TransportTuning)}.{nameof(AdaptiveRunningThresholdMicroseconds)} must be between {nameof(AdaptiveThresholdMicroseconds)} and 10000000, but was {AdaptiveRunningThresholdMicroseconds}.";
        }

        if (AdaptiveIntervalMilliseconds is < 1 or > 1000)
        {
            yield return $"{nameof(TransportTuning)}.{nameof(AdaptiveIntervalMilliseconds)} must be between 1 and 1000, but was {AdaptiveIntervalMilliseconds}.";
        }

        if (AdaptiveCalmIntervalMilliseconds < AdaptiveIntervalMilliseconds || AdaptiveCalmIntervalMilliseconds > 1000)
        {
            yield return $"{nameof(TransportTuning)}.{nameof(AdaptiveCalmIntervalMilliseconds)} must be between {nameof(AdaptiveIntervalMilliseconds)} and 1000, but was {AdaptiveCalmIntervalMilliseconds}.";
        }

        if (StandbyRetireMilliseconds < 1 || LoopThreadLimit < 0 || LoopThreadCeiling < 0)
        {
            yield return $"{nameof(TransportTuning)}.{nameof(StandbyRetireMilliseconds)} must be positive, and {nameof(LoopThreadLimit)} and {nameof(LoopThreadCeiling)} non-negative.";
        }

        if (AdaptiveComputeDemotionMicroseconds is < 100 or > 10_000_000)
        {
            yield return $"{nameof(TransportTuning)}.{nameof(AdaptiveComputeDemotionMicroseconds)} must be between 100 and 10000000, but was {AdaptiveComputeDemotionMicroseconds}.";
        }

        if (AdaptivePassBudgetMicroseconds is < 100 or > 1_000_000)
        {
            yield return $"{nameof(TransportTuning)}.{nameof(AdaptivePassBudgetMicroseconds)} must be between 100 and 1000000, but was {AdaptivePassBudgetMicroseconds}.";
        }

        if (IdlePollMaxMicroseconds is < 0 or > 1000 || IdlePollLatencyAllowancePercent is < 0 or > 100)
        {
            yield return $"{nameof(TransportTuning)}.{nameof(IdlePollMaxMicroseconds)} must be between 0 and 1000, and {nameof(IdlePollLatencyAllowancePercent)} between 0 and 100.";
        }

        if (TcpNotSentLowAtBytes < 0)
        {
            yield return $"{nameof(TransportTuning)}.{nameof(TcpNotSentLowAtBytes)} must be non-negative, but was {TcpNotSentLowAtBytes}.";
        }
    }

    private static string? SetBool(string value, Action<bool> set)
    {
        if (!bool.TryParse(value, out bool parsed))
        {
            return $"'{value}' is not true or false.";
        }

        set(parsed);
        return null;
    }

    private static string? SetInt(string value, Action<int> set)
    {
        if (!int.TryParse(value, NumberStyles.Integer, CultureInfo.InvariantCulture, out int parsed))
        {
            return $"'{value}' is not an integer.";
        }

        set(parsed);
        return null;
    }
}
