using System.Buffers.Binary;
using System.Net;
using System.Net.Sockets;

namespace LibuvComparator.Interop;

/// <summary>
/// struct sockaddr_in and sockaddr_in6 (ip(7), ipv6(7)): family in host order, then the port in
/// network order; IPv4 address at offset 4, IPv6 flowinfo at 4, address at 8, scope id at 24.
/// </summary>
internal static class SockAddr
{
    public const int AF_INET = 2;
    public const int AF_INET6 = 10;

    /// <summary>sizeof(struct sockaddr_storage).</summary>
    public const int StorageSize = 128;

    /// <summary>Writes <paramref name="endPoint"/> and returns the length to pass to bind(2).</summary>
    public static int Write(IPEndPoint endPoint, Span<byte> destination)
    {
        destination.Clear();
        BinaryPrimitives.WriteUInt16BigEndian(destination[2..], (ushort)endPoint.Port);
        if (endPoint.AddressFamily == AddressFamily.InterNetworkV6)
        {
            BitConverter.TryWriteBytes(destination, (ushort)AF_INET6);
            endPoint.Address.TryWriteBytes(destination.Slice(8, 16), out _);
            BitConverter.TryWriteBytes(destination[24..], (uint)endPoint.Address.ScopeId);
            return 28;
        }

        BitConverter.TryWriteBytes(destination, (ushort)AF_INET);
        endPoint.Address.TryWriteBytes(destination.Slice(4, 4), out _);
        return 16;
    }

    /// <summary>Reads what getsockname(2) or getpeername(2) returned; null for other families.</summary>
    public static IPEndPoint? Read(ReadOnlySpan<byte> address)
    {
        if (address.Length < 16)
        {
            return null;
        }

        int family = BitConverter.ToUInt16(address);
        int port = BinaryPrimitives.ReadUInt16BigEndian(address[2..]);
        return family switch
        {
            AF_INET => new IPEndPoint(new IPAddress(address.Slice(4, 4)), port),
            AF_INET6 when address.Length >= 28 => new IPEndPoint(new IPAddress(address.Slice(8, 16), BitConverter.ToUInt32(address[24..])), port),
            _ => null,
        };
    }
}
