using System.Net;
using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>socket(7), tcp(7), unix(7): the calls the transport makes on socket fds.</summary>
internal static unsafe partial class Socket
{
    public const int AF_UNIX = 1;
    public const int AF_INET = 2;
    public const int AF_INET6 = 10;

    public const int SOCK_STREAM = 1;
    public const int SOCK_NONBLOCK = 0x800;   // == O_NONBLOCK
    public const int SOCK_CLOEXEC = 0x80000;  // == O_CLOEXEC

    public const int SOL_SOCKET = 1;
    public const int SO_REUSEADDR = 2;
    public const int SO_TYPE = 3;
    public const int SO_LINGER = 13;
    public const int SO_REUSEPORT = 15;       // Linux 3.9
    public const int SO_DOMAIN = 39;
    public const int SO_BUSY_POLL = 46;       // Linux 3.11, socket(7)
    public const int SO_ZEROCOPY = 60;        // Linux 4.14, msg_zerocopy.rst
    public const int IPPROTO_TCP = 6;
    public const int IPPROTO_IPV6 = 41;
    public const int TCP_NODELAY = 1;
    public const int TCP_DEFER_ACCEPT = 9;    // tcp(7)
    public const int TCP_QUICKACK = 12;       // tcp(7)
    public const int TCP_NOTSENT_LOWAT = 25;  // Linux 3.12, tcp(7)
    public const int IPV6_V6ONLY = 26;

    public const int SHUT_WR = 1;
    public const int SHUT_RDWR = 2;
    public const int MSG_NOSIGNAL = 0x4000;
    public const int MSG_ERRQUEUE = 0x2000;
    public const int MSG_ZEROCOPY = 0x4000000;  // Linux 4.14

    [LibraryImport(LibC.Name, EntryPoint = "socket", SetLastError = true)]
    private static partial int socket(int domain, int type, int protocol);

    [LibraryImport(LibC.Name, EntryPoint = "bind", SetLastError = true)]
    private static partial int bind(int fd, byte* addr, uint addrlen);

    [LibraryImport(LibC.Name, EntryPoint = "connect", SetLastError = true)]
    private static partial int connect(int fd, byte* addr, uint addrlen);

    [LibraryImport(LibC.Name, EntryPoint = "listen", SetLastError = true)]
    private static partial int listen(int fd, int backlog);

    [LibraryImport(LibC.Name, EntryPoint = "accept4", SetLastError = true)]
    private static partial int accept4(int fd, byte* addr, uint* addrlen, int flags);

    [LibraryImport(LibC.Name, EntryPoint = "setsockopt", SetLastError = true)]
    private static partial int setsockopt(int fd, int level, int name, void* value, uint len);

    [LibraryImport(LibC.Name, EntryPoint = "getsockopt", SetLastError = true)]
    private static partial int getsockopt(int fd, int level, int name, void* value, uint* len);

    [LibraryImport(LibC.Name, EntryPoint = "getpeername", SetLastError = true)]
    private static partial int getpeername(int fd, byte* addr, uint* addrlen);

    [LibraryImport(LibC.Name, EntryPoint = "getsockname", SetLastError = true)]
    private static partial int getsockname(int fd, byte* addr, uint* addrlen);

    [LibraryImport(LibC.Name, EntryPoint = "shutdown", SetLastError = true)]
    private static partial int shutdown(int fd, int how);

    [LibraryImport(LibC.Name, EntryPoint = "sendmsg", SetLastError = true)]
    private static partial nint sendmsg(int fd, MessageHeader* msg, int flags);

    [LibraryImport(LibC.Name, EntryPoint = "recvmsg", SetLastError = true)]
    internal static partial nint recvmsg(int fd, MessageHeader* msg, int flags);

    /// <summary>A non-blocking, close-on-exec stream socket.</summary>
    public static SysResult Create(int family) => SysResult.Of(socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));

    public static SysResult SetOption(int fd, int level, int name, int value)
        => SysResult.Of(setsockopt(fd, level, name, &value, sizeof(int)));

    public static SysResult GetOption(int fd, int level, int name, out int value)
    {
        int v = 0;
        uint len = sizeof(int);
        var result = SysResult.Of(getsockopt(fd, level, name, &v, &len));
        value = v;
        return result;
    }

    /// <summary>SO_LINGER {1, 0}: the next close(2) sends RST instead of FIN (socket(7)).</summary>
    public static SysResult SetLingerZero(int fd)
    {
        var linger = new Linger { OnOff = 1, Seconds = 0 };
        return SysResult.Of(setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, (uint)sizeof(Linger)));
    }

    public static SysResult Bind(int fd, ReadOnlySpan<byte> address)
    {
        fixed (byte* p = address)
        {
            return SysResult.Of(bind(fd, p, (uint)address.Length));
        }
    }

    public static SysResult Connect(int fd, ReadOnlySpan<byte> address)
    {
        fixed (byte* p = address)
        {
            return SysResult.Of(connect(fd, p, (uint)address.Length));
        }
    }

    public static SysResult Listen(int fd, int backlog) => SysResult.Of(listen(fd, backlog));

    /// <summary>accept4 with a non-blocking, close-on-exec result; the peer's sockaddr goes to <paramref name="address"/>.</summary>
    public static SysResult Accept(int fd, Span<byte> address, out int addressLength)
    {
        uint len = (uint)address.Length;
        fixed (byte* p = address)
        {
            var result = SysResult.Of(accept4(fd, p, &len, SOCK_NONBLOCK | SOCK_CLOEXEC));
            addressLength = (int)Math.Min(len, (uint)address.Length);
            return result;
        }
    }

    /// <summary>getpeername(2): the peer's sockaddr goes to <paramref name="address"/>, as <see cref="Accept"/> would have written it.</summary>
    public static SysResult GetPeerAddress(int fd, Span<byte> address, out int addressLength)
    {
        uint len = (uint)address.Length;
        fixed (byte* p = address)
        {
            var result = SysResult.Of(getpeername(fd, p, &len));
            addressLength = result.IsError ? 0 : (int)Math.Min(len, (uint)address.Length);
            return result;
        }
    }

    public static SysResult Shutdown(int fd, int how) => SysResult.Of(shutdown(fd, how));

    /// <summary>
    /// connect(2) to an AF_UNSPEC address: a connected TCP socket disconnects (tcp_disconnect), sending RST and dropping
    /// its queued data, yet stays open, with its error queue, so MSG_ZEROCOPY notifications still reach it (a closed
    /// socket gets none).
    /// </summary>
    public static SysResult Disconnect(int fd)
    {
        ushort unspecified = 0; // sa_family_t AF_UNSPEC
        return SysResult.Of(connect(fd, (byte*)&unspecified, sizeof(ushort)));
    }

    public static EndPoint? GetLocalEndPoint(int fd)
    {
        byte* buffer = stackalloc byte[SockAddr.MaxLength];
        uint len = SockAddr.MaxLength;
        return SysResult.Of(getsockname(fd, buffer, &len)).IsError
            ? null
            : SockAddr.Parse(new ReadOnlySpan<byte>(buffer, (int)Math.Min(len, (uint)SockAddr.MaxLength)));
    }

    /// <summary>
    /// sendmsg(2) with MSG_NOSIGNAL, so a closed peer gives EPIPE instead of SIGPIPE; with
    /// <paramref name="zeroCopy"/> also MSG_ZEROCOPY (the buffers must then stay unchanged until
    /// <see cref="ErrorQueue.ReadZeroCopyCompletion"/> reports this send).
    /// </summary>
    public static SysResult Send(int fd, Iovec* iov, int iovCount, bool zeroCopy = false)
    {
        MessageHeader header = default;
        header.Iov = iov;
        header.IovLength = (nuint)iovCount;
        return SysResult.Of(sendmsg(fd, &header, MSG_NOSIGNAL | (zeroCopy ? MSG_ZEROCOPY : 0)));
    }

    /// <summary>struct msghdr.</summary>
    [StructLayout(LayoutKind.Sequential)]
    internal struct MessageHeader
    {
        public void* Name;
        public uint NameLength;
        public Iovec* Iov;
        public nuint IovLength;
        public void* Control;
        public nuint ControlLength;
        public int Flags;
    }

    /// <summary>struct linger (socket(7)).</summary>
    [StructLayout(LayoutKind.Sequential)]
    internal struct Linger
    {
        public int OnOff;
        public int Seconds;
    }
}
