using System.Net.Sockets;
using System.Runtime.InteropServices;
using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>
/// Linux errno values (asm-generic/errno-base.h and errno.h; identical on x86_64 and arm64), and the one
/// place where an errno becomes an exception (a failed <see cref="SysResult"/> comes here).
/// </summary>
internal static class Errno
{
    public const int EPERM = 1;
    public const int ENOENT = 2;
    public const int EINTR = 4;
    public const int EBADF = 9;
    public const int EAGAIN = 11;
    public const int ENOMEM = 12;
    public const int EACCES = 13;
    public const int EINVAL = 22;
    public const int ENFILE = 23;
    public const int EMFILE = 24;
    public const int EPIPE = 32;
    public const int ENOSYS = 38;
    public const int EBADR = 53;
    public const int ENOTSOCK = 88;
    public const int EPROTOTYPE = 91;
    public const int EPROTO = 71;
    public const int EOPNOTSUPP = 95;
    public const int EAFNOSUPPORT = 97;
    public const int EADDRINUSE = 98;
    public const int EADDRNOTAVAIL = 99;
    public const int ENETDOWN = 100;
    public const int ENETUNREACH = 101;
    public const int ECONNABORTED = 103;
    public const int ECONNRESET = 104;
    public const int ENOBUFS = 105;
    public const int ETIMEDOUT = 110;
    public const int ECONNREFUSED = 111;
    public const int EHOSTUNREACH = 113;

    /// <summary>The symbolic name of the errno values the transport reports in metrics; "errno N" for others.</summary>
    public static string Name(int errno) => errno switch
    {
        EPERM => "EPERM",
        EINTR => "EINTR",
        EAGAIN => "EAGAIN",
        ENOMEM => "ENOMEM",
        EACCES => "EACCES",
        EINVAL => "EINVAL",
        ENFILE => "ENFILE",
        EMFILE => "EMFILE",
        EPIPE => "EPIPE",
        EPROTO => "EPROTO",
        ECONNABORTED => "ECONNABORTED",
        ECONNRESET => "ECONNRESET",
        ENOBUFS => "ENOBUFS",
        ETIMEDOUT => "ETIMEDOUT",
        _ => $"errno {errno}",
    };

    public static string Describe(int errno) => $"{Marshal.GetPInvokeErrorMessage(errno)} (errno {errno})";

    public static Exception ToException(int errno, string operation) => errno switch
    {
        EADDRINUSE => new AddressInUseException($"{operation} failed: {Describe(errno)}."),
        ECONNRESET or EPIPE => new ConnectionResetException($"{operation} failed: {Describe(errno)}."),
        _ => new SocketException((int)ToSocketError(errno), $"{operation} failed: {Describe(errno)}."),
    };

    /// <summary>
    /// Maps errno to SocketError, so that bind failures surface as <see cref="SocketException"/> (not an
    /// IOException): Kestrel's localhost and IPv6 fallbacks only continue past non-IOExceptions.
    /// </summary>
    public static SocketError ToSocketError(int errno) => errno switch
    {
        EADDRNOTAVAIL => SocketError.AddressNotAvailable,
        EAFNOSUPPORT => SocketError.AddressFamilyNotSupported,
        EACCES or EPERM => SocketError.AccessDenied,
        EADDRINUSE => SocketError.AddressAlreadyInUse,
        ECONNREFUSED => SocketError.ConnectionRefused,
        ECONNRESET => SocketError.ConnectionReset,
        ECONNABORTED => SocketError.ConnectionAborted,
        EINVAL => SocketError.InvalidArgument,
        EMFILE or ENFILE => SocketError.TooManyOpenSockets,
        ENOBUFS or ENOMEM => SocketError.NoBufferSpaceAvailable,
        ENETDOWN => SocketError.NetworkDown,
        ENETUNREACH => SocketError.NetworkUnreachable,
        EHOSTUNREACH => SocketError.HostUnreachable,
        ETIMEDOUT => SocketError.TimedOut,
        ENOTSOCK => SocketError.NotSocket,
        EPROTOTYPE => SocketError.ProtocolType,
        EPIPE => SocketError.Shutdown,
        _ => SocketError.SocketError,
    };
}
