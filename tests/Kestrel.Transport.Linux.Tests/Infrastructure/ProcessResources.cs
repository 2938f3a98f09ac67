using System.Globalization;
using System.Runtime.InteropServices;
using System.Runtime.Versioning;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>The process's open file descriptors and threads, read from /proc.</summary>
internal static class ProcessResources
{
    // Thread names (comm, at most 15 characters) of threads the runtime creates and retires on its own
    // schedule. Anything else that appears and stays belongs to the code under test.
    private static readonly string[] s_runtimeThreadPrefixes = [".NET TP ", ".NET Timer", ".NET Tiered Com"];

    /// <summary>
    /// Starts the runtime's signal handling before any baseline is taken. The runtime starts it lazily, once per
    /// process, on the first PosixSignalRegistration, Console or Process use (a host's ConsoleLifetime, a test that
    /// runs a tool), and keeps it: a pipe whose both ends stay open and a ".NET SigHandler" thread. Started inside a
    /// test's window by work another test left behind, they were once reported as two leaked descriptors of one pipe.
    /// </summary>
    [SupportedOSPlatform("linux")]
    static ProcessResources()
    {
        using var _ = PosixSignalRegistration.Create(PosixSignal.SIGCONT, context => context.Cancel = false);
    }

    /// <summary>Open descriptors as (number, target), e.g. (57, "socket:[123456]") or (12, "anon_inode:[eventpoll]").</summary>
    public static Dictionary<int, string> OpenFileDescriptors()
    {
        var result = new Dictionary<int, string>();
        foreach (var path in Directory.GetFiles("/proc/self/fd"))
        {
            try
            {
                var target = new FileInfo(path).LinkTarget ?? "?";

                // The descriptor the enumeration itself holds on /proc/self/fd.
                if (target.StartsWith("/proc/", StringComparison.Ordinal) && target.EndsWith("/fd", StringComparison.Ordinal))
                {
                    continue;
                }

                result[int.Parse(Path.GetFileName(path), CultureInfo.InvariantCulture)] = target;
            }
            catch (IOException)
            {
                // Closed while we looked.
            }
        }

        return result;
    }

    /// <summary>Descriptors in <paramref name="now"/> that were not open, with the same target, in <paramref name="baseline"/>.</summary>
    public static List<string> NewDescriptors(Dictionary<int, string> baseline, Dictionary<int, string> now)
        => now.Where(fd => !baseline.TryGetValue(fd.Key, out var target) || target != fd.Value)
            .OrderBy(fd => fd.Key)
            .Select(fd => $"{fd.Key} -> {fd.Value}")
            .ToList();

    /// <summary>
    /// New descriptors since <paramref name="baseline"/>, except files the runtime opens once per process and
    /// keeps: assembly images (a framework assembly the first time a code path needs it, e.g.
    /// System.Net.NameResolution.dll during one churn) and symbol files (the first time it formats a stack
    /// trace with line numbers, e.g. for a logged exception). Neither is the transport's doing nor a leak.
    /// </summary>
    public static List<string> NewDescriptorsExceptRuntimeImages(Dictionary<int, string> baseline)
        => NewDescriptors(baseline, OpenFileDescriptors())
            .Where(d => !d.EndsWith(".dll", StringComparison.Ordinal) && !d.EndsWith(".pdb", StringComparison.Ordinal))
            .ToList();

    /// <summary>Live threads as (tid, name).</summary>
    public static Dictionary<int, string> Threads()
    {
        var result = new Dictionary<int, string>();
        foreach (var task in Directory.GetDirectories("/proc/self/task"))
        {
            try
            {
                result[int.Parse(Path.GetFileName(task), CultureInfo.InvariantCulture)] = File.ReadAllText(Path.Combine(task, "comm")).TrimEnd('\n');
            }
            catch (IOException)
            {
                // Exited while we looked.
            }
        }

        return result;
    }

    /// <summary>Threads in <paramref name="now"/> that were not in <paramref name="baseline"/> and are not the runtime's own pool threads.</summary>
    public static List<string> NewThreads(Dictionary<int, string> baseline, Dictionary<int, string> now)
        => now.Where(t => !baseline.ContainsKey(t.Key) && !IsRuntimePoolThread(t.Value))
            .OrderBy(t => t.Key)
            .Select(t => $"{t.Key} '{t.Value}'")
            .ToList();

    /// <summary>The "Threads:" line of /proc/self/status.</summary>
    public static int ThreadCount()
    {
        foreach (var line in File.ReadLines("/proc/self/status"))
        {
            if (line.StartsWith("Threads:", StringComparison.Ordinal))
            {
                return int.Parse(line.AsSpan("Threads:".Length).Trim(), CultureInfo.InvariantCulture);
            }
        }

        throw new InvalidOperationException("/proc/self/status has no Threads: line.");
    }

    private static bool IsRuntimePoolThread(string name)
        => s_runtimeThreadPrefixes.Any(prefix => name.StartsWith(prefix, StringComparison.Ordinal));
}
