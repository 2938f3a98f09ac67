using System.Net;
using System.Net.Sockets;
using System.Runtime.InteropServices;
using Microsoft.AspNetCore.Connections;

namespace LibuvComparator.Interop;

/// <summary>
/// Creates the bound (not yet listening) SO_REUSEPORT sockets that each loop adopts with
/// uv_tcp_open: libuv 1.44 has no UV_TCP_REUSEPORT flag (it arrived in 1.49), so the socket is
/// made here with socket(2), setsockopt(2) and bind(2).
/// </summary>
internal static unsafe partial class ListenSocket
{
    // Linux asm-generic/socket.h and netinet/in.h, the same on x86_64 and arm64.
    private const int SOCK_STREAM = 1;
    private const int SOCK_NONBLOCK = 0x800;
    private const int SOCK_CLOEXEC = 0x80000;
    private const int SOL_SOCKET = 1;
    private const int SO_REUSEADDR = 2;
    private const int SO_LINGER = 13;
    private const int SO_REUSEPORT = 15;
    private const int IPPROTO_IPV6 = 41;
    private const int IPV6_V6ONLY = 26;

    // errno values (asm-generic/errno-base.h, errno.h).
    private const int EACCES = 13;
    private const int EAFNOSUPPORT = 97;
    private const int EADDRINUSE = 98;
    private const int EADDRNOTAVAIL = 99;

    [LibraryImport("libc", EntryPoint = "socket", SetLastError = true)]
    private static partial int Socket(int domain, int type, int protocol);

    [LibraryImport("libc", EntryPoint = "setsockopt", SetLastError = true)]
    private static partial int SetSockOpt(int fd, int level, int name, void* value, uint length);

    [LibraryImport("libc", EntryPoint = "bind", SetLastError = true)]
    private static partial int Bind(int fd, byte* address, uint length);

    [LibraryImport("libc", EntryPoint = "close")]
    private static partial int Close(int fd);

    /// <summary>
    /// Binds the port without SO_REUSEPORT to learn whether it is free and, for port 0, which port
    /// the kernel picked. Without this probe a group of SO_REUSEPORT sockets would silently join
    /// another listener of the same user on that port.
    /// </summary>
    public static int ProbePort(IPEndPoint endPoint)
    {
        using var probe = new System.Net.Sockets.Socket(endPoint.AddressFamily, SocketType.Stream, ProtocolType.Tcp);
        if (endPoint.Address.Equals(IPAddress.IPv6Any))
        {
            probe.DualMode = true;
        }

        probe.SetSocketOption(SocketOptionLevel.Socket, SocketOptionName.ReuseAddress, true);
        try
        {
            probe.Bind(endPoint);
        }
        catch (SocketException e) when (e.SocketErrorCode == SocketError.AddressAlreadyInUse)
        {
            throw new AddressInUseException(e.Message, e);
        }

        return ((IPEndPoint)probe.LocalEndPoint!).Port;
    }

    /// <summary>A non-blocking TCP socket with SO_REUSEADDR and SO_REUSEPORT, bound to <paramref name="endPoint"/>. The caller owns the fd.</summary>
    public static int CreateBound(IPEndPoint endPoint)
    {
        bool v6 = endPoint.AddressFamily == AddressFamily.InterNetworkV6;
        int fd = Socket(v6 ? SockAddr.AF_INET6 : SockAddr.AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
        {
            throw Error(Marshal.GetLastPInvokeError(), "socket", endPoint);
        }

        try
        {
            SetInt(fd, SOL_SOCKET, SO_REUSEADDR, 1, endPoint);
            SetInt(fd, SOL_SOCKET, SO_REUSEPORT, 1, endPoint);
            if (v6)
            {
                SetInt(fd, IPPROTO_IPV6, IPV6_V6ONLY, endPoint.Address.Equals(IPAddress.IPv6Any) ? 0 : 1, endPoint);
            }

            byte* address = stackalloc byte[SockAddr.StorageSize];
            int length = SockAddr.Write(endPoint, new Span<byte>(address, SockAddr.StorageSize));
            if (Bind(fd, address, (uint)length) < 0)
            {
                throw Error(Marshal.GetLastPInvokeError(), "bind", endPoint);
            }

            return fd;
        }
        catch
        {
            _ = Close(fd);
            throw;
        }
    }

    /// <summary>Closes a socket that was never handed to libuv.</summary>
    public static void CloseUnadopted(int fd) => _ = Close(fd);

    /// <summary>SO_LINGER {on, 0}: close(2) then sends RST. Used only where uv_tcp_close_reset refuses (a shutdown is pending).</summary>
    public static void SetLingerZero(int fd)
    {
        int* linger = stackalloc int[2] { 1, 0 };
        _ = SetSockOpt(fd, SOL_SOCKET, SO_LINGER, linger, sizeof(int) * 2);
    }

    private static void SetInt(int fd, int level, int name, int value, IPEndPoint endPoint)
    {
        if (SetSockOpt(fd, level, name, &value, sizeof(int)) < 0)
        {
            throw Error(Marshal.GetLastPInvokeError(), "setsockopt", endPoint);
        }
    }

    // Kestrel falls back (IPv6 to IPv4, localhost to one family) only on non-IOExceptions, and
    // expects AddressInUseException for EADDRINUSE.
    private static Exception Error(int errno, string call, IPEndPoint endPoint)
    {
        string message = $"{call} for {endPoint} failed: {Marshal.GetPInvokeErrorMessage(errno)}.";
        return errno switch
        {
            EADDRINUSE => new AddressInUseException(message),
            EADDRNOTAVAIL => new SocketException((int)SocketError.AddressNotAvailable, message),
            EAFNOSUPPORT => new SocketException((int)SocketError.AddressFamilyNotSupported, message),
            EACCES => new SocketException((int)SocketError.AccessDenied, message),
            _ => new SocketException((int)SocketError.SocketError, message),
        };
    }
}
