using System.Collections.Concurrent;
using System.Diagnostics;
using System.Diagnostics.Metrics;
using System.Globalization;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>
/// What the tests of Adaptive scheduling's safety share: servers with one loop, so that every connection shares it;
/// connections warmed with one request, so that the transport, not Kestrel's accept path, schedules the next; the
/// transport's log lines with their event ids; and its meter's measurements with every attribute.
/// </summary>
internal static class AdaptiveTesting
{
    /// <summary>Adaptive scheduling on epoll and on a movable io_uring ring.</summary>
    public static TheoryData<TransportKind> Kinds => new() { TransportKind.LinuxAdaptive, TransportKind.LinuxIoUringAdaptive };

    /// <summary>A host with one loop and synchronous I/O allowed; <paramref name="linux"/> after the kind's options.</summary>
    public static Task<TestHost> StartAsync(TransportKind kind, ITestOutputHelper output, RequestDelegate handler, Action<LinuxTransportOptions>? linux = null, Action<TestHostSettings>? settings = null)
        => TestHost.StartAsync(kind, output, handler, s =>
        {
            settings?.Invoke(s);
            var kestrel = s.Kestrel;
            s.Kestrel = k =>
            {
                k.AllowSynchronousIO = true;
                kestrel?.Invoke(k);
            };
            s.Linux = o =>
            {
                o.ThreadCount = 1;
                linux?.Invoke(o);
            };
        });

    public static LinuxTransportFactory Factory(TestHost host)
        => Assert.IsType<LinuxTransportFactory>(host.App.Services.GetServices<IConnectionListenerFactory>().Last());

    /// <summary>Connections that each had one request answered.</summary>
    public static async Task<List<RawHttpConnection>> WarmedAsync(TestHost host, int count)
    {
        var connections = new List<RawHttpConnection>();
        using var cts = new CancellationTokenSource(TestTimeouts.Large);
        for (int i = 0; i < count; i++)
        {
            connections.Add(await RawHttpConnection.ConnectAsync(host.EndPoint, cts.Token));
        }

        await Task.WhenAll(connections.Select(c => GetAsync(c, "/warm", TestTimeouts.Large)));
        return connections;
    }

    /// <summary>One GET on <paramref name="connection"/>: its body, after checking the status is 200.</summary>
    public static async Task<string> GetAsync(RawHttpConnection connection, string path, TimeSpan timeout)
    {
        await connection.SendAsync(RawHttpRequest.Get(path), timeout);
        var response = await connection.ReadResponseAsync(timeout);
        Assert.True(response.StatusCode == 200, $"{path}: {response.StatusLine} {response.BodyText}");
        return response.BodyText;
    }

    public static async Task WaitUntilAsync(Func<bool> condition, TimeSpan timeout, string what)
    {
        var waited = Stopwatch.StartNew();
        while (!condition())
        {
            Assert.True(waited.Elapsed < timeout, $"Waited {timeout.TotalSeconds:F0} s for {what}.");
            await Task.Delay(5);
        }
    }

    /// <summary>Threads of this process whose kernel name (comm, cut at 15 bytes) starts with <paramref name="prefix"/>.</summary>
    public static int ThreadsNamed(string prefix)
        => Directory.GetDirectories("/proc/self/task").Count(task =>
        {
            try
            {
                return File.ReadAllText(Path.Combine(task, "comm")).StartsWith(prefix, StringComparison.Ordinal);
            }
            catch (IOException)
            {
                return false;
            }
        });

    /// <summary>True while the thread with kernel id <paramref name="tid"/> exists in this process.</summary>
    public static bool ThreadAlive(int tid) => tid != 0 && Directory.Exists($"/proc/self/task/{tid.ToString(CultureInfo.InvariantCulture)}");

    /// <summary>Spins until this thread has used <paramref name="cpu"/> of CPU time (not wall time, which threads sharing a CPU would all count).</summary>
    public static void ComputeFor(TimeSpan cpu)
    {
        long until = ThreadCpuNanoseconds() + (long)(cpu.TotalMilliseconds * 1_000_000);
        while (ThreadCpuNanoseconds() < until)
        {
            Thread.SpinWait(100);
        }
    }

    private static long ThreadCpuNanoseconds()
    {
        const int ClockThreadCpuTimeId = 3; // clock_gettime(2)
        Assert.Equal(0, clock_gettime(ClockThreadCpuTimeId, out var time));
        return (time.Seconds * 1_000_000_000) + time.Nanoseconds;
    }

    [System.Runtime.InteropServices.DllImport("libc", SetLastError = true)]
    private static extern int clock_gettime(int clock, out Timespec time);

    private readonly struct Timespec
    {
        public readonly long Seconds;
        public readonly long Nanoseconds;
    }
}

/// <summary>The transport's log lines, each with its level and event id, as "Level[id]: message".</summary>
internal sealed class TransportLogLines : ILoggerProvider
{
    private readonly ConcurrentQueue<(LogLevel Level, int Id, string Message)> _lines = new();

    public IReadOnlyList<(LogLevel Level, int Id, string Message)> Lines => [.. _lines];

    public IReadOnlyList<string> With(int eventId, LogLevel? level = null)
        => [.. _lines.Where(l => l.Id == eventId && (level is null || l.Level == level)).Select(l => l.Message)];

    public ILogger CreateLogger(string categoryName) => new Logger(this, categoryName == TransportLog.Category);

    public void Dispose()
    {
    }

    private sealed class Logger(TransportLogLines lines, bool transport) : ILogger
    {
        public IDisposable? BeginScope<TState>(TState state)
            where TState : notnull => null;

        public bool IsEnabled(LogLevel logLevel) => transport;

        public void Log<TState>(LogLevel logLevel, EventId eventId, TState state, Exception? exception, Func<TState, Exception?, string> formatter)
        {
            if (transport)
            {
                lines._lines.Enqueue((logLevel, eventId.Id, formatter(state, exception)));
            }
        }
    }
}

/// <summary>Every measurement of the transport's meter in one host, with all of its attributes (MeasurementRecorder keeps one).</summary>
internal sealed class TaggedMeasurements : IDisposable
{
    private readonly MeterListener _listener = new();
    private readonly ConcurrentQueue<(string Name, double Value, Dictionary<string, object?> Tags)> _measurements = new();

    public TaggedMeasurements(TestHost host)
    {
        var scope = host.App.Services.GetRequiredService<IMeterFactory>();
        _listener.InstrumentPublished = (instrument, listener) =>
        {
            if (instrument.Meter.Scope == scope && instrument.Meter.Name == TransportMetrics.MeterName)
            {
                listener.EnableMeasurementEvents(instrument);
            }
        };
        _listener.SetMeasurementEventCallback<long>((i, v, tags, _) => Record(i, v, tags));
        _listener.SetMeasurementEventCallback<int>((i, v, tags, _) => Record(i, v, tags));
        _listener.SetMeasurementEventCallback<double>((i, v, tags, _) => Record(i, v, tags));
        _listener.Start();
    }

    public void Collect() => _listener.RecordObservableInstruments();

    /// <summary>The sum of <paramref name="name"/>'s measurements whose attributes include every one of <paramref name="tags"/> ("key=value").</summary>
    public long Sum(string name, params string[] tags) => (long)Of(name, tags).Sum(m => m.Value);

    /// <summary>The largest value of <paramref name="name"/> recorded so far (0 when none was).</summary>
    public double Max(string name) => Of(name).Select(m => m.Value).DefaultIfEmpty(0).Max();

    public IEnumerable<(double Value, Dictionary<string, object?> Tags)> Of(string name, params string[] tags)
        => _measurements.Where(m => m.Name == name && tags.All(t => Has(m.Tags, t))).Select(m => (m.Value, m.Tags));

    public string Describe(string name)
        => string.Join("; ", Of(name).Select(m => $"{m.Value} {{{string.Join(", ", m.Tags.Select(t => $"{t.Key}={t.Value}"))}}}"));

    public void Dispose() => _listener.Dispose();

    private static bool Has(Dictionary<string, object?> tags, string tag)
    {
        int equals = tag.IndexOf('=', StringComparison.Ordinal);
        return tags.TryGetValue(tag[..equals], out var value)
            && string.Equals(Convert.ToString(value, CultureInfo.InvariantCulture), tag[(equals + 1)..], StringComparison.Ordinal);
    }

    private void Record(Instrument instrument, double value, ReadOnlySpan<KeyValuePair<string, object?>> tags)
    {
        var copy = new Dictionary<string, object?>();
        foreach (var tag in tags)
        {
            copy[tag.Key] = tag.Value;
        }

        _measurements.Enqueue((instrument.Name, value, copy));
    }
}

/// <summary>
/// A measurement for the lead's quiet machine, not a check: skipped unless KTL_MEASURE=1. Run with
/// <c>KTL_MEASURE=1 dotnet test tests/Kestrel.Transport.Linux.Tests -c Release --no-build --filter "Category=Measurement" --logger "console;verbosity=detailed"</c>.
/// </summary>
public sealed class MeasurementTheoryAttribute : TheoryAttribute
{
    public MeasurementTheoryAttribute()
    {
        if (Environment.GetEnvironmentVariable("KTL_MEASURE") != "1")
        {
            Skip = "A measurement for a quiet machine: set KTL_MEASURE=1 to run it.";
        }
    }
}

/// <summary>As <see cref="MeasurementTheoryAttribute"/>, for a single case.</summary>
public sealed class MeasurementFactAttribute : FactAttribute
{
    public MeasurementFactAttribute()
    {
        if (Environment.GetEnvironmentVariable("KTL_MEASURE") != "1")
        {
            Skip = "A measurement for a quiet machine: set KTL_MEASURE=1 to run it.";
        }
    }
}
