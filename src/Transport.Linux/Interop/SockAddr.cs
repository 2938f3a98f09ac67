using System.Buffers.Binary;
using System.Net;
using System.Net.Sockets;
using System.Text;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>
/// struct sockaddr_in, sockaddr_in6 and sockaddr_un (ip(7), ipv6(7), unix(7)) to and from endpoints. The
/// family is host-endian, written little-endian here: both architectures the transport ships for are.
/// </summary>
internal static class SockAddr
{
    /// <summary>Large enough for sockaddr_in6 (28) and sockaddr_un (110).</summary>
    public const int MaxLength = 128;

    /// <summary>sun_path's size (unix(7)), its terminating NUL included.</summary>
    public const int UnixPathCapacity = 108;

    /// <summary>Writes the sockaddr for an IP endpoint into <paramref name="buffer"/>; returns its length.</summary>
    public static int Write(IPEndPoint endPoint, Span<byte> buffer)
    {
        buffer.Clear();
        if (endPoint.AddressFamily == AddressFamily.InterNetwork)
        {
            BinaryPrimitives.WriteUInt16LittleEndian(buffer, Socket.AF_INET);
            BinaryPrimitives.WriteUInt16BigEndian(buffer[2..], (ushort)endPoint.Port);
            endPoint.Address.TryWriteBytes(buffer[4..8], out _);
            return 16;
        }

        BinaryPrimitives.WriteUInt16LittleEndian(buffer, Socket.AF_INET6);
        BinaryPrimitives.WriteUInt16BigEndian(buffer[2..], (ushort)endPoint.Port);
        endPoint.Address.TryWriteBytes(buffer[8..24], out _);
        BinaryPrimitives.WriteUInt32LittleEndian(buffer[24..], (uint)endPoint.Address.ScopeId);
        return 28;
    }

    /// <summary>Writes a sockaddr_un; returns its length, or -1 when the path does not fit.</summary>
    public static int Write(string path, Span<byte> buffer)
    {
        buffer.Clear();
        BinaryPrimitives.WriteUInt16LittleEndian(buffer, Socket.AF_UNIX);
        int byteCount = Encoding.UTF8.GetByteCount(path);
        if (byteCount >= UnixPathCapacity)
        {
            return -1;
        }

        Encoding.UTF8.GetBytes(path, buffer[2..]);
        return 2 + byteCount + 1;
    }

    public static EndPoint? Parse(ReadOnlySpan<byte> address)
    {
        if (address.Length < 2)
        {
            return null;
        }

        int family = BinaryPrimitives.ReadUInt16LittleEndian(address);
        switch (family)
        {
            case Socket.AF_INET when address.Length >= 8:
                return new IPEndPoint(new IPAddress(address[4..8]), BinaryPrimitives.ReadUInt16BigEndian(address[2..]));
            case Socket.AF_INET6 when address.Length >= 28:
                var ip = new IPAddress(address[8..24], BinaryPrimitives.ReadUInt32LittleEndian(address[24..]));
                return new IPEndPoint(ip, BinaryPrimitives.ReadUInt16BigEndian(address[2..]));
            case Socket.AF_UNIX:
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
