using System.Net;
using System.Net.Sockets;

namespace RawHttp;

/// <summary>Client sockets to a server under test, TCP or Unix-domain.</summary>
public static class ClientSocket
{
    /// <summary>Connects a stream socket of the endpoint's family; TCP ones with Nagle off, as HTTP clients run.</summary>
    /// <param name="endPoint">An IP or Unix-domain socket endpoint.</param>
    /// <param name="cancellationToken">Bounds the connect.</param>
    /// <returns>The connected socket.</returns>
    public static async Task<Socket> ConnectAsync(EndPoint endPoint, CancellationToken cancellationToken)
    {
        ArgumentNullException.ThrowIfNull(endPoint);
        var socket = endPoint is UnixDomainSocketEndPoint
            ? new Socket(AddressFamily.Unix, SocketType.Stream, ProtocolType.Unspecified)
            : new Socket(endPoint.AddressFamily, SocketType.Stream, ProtocolType.Tcp) { NoDelay = true };
        try
        {
            await socket.ConnectAsync(endPoint, cancellationToken);
            return socket;
        }
        catch
        {
            socket.Dispose();
            throw;
        }
    }

    /// <summary>The endpoint of a URL as Kestrel prints it: <c>http://127.0.0.1:PORT</c>, <c>http://[::1]:PORT</c> or <c>http://unix:/PATH</c>.</summary>
    /// <param name="url">The URL.</param>
    /// <returns>The endpoint.</returns>
    public static EndPoint EndPointOf(string url)
    {
        ArgumentNullException.ThrowIfNull(url);
        if (url.StartsWith("http://unix:", StringComparison.Ordinal))
        {
            return new UnixDomainSocketEndPoint(url["http://unix:".Length..]);
        }

        var uri = new Uri(url);
        return new IPEndPoint(IPAddress.Parse(uri.Host.Trim('[', ']')), uri.Port);
    }
}
