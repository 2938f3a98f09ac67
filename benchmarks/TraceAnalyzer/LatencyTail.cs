using System.Globalization;
using System.Text;
using HdrHistogram;
using Microsoft.Diagnostics.Tracing;
using Microsoft.Diagnostics.Tracing.Etlx;

namespace Kestrel.Transport.Linux.TraceAnalyzer;

/// <summary>
/// Lines up an open-loop run's slow requests (benchmarks/loadgen -s: every measured request's intended
/// send time, latency and how late loadgen itself sent it, on CLOCK_MONOTONIC) with what the server's
/// runtime did at the same moments.
/// On Linux the runtime's EventPipe timestamps are CLOCK_MONOTONIC nanoseconds too, so no clock
/// alignment is guessed: a request and an event are compared on one clock.
/// <para>
/// The tail is every request at or above the run's p99. Each tail request was in flight over
/// [intended, intended + latency]; overlapping in-flight intervals are merged into episodes, so a stall
/// that delayed many requests is one episode, and scattered queueing delays are many short ones. Each
/// episode is then matched with the runtime pauses (every suspension of managed code, for a GC or
/// otherwise), thread-pool thread changes, lock contention and methods compiled inside it. The same
/// overlap is measured for all requests, so a cause's share of the tail can be read against its base rate.
/// With SampleProfiler samples in the trace, the busy samples inside the episodes are also tallied by area.
/// Without a trace (a server that is not .NET), only the episodes and the generator's own lateness are reported.
/// </para>
/// </summary>
internal sealed class LatencyTail
{
    private readonly List<(long Start, long Latency, long Lag)> _requests = [];
    private readonly List<(long Start, long End, string What)> _pauses = [];
    private readonly List<(long At, string Kind, string What)> _marks = [];
    private readonly List<(long At, string Area)> _samples = [];
    private (long Start, string Reason)? _openSuspend;
    private string? _gcInPause;
    private double _nsPerTick = 1;
    private long _firstEvent = long.MaxValue, _lastEvent = long.MinValue;

    /// <summary>A request the generator sent this late (ns) was delayed by the machine before the server saw it.</summary>
    private const long LateSend = 100_000;

    private LatencyTail()
    {
    }

    /// <summary>What the server's CPU ran (perf's scheduler tracepoints), when given.</summary>
    private SchedTimeline? _sched;

    /// <summary>Whether runtime events were observed (a .nettrace was given).</summary>
    private bool Traced => _firstEvent <= _lastEvent;

    public long WindowStart { get; private set; }

    public long WindowEnd { get; private set; }

    /// <summary>Reads a loadgen -s file and, when <paramref name="schedPath"/> is given, a perf script of the server's CPU.</summary>
    public static LatencyTail Load(string path, string? schedPath = null)
    {
        var tail = new LatencyTail { _sched = schedPath is null ? null : SchedTimeline.Load(schedPath) };
        foreach (string line in File.ReadLines(path))
        {
            if (line.Length == 0)
            {
                continue;
            }

            string[] parts = line.Split(' ');
            if (parts.Length != 3 || !long.TryParse(parts[0], NumberStyles.None, CultureInfo.InvariantCulture, out long start)
                || !long.TryParse(parts[1], NumberStyles.None, CultureInfo.InvariantCulture, out long latency)
                || !long.TryParse(parts[2], NumberStyles.None, CultureInfo.InvariantCulture, out long lag))
            {
                throw new FormatException($"{path}: expected \"INTENDED_NS LATENCY_NS LAG_NS\" (benchmarks/loadgen -s), got \"{line}\"");
            }

            tail._requests.Add((start, latency, lag));
        }

        if (tail._requests.Count < 100)
        {
            throw new FormatException($"{path}: {tail._requests.Count} requests; a p99 needs at least 100");
        }

        tail._requests.Sort((a, b) => a.Start.CompareTo(b.Start));
        tail.WindowStart = tail._requests[0].Start;
        tail.WindowEnd = tail._requests.Max(r => r.Start + r.Latency);
        return tail;
    }

    /// <summary>
    /// The length of a tick in nanoseconds, from the first and last event's tick counts and their
    /// times relative to the session (TraceEvent keeps the tick frequency to itself). On Linux it is 1.
    /// </summary>
#pragma warning disable CS0618 // TimeStampQPC: "not obsolete but discouraged"
    public void SetClock(TraceLog log)
    {
        long firstTicks = 0, lastTicks = 0;
        double firstMs = 0, lastMs = 0;
        bool any = false;
        foreach (TraceEvent ev in log.Events)
        {
            if (!any)
            {
                (firstTicks, firstMs, any) = (ev.TimeStampQPC, ev.TimeStampRelativeMSec, true);
            }

            (lastTicks, lastMs) = (ev.TimeStampQPC, ev.TimeStampRelativeMSec);
        }

        if (lastTicks > firstTicks)
        {
            _nsPerTick = (lastMs - firstMs) * 1e6 / (lastTicks - firstTicks);
        }
    }
#pragma warning restore CS0618

    // The raw tick count is what puts an event on CLOCK_MONOTONIC; the relative times TraceEvent
    // prefers start at the session, which the requests know nothing of.
#pragma warning disable CS0618 // TimeStampQPC: "not obsolete but discouraged"
    public long Nanoseconds(TraceEvent ev) => (long)(ev.TimeStampQPC * _nsPerTick);
#pragma warning restore CS0618

    public bool InWindow(long ns) => ns >= WindowStart && ns <= WindowEnd;

    /// <summary>Takes the runtime events the episodes are matched with; the rest are ignored.</summary>
    public void Observe(TraceEvent ev)
    {
        long at = Nanoseconds(ev);
        _firstEvent = Math.Min(_firstEvent, at);
        _lastEvent = Math.Max(_lastEvent, at);
        switch (ev.EventName)
        {
            case "GC/SuspendEEStart":
                _openSuspend = (at, Payload(ev, "Reason"));
                _gcInPause = null;
                break;
            case "GC/Start":
                _gcInPause = $"gen{Payload(ev, "Depth")} GC ({Payload(ev, "Reason")})";
                break;
            case "GC/RestartEEStop":
                if (_openSuspend is { } open)
                {
                    _pauses.Add((open.Start, at, _gcInPause ?? $"suspension ({open.Reason})"));
                    _openSuspend = null;
                }

                break;
            case "ThreadPoolWorkerThread/Start":
            case "ThreadPoolWorkerThread/Stop":
                _marks.Add((at, "pool thread", $"{ev.EventName["ThreadPoolWorkerThread/".Length..].ToLowerInvariant()} ({Payload(ev, "ActiveWorkerThreadCount")} active)"));
                break;
            case "ThreadPoolWorkerThreadAdjustment/Adjustment":
                _marks.Add((at, "pool size", $"{Payload(ev, "NewWorkerThreadCount")} threads ({Payload(ev, "Reason")})"));
                break;
            case "Contention/Stop":
                _marks.Add((at, "contention", $"{Payload(ev, "DurationNs")} ns"));
                break;
            case "Method/LoadVerbose":
                _marks.Add((at, "jit", Payload(ev, "OptimizationTier")));
                break;
        }
    }

    public void Sample(long at, string area) => _samples.Add((at, area));

    public void Append(StringBuilder report)
    {
        // The tail is chosen from the exact nanoseconds, not the histogram: its requests are lined up with
        // trace events one by one, so which requests are in it must not depend on a bucket's width.
        var latencies = _requests.Select(r => r.Latency).Order().ToArray();
        long p99 = latencies[NearestRank(99, latencies.Length) - 1];
        var tail = _requests.Where(r => r.Latency >= p99).ToList();
        var latencyUs = Histogram(_requests.Select(r => r.Latency));
        var lagUs = Histogram(_requests.Select(r => r.Lag));
        report.AppendLine();
        report.AppendLine(CultureInfo.InvariantCulture,
            $"#### The latency tail ({_requests.Count:N0} requests over {Ms(WindowEnd - WindowStart):F0} ms)");
        report.AppendLine();
        if (Traced && (_lastEvent < WindowStart || _firstEvent > WindowEnd))
        {
            report.AppendLine("The trace's events do not overlap the requests' window: its timestamps are not on CLOCK_MONOTONIC, so nothing can be lined up.");
            return;
        }

        report.AppendLine(CultureInfo.InvariantCulture,
            $"Latency p50 {ValueAt(latencyUs, 50)}, p90 {ValueAt(latencyUs, 90)}, p99 {ValueAt(latencyUs, 99)}, p99.9 {ValueAt(latencyUs, 99.9)}, max {latencyUs.GetMaxValue()} µs. "
            + $"The tail is the {tail.Count:N0} requests at or above p99.");
        report.AppendLine(CultureInfo.InvariantCulture,
            $"The generator itself sent {Program.Share(tail.Count(r => r.Lag >= LateSend), tail.Count)} of the tail and {Program.Share(_requests.Count(r => r.Lag >= LateSend), _requests.Count)} of all requests ≥ {LateSend / 1000} µs late "
            + $"(its lag: p99 {ValueAt(lagUs, 99)}, max {lagUs.GetMaxValue()} µs).");

        var episodes = Episodes(tail);
        var pauses = _pauses.Where(p => p.End >= WindowStart && p.Start <= WindowEnd).ToList();
        report.AppendLine();
        report.AppendLine(CultureInfo.InvariantCulture,
            $"The tail's in-flight times merge into {episodes.Count} episodes; the largest 5 hold {Program.Share(episodes.OrderByDescending(e => e.Requests).Take(5).Sum(e => e.Requests), tail.Count)} of the tail requests, "
            + $"and {Program.Share(episodes.Where(e => e.Lag >= LateSend).Sum(e => e.Requests), tail.Count)} are in episodes where the generator sent a request ≥ {LateSend / 1000} µs late.");
        if (Traced)
        {
            AppendRuntime(report, tail, episodes, pauses);
        }

        report.AppendLine();
        report.AppendLine("| episode (ms into the window) | length ms | tail requests | worst µs | generator's worst lag µs | pauses inside | other runtime events inside |");
        report.AppendLine("| ---: | ---: | ---: | ---: | ---: | --- | --- |");
        foreach (var e in episodes.OrderByDescending(e => e.Requests).Take(12))
        {
            var inside = pauses.Where(p => p.Start <= e.End && p.End >= e.Start)
                .Select(p => $"{p.What} {Ms(p.End - p.Start):F2} ms").ToList();
            var events = _marks.Where(m => m.At >= e.Start && m.At <= e.End).GroupBy(m => m.Kind)
                .Select(g => $"{g.Key} ×{g.Count()}" + (g.Key is "pool size" or "pool thread" ? $" ({g.Last().What})" : "")).ToList();
            report.AppendLine(CultureInfo.InvariantCulture,
                $"| {Ms(e.Start - WindowStart):F1} | {Ms(e.End - e.Start):F2} | {e.Requests} | {Us(e.Worst)} | {Us(e.Lag)} | {(inside.Count == 0 ? "–" : string.Join("; ", inside))} | {(events.Count == 0 ? "–" : string.Join("; ", events))} |");
        }

        _sched?.Append(report, WindowStart, WindowEnd, episodes.Select(e => (e.Start, e.End)).ToList());
        var windowSamples = _samples.Where(s => InWindow(s.At)).ToList();
        if (windowSamples.Count > 0)
        {
            var inEpisodes = windowSamples.Where(s => episodes.Any(e => s.At >= e.Start && s.At <= e.End)).ToList();
            double episodeShare = episodes.Sum(e => (double)(e.End - e.Start)) / (WindowEnd - WindowStart);
            report.AppendLine();
            report.AppendLine(CultureInfo.InvariantCulture,
                $"Busy samples inside the episodes ({100 * episodeShare:F1}% of the window's time) against the whole window, by area:");
            report.AppendLine();
            report.AppendLine("| area | inside episodes | whole window |");
            report.AppendLine("| --- | ---: | ---: |");
            foreach (var area in windowSamples.GroupBy(s => s.Area).OrderByDescending(g => g.Count()))
            {
                report.AppendLine(CultureInfo.InvariantCulture,
                    $"| {area.Key} | {Program.Share(inEpisodes.Count(s => s.Area == area.Key), inEpisodes.Count)} | {Program.Share(area.Count(), windowSamples.Count)} |");
            }
        }
    }

    private void AppendRuntime(StringBuilder report, List<(long Start, long Latency, long Lag)> tail,
        List<(long Start, long End, int Requests, long Worst, long Lag)> episodes, List<(long Start, long End, string What)> pauses)
    {
        report.AppendLine();
        string kinds = pauses.Count == 0 ? "" : " (" + string.Join(", ", pauses.GroupBy(p => p.What).OrderByDescending(g => g.Count()).Select(g => $"{g.Count()} × {g.Key}")) + ")";
        report.AppendLine(CultureInfo.InvariantCulture,
            $"Runtime pauses in the window: {pauses.Count}, {Ms(pauses.Sum(p => p.End - p.Start)):F1} ms in all, longest {(pauses.Count == 0 ? 0 : Ms(pauses.Max(p => p.End - p.Start))):F2} ms{kinds}.");
        foreach (string kind in _marks.Select(m => m.Kind).Distinct().Order(StringComparer.Ordinal))
        {
            int count = _marks.Count(m => m.Kind == kind && InWindow(m.At));
            report.AppendLine(CultureInfo.InvariantCulture, $"{char.ToUpperInvariant(kind[0])}{kind[1..]} events in the window: {count}.");
        }

        bool OverlapsPause((long Start, long Latency, long Lag) r) => pauses.Any(p => p.Start <= r.Start + r.Latency && p.End >= r.Start);
        bool HasPause((long Start, long End, int Requests, long Worst, long Lag) e) => pauses.Any(p => p.Start <= e.End && p.End >= e.Start);
        report.AppendLine();
        report.AppendLine(CultureInfo.InvariantCulture,
            $"Requests in flight during a runtime pause: {Program.Share(tail.Count(OverlapsPause), tail.Count)} of the tail, against {Program.Share(_requests.Count(OverlapsPause), _requests.Count)} of all requests. "
            + $"{episodes.Count(HasPause)} of the {episodes.Count} episodes contain a runtime pause, holding {Program.Share(episodes.Where(HasPause).Sum(e => e.Requests), tail.Count)} of the tail requests.");
    }

    /// <summary>Merges the tail requests' in-flight intervals into episodes.</summary>
    internal static List<(long Start, long End, int Requests, long Worst, long Lag)> Episodes(List<(long Start, long Latency, long Lag)> tail)
    {
        var episodes = new List<(long Start, long End, int Requests, long Worst, long Lag)>();
        foreach (var (start, latency, lag) in tail.OrderBy(r => r.Start))
        {
            long end = start + latency;
            if (episodes.Count > 0 && start <= episodes[^1].End)
            {
                var last = episodes[^1];
                episodes[^1] = (last.Start, Math.Max(last.End, end), last.Requests + 1, Math.Max(last.Worst, latency), Math.Max(last.Lag, lag));
            }
            else
            {
                episodes.Add((start, end, 1, latency, lag));
            }
        }

        return episodes;
    }

    /// <summary>
    /// Nanoseconds as the whole microseconds the report prints, rounded as <see cref="Us"/> rounds them (half
    /// to even), in an HdrHistogram with 5 significant digits: below 2^18 µs (262 ms) every microsecond has a
    /// bucket of its own, so a percentile read back is exactly the value a sort would have printed; above, a
    /// bucket is 2^-17 of its value wide (2 µs at 262 ms).
    /// </summary>
    internal static LongHistogram Histogram(IEnumerable<long> nanoseconds)
    {
        var microseconds = nanoseconds.Select(ns => (long)Math.Round(Math.Max(ns, 0) / 1e3, MidpointRounding.ToEven)).ToList();
        var histogram = new LongHistogram(Math.Max(2, microseconds.Max()), 5);
        foreach (long us in microseconds)
        {
            histogram.RecordValue(us);
        }

        return histogram;
    }

    /// <summary>
    /// The value at the nearest rank, ⌈p/100 × n⌉, found by walking the histogram's buckets. HdrHistogram's own
    /// GetValueAtPercentile rounds the rank to the nearest instead (the 158th of 160 values for p99, not the
    /// 159th), which would print a p99 below the bound of the tail chosen at that rank.
    /// </summary>
    internal static long ValueAt(HistogramBase histogram, double percentile)
    {
        long rank = NearestRank(percentile, histogram.TotalCount);
        long seen = 0;
        foreach (var bucket in histogram.RecordedValues())
        {
            seen += bucket.CountAddedInThisIterationStep;
            if (seen >= rank)
            {
                return bucket.ValueIteratedTo;
            }
        }

        return histogram.GetMaxValue();
    }

    private static long NearestRank(double percentile, long count) =>
        Math.Clamp((long)Math.Ceiling(percentile / 100 * count), 1, count);

    private static string Payload(TraceEvent ev, string name) =>
        Convert.ToString(ev.PayloadByName(name), CultureInfo.InvariantCulture) ?? "?";

    private static double Ms(long ns) => ns / 1e6;

    private static string Us(long ns) => (ns / 1e3).ToString("F0", CultureInfo.InvariantCulture);
}
