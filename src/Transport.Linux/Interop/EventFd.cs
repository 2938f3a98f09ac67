using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>eventfd(2): a loop's wake-up counter.</summary>
internal static unsafe partial class EventFd
{
    public const int EFD_CLOEXEC = 0x80000;   // == O_CLOEXEC
    public const int EFD_NONBLOCK = 0x800;    // == O_NONBLOCK

    [LibraryImport(LibC.Name, EntryPoint = "eventfd", SetLastError = true)]
    private static partial int eventfd(uint initval, int flags);

    public static SysResult Create() => SysResult.Of(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));

    /// <summary>A blocking eventfd, for an io_uring ring's pending read (a write of 1 never blocks in practice).</summary>
    public static SysResult CreateBlocking() => SysResult.Of(eventfd(0, EFD_CLOEXEC));

    /// <summary>Adds one to the counter, waking an epoll_wait that watches the fd, or completing a ring's read of it.</summary>
    public static void Signal(int fd)
    {
        ulong one = 1;
        // EAGAIN means the counter is at its maximum: the loop is being woken anyway.
        _ = LibC.Write(fd, &one, sizeof(ulong));
    }

    /// <summary>Resets the counter to zero.</summary>
    public static void Drain(int fd)
    {
        ulong value;
        _ = LibC.Read(fd, &value, sizeof(ulong));
    }
}
