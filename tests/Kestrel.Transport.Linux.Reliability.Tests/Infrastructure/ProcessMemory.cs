using System.Globalization;

namespace Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;

/// <summary>The process's resident memory, from /proc/self/status.</summary>
internal static class ProcessMemory
{
    public const long MiB = 1024 * 1024;

    /// <summary>VmRSS in bytes.</summary>
    public static long Rss()
    {
        foreach (var line in File.ReadLines("/proc/self/status"))
        {
            if (line.StartsWith("VmRSS:", StringComparison.Ordinal))
            {
                // "VmRSS:	  123456 kB"
                var kilobytes = line.AsSpan("VmRSS:".Length).Trim();
                return long.Parse(kilobytes[..kilobytes.IndexOf(' ')], CultureInfo.InvariantCulture) * 1024;
            }
        }

        throw new InvalidOperationException("/proc/self/status has no VmRSS: line.");
    }

    /// <summary>RSS after a full, compacting collection, so that garbage does not count as growth.</summary>
    public static long SettledRss()
    {
        System.Runtime.GCSettings.LargeObjectHeapCompactionMode = System.Runtime.GCLargeObjectHeapCompactionMode.CompactOnce;
        GC.Collect(2, GCCollectionMode.Forced, blocking: true, compacting: true);
        GC.WaitForPendingFinalizers();
        GC.Collect(2, GCCollectionMode.Forced, blocking: true, compacting: true);
        return Rss();
    }

    /// <summary>Bytes of live managed objects after a full collection: unlike RSS, not inflated by a heap an earlier test grew.</summary>
    public static long LiveManagedBytes() => GC.GetTotalMemory(forceFullCollection: true);
}
