using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;

/// <summary>RLIMIT_NOFILE of this process (getrlimit(2), setrlimit(2)).</summary>
internal static partial class FileDescriptorLimit
{
    // RLIMIT_NOFILE in <sys/resource.h> (asm-generic/resource.h) on x86-64 and arm64.
    private const int RLIMIT_NOFILE = 7;

    public static (ulong Soft, ulong Hard) Get()
    {
        if (getrlimit(RLIMIT_NOFILE, out var limit) != 0)
        {
            throw new InvalidOperationException($"getrlimit(RLIMIT_NOFILE) failed: errno {Marshal.GetLastPInvokeError()}.");
        }

        return (limit.Current, limit.Maximum);
    }

    /// <summary>Sets the soft limit, keeping the hard one.</summary>
    public static void SetSoft(ulong soft)
    {
        var limit = new RLimit { Current = soft, Maximum = Get().Hard };
        if (setrlimit(RLIMIT_NOFILE, in limit) != 0)
        {
            throw new InvalidOperationException($"setrlimit(RLIMIT_NOFILE, {soft}) failed: errno {Marshal.GetLastPInvokeError()}.");
        }
    }

    /// <summary>Raises the soft limit to at least <paramref name="needed"/> (at most the hard limit); returns the soft limit it found.</summary>
    public static ulong RaiseSoftTo(ulong needed)
    {
        var (soft, hard) = Get();
        Assert.True(hard >= needed, $"RLIMIT_NOFILE's hard limit is {hard}; this test needs {needed} descriptors.");
        if (soft < needed)
        {
            SetSoft(needed);
        }

        return soft;
    }

    [StructLayout(LayoutKind.Sequential)]
    private struct RLimit
    {
        public ulong Current;
        public ulong Maximum;
    }

    [LibraryImport("libc", SetLastError = true)]
    private static partial int getrlimit(int resource, out RLimit limit);

    [LibraryImport("libc", SetLastError = true)]
    private static partial int setrlimit(int resource, in RLimit limit);
}

/// <summary>A theory that is skipped, saying why, when RLIMIT_NOFILE's hard limit is below what it needs.</summary>
public sealed class FileDescriptorTheoryAttribute : TheoryAttribute
{
    public FileDescriptorTheoryAttribute(int needed)
    {
        var hard = FileDescriptorLimit.Get().Hard;
        if (hard < (ulong)needed)
        {
            Skip = $"Needs {needed} file descriptors in this process, but RLIMIT_NOFILE's hard limit is {hard} (raise it with `ulimit -Hn` or LimitNOFILE).";
        }
    }
}
