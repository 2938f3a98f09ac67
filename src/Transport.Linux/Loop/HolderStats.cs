using System.Globalization;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Loop;

/// <summary>
/// What the monitor reads of one loop's holder thread: whether it is asleep in the kernel (/proc/self/task/TID/stat)
/// and how much CPU it has run (schedstat). The two files stay open while the same thread holds the loop and are
/// read with pread, so a look costs one system call per file rather than an open, a read and a close (a loop under
/// watch is looked at a thousand times a second). Monitor thread only.
/// </summary>
internal sealed class HolderStats(string directory) : IDisposable
{
    private object? _hold;
    private OwnedFd? _stat;
    private OwnedFd? _schedstat;

    /// <summary>
    /// Start-up: can a thread's stat and schedstat under <paramref name="directory"/> be read here? Not in gVisor, under
    /// a masked /proc or on WSL1; <paramref name="reason"/> then says what failed.
    /// </summary>
    public static bool CanRead(string directory, out string reason)
    {
        using var stats = new HolderStats(directory);
        int self = Affinity.CurrentThreadId();
        stats.Follow(stats, self);
        if (stats._stat is null || stats._schedstat is null)
        {
            reason = $"{directory}/{self}/{(stats._stat is null ? "stat" : "schedstat")} cannot be opened";
            return false;
        }

        if (stats.IsBlocked || stats.CpuNanoseconds < 0)
        {
            // This thread is running: a stat that says otherwise, or a schedstat without a number, is not what proc(5) describes.
            reason = $"{directory}/{self}/stat and schedstat do not read as proc(5) describes";
            return false;
        }

        reason = "";
        return true;
    }

    /// <summary>True when the thread is asleep in the kernel (state S or D); false when running, preempted, or unreadable.</summary>
    public bool IsBlocked => _stat is not null && Affinity.IsThreadBlocked(_stat);

    /// <summary>The CPU time the thread has run, in nanoseconds; -1 when unreadable.</summary>
    public long CpuNanoseconds => _schedstat is null ? -1 : Affinity.ThreadRuntimeNanoseconds(_schedstat);

    /// <summary>
    /// Reads the thread <paramref name="threadId"/> of <paramref name="hold"/> from now on: the files are opened once per
    /// hold (a new hold is a new object), so a thread id the kernel reuses is never read through an old thread's files.
    /// </summary>
    public void Follow(object hold, int threadId)
    {
        if (ReferenceEquals(hold, _hold))
        {
            return;
        }

        Close();
        _hold = hold;
        string task = $"{directory}/{threadId.ToString(CultureInfo.InvariantCulture)}";
        _stat = Affinity.OpenThreadFile($"{task}/stat");
        _schedstat = Affinity.OpenThreadFile($"{task}/schedstat");
    }

    public void Dispose() => Close();

    /// <summary>Closes the files (an idle server keeps none open); the next <see cref="Follow"/> opens them again.</summary>
    public void Close()
    {
        _stat?.Dispose();
        _schedstat?.Dispose();
        _stat = null;
        _schedstat = null;
        _hold = null;
    }
}
