using System.Globalization;
using System.Text;

namespace Kestrel.Transport.Linux.TraceAnalyzer.Tests;

/// <summary>
/// The open-loop tail analysis on inputs whose answer is known: a loadgen -s file with one planted
/// stall, and a perf script of a CPU whose every nanosecond is accounted for.
/// </summary>
public sealed class LatencyTailTests : IDisposable
{
    private const long Base = 5_000_000_000;   // a CLOCK_MONOTONIC-like origin, 5 s after boot
    private readonly string _dir = Directory.CreateTempSubdirectory("trace-analyzer-tests").FullName;

    public void Dispose() => Directory.Delete(_dir, recursive: true);

    [Fact]
    public void OverlappingSlowRequestsMergeIntoOneEpisode()
    {
        // Two stalls: three requests delayed together (in flight over overlapping spans), and one alone.
        var tail = new List<(long Start, long Latency, long Lag)>
        {
            (1_000, 5_000, 0), (2_000, 4_500, 300_000), (5_500, 1_000, 0),
            (50_000, 2_000, 0),
        };

        var episodes = LatencyTail.Episodes(tail);

        Assert.Equal(2, episodes.Count);
        Assert.Equal((1_000L, 6_500L, 3, 5_000L, 300_000L), episodes[0]);
        Assert.Equal((50_000L, 52_000L, 1, 2_000L, 0L), episodes[1]);
    }

    [Fact]
    public void ReportFindsThePlantedStallAndTheGeneratorsLateSends()
    {
        // 1,000 requests 1 ms apart at 100 µs each, except eleven in a row that a stall held up (5.0 ms
        // down to 4.0 ms); the generator sent six of those late. They are the requests at or above p99.
        var lines = new StringBuilder();
        for (int i = 0; i < 1_000; i++)
        {
            bool stalled = i is >= 500 and <= 510;
            long latency = stalled ? 5_000_000 - (i - 500) * 100_000 : 100_000;
            long lag = stalled && i % 2 == 0 ? 250_000 : 1_000;
            lines.Append(CultureInfo.InvariantCulture, $"{Base + i * 1_000_000L} {latency} {lag}\n");
        }

        string report = Analyze(lines.ToString(), sched: null);

        Assert.Contains("p99 4000,", report, StringComparison.Ordinal);
        Assert.Contains("The tail is the 11 requests at or above p99.", report, StringComparison.Ordinal);
        Assert.Contains("The generator itself sent 54.5% of the tail and 0.6% of all requests ≥ 100 µs late", report, StringComparison.Ordinal);
        Assert.Contains("merge into 1 episodes; the largest 5 hold 100.0% of the tail requests, and 100.0% are in episodes where the generator sent a request ≥ 100 µs late", report, StringComparison.Ordinal);
        // In flight from 500 ms (the first) to 514 ms (the last, sent at 510 ms, 4.0 ms late).
        Assert.Contains("| 500.0 | 14.00 | 11 | 5000 | 250 |", report, StringComparison.Ordinal);
    }

    [Fact]
    public void PercentilesAreTheNearestRankValuesToTheMicrosecondPrinted()
    {
        // 160 requests at 10.5, 20.5, ... 1600.5 µs, each printed rounded half to even (10, 20, ... 1600), and
        // generator lags of 1, 2, ... 160 µs. p99 is the 159th value (⌈0.99 × 160⌉), the tail's bound; rounding
        // the rank to the nearest, as HdrHistogram's GetValueAtPercentile does, would print the 158th.
        var lines = new StringBuilder();
        for (int i = 1; i <= 160; i++)
        {
            lines.Append(CultureInfo.InvariantCulture, $"{Base + i * 10_000_000L} {i * 10_000L + 500} {i * 1_000L}\n");
        }

        string report = Analyze(lines.ToString(), sched: null);

        Assert.Contains("Latency p50 800, p90 1440, p99 1590, p99.9 1600, max 1600 µs. The tail is the 2 requests at or above p99.", report, StringComparison.Ordinal);
        Assert.Contains("(its lag: p99 159, max 160 µs)", report, StringComparison.Ordinal);
    }

    [Fact]
    public void SchedulerTimelineChargesTheCpuToWhoeverHadIt()
    {
        // The window is 0–10 ms. A server thread has the CPU 0–4 ms, a compiler thread 4–6 ms (the stall),
        // the CPU is idle 6–10 ms. The compiler was woken at 3.9 ms: it waited 100 µs for the CPU.
        string lines = TwoSlowRequests(2_000_000);
        string sched = string.Join('\n',
            Switch(Base, "swapper/1", 0, "worker", 101),
            Wakeup(Base + 3_900_000, "compiler", 102),
            Switch(Base + 4_000_000, "worker", 101, "compiler", 102),
            Switch(Base + 6_000_000, "compiler", 102, "swapper/1", 0),
            Switch(Base + 10_050_000, "swapper/1", 0, "worker", 101));

        string report = Analyze(lines, sched);

        // The two slow requests are in flight 4.0–6.0 and 4.1–6.1 ms: one episode, 4.0–6.1 ms.
        Assert.Contains("| compiler | 95.2% | 20.0% |", report, StringComparison.Ordinal);
        Assert.Contains("| worker | 0.0% | 40.0% |", report, StringComparison.Ordinal);
        Assert.Contains("| (idle) | 4.8% | 40.0% |", report, StringComparison.Ordinal);
        Assert.Contains("inside the episodes 1 wake-ups, median 100 µs", report, StringComparison.Ordinal);
    }

    [Fact]
    public void AnUnrecordedSwitchFromIdleIsReportedApartNotGuessed()
    {
        // The record misses the switch from idle back to the worker somewhere in 2–8 ms: the next switch
        // names the worker as outgoing although the CPU was last seen going idle.
        string lines = TwoSlowRequests(1_000_000);
        string sched = string.Join('\n',
            Switch(Base, "swapper/1", 0, "worker", 101),
            Switch(Base + 2_000_000, "worker", 101, "swapper/1", 0),
            Switch(Base + 8_000_000, "worker", 101, "swapper/1", 0),
            Switch(Base + 10_000_000, "swapper/1", 0, "worker", 101));

        string report = Analyze(lines, sched);

        // The one episode (4.0–5.1 ms) falls inside the unrecorded stretch.
        Assert.Contains("| (not recorded: (idle) until worker) | 100.0% | 60.0% |", report, StringComparison.Ordinal);
        Assert.Contains("| worker | 0.0% | 20.0% |", report, StringComparison.Ordinal);
        Assert.Contains("| (idle) | 0.0% | 20.0% |", report, StringComparison.Ordinal);
    }

    [Fact]
    public void MalformedInputIsRefusedWithTheExpectedFormat()
    {
        string path = Path.Combine(_dir, "old.txt");
        File.WriteAllText(path, "5000000000 100000\n");   // two columns: loadgen before LAG_NS
        var error = Assert.Throws<FormatException>(() => LatencyTail.Load(path));
        Assert.Contains("INTENDED_NS LATENCY_NS LAG_NS", error.Message, StringComparison.Ordinal);

        string sched = Path.Combine(_dir, "sched.txt");
        File.WriteAllText(sched, "not perf script output\n");
        Assert.Throws<FormatException>(() => SchedTimeline.Load(sched));

        // From the command line: an error line and exit code 2, not an unhandled exception.
        Assert.Equal(2, Program.Main(["--latency", path]));
        Assert.Equal(2, Program.Main(["--latency", Path.Combine(_dir, "missing.txt")]));
    }

    /// <summary>
    /// A 10 ms window: 100 requests 0.1 ms apart at 50 µs, except the two sent at 4.0 and 4.1 ms, which
    /// take <paramref name="slow"/> ns (they are the requests at or above p99), and one more answered at 10 ms.
    /// </summary>
    private static string TwoSlowRequests(long slow)
    {
        var lines = new StringBuilder();
        for (int i = 0; i < 100; i++)
        {
            lines.Append(CultureInfo.InvariantCulture, $"{Base + i * 100_000L} {(i is 40 or 41 ? slow : 50_000)} 0\n");
        }

        lines.Append(CultureInfo.InvariantCulture, $"{Base + 9_950_000} 50000 0\n");
        return lines.ToString();
    }

    private string Analyze(string latency, string? sched)
    {
        string latencyPath = Path.Combine(_dir, "latency.txt");
        File.WriteAllText(latencyPath, latency);
        string? schedPath = null;
        if (sched is not null)
        {
            schedPath = Path.Combine(_dir, "sched.txt");
            File.WriteAllText(schedPath, sched + "\n");
        }

        var report = new StringBuilder();
        LatencyTail.Load(latencyPath, schedPath).Append(report);
        return report.ToString();
    }

    private static string Time(long ns) => string.Create(CultureInfo.InvariantCulture, $"{ns / 1_000_000_000}.{ns % 1_000_000_000:D9}");

    private static string Switch(long at, string prev, int prevPid, string next, int nextPid) =>
        $"{Time(at)}: sched:sched_switch: prev_comm={prev} prev_pid={prevPid} prev_prio=120 prev_state=S ==> next_comm={next} next_pid={nextPid} next_prio=120";

    private static string Wakeup(long at, string comm, int pid) =>
        $"{Time(at)}: sched:sched_wakeup: comm={comm} pid={pid} prio=120 target_cpu=001";
}
