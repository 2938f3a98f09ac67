using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Reliability.Tests.PortsAndFiles;

/// <summary>
/// Lowers this process's soft RLIMIT_NOFILE so that the next descriptor it opens fails with EMFILE, until
/// disposed. Every thread of the process is affected, so only a suite that runs one test at a time (this one:
/// parallelizeTestCollections is false) may use it, and only for the few calls it means to starve.
/// </summary>
internal sealed partial class FileDescriptorLimit : IDisposable
{
    private const int RlimitNofile = 7;
    private readonly Rlimit _saved;

    private FileDescriptorLimit(Rlimit saved) => _saved = saved;

    /// <summary>
    /// Sets the soft limit to the lowest descriptor number that is free now: the kernel hands out the lowest free
    /// number (open(2)), and every lower one is taken, so the next open, socket or accept fails with EMFILE.
    /// </summary>
    public static FileDescriptorLimit UpToTheLowestFreeDescriptor()
    {
        Assert.True(GetRlimit(RlimitNofile, out var saved) == 0, $"getrlimit failed: errno {Marshal.GetLastPInvokeError()}");
        int lowestFree = Dup(0);
        Assert.True(lowestFree >= 0, $"dup failed: errno {Marshal.GetLastPInvokeError()}");
        _ = Close(lowestFree);

        var lowered = new Rlimit { Current = (ulong)lowestFree, Maximum = saved.Maximum };
        Assert.True(SetRlimit(RlimitNofile, in lowered) == 0, $"setrlimit failed: errno {Marshal.GetLastPInvokeError()}");
        return new FileDescriptorLimit(saved);
    }

    public void Dispose() => Assert.True(SetRlimit(RlimitNofile, in _saved) == 0, $"restoring RLIMIT_NOFILE failed: errno {Marshal.GetLastPInvokeError()}");

    [StructLayout(LayoutKind.Sequential)]
    private struct Rlimit
    {
        public ulong Current;
        public ulong Maximum;
    }

    [LibraryImport("libc", EntryPoint = "getrlimit", SetLastError = true)]
    private static partial int GetRlimit(int resource, out Rlimit limit);

    [LibraryImport("libc", EntryPoint = "setrlimit", SetLastError = true)]
    private static partial int SetRlimit(int resource, in Rlimit limit);

    [LibraryImport("libc", EntryPoint = "dup", SetLastError = true)]
    private static partial int Dup(int fd);

    [LibraryImport("libc", EntryPoint = "close", SetLastError = true)]
    private static partial int Close(int fd);
}
