using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>The libc entry points shared by the other interop files. close(2) is <see cref="OwnedFd"/>'s alone.</summary>
internal static unsafe partial class LibC
{
    public const string Name = "libc";

    public const int F_GETFL = 3;
    public const int F_SETFL = 4;
    public const int O_NONBLOCK = 0x800;   // asm-generic/fcntl.h, same on x86_64 and arm64
    public const int O_CLOEXEC = 0x80000;

    [LibraryImport(Name, EntryPoint = "read", SetLastError = true)]
    private static partial nint read(int fd, void* buffer, nuint count);

    [LibraryImport(Name, EntryPoint = "write", SetLastError = true)]
    private static partial nint write(int fd, void* buffer, nuint count);

    [LibraryImport(Name, EntryPoint = "readv", SetLastError = true)]
    private static partial nint readv(int fd, Iovec* iov, int iovcnt);

    [LibraryImport(Name, EntryPoint = "fcntl", SetLastError = true)]
    private static partial int fcntl(int fd, int cmd, int arg);

    /// <summary>clock_gettime(2)'s CPU-time clock of the calling thread (linux/time.h).</summary>
    private const int CLOCK_THREAD_CPUTIME_ID = 3;

    [LibraryImport(Name, EntryPoint = "clock_gettime")]
    private static partial int clock_gettime(int clock, Timespec* time);

    /// <summary>The CPU time the calling thread has used, in nanoseconds (a system call: not for every pass).</summary>
    public static long ThreadCpuNanoseconds()
    {
        Timespec time;
        return clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time) == 0 ? (time.Seconds * 1_000_000_000) + time.Nanoseconds : -1;
    }

    /// <summary>struct timespec (64-bit fields on x86_64 and arm64).</summary>
    private struct Timespec
    {
        public long Seconds;
        public long Nanoseconds;
    }

    public static SysResult Read(int fd, void* buffer, nuint count) => SysResult.Of(read(fd, buffer, count));

    public static SysResult Write(int fd, void* buffer, nuint count) => SysResult.Of(write(fd, buffer, count));

    public static SysResult ReadVector(int fd, Iovec* iov, int count) => SysResult.Of(readv(fd, iov, count));

    /// <summary>Sets O_NONBLOCK unless it is set already.</summary>
    public static SysResult SetNonBlocking(int fd)
    {
        var flags = SysResult.Of(fcntl(fd, F_GETFL, 0));
        if (flags.IsError || (flags.Value & O_NONBLOCK) != 0)
        {
            return flags.IsError ? flags : SysResult.Success;
        }

        return SysResult.Of(fcntl(fd, F_SETFL, (int)flags.Value | O_NONBLOCK));
    }
}

/// <summary>struct iovec.</summary>
[StructLayout(LayoutKind.Sequential)]
internal unsafe struct Iovec
{
    public void* Base;
    public nuint Length;
}
