using System.Globalization;
using System.Text;
using Microsoft.Diagnostics.Tracing;
using Microsoft.Diagnostics.Tracing.Etlx;
using Microsoft.Diagnostics.Tracing.Parsers.Clr;

namespace Kestrel.Transport.Linux.TraceAnalyzer;

/// <summary>
/// Summarizes the EventPipe SampleProfiler samples of a .nettrace between two times: the share of
/// samples by area (our transport, Kestrel, pipelines, sockets, thread pool, GC/runtime) and the top
/// frames by exclusive and inclusive count. The sample profiler takes a stack of every managed thread
/// about every millisecond; a sample is "managed" when the thread was running managed code and
/// "external" when it was in native code (a system call, the GC, or blocked). Blocked waits
/// (epoll_wait, futex waits in the thread pool) are external samples at the waiting frame; they are
/// reported apart as "idle" so that the CPU picture is the rest.
/// The runtime's GCAllocationTick events (one about every 100 KiB allocated, with the type of the
/// object that crossed the mark and the allocating stack) give the allocation picture of the same
/// window: by type, and by the area of the innermost known allocating frame.
/// </summary>
internal static class Program
{
    private static readonly (string Area, string[] Prefixes)[] s_areas =
    [
        ("transport (Kestrel.Transport.Linux)", ["Kestrel.Transport.Linux"]),
        ("transport (Kestrel Sockets)", ["Microsoft.AspNetCore.Server.Kestrel.Transport.Sockets"]),
        ("System.Net.Sockets", ["System.Net.Sockets"]),
        ("Kestrel HTTP/1.1", ["Microsoft.AspNetCore.Server.Kestrel"]),
        ("System.IO.Pipelines", ["System.IO.Pipelines"]),
        ("application / ASP.NET", ["Microsoft.AspNetCore", "TechEmpower", "Microsoft.Extensions"]),
        ("System.Text.Json", ["System.Text.Json"]),
        ("thread pool / tasks", ["System.Threading", "System.Runtime.CompilerServices"]),
        ("other BCL", ["System.", "Interop"]),
    ];

    private static readonly string[] s_idleFrames =
    [
        "Interop+Sys.WaitForSocketEvents", "Epoll.Wait", "LowLevelLifoSemaphore.WaitNative", "LowLevelLifoSemaphore.WaitForSignal",
        "WaitHandle.WaitOneNoCheck", "Monitor.Wait", "Thread.Sleep", "WaitSubsystem", "LowLevelMonitor.Wait", "PortableThreadPool+GateThread",
        "Console", "Interop+Sys.Read", "Thread.Join", "Thread.StartCore", "Task.SpinThenBlockingWait", "ManualResetEventSlim.Wait",
    ];

    public static int Main(string[] args)
    {
        try
        {
            return Run(args);
        }
        catch (Exception e) when (e is FormatException or IOException)
        {
            // A malformed or missing loadgen -s or perf script file: say which and why, not a stack.
            Console.Error.WriteLine($"TraceAnalyzer: {e.Message}");
            return 2;
        }
    }

    private static int Run(string[] args)
    {
        if (args.Length < 1 || args[0] is "-h" or "--help")
        {
            Console.WriteLine("usage: TraceAnalyzer TRACE.nettrace [--from SECONDS] [--to SECONDS] [--top N] [--out FILE.md] [--title TEXT] [--callers FRAME-SUBSTRING] [--requests N] [--alloc-type TYPE] [--latency LOADGEN-SAMPLES [--sched PERF-SCRIPT]]");
            Console.WriteLine("       TraceAnalyzer --latency LOADGEN-SAMPLES [--sched PERF-SCRIPT] [--out FILE.md] [--title TEXT]   (no trace: a server that is not .NET)");
            return args.Length < 1 ? 2 : 0;
        }

        // Without a trace, --latency alone: the episodes of a server that is not .NET (the C ceiling).
        string? path = args[0].StartsWith("--", StringComparison.Ordinal) ? null : args[0];
        double from = 0, to = double.MaxValue;
        int top = 25;
        string? outPath = null;
        string? callersOf = null;
        long requests = 0;
        string? allocType = null;
        string? latencyPath = null;
        string? schedPath = null;
        string title = path is null ? "open-loop run" : Path.GetFileNameWithoutExtension(path);
        for (int i = path is null ? 0 : 1; i < args.Length; i++)
        {
            switch (args[i])
            {
                case "--from": from = double.Parse(args[++i], CultureInfo.InvariantCulture); break;
                case "--to": to = double.Parse(args[++i], CultureInfo.InvariantCulture); break;
                case "--top": top = int.Parse(args[++i], CultureInfo.InvariantCulture); break;
                case "--out": outPath = args[++i]; break;
                case "--title": title = args[++i]; break;
                case "--callers": callersOf = args[++i]; break;
                case "--requests": requests = long.Parse(args[++i], CultureInfo.InvariantCulture); break;
                case "--alloc-type": allocType = args[++i]; break;
                case "--latency": latencyPath = args[++i]; break;
                case "--sched": schedPath = args[++i]; break;
                default:
                    Console.Error.WriteLine($"TraceAnalyzer: unknown argument '{args[i]}'");
                    return 2;
            }
        }

        if (path is null)
        {
            if (latencyPath is null)
            {
                Console.Error.WriteLine("TraceAnalyzer: give a trace, or --latency FILE");
                return 2;
            }

            var untraced = new StringBuilder();
            untraced.AppendLine(CultureInfo.InvariantCulture, $"### {title}");
            LatencyTail.Load(latencyPath, schedPath).Append(untraced);
            Emit(untraced, outPath);
            return 0;
        }

        if (!File.Exists(path))
        {
            Console.Error.WriteLine($"TraceAnalyzer: {path} does not exist");
            return 1;
        }

        string etlx = Path.ChangeExtension(path, ".etlx");
        TraceLog.CreateFromEventPipeDataFile(path, etlx);
        using var log = new TraceLog(etlx);
        LatencyTail? tail = null;
        if (latencyPath is not null)
        {
            // The window is the open-loop run's own (its requests' clock), not --from/--to.
            tail = LatencyTail.Load(latencyPath, schedPath);
            tail.SetClock(log);
        }

        var exclusive = new Dictionary<string, long>(StringComparer.Ordinal);
        var inclusive = new Dictionary<string, long>(StringComparer.Ordinal);
        var areas = new Dictionary<string, long>(StringComparer.Ordinal);
        var threads = new Dictionary<string, (int Busy, int Idle)>(StringComparer.Ordinal);
        var callerChains = new Dictionary<string, long>(StringComparer.Ordinal);
        int busy = 0, idle = 0, gcSamples = 0;
        double first = double.MaxValue, last = 0;

        var allocatedByType = new Dictionary<string, long>(StringComparer.Ordinal);
        var allocatedByArea = new Dictionary<string, long>(StringComparer.Ordinal);
        var allocChains = new Dictionary<string, long>(StringComparer.Ordinal);
        var jittedByTier = new Dictionary<string, long>(StringComparer.Ordinal);
        long allocated = 0;
        foreach (TraceEvent ev in log.Events)
        {
            double t = ev.TimeStampRelativeMSec / 1000;
            tail?.Observe(ev);
            if (tail is null ? t < from || t > to : !tail.InWindow(tail.Nanoseconds(ev)))
            {
                continue;
            }

            if (ev is MethodLoadUnloadVerboseTraceData jitted && ev.EventName.Contains("Load", StringComparison.Ordinal))
            {
                string tier = jitted.OptimizationTier.ToString();
                jittedByTier[tier] = jittedByTier.GetValueOrDefault(tier) + 1;
                continue;
            }

            if (ev is GCAllocationTickTraceData tick)
            {
                long amount = tick.AllocationAmount64;
                string type = string.IsNullOrEmpty(tick.TypeName) ? "(unknown type)" : tick.TypeName;
                allocated += amount;
                allocatedByType[type] = allocatedByType.GetValueOrDefault(type) + amount;
                var allocFrames = Frames(ev.CallStack());
                string site = AreaOf(allocFrames) ?? "unresolved / native";
                allocatedByArea[site] = allocatedByArea.GetValueOrDefault(site) + amount;
                if (allocType is not null && type == allocType)
                {
                    string chain = string.Join(" <- ", allocFrames.Where(f => !f.StartsWith("?!", StringComparison.Ordinal)).Take(6).Select(f => Truncate(f, 90)));
                    allocChains[chain] = allocChains.GetValueOrDefault(chain) + amount;
                }

                continue;
            }

            if (ev.ProviderName != "Microsoft-DotNETCore-SampleProfiler")
            {
                continue;
            }

            first = Math.Min(first, t);
            last = Math.Max(last, t);
            var frames = Frames(ev.CallStack());
            if (frames.Count == 0)
            {
                continue;
            }

            string threadName = ThreadLabel(ev);
            bool isIdle = frames.Take(4).Any(f => s_idleFrames.Any(idleFrame => f.Contains(idleFrame, StringComparison.Ordinal)));
            var counts = threads.GetValueOrDefault(threadName);
            if (isIdle)
            {
                idle++;
                threads[threadName] = (counts.Busy, counts.Idle + 1);
                continue;
            }

            busy++;
            threads[threadName] = (counts.Busy + 1, counts.Idle);
            if (callersOf is not null)
            {
                int at = frames.FindIndex(f => f.Contains(callersOf, StringComparison.Ordinal));
                if (at >= 0)
                {
                    string chain = string.Join(" <- ", frames.Skip(at).Take(6).Select(f => Truncate(f, 70)));
                    callerChains[chain] = callerChains.GetValueOrDefault(chain) + 1;
                }
            }

            string leaf = frames[0];
            exclusive[leaf] = exclusive.GetValueOrDefault(leaf) + 1;
            foreach (string frame in frames.Distinct(StringComparer.Ordinal))
            {
                inclusive[frame] = inclusive.GetValueOrDefault(frame) + 1;
            }

            if (frames.Any(f => f.Contains("GC", StringComparison.Ordinal) && f.Contains("Collect", StringComparison.Ordinal)))
            {
                gcSamples++;
            }

            string area = AreaOf(frames) ?? "unresolved / native";
            areas[area] = areas.GetValueOrDefault(area) + 1;
            tail?.Sample(tail.Nanoseconds(ev), area);
        }

        var report = new StringBuilder();
        report.AppendLine(CultureInfo.InvariantCulture, $"### {title}");
        report.AppendLine();
        report.AppendLine(busy + idle == 0
            ? "No SampleProfiler samples in the window (a trace of runtime events only)."
            : string.Create(CultureInfo.InvariantCulture, $"Samples {first:F1}-{last:F1} s: {busy} busy, {idle} idle (blocked in epoll/futex waits; left out below)."));
        report.AppendLine();
        AppendTable(report, "area (innermost known frame)", "busy samples", areas, busy, int.MaxValue, area => area);

        report.AppendLine();
        report.AppendLine("| thread | busy | idle |");
        report.AppendLine("| --- | ---: | ---: |");
        foreach (var (thread, counts) in threads.OrderByDescending(t => t.Value.Busy).Take(12))
        {
            report.AppendLine(CultureInfo.InvariantCulture, $"| {thread} | {counts.Busy} | {counts.Idle} |");
        }

        AppendTop(report, "exclusive (leaf frame)", exclusive, busy, top);
        AppendTop(report, "inclusive", inclusive, busy, top);
        if (callersOf is not null)
        {
            AppendTop(report, $"callers of {callersOf}", callerChains, busy, top);
        }

        AppendAllocations(report, allocated, allocatedByType, allocatedByArea, requests, top);
        report.AppendLine();
        report.AppendLine("Methods compiled in the window, by the tier they were compiled for (a settled server compiles few): "
            + (jittedByTier.Count == 0 ? "none." : string.Join(", ", jittedByTier.OrderByDescending(t => t.Value).Select(t => $"{t.Key} {t.Value}")) + "."));
        tail?.Append(report);
        if (allocType is not null)
        {
            report.AppendLine();
            AppendTable(report, $"where `{allocType}` is allocated (innermost managed frames)", "bytes", allocChains,
                allocChains.Values.Sum(), top, chain => $"`{chain}`", "N0");
        }
        Emit(report, outPath);

        File.Delete(etlx);
        return busy == 0 && tail is null ? 1 : 0;
    }

    /// <summary>Prints a summary, and appends it to the --out file when there is one.</summary>
    private static void Emit(StringBuilder report, string? outPath)
    {
        Console.Write(report.ToString());
        if (outPath is not null)
        {
            File.AppendAllText(outPath, report.ToString() + Environment.NewLine);
        }
    }

    /// <summary>The area of the innermost frame that belongs to a known area, or null.</summary>
    private static string? AreaOf(List<string> frames)
    {
        foreach (string frame in frames)
        {
            var match = s_areas.FirstOrDefault(a => a.Prefixes.Any(p => frame.StartsWith(p, StringComparison.Ordinal)));
            if (match.Area is not null)
            {
                return match.Area;
            }
        }

        return null;
    }

    private static void AppendAllocations(StringBuilder report, long allocated, Dictionary<string, long> byType,
        Dictionary<string, long> byArea, long requests, int top)
    {
        report.AppendLine();
        if (allocated == 0)
        {
            report.AppendLine("No GCAllocationTick event in the window (the trace was taken without the GC keyword at verbose level, or nothing allocated 100 KiB).");
            return;
        }

        string perRequest = requests > 0
            ? string.Create(CultureInfo.InvariantCulture, $", {(double)allocated / requests:F0} bytes per request over {requests:N0} requests")
            : "";
        report.AppendLine(CultureInfo.InvariantCulture,
            $"Allocations (GCAllocationTick, one event per ~100 KiB, so each row is sampled): {allocated / 1048576.0:F1} MiB in the window{perRequest}.");
        report.AppendLine();
        AppendTable(report, "allocating area (innermost known frame)", "bytes", byArea, allocated, int.MaxValue, area => area, "N0");
        report.AppendLine();
        AppendTable(report, "type allocated", "bytes", byType, allocated, top, type => $"`{Truncate(type, 200)}`", "N0");
    }

    private static void AppendTop(StringBuilder report, string heading, Dictionary<string, long> counts, long total, int top)
    {
        report.AppendLine();
        AppendTable(report, $"top frames, {heading}", "samples", counts, total, top, frame => $"`{Truncate(frame, 480)}`");
    }

    /// <summary>A markdown table of the <paramref name="top"/> largest counts: label, count, share of the total.</summary>
    private static void AppendTable(StringBuilder report, string heading, string unit, Dictionary<string, long> counts,
        long total, int top, Func<string, string> label, string format = "0")
    {
        report.AppendLine(CultureInfo.InvariantCulture, $"| {heading} | {unit} | share |");
        report.AppendLine("| --- | ---: | ---: |");
        foreach (var (key, count) in counts.OrderByDescending(c => c.Value).Take(top))
        {
            report.AppendLine(CultureInfo.InvariantCulture, $"| {label(key)} | {count.ToString(format, CultureInfo.InvariantCulture)} | {Share(count, total)} |");
        }
    }

    internal static string Share(long count, long total) => total == 0 ? "-" : (100.0 * count / total).ToString("F1", CultureInfo.InvariantCulture) + "%";

    private static string Truncate(string s, int max) => s.Length <= max ? s : s[..(max - 1)] + "…";

    private static string ThreadLabel(TraceEvent ev)
    {
        string? name = ev.Thread()?.ThreadInfo;
        if (string.IsNullOrEmpty(name))
        {
            return "(unnamed threads)";
        }

        // Pool threads are many; one row for all of them.
        return name.StartsWith(".NET TP", StringComparison.Ordinal) || name.StartsWith(".NET Long", StringComparison.Ordinal) ? ".NET thread pool" : name;
    }

    private static List<string> Frames(TraceCallStack? stack)
    {
        var frames = new List<string>();
        for (var s = stack; s is not null; s = s.Caller)
        {
            string name = s.CodeAddress.FullMethodName;
            if (string.IsNullOrEmpty(name))
            {
                name = "?!" + (s.CodeAddress.ModuleName ?? "native");
            }

            frames.Add(name);
        }

        return frames;
    }
}
