using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>
/// epoll(7). struct epoll_event is packed on x86_64 (12 bytes, data at offset 4) and naturally aligned
/// elsewhere (16 bytes, data at offset 8), see sys/epoll.h's __EPOLL_PACKED; events are read through
/// <see cref="EventSize"/> and <see cref="DataOffset"/>, so one build serves both.
/// </summary>
internal static unsafe partial class Epoll
{
    public const uint EPOLLIN = 0x001;
    public const uint EPOLLPRI = 0x002;
    public const uint EPOLLOUT = 0x004;
    public const uint EPOLLERR = 0x008;
    public const uint EPOLLHUP = 0x010;
    public const uint EPOLLRDHUP = 0x2000;
    public const uint EPOLLEXCLUSIVE = 1u << 28;   // Linux 4.5
    public const uint EPOLLET = 1u << 31;

    public const int EPOLL_CTL_ADD = 1;
    public const int EPOLL_CTL_DEL = 2;
    public const int EPOLL_CTL_MOD = 3;

    public const int EPOLL_CLOEXEC = 0x80000;   // == O_CLOEXEC

    // EPIOCGPARAMS = _IOR(0x8A, 0x02, struct epoll_params), EPIOCSPARAMS = _IOW(0x8A, 0x01, ...):
    // linux/eventpoll.h, Linux 6.9.
    private const nuint EPIOCGPARAMS = 0x80088A02;
    private const nuint EPIOCSPARAMS = 0x40088A01;

    public static readonly int EventSize = LayoutFor(RuntimeInformation.ProcessArchitecture).Size;
    public static readonly int DataOffset = LayoutFor(RuntimeInformation.ProcessArchitecture).DataOffset;

    /// <summary>struct epoll_event's size and the offset of its data on <paramref name="architecture"/>.</summary>
    public static (int Size, int DataOffset) LayoutFor(Architecture architecture)
        => architecture is Architecture.X64 or Architecture.X86 ? (12, 4) : (16, 8);

    [LibraryImport(LibC.Name, EntryPoint = "epoll_create1", SetLastError = true)]
    private static partial int epoll_create1(int flags);

    [LibraryImport(LibC.Name, EntryPoint = "epoll_ctl", SetLastError = true)]
    private static partial int epoll_ctl(int epfd, int op, int fd, byte* ev);

    [LibraryImport(LibC.Name, EntryPoint = "epoll_wait", SetLastError = true)]
    private static partial int epoll_wait(int epfd, byte* events, int maxevents, int timeout);

    [LibraryImport(LibC.Name, EntryPoint = "ioctl", SetLastError = true)]
    private static partial int ioctl(int fd, nuint request, void* argument);

    public static SysResult Create() => SysResult.Of(epoll_create1(EPOLL_CLOEXEC));

    /// <summary>epoll_ctl with the fd itself as the event's data.</summary>
    public static SysResult Control(int epfd, int op, int fd, uint events)
    {
        byte* ev = stackalloc byte[16];
        Unsafe.WriteUnaligned(ev, events);
        Unsafe.WriteUnaligned(ev + DataOffset, (ulong)(uint)fd);
        return SysResult.Of(epoll_ctl(epfd, op, fd, ev));
    }

    /// <summary>epoll_wait: the number of events written to <paramref name="events"/>.</summary>
    public static SysResult Wait(int epfd, byte* events, int maxEvents, int timeoutMs)
        => SysResult.Of(epoll_wait(epfd, events, maxEvents, timeoutMs));

    public static uint EventsAt(byte* events, int index) => Unsafe.ReadUnaligned<uint>(events + (index * EventSize));

    public static int FdAt(byte* events, int index) => (int)Unsafe.ReadUnaligned<ulong>(events + (index * EventSize) + DataOffset);

    /// <summary>Reads the epoll instance's busy-poll parameters (struct epoll_params, 8 bytes); ENOTTY before Linux 6.9.</summary>
    public static SysResult GetBusyPollParameters(int epfd, out ulong parameters)
    {
        ulong value = 0;
        var result = SysResult.Of(ioctl(epfd, EPIOCGPARAMS, &value));
        parameters = value;
        return result;
    }

    /// <summary>
    /// Sets the epoll instance's busy-poll parameters (struct epoll_params { u32 busy_poll_usecs;
    /// u16 busy_poll_budget; u8 prefer_busy_poll; u8 pad; }); a budget of 0 means the kernel's default.
    /// ENOTTY before Linux 6.9.
    /// </summary>
    public static SysResult SetBusyPollParameters(int epfd, uint microseconds)
    {
        ulong value = microseconds;
        return SysResult.Of(ioctl(epfd, EPIOCSPARAMS, &value));
    }
}
