using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>sched_getaffinity(2) / sched_setaffinity(2) and sched_setscheduler(2) for the calling thread, and gettid(2).</summary>
internal static unsafe partial class Affinity
{
    // cpu_set_t is 1024 bits in glibc; the kernel accepts any multiple of the word size that covers its CPUs.
    private const int MaskBytes = 128;

    [LibraryImport(LibC.Name, EntryPoint = "sched_getaffinity", SetLastError = true)]
    private static partial int sched_getaffinity(int pid, nuint size, byte* mask);

    [LibraryImport(LibC.Name, EntryPoint = "sched_setaffinity", SetLastError = true)]
    private static partial int sched_setaffinity(int pid, nuint size, byte* mask);

    [LibraryImport(LibC.Name, EntryPoint = "sched_setscheduler", SetLastError = true)]
    private static partial int sched_setscheduler(int pid, int policy, int* param);

    /// <summary>SCHED_BATCH (sched(7)): a normal-priority thread that does not preempt others when it wakes.</summary>
    private const int SCHED_BATCH = 3;

    /// <summary>Puts the calling thread in SCHED_BATCH.</summary>
    public static SysResult SetCurrentThreadBatch()
    {
        int priority = 0;
        return SysResult.Of(sched_setscheduler(0, SCHED_BATCH, &priority));
    }

    [LibraryImport(LibC.Name, EntryPoint = "gettid")]
    private static partial int gettid();

    [LibraryImport(LibC.Name, EntryPoint = "open", StringMarshalling = StringMarshalling.Utf8, SetLastError = true)]
    private static partial int open(string path, int flags);

    /// <summary>The kernel's id of the calling thread (the name under /proc/self/task).</summary>
    public static int CurrentThreadId() => gettid();

    [LibraryImport(LibC.Name, EntryPoint = "pread", SetLastError = true)]
    private static partial nint pread(int fd, byte* buffer, nuint count, long offset);

    /// <summary>
    /// True when the thread whose /proc/self/task/TID/stat is <paramref name="statPath"/> is blocked
    /// (state S or D, proc(5)); false when it is running or waiting for a CPU (R), and when the
    /// state cannot be read.
    /// </summary>
    public static bool IsThreadBlocked(string statPath)
    {
        using var file = OpenThreadFile(statPath);
        return file is not null && IsThreadBlocked(file);
    }

    /// <summary>As <see cref="IsThreadBlocked(string)"/>, from a stat file kept open (<see cref="OpenThreadFile"/>): one pread, no open and close.</summary>
    public static bool IsThreadBlocked(OwnedFd stat)
    {
        byte* buffer = stackalloc byte[512];
        var length = SysResult.Of(pread(stat.Value, buffer, 512, 0));
        if (length.IsError || length.Value == 0)
        {
            return false;
        }

        // "tid (comm) S ...": the state follows the last ')' (comm may contain parentheses and spaces).
        var text = new ReadOnlySpan<byte>(buffer, (int)length.Value);
        int close = text.LastIndexOf((byte)')');
        return close >= 0 && close + 2 < text.Length && text[close + 2] is (byte)'S' or (byte)'D';
    }

    /// <summary>
    /// The CPU time, in nanoseconds, the thread whose /proc/self/task/TID/schedstat is <paramref name="schedstatPath"/>
    /// has run (its first field, proc(5)); -1 when it cannot be read.
    /// </summary>
    public static long ThreadRuntimeNanoseconds(string schedstatPath)
    {
        using var file = OpenThreadFile(schedstatPath);
        return file is null ? -1 : ThreadRuntimeNanoseconds(file);
    }

    /// <summary>As <see cref="ThreadRuntimeNanoseconds(string)"/>, from a schedstat file kept open: one pread.</summary>
    public static long ThreadRuntimeNanoseconds(OwnedFd schedstat)
    {
        byte* buffer = stackalloc byte[128];
        var length = SysResult.Of(pread(schedstat.Value, buffer, 128, 0));
        if (length.IsError || length.Value == 0 || buffer[0] is < (byte)'0' or > (byte)'9')
        {
            return -1;
        }

        long value = 0;
        var text = new ReadOnlySpan<byte>(buffer, (int)length.Value);
        foreach (byte b in text)
        {
            if (b is < (byte)'0' or > (byte)'9')
            {
                break;
            }

            value = (value * 10) + (b - '0');
        }

        return value;
    }

    /// <summary>
    /// Opens a thread's /proc file (stat, schedstat) to read it again and again with pread (proc files answer each read
    /// afresh from offset 0); null when it cannot be opened. The file goes on answering while the thread lives.
    /// </summary>
    public static OwnedFd? OpenThreadFile(string path) => OwnedFd.TryTake(SysResult.Of(open(path, LibC.O_CLOEXEC)));

    /// <summary>The CPUs the calling thread may run on, in ascending order; empty, with the error in <paramref name="result"/>, on failure.</summary>
    public static List<int> AllowedCpus(out SysResult result)
    {
        byte* mask = stackalloc byte[MaskBytes];
        new Span<byte>(mask, MaskBytes).Clear();
        var cpus = new List<int>();
        result = SysResult.Of(sched_getaffinity(0, MaskBytes, mask));
        if (!result.IsError)
        {
            for (int cpu = 0; cpu < MaskBytes * 8; cpu++)
            {
                if ((mask[cpu / 8] & (1 << (cpu % 8))) != 0)
                {
                    cpus.Add(cpu);
                }
            }
        }

        return cpus;
    }

    /// <summary>Pins the calling thread to <paramref name="cpu"/>.</summary>
    public static SysResult PinCurrentThread(int cpu)
    {
        if (cpu is < 0 or >= MaskBytes * 8)
        {
            return SysResult.Failed(Errno.EINVAL);
        }

        byte* mask = stackalloc byte[MaskBytes];
        new Span<byte>(mask, MaskBytes).Clear();
        mask[cpu / 8] = (byte)(1 << (cpu % 8));
        return SysResult.Of(sched_setaffinity(0, MaskBytes, mask));
    }
}
