using System.Net;
using System.Net.Sockets;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>A theory that is skipped, with the reason, on a host without IPv6 loopback (some containers).</summary>
public sealed class IPv6TheoryAttribute : TheoryAttribute
{
    private static readonly Lazy<string?> s_unavailableReason = new(ProbeIPv6);

    public IPv6TheoryAttribute()
    {
        if (s_unavailableReason.Value is { } reason)
        {
            Skip = reason;
        }
    }

    private static string? ProbeIPv6()
    {
        if (!Socket.OSSupportsIPv6)
        {
            return "IPv6 is not supported on this host (Socket.OSSupportsIPv6 is false).";
        }

        try
        {
            using var probe = new Socket(AddressFamily.InterNetworkV6, SocketType.Stream, ProtocolType.Tcp);
            probe.Bind(new IPEndPoint(IPAddress.IPv6Loopback, 0));
            return null;
        }
        catch (SocketException ex)
        {
            return $"IPv6 loopback [::1] cannot be bound on this host: {ex.SocketErrorCode} ({ex.Message}).";
        }
    }
}
