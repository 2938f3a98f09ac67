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
        nameof(ZeroCopyWhenKernelCopies),
    ];

    internal IEnumerable<string> Validate()
    {
        if (MaxBytesPerRead is < 2048 or > 1024 * 1024)
        {
            yield return $"{nameof(TransportTuning)}.{nameof(MaxBytesPerRead)} must be between 2048 and 1048576, but was {MaxBytesPerRead}.";
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
