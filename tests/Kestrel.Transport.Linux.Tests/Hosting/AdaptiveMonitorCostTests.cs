using System.Diagnostics;
using System.Globalization;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>
/// What Adaptive scheduling's monitor costs (issue 38), for docs/performance.md: its own thread's CPU at 16 loops, while
/// every loop runs continuations long enough to watch (the monitor then looks at each loop every millisecond and reads
/// the holder's stat and schedstat), and while they are all quick (it looks at its calm pace). Also the cost of one read
/// of a thread's stat by open, read and close (how the monitor read it before) against one pread of a file kept open.
/// A measurement for a quiet machine with 16 CPUs or more, skipped unless KTL_MEASURE=1.
/// </summary>
public sealed class AdaptiveMonitorCostTests(ITestOutputHelper output)
{
    private const int Loops = 16;
    private const int Connections = 64;
    private static readonly TimeSpan Window = TimeSpan.FromSeconds(10);

    [MeasurementTheory]
    [Trait("Category", "Measurement")]
    [MemberData(nameof(AdaptiveTesting.Kinds), MemberType = typeof(AdaptiveTesting))]
    public async Task Measure_the_monitor_CPU_at_16_loops(TransportKind kind)
    {
        await using var host = await AdaptiveTesting.StartAsync(
            kind,
            output,
            async context =>
            {
                if (context.Request.Path == "/watched")
                {
                    // Past half the 1 ms threshold, where the monitor watches every millisecond; under the 2 ms that demotes.
                    AdaptiveTesting.ComputeFor(TimeSpan.FromMicroseconds(700));
                }

                await context.Response.WriteAsync("ok");
            },
            o => o.ThreadCount = Loops);

        var monitor = AdaptiveTesting.Factory(host).Loops[0].Continuations!.Monitor;
        var connections = await AdaptiveTesting.WarmedAsync(host, Connections);
        try
        {
            foreach (string path in new[] { "/watched", "/quick" })
            {
                using var stop = new CancellationTokenSource();
                long requests = 0;
                var load = Task.WhenAll(connections.Select(async c =>
                {
                    while (!stop.IsCancellationRequested)
                    {
                        await AdaptiveTesting.GetAsync(c, path, TestTimeouts.Large);
                        Interlocked.Increment(ref requests);
                    }
                }));

                await Task.Delay(TimeSpan.FromSeconds(2)); // past the start of the load
                long cpuBefore = ThreadCpu(monitor.ThreadId);
                long requestsBefore = Interlocked.Read(ref requests);
                var clock = Stopwatch.StartNew();
                await Task.Delay(Window);
                long cpu = ThreadCpu(monitor.ThreadId) - cpuBefore;
                double seconds = clock.Elapsed.TotalSeconds;
                long done = Interlocked.Read(ref requests) - requestsBefore;
                await stop.CancelAsync();
                await load.WaitAsync(TestTimeouts.Large);
                output.WriteLine(string.Create(
                    CultureInfo.InvariantCulture,
                    $"monitor, {kind}, {Loops} loops, {path[1..]} continuations: {cpu / 1e6 / seconds:F2} ms of CPU per second ({cpu / 1e7 / seconds:F2}% of one CPU) over {seconds:F1} s, {done / seconds:F0} requests/s"));
            }
        }
        finally
        {
            connections.ForEach(c => c.Dispose());
        }

        output.WriteLine(ReadCosts());
        await host.StopAsync();
    }

    /// <summary>One read of this thread's stat: open, read, close against pread on a file kept open (what the monitor does now).</summary>
    private static string ReadCosts()
    {
        const int Reads = 20_000;
        string stat = $"/proc/self/task/{Affinity.CurrentThreadId()}/stat";
        var clock = Stopwatch.StartNew();
        for (int i = 0; i < Reads; i++)
        {
            Affinity.IsThreadBlocked(stat);
        }

        double opened = clock.Elapsed.TotalMicroseconds / Reads;
        using var file = Affinity.OpenThreadFile(stat)!;
        clock.Restart();
        for (int i = 0; i < Reads; i++)
        {
            Affinity.IsThreadBlocked(file);
        }

        double kept = clock.Elapsed.TotalMicroseconds / Reads;
        return string.Create(CultureInfo.InvariantCulture, $"one read of a thread's stat: {opened:F2} µs by open, read and close; {kept:F2} µs by pread on a file kept open");
    }

    private static long ThreadCpu(int tid)
    {
        string text = File.ReadAllText($"/proc/self/task/{tid.ToString(CultureInfo.InvariantCulture)}/schedstat");
        return long.Parse(text.AsSpan(0, text.IndexOf(' ', StringComparison.Ordinal)), CultureInfo.InvariantCulture);
    }
}
