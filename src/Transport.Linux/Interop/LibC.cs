using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>The libc entry points shared by the other interop files. Each returns -1 and sets errno on failure.</summary>
internal static unsafe partial class LibC
{
    public const string Name = "libc";

    [LibraryImport(Name, EntryPoint = "close", SetLastError = true)]
    public static partial int close(int fd);

    [LibraryImport(Name, EntryPoint = "read", SetLastError = true)]
    public static partial nint read(int fd, void* buffer, nuint count);

    [LibraryImport(Name, EntryPoint = "write", SetLastError = true)]
    public static partial nint write(int fd, void* buffer, nuint count);

    [LibraryImport(Name, EntryPoint = "readv", SetLastError = true)]
    public static partial nint readv(int fd, Iovec* iov, int iovcnt);

    [LibraryImport(Name, EntryPoint = "fcntl", SetLastError = true)]
    public static partial int fcntl(int fd, int cmd, int arg);

    public const int F_GETFL = 3;
    public const int F_SETFL = 4;
    public const int O_NONBLOCK = 0x800;   // asm-generic/fcntl.h, same on x86_64 and arm64
    public const int O_CLOEXEC = 0x80000;

    /// <summary>close(2) once; EINTR is not retried (Linux always releases the fd, see close(2) NOTES).</summary>
    public static void CloseFd(int fd)
    {
        if (fd >= 0)
        {
            close(fd);
        }
    }

    public static int SetNonBlocking(int fd)
    {
        int flags = Errno.Check(fcntl(fd, F_GETFL, 0));
        if (flags < 0)
        {
            return flags;
        }

        return (flags & O_NONBLOCK) != 0 ? 0 : Errno.Check(fcntl(fd, F_SETFL, flags | O_NONBLOCK));
    }
}

/// <summary>struct iovec.</summary>
[StructLayout(LayoutKind.Sequential)]
internal unsafe struct Iovec
{
    public void* Base;
    public nuint Length;
}
