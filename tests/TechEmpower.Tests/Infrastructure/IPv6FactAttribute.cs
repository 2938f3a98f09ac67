using System.Net;
using System.Net.Sockets;

namespace TechEmpower.Tests.Infrastructure;

/// <summary>A fact that is skipped, with the reason, on a host without the IPv6 loopback (some containers).</summary>
public sealed class IPv6FactAttribute : FactAttribute
{
    private static readonly Lazy<string?> s_unavailableReason = new(Probe);

    public IPv6FactAttribute()
    {
        if (s_unavailableReason.Value is { } reason)
        {
            Skip = reason;
        }
    }

    private static string? Probe()
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
        catch (SocketException e)
        {
            return $"The IPv6 loopback [::1] cannot be bound on this host: {e.SocketErrorCode} ({e.Message}).";
        }
    }
}
