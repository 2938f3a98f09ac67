using System.Buffers.Binary;
using System.Net;
using System.Net.Sockets;
using System.Runtime.InteropServices;
using System.Text;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>socket(7), tcp(7), unix(7): the calls the transport makes on socket fds. Each returns a value or -errno.</summary>
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
    public const int SO_DOMAIN = 39;
    public const int SO_LINGER = 13;
    public const int SO_REUSEPORT = 15;       // Linux 3.9
    public const int IPPROTO_TCP = 6;
    public const int IPPROTO_IPV6 = 41;
    public const int TCP_NODELAY = 1;
    public const int TCP_DEFER_ACCEPT = 9;    // tcp(7)
    public const int TCP_QUICKACK = 12;       // tcp(7)
    public const int TCP_NOTSENT_LOWAT = 25;  // Linux 3.12, tcp(7)
    public const int SO_BUSY_POLL = 46;       // Linux 3.11, socket(7)
    public const int SO_ZEROCOPY = 60;        // Linux 4.14, msg_zerocopy.rst
    public const int IPV6_V6ONLY = 26;

    public const int SHUT_WR = 1;
    public const int SHUT_RDWR = 2;
    public const int MSG_NOSIGNAL = 0x4000;
    public const int MSG_ERRQUEUE = 0x2000;
    public const int MSG_ZEROCOPY = 0x4000000;  // Linux 4.14

    // The error-queue records that carry MSG_ZEROCOPY completions (ip(7), ipv6(7), linux/errqueue.h).
    private const int SOL_IP = 0;
    private const int IP_RECVERR = 11;
    private const int SOL_IPV6 = 41;
    private const int IPV6_RECVERR = 25;
    private const byte SO_EE_ORIGIN_ZEROCOPY = 5;
    private const byte SO_EE_CODE_ZEROCOPY_COPIED = 1;

    /// <summary>Large enough for sockaddr_in6 (28) and sockaddr_un (110).</summary>
    public const int MaxAddressLength = 128;

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

    [LibraryImport(LibC.Name, EntryPoint = "getsockname", SetLastError = true)]
    private static partial int getsockname(int fd, byte* addr, uint* addrlen);

    [LibraryImport(LibC.Name, EntryPoint = "shutdown", SetLastError = true)]
    private static partial int shutdown(int fd, int how);

    [LibraryImport(LibC.Name, EntryPoint = "sendmsg", SetLastError = true)]
    private static partial nint sendmsg(int fd, MessageHeader* msg, int flags);

    [LibraryImport(LibC.Name, EntryPoint = "recvmsg", SetLastError = true)]
    private static partial nint recvmsg(int fd, MessageHeader* msg, int flags);

    [StructLayout(LayoutKind.Sequential)]
    private struct MessageHeader
    {
        public void* Name;
        public uint NameLength;
        public Iovec* Iov;
        public nuint IovLength;
        public void* Control;
        public nuint ControlLength;
        public int Flags;
    }

    public static int Create(int family) => Errno.Check(socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));

    public static int SetOption(int fd, int level, int name, int value)
        => Errno.Check(setsockopt(fd, level, name, &value, sizeof(int)));

    public static int GetOption(int fd, int level, int name, out int value)
    {
        int v = 0;
        uint len = sizeof(int);
        int rc = Errno.Check(getsockopt(fd, level, name, &v, &len));
        value = v;
        return rc;
    }

    /// <summary>SO_LINGER {1, 0}: the next close(2) sends RST instead of FIN (socket(7)).</summary>
    public static int SetLingerZero(int fd)
    {
        long linger = 1; // struct linger { int l_onoff = 1; int l_linger = 0; }
        return Errno.Check(setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, sizeof(long)));
    }

    public static int Bind(int fd, ReadOnlySpan<byte> address)
    {
        fixed (byte* p = address)
        {
            return Errno.Check(bind(fd, p, (uint)address.Length));
        }
    }

    public static int Connect(int fd, ReadOnlySpan<byte> address)
    {
        fixed (byte* p = address)
        {
            return Errno.Check(connect(fd, p, (uint)address.Length));
        }
    }

    public static int Listen(int fd, int backlog) => Errno.Check(listen(fd, backlog));

    public static int Accept(int fd, Span<byte> address, out int addressLength)
    {
        uint len = (uint)address.Length;
        fixed (byte* p = address)
        {
            int rc = Errno.Check(accept4(fd, p, &len, SOCK_NONBLOCK | SOCK_CLOEXEC));
            addressLength = (int)len;
            return rc;
        }
    }

    public static int Shutdown(int fd, int how) => Errno.Check(shutdown(fd, how));

    public static EndPoint? GetLocalEndPoint(int fd)
    {
        byte* buffer = stackalloc byte[MaxAddressLength];
        uint len = MaxAddressLength;
        return getsockname(fd, buffer, &len) == 0 ? ParseAddress(new ReadOnlySpan<byte>(buffer, (int)len)) : null;
    }

    /// <summary>
    /// sendmsg(2) with MSG_NOSIGNAL, so a closed peer gives EPIPE instead of SIGPIPE; with
    /// <paramref name="zeroCopy"/> also MSG_ZEROCOPY (the buffers must then stay unchanged until
    /// <see cref="ReadZeroCopyCompletion"/> reports this send).
    /// </summary>
    public static long Send(int fd, Iovec* iov, int iovCount, bool zeroCopy = false)
    {
        MessageHeader header = default;
        header.Iov = iov;
        header.IovLength = (nuint)iovCount;
        return Errno.Check((long)sendmsg(fd, &header, MSG_NOSIGNAL | (zeroCopy ? MSG_ZEROCOPY : 0)));
    }

    /// <summary>
    /// Takes one MSG_ZEROCOPY completion off the socket's error queue (msg_zerocopy.rst): 1 with the
    /// inclusive range of send ids it completes, and whether the kernel copied the data after all;
    /// 0 when the queue holds no completion; or -errno (-EAGAIN: the queue is empty).
    /// </summary>
    public static int ReadZeroCopyCompletion(int fd, out uint first, out uint last, out bool copied)
    {
        first = last = 0;
        copied = false;
        // cmsghdr (16 bytes on LP64) + sock_extended_err (16), with room to spare.
        ulong* control = stackalloc ulong[16];
        MessageHeader header = default;
        header.Control = control;
        header.ControlLength = 16 * sizeof(ulong);
        long rc = Errno.Check((long)recvmsg(fd, &header, MSG_ERRQUEUE));
        if (rc < 0)
        {
            return (int)rc;
        }

        byte* cmsg = (byte*)control;
        byte* end = cmsg + header.ControlLength;
        while (cmsg + 16 <= end)
        {
            nuint length = *(nuint*)cmsg;
            int level = *(int*)(cmsg + 8);
            int type = *(int*)(cmsg + 12);
            if (length < 16 + 16 || cmsg + length > end)
            {
                break;
            }

            byte* error = cmsg + 16; // struct sock_extended_err
            if (((level == SOL_IP && type == IP_RECVERR) || (level == SOL_IPV6 && type == IPV6_RECVERR))
                && error[4] == SO_EE_ORIGIN_ZEROCOPY && *(uint*)error == 0)
            {
                copied = (error[6] & SO_EE_CODE_ZEROCOPY_COPIED) != 0;
                first = *(uint*)(error + 8);
                last = *(uint*)(error + 12);
                return 1;
            }

            cmsg += (length + 7) & ~(nuint)7;
        }

        return 0;
    }

    /// <summary>Writes the sockaddr for an IP endpoint into <paramref name="buffer"/>; returns its length.</summary>
    public static int WriteAddress(IPEndPoint endPoint, Span<byte> buffer)
    {
        buffer.Clear();
        if (endPoint.AddressFamily == AddressFamily.InterNetwork)
        {
            BinaryPrimitives.WriteUInt16LittleEndian(buffer, AF_INET);
            BinaryPrimitives.WriteUInt16BigEndian(buffer[2..], (ushort)endPoint.Port);
            endPoint.Address.TryWriteBytes(buffer[4..8], out _);
            return 16;
        }

        BinaryPrimitives.WriteUInt16LittleEndian(buffer, AF_INET6);
        BinaryPrimitives.WriteUInt16BigEndian(buffer[2..], (ushort)endPoint.Port);
        endPoint.Address.TryWriteBytes(buffer[8..24], out _);
        BinaryPrimitives.WriteUInt32LittleEndian(buffer[24..], (uint)endPoint.Address.ScopeId);
        return 28;
    }

    /// <summary>Writes a sockaddr_un; returns its length, or -1 when the path does not fit (108 bytes, unix(7)).</summary>
    public static int WriteAddress(string path, Span<byte> buffer)
    {
        buffer.Clear();
        BinaryPrimitives.WriteUInt16LittleEndian(buffer, AF_UNIX);
        int byteCount = Encoding.UTF8.GetByteCount(path);
        if (byteCount >= 108)
        {
            return -1;
        }

        Encoding.UTF8.GetBytes(path, buffer[2..]);
        return 2 + byteCount + 1;
    }

    public static EndPoint? ParseAddress(ReadOnlySpan<byte> address)
    {
        if (address.Length < 2)
        {
            return null;
        }

        int family = BinaryPrimitives.ReadUInt16LittleEndian(address);
        switch (family)
        {
            case AF_INET when address.Length >= 8:
                return new IPEndPoint(new IPAddress(address[4..8]), BinaryPrimitives.ReadUInt16BigEndian(address[2..]));
            case AF_INET6 when address.Length >= 28:
                var ip = new IPAddress(address[8..24], BinaryPrimitives.ReadUInt32LittleEndian(address[24..]));
                return new IPEndPoint(ip, BinaryPrimitives.ReadUInt16BigEndian(address[2..]));
            case AF_UNIX:
                // An unbound client socket has no name (unix(7): "unnamed"): only the family comes back.
                var path = address[2..];
                int nul = path.IndexOf((byte)0);
                path = nul >= 0 ? path[..nul] : path;
                return path.IsEmpty ? null : new UnixDomainSocketEndPoint(Encoding.UTF8.GetString(path));
            default:
                return null;
        }
    }
}
