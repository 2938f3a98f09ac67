using System.Globalization;
using System.Text;
using System.Text.RegularExpressions;

namespace Kestrel.Transport.Linux.TraceAnalyzer;

/// <summary>
/// What the server's CPU ran, from the kernel's scheduler tracepoints: `perf record -C CPU -k
/// CLOCK_MONOTONIC -e sched:sched_switch -e sched:sched_wakeup`, printed with `perf script -F
/// time,event,trace --ns`. Each switch starts an interval in which the incoming thread had the CPU
/// ("swapper" is the idle task); each wake-up starts a wait that ends when the thread is switched in.
/// Threads are told apart by name, which is how .NET and the transport name theirs.
/// <para>
/// On the VMs here some switches from the idle task are not recorded: a switch then names as outgoing
/// a thread that was never seen coming in. The CPU went from idle to that thread somewhere in the
/// interval, at a time the record does not give, so the interval is reported apart, as "not recorded",
/// and not guessed. (A raw C server that sleeps between most requests loses nearly all of them; the
/// .NET servers lose about 0.2% of their switches.) Only wake-ups traced on this CPU are seen: a thread
/// woken from another CPU has no recorded wait.
/// </para>
/// </summary>
internal sealed partial class SchedTimeline
{
    private readonly List<(long Start, long End, string Thread)> _running = [];
    private readonly List<(long Woken, long Ran, string Thread)> _waits = [];

    private SchedTimeline()
    {
    }

    [GeneratedRegex(@"^\s*(?<time>\d+\.\d+):\s+sched:(?<event>sched_switch|sched_wakeup):\s+(?<trace>.*)$")]
    private static partial Regex LineRegex();

    [GeneratedRegex(@"prev_comm=(?<prevComm>.*?) prev_pid=(?<prevPid>\d+) .*next_comm=(?<comm>.*?) next_pid=(?<pid>\d+)")]
    private static partial Regex SwitchRegex();

    [GeneratedRegex(@"^comm=(?<comm>.*?) pid=(?<pid>\d+)")]
    private static partial Regex WakeupRegex();

    public static SchedTimeline Load(string path)
    {
        var timeline = new SchedTimeline();
        var woken = new Dictionary<int, long>();
        (long Since, string Thread, int Pid)? current = null;
        int lines = 0;
        foreach (string line in File.ReadLines(path))
        {
            var match = LineRegex().Match(line);
            if (!match.Success)
            {
                continue;
            }

            lines++;
            string time = match.Groups["time"].Value;
            int dot = time.IndexOf('.', StringComparison.Ordinal);
            long at = long.Parse(time[..dot], CultureInfo.InvariantCulture) * 1_000_000_000
                + long.Parse(time[(dot + 1)..].PadRight(9, '0')[..9], CultureInfo.InvariantCulture);
            string trace = match.Groups["trace"].Value;
            if (match.Groups["event"].Value == "sched_wakeup")
            {
                var wake = WakeupRegex().Match(trace);
                if (wake.Success)
                {
                    woken[int.Parse(wake.Groups["pid"].Value, CultureInfo.InvariantCulture)] = at;
                }

                continue;
            }

            var next = SwitchRegex().Match(trace);
            if (!next.Success)
            {
                continue;
            }

            int pid = int.Parse(next.Groups["pid"].Value, CultureInfo.InvariantCulture);
            int prevPid = int.Parse(next.Groups["prevPid"].Value, CultureInfo.InvariantCulture);
            if (current is { } running)
            {
                string prev = prevPid == 0 ? "(idle)" : next.Groups["prevComm"].Value;
                timeline._running.Add((running.Since, at, running.Pid == prevPid ? running.Thread : $"(not recorded: {running.Thread} until {prev})"));
            }

            string thread = pid == 0 ? "(idle)" : next.Groups["comm"].Value;
            current = (at, thread, pid);
            if (woken.Remove(pid, out long since))
            {
                timeline._waits.Add((since, at, thread));
            }
        }

        if (lines == 0)
        {
            throw new FormatException($"{path}: no sched_switch or sched_wakeup line (expected `perf script -F time,event,trace --ns` output)");
        }

        return timeline;
    }

    /// <summary>
    /// The CPU's time by thread name inside the episodes and over the whole window, and how long woken
    /// threads waited for the CPU inside and outside the episodes.
    /// </summary>
    public void Append(StringBuilder report, long windowStart, long windowEnd, List<(long Start, long End)> episodes)
    {
        var inside = new Dictionary<string, long>(StringComparer.Ordinal);
        var whole = new Dictionary<string, long>(StringComparer.Ordinal);
        foreach (var (start, end, thread) in _running)
        {
            long overall = Overlap(start, end, windowStart, windowEnd);
            if (overall <= 0)
            {
                continue;
            }

            whole[thread] = whole.GetValueOrDefault(thread) + overall;
            long within = episodes.Sum(e => Overlap(start, end, e.Start, e.End));
            inside[thread] = inside.GetValueOrDefault(thread) + within;
        }

        long insideTotal = inside.Values.Sum(), wholeTotal = whole.Values.Sum();
        report.AppendLine();
        report.AppendLine(CultureInfo.InvariantCulture,
            $"The server's CPU, from the scheduler's tracepoints: {wholeTotal / 1e6:F0} ms of the window seen, {insideTotal / 1e6:F1} ms of it inside the episodes.");
        report.AppendLine();
        report.AppendLine("| thread on the CPU | inside episodes | whole window |");
        report.AppendLine("| --- | ---: | ---: |");
        foreach (var (thread, ns) in whole.OrderByDescending(t => t.Value).Take(12))
        {
            report.AppendLine(CultureInfo.InvariantCulture,
                $"| {thread} | {Program.Share(inside.GetValueOrDefault(thread), insideTotal)} | {Program.Share(ns, wholeTotal)} |");
        }

        var waits = _waits.Where(w => w.Ran >= windowStart && w.Ran <= windowEnd).ToList();
        bool InEpisode(long at) => episodes.Any(e => at >= e.Start && at <= e.End);
        var waitsInside = waits.Where(w => InEpisode(w.Ran)).Select(w => w.Ran - w.Woken).Order().ToList();
        var waitsOutside = waits.Where(w => !InEpisode(w.Ran)).Select(w => w.Ran - w.Woken).Order().ToList();
        report.AppendLine();
        report.AppendLine(CultureInfo.InvariantCulture,
            $"From wake-up to running (wake-ups traced on this CPU): inside the episodes {Describe(waitsInside)}; outside {Describe(waitsOutside)}.");
        var longest = waits.OrderByDescending(w => w.Ran - w.Woken).Take(5)
            .Select(w => string.Create(CultureInfo.InvariantCulture, $"{w.Thread} {(w.Ran - w.Woken) / 1e3:F0} µs at {(w.Woken - windowStart) / 1e6:F1} ms"));
        report.AppendLine(CultureInfo.InvariantCulture, $"Longest waits: {string.Join("; ", longest)}.");
    }

    private static string Describe(List<long> sorted) => sorted.Count == 0
        ? "no wake-ups"
        : string.Create(CultureInfo.InvariantCulture,
            $"{sorted.Count:N0} wake-ups, median {sorted[sorted.Count / 2] / 1e3:F0} µs, p99 {sorted[(int)(0.99 * (sorted.Count - 1))] / 1e3:F0} µs, max {sorted[^1] / 1e3:F0} µs");

    private static long Overlap(long start, long end, long from, long to) => Math.Max(0, Math.Min(end, to) - Math.Max(start, from));
}
